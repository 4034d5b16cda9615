"""Every Trainer setting a user may set either works with MultigridCallback or is refused before
the first step: precision, val_check_interval, max_steps, repeated fit, a reused callback, a
mid-epoch resume, short cycle only, parameter groups added during fit and precise BN.

Real Trainer fitting the tiny 3D CNN of ``test_callback.py`` on real H.264 videos.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from lightning_multigrid._lightning import pl
from lightning_multigrid.callback import MultigridCallback
from lightning_multigrid.data.datamodule import MultigridVideoDataModule
from lightning_multigrid.norm import MultigridBatchNorm

from test_callback import BASE_LR, MAX_EPOCHS, MILESTONES, RecordingNet, StopAfter, fit, make_datamodule
from test_callback import train_manifest as train_manifest  # the module-scoped fixture

BackboneFinetuning = pl.callbacks.BackboneFinetuning
ModelCheckpoint = pl.callbacks.ModelCheckpoint

CLIPS = 32  # the train manifest lists the 16 videos twice; baseline batch 1 -> 32 batches/epoch


class IndexRecordingNet(RecordingNet):
    """Also records the clips (dataset indices) and the video dtype of every step."""

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.steps[-1]["index"] = batch["index"].tolist()
        self.steps[-1]["dtype"] = batch["video"].dtype
        return loss


# ------------------------------------------------------------------ precision (items 1, 3)


@pytest.mark.parametrize("with_callback", [True, False])
@pytest.mark.parametrize("precision", ["bf16-true", "16-true", "64-true", "bf16-mixed"])
def test_precision_settings_train(synthetic_dataset, train_manifest, precision, with_callback):
    # bf16-true: Lightning converts the batch before the transfer hooks, when the video is still
    # uint8; the DataModule must hand the model bfloat16, not its normalised float32.
    model = IndexRecordingNet()
    datamodule = make_datamodule(synthetic_dataset, train_manifest, batch_size=2)
    callbacks = [MultigridCallback(bn_base_size=2, precise_bn_batches=1, milestones=[1])] if with_callback else []
    pl.seed_everything(0, verbose=False)
    trainer = pl.Trainer(
        max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        limit_train_batches=3, limit_val_batches=1, precision=precision, callbacks=callbacks,
    )
    trainer.fit(model, datamodule=datamodule)
    # Mixed precision keeps float32 input: autocast casts inside the model.
    expected = {"bf16-true": torch.bfloat16, "16-true": torch.float16, "64-true": torch.float64}.get(precision, torch.float32)
    assert model.steps and {s["dtype"] for s in model.steps} == {expected}
    assert all(torch.isfinite(p).all() for p in model.parameters())


# ------------------------------------------------------------------ val_check_interval (item 2)


class ValidationRecorder(IndexRecordingNet):
    def __init__(self) -> None:
        super().__init__()
        self.validations: list[tuple[int, int]] = []  # (epoch, global step)
        self.val_check_batches: dict[int, tuple[int, int]] = {}  # epoch -> (val_check_batch, batches)

    def on_train_epoch_start(self) -> None:
        self.val_check_batches[self.current_epoch] = (self.trainer.val_check_batch, self.trainer.num_training_batches)

    def on_validation_start(self) -> None:
        if not self.trainer.sanity_checking:
            self.validations.append((self.current_epoch, self.global_step))


def test_integer_val_check_interval_is_a_fraction_of_the_baseline_epoch(synthetic_dataset, train_manifest):
    model = ValidationRecorder()
    callback = MultigridCallback(bn_base_size=2, precise_bn_batches=0, milestones=MILESTONES)
    trainer = fit(model, make_datamodule(synthetic_dataset, train_manifest), callback, val_check_interval=10)
    schedule = callback.schedule
    assert schedule is not None and trainer.current_epoch == schedule.max_epochs
    # Every 10 of the baseline's 32 batches = every 10/32 of an epoch, in every multigrid epoch.
    for epoch in range(schedule.max_epochs):
        val_check_batch, batches = model.val_check_batches[epoch]
        assert batches == schedule.iterations_in_epoch(epoch, CLIPS)
        assert val_check_batch == max(1, int(batches * 10 / 32)), epoch
    longest = max(range(schedule.max_epochs), key=lambda e: schedule.iterations_in_epoch(e, CLIPS))
    assert sum(e == longest for e, _ in model.validations) >= 3  # mid-epoch validations happened
    assert trainer.val_check_interval == 10  # the user's value is back after fit


def test_step_based_val_check_interval_is_refused(synthetic_dataset, train_manifest):
    model = IndexRecordingNet()
    with pytest.raises(ValueError, match="check_val_every_n_epoch=None"):
        fit(model, make_datamodule(synthetic_dataset, train_manifest), MultigridCallback(precise_bn_batches=0),
            val_check_interval=10, check_val_every_n_epoch=None)
    assert model.steps == []


@pytest.mark.parametrize(("trainer_args", "match"), [
    ({"max_epochs": None}, r"it was not given: Lightning filled in its default 1000.*Pass `max_epochs`"),
    ({"max_epochs": None, "max_steps": 500}, r"got -1 \(no epoch limit.*Pass `max_epochs`"),
])
def test_a_trainer_without_max_epochs_is_refused(synthetic_dataset, train_manifest, trainer_args, match):
    """Lightning fills in `max_epochs` before the callback's `setup` (issue 36, item 1)."""
    model = IndexRecordingNet()
    with pytest.raises(ValueError, match=match):
        fit(model, make_datamodule(synthetic_dataset, train_manifest), MultigridCallback(precise_bn_batches=0),
            **trainer_args)
    assert model.steps == []


