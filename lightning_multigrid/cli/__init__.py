"""The ``lightning-multigrid`` command: ``commands`` (every command and its dispatch: ``main``), ``schedule`` (the
schedule preview), ``trainer`` (``fit``/``validate``/``test`` through LightningCLI), ``compare``
(baseline against multigrid), ``renamed_options`` (the previous release's option names).

``main`` is the entry point (``lightning_multigrid.cli:main``); ``python -m lightning_multigrid.cli`` runs it too.
"""

from __future__ import annotations

from typing import Any

from lightning_multigrid._lazy import lazy_attribute

__all__ = ["main"]


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, {"main": "lightning_multigrid.cli.commands"}, name)
