"""Either Lightning package: the unified ``lightning`` (``lightning.pytorch``) or ``pytorch_lightning``.

The package lightning_multigrid uses is chosen once per process (``lightning_multigrid/_lightning.py``),
so the fits run in their own processes (``tests/lightning_package_fit.py``): a user's Trainer of each
package with the callback, the DataModule, ``VideoClassifier``, the BatchNorm-sync plugin and the
command line, with the other package importable and not.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

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
        pytest.skip(f"needs {sorted(needed - INSTALLED)} installed (lightning >= 2.6 installs both)")
    outcome = _fit(package, only, synthetic_dataset, tmp_path)
    assert outcome["chosen"] == package
    assert outcome["steps"] == 9  # 2 baseline epochs of 8 clips at batch 2 -> 3 multigrid epochs, 9 steps
    if only:
        assert outcome["loaded"] == [package]
    assert (tmp_path / "lightning_logs" / "version_0" / "metrics.csv").exists()  # the command line's run


@pytest.mark.skipif(len(INSTALLED) < 2, reason="needs both Lightning packages (lightning >= 2.6 installs both)")
def test_the_callback_works_with_a_trainer_of_the_other_package(synthetic_dataset):
    # A user of the other package, with their own LightningModule and DataModule (which keeps ours
    # inside): Lightning calls a callback's hooks whatever its class, and the callback reads the
    # Trainer only through attributes both packages share.
    import torch
    from torch import nn

    from lightning_multigrid import MultigridCallback, MultigridVideoDataModule

    other = importlib.import_module("pytorch_lightning" if pl.__name__ == "lightning.pytorch" else "lightning.pytorch")
    data = synthetic_dataset
    inner = MultigridVideoDataModule(
        train_manifest=str(data.train_manifest), val_manifest=str(data.val_manifest), root_dir=str(data.root),
        batch_size=2, num_frames=4, crop_size=32, sampling_rate=2, num_workers=0,
    )

    class UsersNet(other.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(
                nn.Conv3d(3, 4, 3, padding=1), nn.BatchNorm3d(4), nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(4, 4)
            )
            self.shapes = []

        def forward(self, video):
            return self.net(video)

        def training_step(self, batch, batch_idx):
            self.shapes.append(tuple(batch["video"].shape))
            return nn.functional.cross_entropy(self(batch["video"]), batch["label"])

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            return [optimizer], [torch.optim.lr_scheduler.MultiStepLR(optimizer, [1])]

    callback = MultigridCallback(precise_bn_batches=0)
    assert not isinstance(callback, other.Callback)
    model = UsersNet()
    trainer = other.Trainer(
        max_epochs=2, callbacks=[callback], logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    trainer.fit(model, datamodule=users_datamodule(other, inner))
    assert callback.schedule is not None and trainer.current_epoch == callback.schedule.max_epochs
    assert len({shape[2:] for shape in model.shapes}) > 1  # the grids changed: the schedule was served


# ---------------------------------------------------------------------------- issue 41, item 4

BOTH = pytest.mark.skipif(len(INSTALLED) < 2, reason="needs both Lightning packages (lightning >= 2.6 installs both)")


def users_datamodule(other, inner):
    """A user's DataModule of the ``other`` package that serves through ``inner`` (ours)."""

    class UsersData(other.LightningDataModule):
        base_shape = property(lambda self: inner.base_shape)
        clip_sampling = property(lambda self: inner.clip_sampling)

        def serve(self, plan):
            inner.serve(plan)

        def setup(self, stage):
            inner.setup(stage)

        def train_dataloader(self):
            return inner.train_dataloader()

        def on_after_batch_transfer(self, batch, dataloader_idx):
            return inner.on_after_batch_transfer(batch, dataloader_idx)

    return UsersData()


def _other_package():
    return importlib.import_module("pytorch_lightning" if pl.__name__ == "lightning.pytorch" else "lightning.pytorch")


