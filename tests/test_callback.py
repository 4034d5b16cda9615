"""MultigridCallback on a real Trainer fitting a tiny 3D CNN on real H.264 videos.

Every step records the (batch, frames, crop) the model saw, the LR the optimizer used and the
BatchNorm grouping; all must equal what the schedule says.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR, MultiStepLR, OneCycleLR, ReduceLROnPlateau

from lightning_multigrid._lightning import pl
from lightning_multigrid.callback import MultigridCallback
from lightning_multigrid.data.datamodule import MultigridVideoDataModule
from lightning_multigrid.data.synthetic import SyntheticDataset
from lightning_multigrid.fit.precise_bn import update_bn_stats
from lightning_multigrid.norm import MultigridBatchNorm
from lightning_multigrid.schedule.config import ShortRun

BASE: dict[str, Any] = dict(batch_size=1, num_frames=8, crop_size=32, sampling_rate=2)
BASE_LR = 0.1
MAX_EPOCHS, MILESTONES = 4, [2]


@pytest.fixture(scope="module")
def train_manifest(synthetic_dataset: SyntheticDataset, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 16 training videos listed twice: 32 clips, enough for several short cycles per epoch."""
    lines = synthetic_dataset.train_manifest.read_text().splitlines()
    path = tmp_path_factory.mktemp("manifest") / "train.csv"
    path.write_text("\n".join(lines * 2) + "\n")
    return path


def make_datamodule(data: SyntheticDataset, train_manifest: Path, **overrides: Any) -> MultigridVideoDataModule:
    kwargs: dict[str, Any] = dict(
        train_manifest=str(train_manifest),
        val_manifest=str(data.val_manifest),
        root_dir=str(data.root),
        num_workers=0,
        flip=False,
        seed=1,
        **BASE,
    )
    kwargs.update(overrides)
    return MultigridVideoDataModule(**kwargs)


class RecordingNet(pl.LightningModule):
    """A tiny 3D CNN with BatchNorm; records the grid, LR and BN grouping of every step."""

    def __init__(self, lr_schedule: str = "multistep") -> None:
        super().__init__()
        self.lr_schedule = lr_schedule
        self.net = nn.Sequential(
            nn.Conv3d(3, 4, 3, padding=1), nn.BatchNorm3d(4), nn.ReLU(),
            nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(4, 4),
        )
        self.steps: list[dict[str, Any]] = []
        self.lrs: list[float] = []

    def forward(self, video: torch.Tensor) -> torch.Tensor:
        return self.net(video)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        video = batch["video"]
        bn = self.net[1]
        self.steps.append({
            "epoch": self.current_epoch,
            "batch_idx": batch_idx,
            "shape": tuple(video.shape),
            "bn": (bn.mode, bn.num_splits) if isinstance(bn, MultigridBatchNorm) else None,
            "lr": self.lrs[-1],
        })
        return nn.functional.cross_entropy(self(video), batch["label"])

    def on_train_start(self) -> None:
        # Registered after the callback's pre-hook, so it sees the LR the step really uses. The
        # step's training_step runs later, inside the optimizer's closure.
        optimizer = self.trainer.optimizers[0]
        optimizer.register_step_pre_hook(lambda opt, args, kwargs: self.lrs.append(opt.param_groups[0]["lr"]))

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.log("val_loss", nn.functional.cross_entropy(self(batch["video"]), batch["label"]), batch_size=len(batch["label"]))

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=BASE_LR, momentum=0.9)
        if self.lr_schedule == "multistep":
            return {"optimizer": optimizer, "lr_scheduler": MultiStepLR(optimizer, MILESTONES, gamma=0.1)}
        if self.lr_schedule == "warmup_cosine":
            # Per step: linear warm-up over `warmup` baseline steps, then cosine to 0.
            total = int(self.trainer.estimated_stepping_batches)
            scheduler = LambdaLR(optimizer, lambda step: warmup_cosine(step, total))
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
        if self.lr_schedule == "one_cycle":
            total = int(self.trainer.estimated_stepping_batches)
            scheduler = OneCycleLR(optimizer, max_lr=BASE_LR, total_steps=total)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
        if self.lr_schedule == "plateau":
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": ReduceLROnPlateau(optimizer), "monitor": "val_loss"}}
        raise ValueError(self.lr_schedule)


def warmup_cosine(step: int, total: int, warmup: int = 10) -> float:
    if step < warmup:
        return 0.1 + 0.9 * step / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))


def fit(
    model: pl.LightningModule, datamodule: MultigridVideoDataModule, callback: MultigridCallback, **trainer_args: Any
) -> pl.Trainer:
    pl.seed_everything(0, verbose=False)
    args: dict[str, Any] = dict(
        max_epochs=MAX_EPOCHS, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=1,
        deterministic=True,
    )
    args.update(trainer_args)
    trainer = pl.Trainer(callbacks=[callback], **args)
    trainer.fit(model, datamodule=datamodule)
    return trainer