# ------------------------------------------------------------------ long-cycle factors (item 4)


def test_long_cycle_crop_below_the_short_cycle_crops_is_refused(synthetic_dataset, train_manifest):
    model = IndexRecordingNet()
    # s_factor 0.4 of 32 px = 13 px, below the short cycle's 23 px (1/sqrt2): batches of 0 clips.
    callback = MultigridCallback(long_cycle_factors=[(0.25, 0.4), (1, 1)], precise_bn_batches=0)
    with pytest.raises(ValueError, match=r"\(0\.25, 0\.4\) gives a 13-pixel crop.*23-pixel short-cycle crop"):
        fit(model, make_datamodule(synthetic_dataset, train_manifest), callback)
    assert model.steps == []


# ------------------------------------------------------------------ max_steps (item 5)


def test_max_steps_that_ends_the_baseline_early_is_refused(synthetic_dataset, train_manifest):
    model = IndexRecordingNet()
    # The baseline has 4 x 32 = 128 steps: max_steps=64 would stop it after 2 epochs.
    with pytest.raises(ValueError, match=r"max_steps=64.*2\.00 of its `max_epochs`=4.*max_epochs=2"):
        fit(model, make_datamodule(synthetic_dataset, train_manifest), MultigridCallback(precise_bn_batches=0),
            max_steps=64)
    assert model.steps == []


def test_max_steps_beyond_the_baseline_does_not_cut_the_multigrid_run(synthetic_dataset, train_manifest):
    model = IndexRecordingNet()
    # 128 baseline steps: max_steps=128 does not limit the baseline. The multigrid run with
    # epoch_factor=6 takes more steps than that, and must still run all its epochs.
    callback = MultigridCallback(bn_base_size=2, precise_bn_batches=0, epoch_factor=6.0, milestones=MILESTONES)
    trainer = fit(model, make_datamodule(synthetic_dataset, train_manifest), callback, max_steps=128)
    assert callback.schedule is not None
    assert callback.schedule.total_iterations(CLIPS) > 128
    assert len(model.steps) == callback.schedule.total_iterations(CLIPS)
    assert trainer.current_epoch == callback.schedule.max_epochs
    assert trainer.max_steps == 128