@BOTH
def test_a_module_of_the_other_package_without_forward_skips_the_preflight(synthetic_dataset):
    """The preflight compared `forward` with the chosen package's LightningModule only, and called it."""
    import torch
    from torch import nn

    from lightning_multigrid import MultigridCallback, MultigridVideoDataModule

    other = _other_package()
    data = synthetic_dataset
    inner = MultigridVideoDataModule(
        train_manifest=str(data.train_manifest), root_dir=str(data.root), batch_size=2, num_frames=4, crop_size=32,
        sampling_rate=2, num_workers=0,
    )

    class NoForward(other.LightningModule):  # training_step calls its layers itself
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Conv3d(3, 4, 3, padding=1), nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(4, 4))

        def training_step(self, batch, batch_idx):
            return nn.functional.cross_entropy(self.net(batch["video"]), batch["label"])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    callback = MultigridCallback(precise_bn_batches=0)  # preflight on (the default)
    trainer = other.Trainer(max_epochs=2, callbacks=[callback], logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(NoForward(), datamodule=users_datamodule(other, inner))
    assert callback.schedule is not None and trainer.current_epoch == callback.schedule.max_epochs


@BOTH
@pytest.mark.slow
def test_sync_batchnorm_is_refused_under_ddp_with_the_other_packages_trainer(synthetic_dataset, tmp_path):
    """The refusal checked the chosen package's TorchSyncBatchNorm only; torch failed later ("SyncBatchNorm layers
    only work with GPU modules"), and on GPUs the BatchNorm plan would have been replaced without a word."""
    from conftest import run_ddp_script

    script = Path(__file__).with_name("ddp_other_package.py")
    run_ddp_script([str(script), str(tmp_path), str(synthetic_dataset.root), str(synthetic_dataset.train_manifest)],
                   cwd=tmp_path, timeout_s=240)
    outcome = (tmp_path / "rank0.txt").read_text()
    assert outcome.startswith("ValueError: `Trainer(sync_batchnorm=True)` replaces every BatchNorm"), outcome


def _run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}  # neither package imported: the default rule
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    return subprocess.run([sys.executable, "-m", "lightning_multigrid.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


@BOTH
@pytest.mark.slow
def test_a_config_naming_lightning_pytorch_classes_fits(synthetic_dataset, tmp_path):
    """`lightning.pytorch.callbacks.ModelSummary`, as Lightning's docs write it, exited 2 ("does not correspond to a
    subclass of Callback") unless `LIGHTNING_MULTIGRID_PACKAGE=lightning` was set."""
    data = synthetic_dataset
    config = tmp_path / "config.yaml"
    config.write_text(
        "# pytorch_lightning users write pytorch_lightning.callbacks...: a comment names no class\n"
        "trainer:\n  max_epochs: 2\n  limit_val_batches: 1\n  enable_progress_bar: false\n"
        f"  default_root_dir: {tmp_path}\n"
        "  callbacks:\n    - class_path: lightning.pytorch.callbacks.ModelSummary\n      init_args:\n        max_depth: 1\n"
        "model:\n  num_classes: 4\n  backbone: tiny\n  tiny_width: 4\n  milestones: [1]\n"
        f"data:\n  train_manifest: {data.train_manifest}\n  val_manifest: {data.val_manifest}\n  root_dir: {data.root}\n"
        "  batch_size: 2\n  num_frames: 4\n  crop_size: 32\n  sampling_rate: 2\n  num_workers: 0\n"
    )
    result = _run_cli(["fit", "--config", str(config)], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "lightning_logs" / "version_0" / "metrics.csv").exists()


@BOTH
def test_a_config_naming_both_packages_or_another_than_the_process_uses_is_one_line(tmp_path, capsys):
    from lightning_multigrid.cli.commands import main

    config = tmp_path / "config.yaml"
    config.write_text("trainer:\n  callbacks:\n    - class_path: lightning.pytorch.callbacks.ModelSummary\n")
    with pytest.raises(SystemExit) as both:
        main(["fit", "--config", str(config), "--trainer.logger=pytorch_lightning.loggers.CSVLogger"])
    assert both.value.code == 2
    assert capsys.readouterr().err == (
        "lightning-multigrid fit: error: the configuration names classes of both Lightning packages "
        "(`lightning.pytorch.` and `pytorch_lightning.`), and a Trainer of one refuses the other's: write them all "
        "from one package.\n"
    )
    other = _other_package().__name__  # this process already uses `pl`'s package
    config.write_text(f"trainer:\n  callbacks:\n    - class_path: {other}.callbacks.ModelSummary\n")
    with pytest.raises(SystemExit) as mismatch:
        main(["fit", f"--config={config}"])
    assert mismatch.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"names `{other}.` classes, but this process uses" in err
    assert f"`{ENV_VAR}=" in err and f"write the classes as `{pl.__name__}.`" in err


@BOTH
def test_importing_lightning_multigrid_first_then_lightning_is_refused_at_once_naming_the_fix(synthetic_dataset, tmp_path):
    """`ValueError: Expected a parent` from inside Lightning: the DataModule was built for the package chosen
    before the user imported theirs."""
    data = synthetic_dataset
    script = (
        "from lightning_multigrid import MultigridVideoDataModule\n"
        "import lightning as L\n"
        "import torch\n"
        "class Net(L.LightningModule):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.layer = torch.nn.Linear(1, 1)\n"
        "    def training_step(self, batch, batch_idx):\n"
        "        return self.layer(batch['video'].float().mean((1, 2, 3, 4))[:, None]).sum()\n"
        "    def configure_optimizers(self):\n"
        "        return torch.optim.SGD(self.parameters(), lr=0.1)\n"
        f"dm = MultigridVideoDataModule(train_manifest={str(data.train_manifest)!r}, root_dir={str(data.root)!r},"
        " batch_size=2, num_frames=4, crop_size=32, num_workers=0)\n"
        "L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False).fit(Net(), datamodule=dm)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, env=env,
                            timeout=300)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last == (
        "TypeError: MultigridVideoDataModule is a `pytorch_lightning` class and the Trainer is `lightning.pytorch`'s: a "
        "Trainer takes only its own package's modules. lightning_multigrid uses `pytorch_lightning` in this process, "
        "chosen by the package installed (lightning_multigrid was imported before either, or after both). Import "
        "`lightning` before "
        "lightning_multigrid (e.g. `import lightning.pytorch as pl` first), or set "
        "`LIGHTNING_MULTIGRID_PACKAGE=lightning` in the environment; or use `pytorch_lightning.Trainer`."
    ), result.stderr[-2000:]
    # Said first when the DataModule was built, before any Trainer:
    assert "`lightning.pytorch` was imported after lightning_multigrid, which uses `pytorch_lightning`" in result.stderr