CYCLES = {
    "long+short": {},
    "long only": {"short_cycle": False},
    "short only": {"long_cycle": False},
    # floor(0.5 * 4) = 2 coarse epochs split 1 : 2 : 4 -> 0, 1, 1: 4 x 23 px, 4 x 32 px, then 8 x 32 px,
    # the coarse ones at batch 1 * min(r, 2) = 2 with LR factor 2.
    "short run": {"short_run": ShortRun(max_lr_factor=2)},
}


@pytest.mark.parametrize(
    "cycles, lr_schedule",
    [(c, "multistep") for c in CYCLES] + [("long+short", "warmup_cosine"), ("long+short", "one_cycle")],
)
def test_every_step_follows_the_schedule(synthetic_dataset, train_manifest, cycles, lr_schedule):
    model = RecordingNet(lr_schedule)
    datamodule = make_datamodule(synthetic_dataset, train_manifest)
    callback = MultigridCallback(bn_base_size=2, precise_bn_batches=0, milestones=MILESTONES, **CYCLES[cycles])
    trainer = fit(model, datamodule, callback)
    schedule = callback.schedule
    assert schedule is not None
    assert trainer.current_epoch == schedule.max_epochs  # Lightning ran the multigrid epochs

    # Baseline: 32 clips in batches of 1 -> 32 steps per epoch.
    clips = baseline_steps_per_epoch = 32
    epochs_seen = sorted({s["epoch"] for s in model.steps})
    assert epochs_seen == list(range(schedule.max_epochs))
    for epoch in epochs_seen:
        steps = [s for s in model.steps if s["epoch"] == epoch]
        assert len(steps) == schedule.iterations_in_epoch(epoch, clips)
        stage = schedule.stage_at(epoch)
        for step in steps:
            grid = schedule.grid_at(epoch, step["batch_idx"])
            expected_batch = min(grid.batch_size, clips - sum(
                schedule.grid_at(epoch, i).batch_size for i in range(step["batch_idx"])))
            assert step["shape"] == (expected_batch, 3, grid.num_frames, grid.crop_size, grid.crop_size)
            # Short cycle only: the user's BatchNorm stays (not converted, as the reference).
            assert step["bn"] == (None if cycles == "short only" else (stage.bn.mode, stage.bn.num_splits))
            baseline_epoch = schedule.baseline_epoch_at(epoch + step["batch_idx"] / len(steps))
            if lr_schedule == "multistep":
                # The reference's relative LR (gamma^stage * r) times the base LR.
                expected_lr = BASE_LR * schedule.relative_lr_at(epoch)
            elif lr_schedule == "warmup_cosine":
                if model.steps.index(step) < WARMUP_END_STEP[cycles]:
                    continue  # the warm-up: test_warmup_runs_the_baseline_steps_from_the_unscaled_lr
                baseline_step = math.floor(baseline_epoch * baseline_steps_per_epoch + 1e-6)
                expected_lr = BASE_LR * warmup_cosine(baseline_step, MAX_EPOCHS * baseline_steps_per_epoch) * stage.lr_factor
            else:
                baseline_step = math.floor(baseline_epoch * baseline_steps_per_epoch + 1e-6)
                expected_lr = one_cycle_lr(baseline_step, MAX_EPOCHS * clips) * stage.lr_factor
            assert step["lr"] == pytest.approx(expected_lr, rel=1e-6), (epoch, step["batch_idx"])
    # The long cycle really varied the grid and the BN grouping (when on).
    if cycles == "short run":
        assert schedule.max_epochs == MAX_EPOCHS
        assert {(s["epoch"], s["shape"][0], s["shape"][2], s["shape"][3]) for s in model.steps} >= {
            (0, 2, 4, 23), (1, 2, 4, 32), (2, 1, 8, 32), (3, 1, 8, 32)}
    elif cycles != "short only":
        assert {s["shape"][2] for s in model.steps} == {2, 4, 8}
        assert {s["bn"][0] for s in model.steps} == {"split", "plain"}


# The first multigrid step after the warm-up: the baseline's 10 warm-up steps, as many multigrid steps
# (step 10 lands at 99.8% of it: the steps per epoch are estimated from the cycle's average batch).
WARMUP_END_STEP = {"long+short": 11}


