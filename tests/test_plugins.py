"""MultigridBatchNormSync: the Lightning LayerSync plugin, and the sync_batchnorm guard."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from lightning_fabric.utilities.exceptions import MisconfigurationException
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_multigrid._lightning import pl
from lightning_multigrid.norm import MultigridBatchNorm
from lightning_multigrid.plugins import MultigridBatchNormSync, check_no_torch_sync_batchnorm

from conftest import run_ddp_script


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


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # jsonargparse, from inside LightningCLI
def test_lightning_cli_config_installs_the_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_multigrid._lightning import LightningCLI

    monkeypatch.setattr(sys, "argv", ["lightning-multigrid"])  # not pytest's arguments

    plugin = {"class_path": "lightning_multigrid.plugins.MultigridBatchNormSync", "init_args": {"exclude": ["head"]}}
    cli = LightningCLI(
        TinyVideoModel, run=False, seed_everything_default=False,
        args={"trainer": {"plugins": [plugin], "strategy": "ddp", "accelerator": "cpu", "devices": 2, "logger": False}},
    )
    layer_sync = cli.trainer.strategy._layer_sync  # what the DDP strategy will apply in setup
    assert isinstance(layer_sync, MultigridBatchNormSync) and layer_sync.exclude == ["head"]


# A real 2-process DDP fit, run as a script: Lightning's ``strategy="ddp"`` re-launches the running
# script for rank 1, which cannot work from inside pytest. (Not ddp_spawn/forkserver: they pickle
# the model into shared memory, so on CPU both ranks would update the same tensors; not ddp_fork:
# a process group another test left in the pytest process would be inherited.)
_DDP_SCRIPT = textwrap.dedent(
    """
    import json
    import sys

    from lightning_multigrid._lightning import pl
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from lightning_multigrid.norm import MultigridBatchNorm, apply_bn_plan
    from lightning_multigrid.plugins import MultigridBatchNormSync
    from lightning_multigrid.schedule import BNPlan


    class TinyVideoModel(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv3d(3, 4, 1)
            self.norm = nn.BatchNorm3d(4)
            self.head = nn.Sequential(nn.Linear(4, 2), nn.BatchNorm1d(2))

        def forward(self, x):
            return self.head(self.norm(self.conv(x)).mean((2, 3, 4)))

        def training_step(self, batch, batch_idx):
            return nn.functional.cross_entropy(self(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            generator = torch.Generator().manual_seed(0)
            videos = torch.randn(16, 3, 2, 4, 4, generator=generator)
            labels = torch.randint(0, 2, (16,), generator=generator)
            return DataLoader(TensorDataset(videos, labels), batch_size=4)


    class Record(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            self.converted = isinstance(pl_module.norm, MultigridBatchNorm)  # by the plugin
            self.configured = apply_bn_plan(pl_module, BNPlan("sync", group_size=2))
            self.modes = [pl_module.norm.mode, pl_module.head[1].mode]

        def on_train_end(self, trainer, pl_module):
            result = {
                "world_size": trainer.world_size, "converted": self.converted,
                "configured": self.configured, "modes": self.modes,
                "steps": pl_module.norm.num_batches_tracked.item(),
                "running_var": pl_module.norm.running_var.tolist(),
                "head_running_var": pl_module.head[1].running_var.tolist(),
            }
            with open(f"{sys.argv[1]}/rank{trainer.global_rank}.json", "w") as file:
                json.dump(result, file)


    if __name__ == "__main__":
        torch.set_num_threads(1)
        model = TinyVideoModel()
        trainer = pl.Trainer(
            plugins=[MultigridBatchNormSync()], strategy="ddp", accelerator="cpu", devices=2,
            max_epochs=1, callbacks=[Record()], logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, default_root_dir=sys.argv[1],
        )
        trainer.fit(model)
        if trainer.global_rank == 0:
            # The strategy reverted the layers at the end of fit.
            assert type(model.norm) is nn.BatchNorm3d, type(model.norm)
    """
)
TIMEOUT_S = 180


@pytest.mark.skipif(sys.platform == "win32", reason="process groups (os.killpg) are POSIX")
def test_ddp_fit_with_the_plugin(tmp_path: Path) -> None:
    script = tmp_path / "plugin_ddp_fit.py"
    script.write_text(_DDP_SCRIPT)
    run_ddp_script([str(script), str(tmp_path)], cwd=tmp_path, timeout_s=TIMEOUT_S)
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    for rank in ranks:
        assert rank["world_size"] == 2 and rank["converted"] and rank["configured"] == 2
        assert rank["modes"] == ["sync", "sync"]
        assert rank["steps"] == 2  # 16 clips / (4 per rank x 2 ranks)
    # Statistics synced over both ranks: identical running statistics, bit for bit.
    assert ranks[0]["running_var"] == ranks[1]["running_var"]
    assert ranks[0]["head_running_var"] == ranks[1]["head_running_var"]
