"""The multigrid options as one value: each default written once (config.DEFAULTS), read everywhere else."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

from lightning_multigrid.callback import MultigridCallback
from lightning_multigrid.cli.schedule import add_schedule_arguments, schedule_options
from lightning_multigrid.schedule.config import DEFAULT_SHORT_RUN, DEFAULTS, MultigridOptions, ShortRun

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_multigrid"
OPTION_NAMES = {f.name for f in dataclasses.fields(MultigridOptions)}
# The short-run mode's settings, flat as the `schedule` command and old checkpoints name them.
SHORT_RUN_NAMES = {f"short_run_{f.name}" for f in dataclasses.fields(ShortRun)} | {f.name for f in dataclasses.fields(ShortRun)}
NAMES = OPTION_NAMES | SHORT_RUN_NAMES


def test_the_callback_signature_reads_its_defaults_from_the_options():
    parameters = inspect.signature(MultigridCallback).parameters
    for name in OPTION_NAMES & set(parameters):
        default = parameters[name].default
        if default is not None or name == "short_run":  # None: the options' own default (the factors)
            assert default == getattr(DEFAULTS, name), name
    assert MultigridCallback().options == DEFAULTS


def test_the_schedule_command_reads_its_defaults_from_the_options():
    parser = argparse.ArgumentParser()
    add_schedule_arguments(parser)
    args = parser.parse_args("--batch-size 8 --num-frames 8 --crop-size 64 --max-epochs 10".split())
    assert schedule_options(args) == DEFAULTS
    assert (args.short_run_coarse_share, args.short_run_max_lr_factor) == dataclasses.astuple(DEFAULT_SHORT_RUN)
    assert "(1.5)" in parser.format_help()  # `%(default)s` shows the options' default


def _written_defaults(source: str) -> list[tuple[int, str]]:
    """Where ``source`` writes a literal default for a multigrid option: a parameter default, a
    class field, an argparse ``default=`` of the option's flag, or the option passed as a literal
    keyword (``MultigridOptions(epoch_factor=1.5)``). ``None`` is not a value: "not given"."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += _parameter_defaults(node.args)
        elif isinstance(node, ast.ClassDef):
            found += [
                (item.lineno, item.target.id) for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.target.id in NAMES
                and item.value is not None and _is_literal(item.value)
            ]
        elif isinstance(node, ast.Call):
            found += _keyword_defaults(node)
    return found


def _parameter_defaults(arguments: ast.arguments) -> list[tuple[int, str]]:
    positional = [*arguments.posonlyargs, *arguments.args]
    pairs = list(zip(positional[len(positional) - len(arguments.defaults):], arguments.defaults))
    pairs += [(a, d) for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults) if d is not None]
    return [(d.lineno, a.arg) for a, d in pairs if a.arg in NAMES and _is_literal(d)]


def _keyword_defaults(call: ast.Call) -> list[tuple[int, str]]:
    flag = next((a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)), "")
    dest = flag.lstrip("-").replace("-", "_")  # argparse's name of a `--flag`
    found = []
    for keyword in call.keywords:
        if keyword.arg == "default" and dest in NAMES and _is_literal(keyword.value):
            found.append((keyword.value.lineno, dest))
        elif keyword.arg in NAMES and _is_literal(keyword.value):
            found.append((keyword.value.lineno, keyword.arg))
    return found


def _is_literal(node: ast.expr) -> bool:
    """A value written out: a constant other than ``None``, or a tuple of them."""
    if isinstance(node, ast.Tuple):
        return all(_is_literal(e) for e in node.elts)
    return isinstance(node, ast.Constant) and node.value is not None


@pytest.mark.parametrize(
    "source",
    [
        "def f(epoch_factor=1.5): ...",
        "def f(*, bn_base_size: int = 8): ...",
        "class C:\n    full_grid_share: float = 0.0",
        "parser.add_argument('--short-run-coarse-share', type=float, default=0.5)",
        "MultigridOptions(long_cycle_factors=((0.5, 1.0), (1.0, 1.0)))",
    ],
)
def test_the_scan_sees_a_default_written_elsewhere(source):
    assert _written_defaults(source)


def test_no_module_but_config_writes_a_default():
    written = {
        f"{path.relative_to(PACKAGE.parent)}:{line} {name}"
        for path in sorted(PACKAGE.rglob("*.py")) if path.name != "config.py"
        for line, name in _written_defaults(path.read_text(encoding="utf-8"))
    }
    assert not written, f"multigrid option defaults written outside config.py: {sorted(written)}"