# ------------------------------------------------------------------ repeated fit, reuse (items 6, 7)


def test_second_fit_on_the_same_trainer_trains_nothing_more(synthetic_dataset, train_manifest):
    model = IndexRecordingNet()
    datamodule = make_datamodule(synthetic_dataset, train_manifest)
    callback = MultigridCallback(bn_base_size=2, precise_bn_batches=0, milestones=MILESTONES)
    trainer = fit(model, datamodule, callback, limit_train_batches=2)
    steps = len(model.steps)
    assert trainer.max_epochs == MAX_EPOCHS  # the baseline's, not the multigrid run's 6
    assert trainer.reload_dataloaders_every_n_epochs == 0
    trainer.fit(model, datamodule=datamodule)  # as plain Lightning: already done
    assert len(model.steps) == steps
    assert trainer.max_epochs == MAX_EPOCHS


def test_reused_callback_applies_the_plan_to_the_new_model(synthetic_dataset, train_manifest):
    callback = MultigridCallback(bn_base_size=2, precise_bn_batches=0, milestones=MILESTONES)
    first = IndexRecordingNet()
    # Stopped in the first (split) stage, so the callback last applied a split plan.
    pl.seed_everything(0, verbose=False)
    trainer = pl.Trainer(
        max_epochs=MAX_EPOCHS, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
        limit_train_batches=2, callbacks=[callback, StopAfter(1)],
    )
    trainer.fit(first, datamodule=make_datamodule(synthetic_dataset, train_manifest))
    assert callback.schedule is not None
    plan = callback.schedule.stage_at(0).bn
    assert plan.mode == "split"
    assert {s["bn"] for s in first.steps} == {("split", plan.num_splits)}

    second = IndexRecordingNet()
    fit(second, make_datamodule(synthetic_dataset, train_manifest), callback, limit_train_batches=2)
    first_stage = [s for s in second.steps if s["epoch"] < callback.schedule.stages[0].end_epoch]
    assert first_stage and {s["bn"] for s in first_stage} == {("split", plan.num_splits)}


# ------------------------------------------------------------------ mid-epoch resume (item 8)


class CrashAtStep(pl.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError(f"simulated crash at step {self.step}")


def test_mid_epoch_resume_ends_identical_to_an_uninterrupted_run(synthetic_dataset, train_manifest, tmp_path):
    def run(directory: Path, ckpt_path: str | None = None, every: int | None = None, crash: int | None = None) -> IndexRecordingNet:
        pl.seed_everything(0, verbose=False)
        model = IndexRecordingNet()
        callbacks: list[pl.Callback] = [MultigridCallback(bn_base_size=2, precise_bn_batches=0)]
        if every is not None:
            callbacks.append(ModelCheckpoint(dirpath=directory, every_n_train_steps=every, save_top_k=-1))
        if crash is not None:
            callbacks.append(CrashAtStep(crash))
        trainer = pl.Trainer(
            max_epochs=MAX_EPOCHS, accelerator="cpu", logger=False, enable_progress_bar=False,
            enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, deterministic=True,
            enable_checkpointing=every is not None, callbacks=callbacks,
        )
        trainer.fit(model, datamodule=make_datamodule(synthetic_dataset, train_manifest), ckpt_path=ckpt_path)
        return model

    uninterrupted = run(tmp_path / "uninterrupted")
    # A checkpoint every 20 steps; the crash comes 5 steps after the one at step 40.
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(tmp_path / "interrupted", every=20, crash=45)
    (checkpoint,) = (tmp_path / "interrupted").glob("*step=40.ckpt")
    saved = uninterrupted.steps[39]  # the last step before the checkpoint
    after = uninterrupted.steps[40]
    assert after["epoch"] == saved["epoch"] and after["batch_idx"] > 0  # premise: mid-epoch

    resumed = run(tmp_path / "resumed", ckpt_path=str(checkpoint))
    keys = ("epoch", "batch_idx", "shape", "index", "lr", "bn")
    assert [tuple(s[k] for k in keys) for s in resumed.steps] == [tuple(s[k] for k in keys) for s in uninterrupted.steps[40:]]
    for name, value in uninterrupted.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], value, rtol=0, atol=0, msg=name)


