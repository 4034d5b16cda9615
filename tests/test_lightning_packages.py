"""Either Lightning package: the unified ``lightning`` (``lightning.pytorch``) or ``pytorch_lightning``.

The package lightning_multigrid uses is chosen once per process (``lightning_multigrid/_lightning.py``),
so the fits run in their own processes (``tests/lightning_package_fit.py``): a user's Trainer of each
package with the callback, the DataModule, ``VideoClassifier``, the BatchNorm-sync plugin and the
command line, with the other package importable and not.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from lightning_multigrid import _lightning
from lightning_multigrid._lightning import ENV_VAR, choose_package, pl

SCRIPT = Path(__file__).with_name("lightning_package_fit.py")
INSTALLED = {name for name in ("lightning", "pytorch_lightning") if find_spec(name) is not None}


@pytest.mark.parametrize(
    ("environ", "imported", "expected"),
    [
        ({ENV_VAR: "pytorch_lightning"}, {"lightning"}, "pytorch_lightning"),  # the variable wins
        ({ENV_VAR: "lightning"}, {"pytorch_lightning"}, "lightning"),
        ({}, {"lightning", "torch"}, "lightning"),  # the user imported one first
        ({}, {"pytorch_lightning"}, "pytorch_lightning"),
    ],
)
def test_the_package_follows_the_variable_then_the_users_import(environ, imported, expected):
    assert choose_package(environ, imported) == expected


def test_with_neither_imported_an_installed_one():
    chosen = choose_package({}, set())
    assert chosen in INSTALLED
    assert chosen == ("pytorch_lightning" if INSTALLED == {"lightning", "pytorch_lightning"} else next(iter(INSTALLED)))


def test_another_value_of_the_variable_is_refused():
    with pytest.raises(ValueError, match=f"`{ENV_VAR}` must be 'lightning' or 'pytorch_lightning', got 'lightning.pytorch'"):
        choose_package({ENV_VAR: "lightning.pytorch"}, set())


def test_a_trainer_of_the_other_package_is_refused_with_the_fix():
    _lightning.check_trainer(pl.Trainer(logger=False), "MultigridCallback")
    with pytest.raises(TypeError, match=rf"uses `{pl.__name__}` in this process.*{ENV_VAR}="):
        _lightning.check_trainer(object(), "MultigridCallback")


def _fit(package: str, only: bool, synthetic_dataset, tmp_path: Path) -> dict[str, object]:
    data = synthetic_dataset
    args = [package, "1" if only else "0", str(data.root), str(data.train_manifest), str(data.val_manifest), str(tmp_path)]
    result = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("package", "only"),
    [("lightning", True), ("pytorch_lightning", True), ("lightning", False)],
    ids=["lightning-alone", "pytorch_lightning-alone", "lightning-beside-pytorch_lightning"],
)
def test_a_users_trainer_of_either_package_fits(package, only, synthetic_dataset, tmp_path):
    # "beside": both installed, the user imports `lightning` first; with neither imported the choice
    # would be pytorch_lightning, so this case shows the user's import decides.
    needed = {package} if only else {"lightning", "pytorch_lightning"}
    if not needed <= INSTALLED:
        pytest.skip(f"needs {sorted(needed - INSTALLED)} installed (.ci/run installs both)")
    outcome = _fit(package, only, synthetic_dataset, tmp_path)
    assert outcome["chosen"] == package
    assert outcome["steps"] == 9  # 2 baseline epochs of 8 clips at batch 2 -> 3 multigrid epochs, 9 steps
    if only:
        assert outcome["loaded"] == [package]
    assert (tmp_path / "lightning_logs" / "version_0" / "metrics.csv").exists()  # the command line's run