def test_warmup_runs_the_baseline_steps_from_the_unscaled_lr(synthetic_dataset, train_manifest):
    """The reference's warm-up (start at the unscaled LR, end at the scaled one), over as many
    optimizer steps as the baseline's (10), not over its epochs (which pass in 2-3 steps at r = 8)."""
    model = RecordingNet("warmup_cosine")
    callback = MultigridCallback(bn_base_size=2, precise_bn_batches=0, milestones=MILESTONES)
    fit(model, make_datamodule(synthetic_dataset, train_manifest), callback)
    schedule = callback.schedule
    assert schedule is not None
    lrs = [s["lr"] for s in model.steps]
    assert lrs[0] == pytest.approx(0.1 * BASE_LR)  # the baseline's first LR, not r = 8 times it
    # The reference's formula, start + progress * (r * end - start), with progress counted in optimizer
    # steps over the baseline's 10 (the epochs here hold 3, 6 and 7 steps: the warm-up ends in epoch
    # 2, whose long-cycle grid has r = 2, so the LR peaks at 2 * BASE_LR there).
    start, end_factor = 0.1 * BASE_LR, schedule.stage_at(model.steps[10]["epoch"]).lr_factor
    assert end_factor == 2
    assert lrs[:10] == pytest.approx([start + k / 10 * (end_factor * BASE_LR - start) for k in range(10)], rel=1e-6)
    assert lrs[10] == pytest.approx(end_factor * BASE_LR, rel=0.01)


def one_cycle_lr(step: int, total: int) -> float:
    """OneCycleLR's LR after `step` steps, from a fresh scheduler (independent of the callback)."""
    optimizer = torch.optim.SGD([torch.zeros(1)], lr=BASE_LR, momentum=0.9)
    scheduler = OneCycleLR(optimizer, max_lr=BASE_LR, total_steps=total)
    for _ in range(min(step, total - 1)):
        optimizer.step()
        scheduler.step()
    return optimizer.param_groups[0]["lr"]


def test_summary_states_the_regime(synthetic_dataset, train_manifest, tmp_path, caplog):
    from lightning_multigrid.module import VideoClassifier

    path = tmp_path / "pretrained.pt"
    torch.save(VideoClassifier(num_classes=4, backbone="tiny", tiny_width=4).backbone.state_dict(), path)
    for weights, expected in ((None, "from scratch: BELOW the validated regime (128 baseline steps < 10000"),
                              (str(path), "fine-tuning from pretrained weights")):
        model = VideoClassifier(num_classes=4, backbone="tiny", tiny_width=4, weights=weights, milestones=MILESTONES)
        caplog.clear()
        with caplog.at_level("INFO"):
            fit(model, make_datamodule(synthetic_dataset, train_manifest), MultigridCallback(precise_bn_batches=0),
                limit_train_batches=1)
        # 32 clips in batches of 1 for 4 epochs: 128 baseline steps.
        assert "regime: 128 baseline optimizer steps per device" in caplog.text
        assert expected in caplog.text and "if from scratch" not in caplog.text


def test_milestones_read_from_the_users_scheduler(synthetic_dataset, train_manifest):
    model = RecordingNet("multistep")
    callback = MultigridCallback(precise_bn_batches=0)
    fit(model, make_datamodule(synthetic_dataset, train_manifest), callback, limit_train_batches=2)
    assert callback.schedule is not None
    assert callback.schedule.config.milestones == tuple(MILESTONES)
    assert callback.schedule.max_epochs == 6


def test_resume_ends_identical_to_an_uninterrupted_run(synthetic_dataset, train_manifest, tmp_path):
    def run(directory: Path, ckpt_path: str | None = None, stop_after: int | None = None) -> RecordingNet:
        pl.seed_everything(0, verbose=False)
        model = RecordingNet("multistep")
        callbacks: list[pl.Callback] = [
            MultigridCallback(bn_base_size=2, precise_bn_batches=0),
            pl.callbacks.ModelCheckpoint(dirpath=directory, save_last=True, save_top_k=0),
        ]
        if stop_after is not None:
            callbacks.append(StopAfter(stop_after))
        trainer = pl.Trainer(
            max_epochs=MAX_EPOCHS, accelerator="cpu", logger=False, enable_progress_bar=False,
            enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, deterministic=True,
            callbacks=callbacks,
        )
        trainer.fit(model, datamodule=make_datamodule(synthetic_dataset, train_manifest), ckpt_path=ckpt_path)
        return model

    uninterrupted = run(tmp_path / "uninterrupted")
    interrupted = run(tmp_path / "interrupted", stop_after=2)
    assert max(s["epoch"] for s in interrupted.steps) == 1
    resumed = run(tmp_path / "resumed", ckpt_path=str(tmp_path / "interrupted" / "last.ckpt"))
    assert min(s["epoch"] for s in resumed.steps) == 2
    # The resumed run saw exactly the steps the uninterrupted run saw from epoch 2 on.
    tail = [s for s in uninterrupted.steps if s["epoch"] >= 2]
    assert [(s["epoch"], s["shape"], s["lr"], s["bn"]) for s in resumed.steps] == [
        (s["epoch"], s["shape"], s["lr"], s["bn"]) for s in tail
    ]
    for name, value in uninterrupted.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], value, rtol=0, atol=0, msg=name)


