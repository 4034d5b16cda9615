"""The one import of Lightning: ``lightning.pytorch`` (the unified ``lightning`` package) or ``pytorch_lightning``.

Both packages ship the same Trainer under two names, and a Trainer of one refuses the other's
LightningModule, DataModule and plugins. Every module of this package that needs Lightning takes it
from here (``from lightning_multigrid._lightning import pl``), so the whole package uses one of the two,
chosen once per process when this module is first imported:

1. the environment variable ``LIGHTNING_MULTIGRID_PACKAGE`` (``lightning`` or ``pytorch_lightning``), if set;
2. otherwise the one the program has already imported, if it has imported exactly one
   (``import lightning as L`` before ``from lightning_multigrid import ...``);
3. otherwise the one installed; with both installed, ``pytorch_lightning``: its users' imports sort
   after ``lightning_multigrid`` and so come too late for rule 2, while ``lightning`` sorts before it.

The callback works with a Trainer of either package (Lightning calls a callback's hooks whatever its
class, and it reads the Trainer through attributes both share); the DataModule, ``VideoClassifier``
and the plugins work only with the chosen package's Trainer.
"""

from __future__ import annotations

import importlib
import os
import sys
from importlib.util import find_spec
from types import ModuleType
from typing import TYPE_CHECKING, Any

__all__ = [
    "ENV_VAR", "PACKAGE", "RANK_ZERO_LOGGERS", "Callback", "LayerSync", "LightningCLI", "MisconfigurationException",
    "TorchSyncBatchNorm", "choose_package", "pl", "rank_zero_info", "rank_zero_warn", "submodule",
]

ENV_VAR = "LIGHTNING_MULTIGRID_PACKAGE"
# distribution's import name -> the module that holds the Trainer
_TRAINER_MODULE = {"lightning": "lightning.pytorch", "pytorch_lightning": "pytorch_lightning"}


def _installed(name: str) -> bool:
    return name in sys.modules or find_spec(name) is not None


def choose_package(environ: dict[str, str] | os._Environ[str], imported: set[str] | Any) -> str:
    """``"lightning"`` or ``"pytorch_lightning"`` by the rules in the module docstring.

    Args:
        environ: the process environment.
        imported: names of the modules imported so far (``sys.modules``).

    Raises:
        ValueError: the environment variable names another package.
        ImportError: neither package is installed.
    """
    asked = environ.get(ENV_VAR)
    if asked:
        if asked not in _TRAINER_MODULE:
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


PACKAGE = choose_package(os.environ, sys.modules)

if TYPE_CHECKING:  # one set of names for the type checker; both packages are untyped for mypy (pyproject)
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import Callback
    from pytorch_lightning.cli import LightningCLI
    from pytorch_lightning.plugins import LayerSync
    from pytorch_lightning.plugins.layer_sync import TorchSyncBatchNorm
    from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn
    from pytorch_lightning.utilities.exceptions import MisconfigurationException
else:
    pl = importlib.import_module(_TRAINER_MODULE[PACKAGE])
    Callback = pl.Callback
    LayerSync = pl.plugins.LayerSync
    TorchSyncBatchNorm = pl.plugins.layer_sync.TorchSyncBatchNorm
    rank_zero_info = pl.utilities.rank_zero_info
    rank_zero_warn = pl.utilities.rank_zero_warn
    MisconfigurationException = pl.utilities.exceptions.MisconfigurationException

# Lightning's rank-zero messages go through one of these loggers (the Trainer's, or Fabric's under it).
_FABRIC_MODULE = "lightning.fabric" if PACKAGE == "lightning" else "lightning_fabric"
RANK_ZERO_LOGGERS = (f"{_TRAINER_MODULE[PACKAGE]}.utilities.rank_zero", f"{_FABRIC_MODULE}.utilities.rank_zero")


def submodule(name: str) -> ModuleType:
    """``<package>.<name>`` of the chosen package, e.g. ``submodule("cli")`` (not imported by the package itself)."""
    return importlib.import_module(f"{_TRAINER_MODULE[PACKAGE]}.{name}")


def __getattr__(name: str) -> Any:
    # LightningCLI on first use: Lightning's package does not import its CLI module (it needs jsonargparse).
    if name == "LightningCLI":
        return submodule("cli").LightningCLI
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

