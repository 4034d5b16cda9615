"""Either Lightning package: the unified ``lightning`` (``lightning.pytorch``) or ``pytorch_lightning``.

The package lightning_multigrid uses is chosen once per process (``lightning_multigrid/_lightning.py``),
so the fits run in their own processes (``tests/lightning_package_fit.py``): a user's Trainer of each
package with the callback, the DataModule, ``VideoClassifier``, the BatchNorm-sync plugin and the
command line, with the other package importable and not.
"""

from __future__ import annotations

import importlib
import json
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
    trainer.fit(model, datamodule=UsersData())
    assert callback.schedule is not None and trainer.current_epoch == callback.schedule.max_epochs
    assert len({shape[2:] for shape in model.shapes}) > 1  # the grids changed: the schedule was served
