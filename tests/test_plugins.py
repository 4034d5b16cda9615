"""MultigridBatchNormSync: the Lightning LayerSync plugin, and the sync_batchnorm guard."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
from lightning_fabric.utilities.exceptions import MisconfigurationException
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_multigrid.norm import MultigridBatchNorm, apply_bn_plan
from lightning_multigrid.plugins import MultigridBatchNormSync, check_no_torch_sync_batchnorm
from lightning_multigrid.schedule import BNPlan


class TinyVideoModel(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv3d(3, 4, 1)
        self.norm = nn.BatchNorm3d(4)
        self.head = nn.Sequential(nn.Linear(4, 2), nn.BatchNorm1d(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.conv(x)).mean((2, 3, 4)))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        video, label = batch
        return nn.functional.cross_entropy(self(video), label)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(0)
        videos = torch.randn(16, 3, 2, 4, 4, generator=generator)
        labels = torch.randint(0, 2, (16,), generator=generator)
        return DataLoader(TensorDataset(videos, labels), batch_size=4)


def test_apply_and_revert() -> None:
    model = TinyVideoModel()
    weight, running_mean = model.norm.weight, model.norm.running_mean
    plugin = MultigridBatchNormSync(exclude=["head"])
    assert plugin.apply(model) is model
    assert isinstance(model.norm, MultigridBatchNorm) and model.norm.weight is weight
    assert type(model.head[1]) is nn.BatchNorm1d  # excluded
    assert plugin.revert(model) is model
    assert type(model.norm) is nn.BatchNorm3d and model.norm.running_mean is running_mean


def test_sync_batchnorm_true_with_the_plugin_is_refused() -> None:
    # Lightning itself refuses two layer-sync plugins, naming both settings.
    with pytest.raises(MisconfigurationException, match=r"sync_batchnorm=True.*MultigridBatchNormSync"):
        pl.Trainer(
            plugins=[MultigridBatchNormSync()], sync_batchnorm=True, strategy="ddp", accelerator="cpu",
            devices=2, logger=False, enable_checkpointing=False,
        )


def test_check_no_torch_sync_batchnorm() -> None:
    trainer = pl.Trainer(sync_batchnorm=True, strategy="ddp", accelerator="cpu", devices=2, logger=False)
    with pytest.raises(ValueError, match=r"Remove `sync_batchnorm=True`.*MultigridBatchNormSync"):
        check_no_torch_sync_batchnorm(trainer)
    check_no_torch_sync_batchnorm(
        pl.Trainer(plugins=[MultigridBatchNormSync()], strategy="ddp", accelerator="cpu", devices=2, logger=False)
    )
    # On one device Lightning ignores sync_batchnorm, so there is nothing to refuse.
    check_no_torch_sync_batchnorm(pl.Trainer(sync_batchnorm=True, accelerator="cpu", devices=1, logger=False))


class _SyncAndCheck(pl.Callback):
    """Runs inside each DDP worker: sets sync over both ranks and checks the statistics agree."""

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        assert isinstance(pl_module.norm, MultigridBatchNorm)  # installed by the plugin
        assert apply_bn_plan(pl_module, BNPlan("sync", group_size=2)) == 2

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for layer in (pl_module.norm, pl_module.head[1]):
            gathered = trainer.strategy.all_gather(layer.running_var)
            assert torch.equal(gathered[0], gathered[1])
        assert pl_module.norm.num_batches_tracked.item() == 2  # 16 clips / (4 per rank x 2 ranks)


@pytest.mark.skipif("fork" not in torch.multiprocessing.get_all_start_methods(), reason="needs fork (POSIX)")
def test_ddp_fit_with_the_plugin(tmp_path: object) -> None:
    model = TinyVideoModel()
    trainer = pl.Trainer(
        plugins=[MultigridBatchNormSync()], strategy="ddp_fork", accelerator="cpu", devices=2,
        max_epochs=1, callbacks=[_SyncAndCheck()], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path),
    )
    trainer.fit(model)
    # The workers reverted the layers before handing the trained weights back.
    assert type(model.norm) is nn.BatchNorm3d
    assert model.norm.num_batches_tracked.item() == 2
