"""Which Lightning package lightning_multigrid uses: the rules (:mod:`lightning_multigrid._lightning` applies
them when first imported), and the package a command line's class paths name. Imports no Lightning, so the
command line can choose before anything imports one.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable
from importlib.util import find_spec
from typing import Any

__all__ = ["ENV_VAR", "TRAINER_MODULE", "choose_package", "packages_named"]

ENV_VAR = "LIGHTNING_MULTIGRID_PACKAGE"
# distribution's import name -> the module that holds the Trainer
TRAINER_MODULE = {"lightning": "lightning.pytorch", "pytorch_lightning": "pytorch_lightning"}
# A class path of either package, as a config or a flag writes it: `lightning.pytorch.callbacks.ModelSummary`.
_CLASS_PATH = re.compile(r"(?<![\w.])(lightning\.pytorch|pytorch_lightning)\.\w")


def _installed(name: str) -> bool:
    return name in sys.modules or find_spec(name) is not None


def choose_package(environ: dict[str, str] | os._Environ[str], imported: set[str] | Any) -> str:
    """``"lightning"`` or ``"pytorch_lightning"`` by the rules in :mod:`lightning_multigrid._lightning`'s docstring.

    Args:
        environ: the process environment.
        imported: names of the modules imported so far (``sys.modules``).

    Raises:
        ValueError: the environment variable names another package.
        ImportError: neither package is installed.
    """
    asked = environ.get(ENV_VAR)
    if asked:
        if asked not in TRAINER_MODULE:
            raise ValueError(f"`{ENV_VAR}` must be 'lightning' or 'pytorch_lightning', got {asked!r}.")
        return asked
    already = [name for name in ("lightning", "pytorch_lightning") if name in imported]
    if len(already) == 1:
        return already[0]
    found = [name for name in ("pytorch_lightning", "lightning") if _installed(name)]
    if not found:
        raise ImportError(
            "lightning-multigrid needs Lightning: `pip install lightning` (or `pip install pytorch-lightning`)."
        )
    return found[0]


def packages_named(texts: Iterable[str]) -> set[str]:
    """The Lightning packages (``"lightning"``, ``"pytorch_lightning"``) whose class paths ``texts`` name
    (``lightning.pytorch.callbacks.ModelSummary``, ``pytorch_lightning.loggers.CSVLogger``); YAML comments
    are left out."""
    named = set()
    for text in texts:
        for line in text.splitlines():
            code = line.split(" #")[0] if not line.lstrip().startswith("#") else ""
            named |= {"lightning" if match == "lightning.pytorch" else match for match in _CLASS_PATH.findall(code)}
    return named
