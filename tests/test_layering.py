"""Import layering (DESIGN.md §3), checked over every module of the package.

Each module's import-time dependencies are read from its source (module-level imports, with the
package ``__init__`` files an import runs), followed through the package, and compared with its
layer: the grid facts and the schedule import no torch; below the Lightning layer nothing imports
Lightning; the data pipeline (batch sampler, DataModule) needs the grid facts, not the schedule;
nothing imports pytorchvideo until a backbone builder needs it; no two modules import each other,
directly or around a circle.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

PACKAGE = "lightning_multigrid"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

# Lightning's two packages (the unified `lightning` and `pytorch_lightning`, with their Fabric).
LIGHTNING_PACKAGES = {"lightning", "pytorch_lightning", "lightning_fabric"}
# The one module that imports them; everything else takes Lightning from it.
LIGHTNING_IMPORT = f"{PACKAGE}._lightning"
# The Lightning layer: the only modules that may import Lightning (through `_lightning`).
LIGHTNING_LAYER = {
    LIGHTNING_IMPORT,
    f"{PACKAGE}._internals",
    f"{PACKAGE}.callback",
    f"{PACKAGE}.data.datamodule",
    f"{PACKAGE}.memory_format",
    f"{PACKAGE}.module",
    f"{PACKAGE}.plugins",
    *(f"{PACKAGE}.cli.{name}" for name in ("__main__", "commands", "compare", "trainer")),
    *(f"{PACKAGE}.fit.{name}" for name in ("facts", "precise_bn", "step_log")),
}
# The schedule's room: the options and config, the batch sizing, a stage, the two builders, the schedule value.
SCHEDULE_MODULES = {
    f"{PACKAGE}.schedule{name}" for name in ("", ".build", ".config", ".sizing", ".stages", ".allocation", ".short_run")
}
# Pure Python: importable without torch.
PURE = {
    PACKAGE, *(f"{PACKAGE}.{name}" for name in ("_checks", "_lazy", "_moved", "_tables", "grid", "contracts")),
    *SCHEDULE_MODULES, f"{PACKAGE}.schedule.preview", f"{PACKAGE}.schedule.limits",
    f"{PACKAGE}.fit", f"{PACKAGE}.fit.plan", f"{PACKAGE}.fit.meter",
    f"{PACKAGE}.cli", f"{PACKAGE}.cli.schedule", f"{PACKAGE}.cli.renamed_options",
}
# They read the plan through `grid.GridPlan`; the schedule is one implementation of it.
WITHOUT_SCHEDULE = {f"{PACKAGE}.data.sampler", f"{PACKAGE}.data.datamodule"}



def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = sorted(_module_name(path) for path in ROOT.rglob("*.py"))


def _path_of(module: str) -> Path | None:
    base = ROOT.parent.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _top_level_imports(tree: ast.Module, module: str) -> set[str]:
    """Modules imported when ``module`` is imported: not inside functions or ``if TYPE_CHECKING``."""
    is_package = _path_of(module) == ROOT.parent.joinpath(*module.split("."), "__init__.py")
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{anchor}.{base}" if base else anchor
                found.add(base)
                # `from package import submodule` imports the submodule too.
                found.update(f"{base}.{alias.name}" for alias in node.names if _path_of(f"{base}.{alias.name}"))
            elif isinstance(node, ast.If):
                if "TYPE_CHECKING" not in ast.unparse(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, (ast.With, ast.Try)):
                visit(node.body)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(tree.body)
    return found


@cache
def _imports(module: str) -> frozenset[str]:
    """Every module imported, transitively, by importing ``module`` (parent packages included)."""
    seen: set[str] = set()
    stack = [module]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        stack.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # parent packages run first
        path = _path_of(name) if parts[0] == PACKAGE else None
        if path is not None:
            stack.extend(_top_level_imports(ast.parse(path.read_text()), name))
    return frozenset(seen)


def _external(module: str) -> set[str]:
    return {name.split(".")[0] for name in _imports(module)} - {PACKAGE}


@pytest.mark.parametrize("module", MODULES)
def test_module_respects_its_layer(module):
    external = _external(module)
    if module in PURE:
        assert not external & {"torch", "torchvision", *LIGHTNING_PACKAGES} and LIGHTNING_IMPORT not in _imports(module), (
            f"{module} must stay pure Python, imports {sorted(external)}"
        )
    if module not in LIGHTNING_LAYER:
        lightning = {LIGHTNING_IMPORT, *(f"{PACKAGE}.{name}" for name in ("callback", "module", "cli.commands"))} & _imports(module)
        assert not external & LIGHTNING_PACKAGES and not lightning, (
            f"{module} is below the Lightning layer but imports Lightning"
        )
    assert "pytorchvideo" not in external, f"{module} imports pytorchvideo at import time"


def test_the_static_reading_agrees_with_a_real_import():
    # The AST reading above must see what Python really does: check it on the two ends.
    code = (
        "import sys; import lightning_multigrid.schedule.build, lightning_multigrid.models, lightning_multigrid.data.sampler; "
        "print(sorted(m for m in ('torch', 'pytorch_lightning', 'lightning', 'pytorchvideo') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "['torch']"
    code = "import sys; import lightning_multigrid.data.sampler; print('lightning_multigrid.schedule.build' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
    assert "torch" in _external(f"{PACKAGE}.data.sampler")
    assert LIGHTNING_IMPORT in _imports(f"{PACKAGE}.callback")


def test_the_data_pipeline_does_not_load_the_model_zoo():
    # It needs the one [slow, fast] split from models/, not the backbones: torchvision's model zoo
    # costs about a second of start-up in every tool and every spawned DataLoader worker.
    code = "import sys, lightning_multigrid.data; print('torchvision.models' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize("module", sorted(WITHOUT_SCHEDULE))
def test_the_data_pipeline_does_not_import_the_schedule(module):
    imported = sorted(SCHEDULE_MODULES & _imports(module))
    assert not imported, f"{module} imports the schedule's {imported}; it needs grid.py only"


@pytest.mark.parametrize("module", [f"{PACKAGE}.data.loaders", f"{PACKAGE}.data.transfer"])
def test_loader_building_and_device_transforms_are_below_the_lightning_layer(module):
    assert module not in LIGHTNING_LAYER
    assert not _external(module) & LIGHTNING_PACKAGES and LIGHTNING_IMPORT not in _imports(module)


def test_only_one_module_imports_lightning():
    # Either Lightning package, whichever the process uses, comes from `_lightning`: an import of
    # one of them anywhere else (even inside a function) would tie that module to one package.
    direct = {
        module for module in MODULES if module != LIGHTNING_IMPORT
        if {name.split(".")[0] for name in _imported_anywhere(ast.parse(_source(module)), module)} & LIGHTNING_PACKAGES
    }
    assert not direct, f"{sorted(direct)} import Lightning; take it from {LIGHTNING_IMPORT}"
    assert _imported_anywhere(ast.parse("import pytorch_lightning\ndef f():\n    import lightning.pytorch\n"), PACKAGE) == {
        "pytorch_lightning", "lightning.pytorch"
    }


def _imported_anywhere(tree: ast.Module, module: str) -> set[str]:
    """Modules ``module`` imports at import time or inside its functions (not under ``TYPE_CHECKING``)."""
    typing_only = {
        id(inner) for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for statement in node.body for inner in ast.walk(statement)
    }
    imports: list[ast.stmt] = [
        node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in typing_only
    ]
    return _top_level_imports(ast.Module(body=imports, type_ignores=[]), module)


def _source(module: str) -> str:
    path = _path_of(module)
    assert path is not None
    return path.read_text()


def _import_graph() -> dict[str, set[str]]:
    """Each package module -> the package modules it imports directly, at import time or deferred."""
    known = set(MODULES)
    graph = {}
    for module in MODULES:
        path = _path_of(module)
        assert path is not None
        graph[module] = {m for m in _imported_anywhere(ast.parse(path.read_text()), module) if m in known} - {module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The circles of ``graph``: each set of modules that reach one another through imports."""
    reach = {node: _reachable(graph, node) for node in graph}
    return {frozenset({node} | {o for o in reach[node] if node in reach[o]}) for node in graph if node in reach[node]}


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    stack = [start]
    while stack:
        for target in graph[stack.pop()] - seen:
            seen.add(target)
            stack.append(target)
    return seen


