"""Names a package imports on first access (its ``_LAZY`` table), so importing it loads only what is used."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

__all__ = ["lazy_attribute"]


def lazy_attribute(package: str, lazy: Mapping[str, str], name: str) -> Any:
    """``name`` from the module ``lazy`` maps it to: a package's ``__getattr__``.

    Raises:
        AttributeError: when ``name`` is not one of ``package``'s lazy names.
    """
    if name in lazy:
        return getattr(importlib.import_module(lazy[name]), name)
    raise AttributeError(f"module {package!r} has no attribute {name!r}")