# ------------------------------------------------------------------ short cycle only (item 10)


def test_short_cycle_only_keeps_the_users_batchnorm(synthetic_dataset, train_manifest):
    model = IndexRecordingNet()
    callback = MultigridCallback(long_cycle=False, bn_base_size=2, precise_bn_batches=0, milestones=MILESTONES)
    # Base batch 4 with bn_base_size 2 would be "split in 2" with the long cycle on.
    fit(model, make_datamodule(synthetic_dataset, train_manifest, batch_size=4), callback, limit_train_batches=3)
    assert type(model.net[1]) is nn.BatchNorm3d
    assert model.steps and {s["bn"] for s in model.steps} == {None}


# ------------------------------------------------------------------ parameter groups (item 12)


class BackboneNet(IndexRecordingNet):
    """Backbone (conv + BN) frozen at first; BackboneFinetuning adds its parameter group later."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv3d(3, 4, 3, padding=1), nn.BatchNorm3d(4), nn.ReLU())
        self.net = nn.Sequential(self.backbone, nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(4, 4))
        self.group_lrs: list[tuple[int, list[float], list[float]]] = []  # (epoch, set, used)
        self._set_lrs: list[float] = []

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.lrs.append(0.0)  # RecordingNet reads lrs[-1]; the group LRs are recorded below
        video = batch["video"]
        self.steps.append({"epoch": self.current_epoch, "batch_idx": batch_idx, "shape": tuple(video.shape)})
        return nn.functional.cross_entropy(self(video), batch["label"])

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self._set_lrs = [g["lr"] for g in self.trainer.optimizers[0].param_groups]  # what the user's code set

    def on_train_start(self) -> None:
        optimizer = self.trainer.optimizers[0]
        optimizer.register_step_pre_hook(
            lambda opt, args, kwargs: self.group_lrs.append(
                (self.current_epoch, list(self._set_lrs), [g["lr"] for g in opt.param_groups])
            )
        )

    def configure_optimizers(self) -> Any:
        trainable = [p for p in self.parameters() if p.requires_grad]
        optimizer = torch.optim.SGD(trainable, lr=BASE_LR, momentum=0.9)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.MultiStepLR(optimizer, MILESTONES)}


def test_parameter_groups_added_during_fit_are_scaled_too(synthetic_dataset, train_manifest):
    model = BackboneNet()
    callback = MultigridCallback(bn_base_size=2, precise_bn_batches=0, milestones=MILESTONES)
    pl.seed_everything(0, verbose=False)
    trainer = pl.Trainer(
        max_epochs=MAX_EPOCHS, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
        limit_train_batches=2, callbacks=[callback, BackboneFinetuning(unfreeze_backbone_at_epoch=1)],
    )
    trainer.fit(model, datamodule=make_datamodule(synthetic_dataset, train_manifest))
    schedule = callback.schedule
    assert schedule is not None
    added = [(epoch, set_lrs, used) for epoch, set_lrs, used in model.group_lrs if len(used) == 2]
    assert added, "BackboneFinetuning added no parameter group"
    assert any(schedule.stage_at(epoch).lr_factor > 1 for epoch, _, _ in added)  # premise
    for epoch, set_lrs, used in added:
        factor = schedule.stage_at(epoch).lr_factor
        assert used[1] == pytest.approx(set_lrs[1] * factor, rel=1e-9), epoch
        assert used[0] == pytest.approx(BASE_LR * schedule.relative_lr_at(epoch), rel=1e-6), epoch


# ------------------------------------------------------------------ precise BN (item 13)


class CountingDataModule(MultigridVideoDataModule):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.precise_bn_calls = 0

    def precise_bn_dataloader(self) -> Any:
        self.precise_bn_calls += 1
        return super().precise_bn_dataloader()


def test_precise_bn_runs_only_after_the_weights_changed(synthetic_dataset, train_manifest):
    model = IndexRecordingNet()
    datamodule = CountingDataModule(
        train_manifest=str(train_manifest), val_manifest=str(synthetic_dataset.val_manifest),
        root_dir=str(synthetic_dataset.root), num_workers=0, flip=False, seed=1,
        batch_size=1, num_frames=8, crop_size=32, sampling_rate=2,
    )
    callback = MultigridCallback(bn_base_size=2, precise_bn_batches=2, milestones=MILESTONES)
    trainer = fit(model, datamodule, callback, limit_train_batches=2)
    assert callback.schedule is not None
    assert datamodule.precise_bn_calls == callback.schedule.max_epochs  # one per epoch-end validation
    bn = model.net[1]
    assert isinstance(bn, MultigridBatchNorm)
    statistics = (bn.running_mean.clone(), bn.running_var.clone())
    trainer.validate(model, datamodule=datamodule, verbose=False)
    assert datamodule.precise_bn_calls == callback.schedule.max_epochs
    assert torch.equal(bn.running_mean, statistics[0]) and torch.equal(bn.running_var, statistics[1])


# ------------------------------------------------------------------ accumulate_grad_batches


class StepLRRecorder(IndexRecordingNet):
    """Records (epoch, batch index, LR) at every optimizer step (every 2nd batch here)."""

    def __init__(self) -> None:
        super().__init__("warmup_cosine")
        self.lrs = [float("nan")]  # batches that only accumulate run outside optimizer.step
        self.optimizer_steps: list[tuple[int, int, float]] = []
        self._batch_idx = 0

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self._batch_idx = batch_idx

    def on_train_start(self) -> None:
        super().on_train_start()
        self.trainer.optimizers[0].register_step_pre_hook(
            lambda opt, args, kwargs: self.optimizer_steps.append(
                (self.current_epoch, self._batch_idx, opt.param_groups[0]["lr"])
            )
        )


def test_accumulated_steps_follow_the_baseline_step_schedule(synthetic_dataset, train_manifest):
    from test_callback import warmup_cosine

    model = StepLRRecorder()
    callback = MultigridCallback(bn_base_size=2, precise_bn_batches=0, milestones=MILESTONES)
    fit(model, make_datamodule(synthetic_dataset, train_manifest), callback, accumulate_grad_batches=2)
    schedule = callback.schedule
    assert schedule is not None and model.optimizer_steps
    baseline_steps_per_epoch = CLIPS // 2  # 32 batches, a step every 2
    # The warm-up's 10 baseline optimizer steps are 10 multigrid optimizer steps too, from the unscaled
    # LR (test_callback.py::test_warmup_runs_the_baseline_steps_from_the_unscaled_lr); then the mapping.
    # (The first step comes after 2 batches, half a baseline step into the warm-up by position.)
    assert 0.1 * BASE_LR < model.optimizer_steps[0][2] < 2 * 0.1 * BASE_LR
    for epoch, batch_idx, lr in model.optimizer_steps[11:]:
        batches = schedule.iterations_in_epoch(epoch, CLIPS)
        baseline_epoch = schedule.baseline_epoch_at(epoch + batch_idx / batches)
        baseline_step = int(baseline_epoch * baseline_steps_per_epoch + 1e-6)
        expected = BASE_LR * warmup_cosine(baseline_step, MAX_EPOCHS * baseline_steps_per_epoch)
        assert lr == pytest.approx(expected * schedule.stage_at(epoch).lr_factor, rel=1e-6), (epoch, batch_idx)


@pytest.mark.parametrize("name", ["scale_bn_base_size", "long_cycle", "convert_batchnorm", "preflight"])
def test_callback_switches_accept_only_real_booleans(name):
    with pytest.raises(ValueError, match=f"`{name}` must be True or False, got 'false'"):
        MultigridCallback(**{name: "false"})