class StopAfter(pl.Callback):
    def __init__(self, epochs: int) -> None:
        self.epochs = epochs

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.current_epoch + 1 >= self.epochs:
            trainer.should_stop = True


def test_refuses_sync_batchnorm(synthetic_dataset, train_manifest, monkeypatch):
    for name in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK"):
        monkeypatch.delenv(name, raising=False)  # undone after the test: Lightning sets them
    trainer = pl.Trainer(
        max_epochs=2, accelerator="cpu", devices=1, strategy="ddp", sync_batchnorm=True, logger=False,
        callbacks=[MultigridCallback()],
    )
    try:
        with pytest.raises(ValueError, match="Remove `sync_batchnorm=True`"):
            trainer.fit(RecordingNet(), datamodule=make_datamodule(synthetic_dataset, train_manifest))
    finally:
        # The DDP strategy set up a one-rank process group; forked workers of later tests must not inherit it.
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def test_refuses_reduce_on_plateau(synthetic_dataset, train_manifest):
    with pytest.raises(ValueError, match="ReduceLROnPlateau reacts to metrics"):
        fit(RecordingNet("plateau"), make_datamodule(synthetic_dataset, train_manifest), MultigridCallback())


def test_refuses_a_datamodule_without_grids():
    class PlainData(pl.LightningDataModule):
        def train_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(4, 3, 4, 8, 8)))

    with pytest.raises(ValueError, match="needs a DataModule that serves multigrid grids, got PlainData"):
        fit(RecordingNet(), PlainData(), MultigridCallback())


def test_preflight_fails_before_training(synthetic_dataset, train_manifest):
    class FixedHead(RecordingNet):
        def __init__(self) -> None:
            super().__init__()
            # Flattening a (4, 8, 32, 32) feature map only fits the base grid.
            self.net = nn.Sequential(nn.Conv3d(3, 4, 3, padding=1), nn.Flatten(), nn.Linear(4 * 8 * 32 * 32, 4))

    model = FixedHead()
    with pytest.raises(ValueError, match="net"):
        fit(model, make_datamodule(synthetic_dataset, train_manifest), MultigridCallback(milestones=MILESTONES))
    assert model.steps == []


def test_logs_grid_lr_and_skipped_videos(synthetic_dataset, train_manifest, tmp_path):
    logger = pl.loggers.CSVLogger(tmp_path)
    model = RecordingNet("multistep")
    fit(model, make_datamodule(synthetic_dataset, train_manifest), MultigridCallback(precise_bn_batches=0),
        logger=logger, log_every_n_steps=1, limit_train_batches=3)
    header = (Path(logger.log_dir) / "metrics.csv").read_text().splitlines()[0].split(",")
    for key in ("batch_size", "num_frames", "crop_size", "lr_factor", "lr", "bn_groups", "skipped_videos"):
        assert f"multigrid/{key}" in header


def test_precise_bn_recomputes_statistics_at_the_base_shape(synthetic_dataset, train_manifest):
    class InputNorm(RecordingNet):
        """BatchNorm first, so its statistics are those of the normalised input clips."""

        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.BatchNorm3d(3), nn.Conv3d(3, 4, 3, padding=1), nn.ReLU(),
                                     nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(4, 4))

    model = InputNorm()
    datamodule = make_datamodule(synthetic_dataset, train_manifest)
    trainer = fit(model, datamodule, MultigridCallback(precise_bn_batches=3, milestones=MILESTONES), limit_train_batches=2)
    bn = model.net[0]
    assert isinstance(bn, MultigridBatchNorm)
    # The callback's last precise BN saw normalised clips (normalising twice would put the mean
    # near (-2 - 0.45) / 0.225 = -10.9).
    assert bn.running_mean.abs().max() < 2.5

    # Recomputed: the plain average over 3 base-shape batches of the precise-BN loader; iterating
    # it again in the same epoch gives the same clips.
    assert update_bn_stats(trainer, model, datamodule.precise_bn_dataloader(), 3) == 3
    means, variances = [], []
    for batch, _ in zip(datamodule.precise_bn_dataloader(), range(3)):
        video = datamodule.on_after_batch_transfer(batch, 0)["video"]
        assert video.shape[1:] == (3, BASE["num_frames"], BASE["crop_size"], BASE["crop_size"])
        means.append(video.mean(dim=(0, 2, 3, 4)))
        variances.append(video.transpose(0, 1).flatten(1).var(dim=1))
    torch.testing.assert_close(bn.running_mean, torch.stack(means).mean(0), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(bn.running_var, torch.stack(variances).mean(0), rtol=1e-4, atol=1e-5)
    assert bn.momentum == 0.1  # restored
