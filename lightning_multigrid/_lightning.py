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
class, and it reads the Trainer through attributes both share; where it checks a class, it checks
both packages' with :func:`either_package`); the DataModule, ``VideoClassifier`` and the plugins work
only with the chosen package's Trainer, and the DataModule refuses another at once
(:func:`check_trainer_package`). The command line chooses the package its class paths name
(``lightning.pytorch.callbacks.ModelSummary``), before this module is imported.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

from lightning_multigrid._package_choice import ENV_VAR, TRAINER_MODULE, choose_package

__all__ = [
    "ENV_VAR", "PACKAGE", "RANK_ZERO_LOGGERS", "Callback", "LayerSync", "LightningCLI", "MisconfigurationException",
    "TorchSyncBatchNorm", "check_trainer_package", "choose_package", "either_package", "package_of", "pl",
    "rank_zero_info", "rank_zero_warn", "submodule", "warn_if_the_other_package_is_imported",
]

# The variable and the rules live in `_package_choice` (no Lightning import), which the command line reads first.

PACKAGE = choose_package(os.environ, sys.modules)
# Why, for messages: the rule of the module docstring that chose it.
_CHOSEN_BY_DEFAULT = not os.environ.get(ENV_VAR) and [n for n in TRAINER_MODULE if n in sys.modules] != [PACKAGE]
_CHOSEN_BY = (
    f"`{ENV_VAR}={os.environ[ENV_VAR]}`" if os.environ.get(ENV_VAR)
    else "the package installed (lightning_multigrid was imported before either, or after both)" if _CHOSEN_BY_DEFAULT
    else "the package the program imported first"
)

if TYPE_CHECKING:  # one set of names for the type checker; both packages are untyped for mypy (pyproject)
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import Callback
    from pytorch_lightning.cli import LightningCLI
    from pytorch_lightning.plugins import LayerSync
    from pytorch_lightning.plugins.layer_sync import TorchSyncBatchNorm
    from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn
    from pytorch_lightning.utilities.exceptions import MisconfigurationException
else:
    pl = importlib.import_module(TRAINER_MODULE[PACKAGE])
    Callback = pl.Callback
    LayerSync = pl.plugins.LayerSync
    TorchSyncBatchNorm = pl.plugins.layer_sync.TorchSyncBatchNorm
    rank_zero_info = pl.utilities.rank_zero_info
    rank_zero_warn = pl.utilities.rank_zero_warn
    MisconfigurationException = pl.utilities.exceptions.MisconfigurationException

# Lightning's rank-zero messages go through one of these loggers (the Trainer's, or Fabric's under it).
_FABRIC_MODULE = "lightning.fabric" if PACKAGE == "lightning" else "lightning_fabric"
RANK_ZERO_LOGGERS = (f"{TRAINER_MODULE[PACKAGE]}.utilities.rank_zero", f"{_FABRIC_MODULE}.utilities.rank_zero")


def either_package(name: str) -> tuple[type, ...]:
    """The class ``name`` (a path under the Trainer's module: ``"LightningModule"``, ``"callbacks.Timer"``) of
    each Lightning package the process has imported, for ``isinstance`` checks on the user's objects: a
    package not imported made none of them, and is not imported here."""
    found = []
    for module_name in TRAINER_MODULE.values():
        obj: Any = sys.modules.get(module_name)
        for part in name.split(".") if obj is not None else ():
            obj = getattr(obj, part, None)
        if isinstance(obj, type):
            found.append(obj)
    return tuple(found)


def package_of(obj: object) -> str | None:
    """``"lightning"`` or ``"pytorch_lightning"``: the package whose class ``obj``'s class derives from
    (``trainer``: its ``Trainer``); ``None`` for neither."""
    for klass in type(obj).__mro__:
        top = klass.__module__.split(".")[0]
        if top in TRAINER_MODULE and klass.__module__.startswith(TRAINER_MODULE[top]):
            return top
    return None


_warned_other_package = False


def warn_if_the_other_package_is_imported(owner: object) -> None:
    """Warn, once per process, when the user imported the other Lightning package after this one was chosen by
    default (neither imported yet): ``owner``, built on the chosen package's class, will not train under the
    other's Trainer. Said when the object is built, before any Trainer is."""
    global _warned_other_package
    other = next(name for name in TRAINER_MODULE if name != PACKAGE)
    if _warned_other_package or not _CHOSEN_BY_DEFAULT or other not in sys.modules:
        return
    _warned_other_package = True
    rank_zero_warn(
        f"`{TRAINER_MODULE[other]}` was imported after lightning_multigrid, which uses `{PACKAGE}` in this process "
        f"(chosen by {_CHOSEN_BY}): {type(owner).__name__} works only with `{TRAINER_MODULE[PACKAGE]}.Trainer`. "
        f"To train with `{TRAINER_MODULE[other]}.Trainer`, import `{other}` before lightning_multigrid or set "
        f"`{ENV_VAR}={other}`."
    )


def check_trainer_package(owner: object, trainer: object) -> None:
    """Refuse a ``trainer`` of the other Lightning package than the one ``owner`` (an object of this package
    built on the chosen package's class) was built for, naming both, why, and the fix.

    Lightning would fail later, inside its own code (``ValueError: Expected a parent``).

    Raises:
        TypeError: when the Trainer is the other package's.
    """
    theirs = package_of(trainer)
    if theirs is None or theirs == PACKAGE:
        return
    name = type(owner).__name__
    raise TypeError(
        f"{name} is a `{TRAINER_MODULE[PACKAGE]}` class and the Trainer is `{TRAINER_MODULE[theirs]}`'s: a "
        f"Trainer takes only its own package's modules. lightning_multigrid uses `{PACKAGE}` in this process, "
        f"chosen by {_CHOSEN_BY}. Import `{theirs}` before lightning_multigrid (e.g. `import "
        f"{TRAINER_MODULE[theirs]} as pl` first), or set `{ENV_VAR}={theirs}` in the environment; or use "
        f"`{TRAINER_MODULE[PACKAGE]}.Trainer`."
    )


def submodule(name: str) -> ModuleType:
    """``<package>.<name>`` of the chosen package, e.g. ``submodule("cli")`` (not imported by the package itself)."""
    return importlib.import_module(f"{TRAINER_MODULE[PACKAGE]}.{name}")


def __getattr__(name: str) -> Any:
    # LightningCLI on first use: Lightning's package does not import its CLI module (it needs jsonargparse).
    if name == "LightningCLI":
        return submodule("cli").LightningCLI
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

