"""Modules that moved into the package's rooms, importable by their old paths.

``lightning_multigrid.config`` is ``lightning_multigrid.schedule.config`` now, and so on (:data:`MOVED`;
``ReaderSettings``' module moved above ``data/decoding/``, as it builds the store's reader too).
A finder on ``sys.meta_path`` answers an old path with the module at its new one: the same module
object, so a class imported either way is the same class, and code or configs written against the
old paths keep working.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType

__all__ = ["MOVED", "install"]

_P = "lightning_multigrid"
# old module -> the module it is now.
MOVED = {
    f"{_P}.{old}": f"{_P}.{new}"
    for old, new in {
        "config": "schedule.config",
        "stages": "schedule.stages",
        "allocation": "schedule.allocation",
        "short_run": "schedule.short_run",
        "cost": "schedule.cost",
        "preview": "schedule.preview",
        "limits": "schedule.limits",
        "lr": "schedule.lr",
        "resume": "fit.resume",
        "rng": "fit.rng",
        "batch_grid": "fit.batch_grid",
        "step_log": "fit.step_log",
        "meter": "fit.meter",
        "precise_bn": "fit.precise_bn",
        "multiview": "fit.multiview",
        "trainer_cli": "cli.trainer",
        "compare": "cli.compare",
        "schedule_command": "cli.schedule",
        "renamed_options": "cli.renamed_options",
        "data.decoding.settings": "data.reader_settings",
    }.items()
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self) -> None:
        self._own_specs: dict[str, ModuleSpec | None] = {}

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
        return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED else None

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        module = importlib.import_module(MOVED[spec.name])
        self._own_specs[module.__name__] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system has just set the old path's spec on the module: give it back its own.
        module.__spec__ = self._own_specs.pop(module.__name__)


def install() -> None:
    """Put the finder first on ``sys.meta_path``, once."""
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedModules())  # before an editable install's finder