def test_no_import_cycles():
    cycles = _cycles(_import_graph())
    assert not cycles, f"import cycles: {[sorted(c) for c in cycles]}"


def test_the_cycle_finder_finds_circles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": set()}
    assert _cycles(graph) == {frozenset({"a", "b", "c"}), frozenset({"d", "e"})}
    tree = ast.parse("import os\nif TYPE_CHECKING:\n    import json\ndef f():\n    import csv\n")
    assert _imported_anywhere(tree, f"{PACKAGE}.x") == {"os", "csv"}


# The data folder's rooms import one way: the store's format and reader are built on the manifests and
# the decoders, so neither of those imports the store (what needs all three, the manifest dispatch and
# ReaderSettings, lives above them in `data/`).
STORE = f"{PACKAGE}.data.store"
BELOW_THE_STORE = [m for m in MODULES if m.startswith((f"{PACKAGE}.data.decoding", f"{PACKAGE}.data.manifests"))]


@pytest.mark.parametrize("module", BELOW_THE_STORE)
def test_the_decoders_and_the_manifests_do_not_import_the_store(module):
    tree = ast.parse(_source(module))
    # Every import statement, also inside functions and under `if TYPE_CHECKING`.
    imported = _top_level_imports(
        ast.Module(body=[n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))], type_ignores=[]),
        module,
    )
    upward = sorted(name for name in imported if name == STORE or name.startswith(f"{STORE}."))
    assert not upward, f"{module} imports {upward}: the store imports {module.rsplit('.', 1)[0]}, not the other way"


def test_importing_the_decoders_and_the_manifests_loads_no_module_of_the_store():
    # What the static reading cannot see: a name looked up by module name (the old paths of ReaderSettings
    # and load_manifest) must not load the store either until it is used.
    code = (
        f"import importlib, sys; [importlib.import_module(m) for m in {BELOW_THE_STORE!r}]; "
        f"print(sorted(m for m in sys.modules if m == {STORE!r} or m.startswith({STORE + '.'!r})))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
    assert len(BELOW_THE_STORE) > 10  # both rooms found


def test_only_the_callback_changes_trainer_settings():
    # docs/architecture.md: the callback is the one class that changes the Trainer's settings (and
    # restores them); every such change goes through `_internals.setting_owner`.
    callers = set()
    for module in MODULES:
        path = _path_of(module)
        assert path is not None
        tree = ast.parse(path.read_text())
        if any(
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setting_owner"
            for node in ast.walk(tree)
        ):
            callers.add(module)
    assert callers == {f"{PACKAGE}.callback"}
