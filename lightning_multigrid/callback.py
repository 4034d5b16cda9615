"""MultigridCallback: the only place that talks to the Trainer.

It builds one schedule when fitting starts, and then only reads Trainer state, asks the schedule
and applies the answer: the epoch budget (``fit_loop.max_epochs``), the grid (the DataModule
serves it; the callback asks Lightning to reload the train loader at long-cycle shape changes),
the learning rate (the user's scheduler, read on the baseline timeline, times the long-cycle
factor, for one optimizer step at a time), BatchNorm grouping, precise BN and logging.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback
from pytorch_lightning.utilities import rank_zero_info
from torch.optim.lr_scheduler import MultiStepLR, ReduceLROnPlateau, SequentialLR, StepLR
from typing_extensions import override

from lightning_multigrid.lr import BaselineLR
from lightning_multigrid.norm import apply_bn_plan, convert_batchnorm, create_sync_groups
from lightning_multigrid.plugins import check_no_torch_sync_batchnorm
from lightning_multigrid.preview import format_table
from lightning_multigrid.schedule import (
    DEFAULT_LONG_CYCLE_FACTORS,
    DEFAULT_SHORT_CYCLE_FACTORS,
    BNPlan,
    GridShape,
    MultigridConfig,
    MultigridSchedule,
    Stage,
    build_schedule,
)

__all__ = ["GridDataModule", "MultigridCallback"]


@runtime_checkable
class GridDataModule(Protocol):
    """What the callback needs from a DataModule: its base shape and a way to serve grids."""

    @property
    def base_shape(self) -> GridShape: ...

    @property
    def sampling_rate(self) -> float: ...

    def attach_schedule(self, schedule: MultigridSchedule | None) -> None: ...


class MultigridCallback(Callback):
    """Train on the multigrid schedule: add it to a Trainer that trains a baseline.

    The Trainer's ``max_epochs`` and the user's optimizer and LR scheduler describe the baseline
    run; the callback turns them into a multigrid run of ``epoch_factor``-times as many (cheaper)
    epochs. The LightningModule must accept any batch, frames and crop size (see
    :func:`lightning_multigrid.models.make_multigrid_compatible`).

    Args:
        enabled: ``False`` turns the callback into a no-op, so one config runs the baseline too.
        long_cycle: vary frames and crop over epochs (paper, Section 3.2).
        short_cycle: vary the crop every iteration.
        epoch_factor: multigrid epochs relative to the baseline's ``max_epochs``.
        milestones: baseline epochs where LR stages start. ``None`` reads them from the user's
            ``MultiStepLR``/``StepLR`` (also inside ``SequentialLR``) or from a ``lr_milestones``
            attribute of the LightningModule; without either, training is one long cycle.
        bn_base_size: clips over which BatchNorm computes statistics.
        convert_batchnorm: replace the model's BatchNorm layers with
            :class:`~lightning_multigrid.norm.MultigridBatchNorm` so their grouping follows the
            schedule. Turn off to keep plain BatchNorm (statistics then vary with the batch).
        manage_lr: map each step onto the baseline LR timeline and scale by the long-cycle
            factor. Turn off to leave the LR entirely to the user.
        precise_bn_batches: before each validation, recompute BatchNorm statistics at the
            base shape over this many training batches (0 turns it off). Needs a DataModule with
            ``precise_bn_dataloader()``.
        preflight: run one tiny forward per grid when fitting starts, to fail before training.
        long_cycle_factors: ``(t_factor, s_factor)`` per long-cycle shape, coarsest first.
        short_cycle_factors: crop factors of the two smaller short-cycle iterations.
        full_grid_share: at least this fraction of the baseline's iterations at the full grid,
            in a fine-tuning phase without short cycle (``0``: the paper's schedule).
        scale_bn_base_size: scale ``bn_base_size`` with each grid's relative batch, so BatchNorm
            statistics cover as many values on every grid. Both: see
            :class:`~lightning_multigrid.schedule.MultigridConfig`.

    Example::

        trainer = Trainer(max_epochs=100, callbacks=[MultigridCallback()])
        trainer.fit(model, datamodule=MultigridVideoDataModule(...))
    """

    def __init__(
        self,
        enabled: bool = True,
        long_cycle: bool = True,
        short_cycle: bool = True,
        epoch_factor: float = 1.5,
        milestones: list[int] | None = None,
        bn_base_size: int = 8,
        convert_batchnorm: bool = True,
        manage_lr: bool = True,
        precise_bn_batches: int = 200,
        preflight: bool = True,
        long_cycle_factors: list[tuple[float, float]] | None = None,
        short_cycle_factors: tuple[float, float] | None = None,
        full_grid_share: float = 0.0,
        scale_bn_base_size: bool = False,
    ) -> None:
        if precise_bn_batches < 0:
            raise ValueError(f"`precise_bn_batches` must be >= 0, got {precise_bn_batches!r}.")
        self.enabled = enabled
        self.long_cycle = long_cycle
        self.short_cycle = short_cycle
        self.epoch_factor = epoch_factor
        self.milestones = milestones
        self.bn_base_size = bn_base_size
        self.convert_batchnorm = convert_batchnorm
        self.manage_lr = manage_lr
        self.precise_bn_batches = precise_bn_batches
        self.preflight = preflight
        self.long_cycle_factors = tuple(tuple(f) for f in long_cycle_factors or DEFAULT_LONG_CYCLE_FACTORS)
        self.short_cycle_factors = tuple(short_cycle_factors or DEFAULT_SHORT_CYCLE_FACTORS)
        self.full_grid_share = full_grid_share
        self.scale_bn_base_size = scale_bn_base_size
        self.schedule: MultigridSchedule | None = None
        self._restored_config: dict[str, Any] | None = None
        self._baseline_max_epochs = 0
        self._baseline_lrs: list[tuple[torch.optim.Optimizer, BaselineLR]] = []
        self._hook_handles: list[Any] = []
        self._saved_lrs: dict[int, list[float]] = {}
        self._position = (0, 0, 1)  # (epoch, batch index, batches in the epoch)
        self._applied_bn: BNPlan | None = None
        self.effective_lr: float | None = None

    # ---------------------------------------------------------------- set-up

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit" or not self.enabled:
            return
        if trainer.max_epochs is None or trainer.max_epochs < 1:
            raise ValueError(
                f"MultigridCallback needs `Trainer(max_epochs=...)`, the baseline's epochs, got {trainer.max_epochs!r}."
            )
        check_no_torch_sync_batchnorm(trainer)
        if not isinstance(trainer.datamodule, GridDataModule):
            raise ValueError(
                f"MultigridCallback needs a DataModule that serves multigrid grids, got "
                f"{type(trainer.datamodule).__name__}. Use `MultigridVideoDataModule`, or give yours "
                "`base_shape`, `sampling_rate` and `attach_schedule(schedule)` and build its train "
                "loader with `ShortCycleBatchSampler`."
            )
        self._baseline_max_epochs = trainer.max_epochs
        if self.convert_batchnorm:
            convert_batchnorm(pl_module)

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # After configure_optimizers: the user's schedulers exist and describe the baseline run.
        if not self.enabled:
            return
        datamodule = trainer.datamodule
        configs = trainer.lr_scheduler_configs
        if any(isinstance(c.scheduler, ReduceLROnPlateau) for c in configs):
            if self.manage_lr or self.milestones is None:
                raise ValueError(
                    "ReduceLROnPlateau reacts to metrics, so multigrid cannot map it onto the baseline "
                    "run. Use a step or cosine schedule, or pass `MultigridCallback(manage_lr=False, "
                    "milestones=[...])` to keep it and scale nothing."
                )
        steps_per_epoch = self._baseline_steps_per_epoch(trainer) if any(c.interval == "step" for c in configs) else 1
        config = self._build_config(trainer, pl_module, steps_per_epoch)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.schedule = build_schedule(config)
        for warning in caught:
            rank_zero_info(f"multigrid: {warning.message}")

        trainer.fit_loop.max_epochs = self.schedule.max_epochs
        datamodule.attach_schedule(self.schedule)
        # A train loader built before now (e.g. by `estimated_stepping_batches` in
        # configure_optimizers) serves the baseline grid; Lightning has no public way to drop it.
        trainer.fit_loop._combined_loader = None
        if trainer.world_size > 1:
            create_sync_groups(s.bn.group_size for s in self.schedule.stages if s.bn.mode == "sync")
        if self.manage_lr:
            self._install_lr_mapping(trainer, pl_module, steps_per_epoch)
        if self.preflight:
            self._preflight(pl_module, datamodule)
        rank_zero_info(self._summary(datamodule))

    def _build_config(self, trainer: pl.Trainer, pl_module: pl.LightningModule, steps_per_epoch: int) -> MultigridConfig:
        base = trainer.datamodule.base_shape
        milestones: Sequence[int] | None = self.milestones
        if milestones is None:
            milestones = _find_milestones(pl_module, trainer.lr_scheduler_configs, steps_per_epoch, self._baseline_max_epochs)
        config = MultigridConfig(
            batch_size=base.batch_size,
            num_frames=base.num_frames,
            crop_size=base.crop_size,
            max_epochs=self._baseline_max_epochs,
            milestones=tuple(milestones),
            sampling_rate=trainer.datamodule.sampling_rate,
            devices=trainer.world_size,
            long_cycle=self.long_cycle,
            short_cycle=self.short_cycle,
            epoch_factor=self.epoch_factor,
            long_cycle_factors=self.long_cycle_factors,  # type: ignore[arg-type]
            short_cycle_factors=self.short_cycle_factors,  # type: ignore[arg-type]
            bn_base_size=self.bn_base_size,
            jitter_scales=getattr(trainer.datamodule, "jitter_scales", None),
            full_grid_share=self.full_grid_share,
            scale_bn_base_size=self.scale_bn_base_size,
        )
        if self._restored_config is not None:
            restored = _config_from_dict(self._restored_config)
            if restored != config:
                rank_zero_info(
                    "multigrid: the checkpoint's schedule settings differ from this run's; resuming "
                    f"the checkpoint's schedule ({restored})."
                )
            return restored
        return config

    def _baseline_steps_per_epoch(self, trainer: pl.Trainer) -> int:
        # Called before the schedule is attached, so this is the baseline loader's length, as the
        # user's configure_optimizers saw it.
        return max(1, int(trainer.estimated_stepping_batches) // self._baseline_max_epochs)

    def _install_lr_mapping(self, trainer: pl.Trainer, pl_module: pl.LightningModule, steps_per_epoch: int) -> None:
        by_optimizer = {id(c.scheduler.optimizer): c for c in trainer.lr_scheduler_configs}
        for optimizer in trainer.optimizers:
            config = by_optimizer.get(id(optimizer))
            tracker = BaselineLR(
                optimizer,
                None if config is None else config.scheduler,
                interval="step" if config is not None and config.interval == "step" else "epoch",
                frequency=1 if config is None else config.frequency,
                steps_per_epoch=steps_per_epoch,
                share=(pl_module, trainer),
            )
            self._baseline_lrs.append((optimizer, tracker))
            self._hook_handles.append(optimizer.register_step_pre_hook(functools.partial(self._scale_lr, tracker)))
            self._hook_handles.append(optimizer.register_step_post_hook(self._restore_lr))

    def _preflight(self, pl_module: pl.LightningModule, datamodule: Any) -> None:
        from lightning_multigrid.models import preflight

        assert self.schedule is not None
        grids = self.schedule.distinct_grids()
        if callable(getattr(pl_module, "preflight", None)):
            pl_module.preflight(grids)  # the module knows its own input format (e.g. pathways)
        elif type(pl_module).forward is pl.LightningModule.forward:
            rank_zero_info("multigrid: skipped the preflight check: the LightningModule has no `forward`.")
        else:
            preflight(pl_module, grids, slowfast_alpha=getattr(datamodule, "slowfast_alpha", None), device=pl_module.device)

    def _summary(self, datamodule: Any) -> str:
        assert self.schedule is not None
        size = getattr(datamodule, "train_dataset_size", None)
        return "Multigrid schedule\n" + format_table(self.schedule, size if isinstance(size, int) and size > 0 else None)

    # ------------------------------------------------------------- training

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.schedule is None:
            return
        # On resume the train loader was built while `current_epoch` still named the checkpoint's
        # epoch, not the one about to run: ask for a rebuild (a no-op for a fresh run at epoch 0).
        trainer.reload_dataloaders_every_n_epochs = 1

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        if self.schedule is None:
            return
        epoch = trainer.current_epoch
        self._position = (epoch, batch_idx, max(1, int(trainer.num_training_batches)))
        stage = self._stage(epoch)
        if stage.bn != self._applied_bn:
            apply_bn_plan(pl_module, stage.bn)
            self._applied_bn = stage.bn

    def _stage(self, epoch: int) -> Stage:
        assert self.schedule is not None, "MultigridCallback: the schedule is built in on_fit_start."
        return self.schedule.stage_at(epoch)

    def _scale_lr(self, tracker: BaselineLR, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """Optimizer step pre-hook: the baseline LR at this point, times the long-cycle factor."""
        assert self.schedule is not None
        epoch, batch_idx, num_batches = self._position
        baseline_epoch = self.schedule.baseline_epoch_at(epoch + batch_idx / num_batches)
        factor = self._stage(epoch).lr_factor
        self._saved_lrs[id(optimizer)] = [g["lr"] for g in optimizer.param_groups]
        for group, lr in zip(optimizer.param_groups, tracker.lrs_at(baseline_epoch)):
            group["lr"] = lr * factor
        if optimizer is self._baseline_lrs[0][0]:
            self.effective_lr = optimizer.param_groups[0]["lr"]

    def _restore_lr(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """Optimizer step post-hook: give the user's scheduler back the LR it set."""
        for group, lr in zip(optimizer.param_groups, self._saved_lrs.pop(id(optimizer), [])):
            group["lr"] = lr

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.schedule is None:
            return
        epoch = trainer.current_epoch
        stage = self._stage(epoch)
        grid = self.schedule.short_cycle_at(epoch, batch_idx)
        metrics = {
            "multigrid/batch_size": float(grid.batch_size),
            "multigrid/num_frames": float(grid.num_frames),
            "multigrid/crop_size": float(grid.crop_size),
            "multigrid/lr_factor": float(stage.lr_factor),
            "multigrid/bn_groups": float(stage.bn.num_splits),
            "multigrid/bn_sync_ranks": float(stage.bn.group_size),
        }
        if self.effective_lr is not None:
            metrics["multigrid/lr"] = self.effective_lr
        skipped = getattr(trainer.datamodule, "skipped_videos", None)
        if isinstance(skipped, int):
            metrics["multigrid/skipped_videos"] = float(skipped)
        shown = {"multigrid/batch_size", "multigrid/num_frames", "multigrid/crop_size"}
        for key, value in metrics.items():
            pl_module.log(key, value, on_step=True, on_epoch=False, prog_bar=key in shown, batch_size=grid.batch_size)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Reload the train loader only where the long-cycle shape (or the short cycle: a
        # `full_grid_share` fine-tuning drops it) changes, so Lightning reads the new epoch length
        # there; the DataModule decides whether that needs a new loader.
        if self.schedule is None:
            return
        epoch = trainer.current_epoch
        now, upcoming = self._stage(epoch), self._stage(epoch + 1)
        changes = (upcoming.shape, upcoming.short_cycle) != (now.shape, now.short_cycle)
        trainer.reload_dataloaders_every_n_epochs = 1 if changes else 0

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or not self.precise_bn_batches or self.schedule is None:
            return
        loader_factory = getattr(trainer.datamodule, "precise_bn_dataloader", None)
        if loader_factory is None:
            return
        from lightning_multigrid.precise_bn import update_bn_stats

        update_bn_stats(trainer, pl_module, loader_factory(), self.precise_bn_batches)
        # Precise BN ran at the base shape in plain mode; training resumes with its own plan.
        self._applied_bn = None

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles.clear()
        self._baseline_lrs.clear()

    # --------------------------------------------------------------- resume

    @override
    def state_dict(self) -> dict[str, Any]:
        if self.schedule is None:
            return {}
        return {"config": dataclasses.asdict(self.schedule.config)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restored_config = state_dict.get("config")


def _config_from_dict(values: dict[str, Any]) -> MultigridConfig:
    """Rebuild a config saved with ``dataclasses.asdict`` (lists back to tuples)."""
    values = dict(values)
    values["milestones"] = tuple(values["milestones"])
    values["long_cycle_factors"] = tuple(tuple(f) for f in values["long_cycle_factors"])
    values["short_cycle_factors"] = tuple(values["short_cycle_factors"])
    if values.get("jitter_scales") is not None:
        values["jitter_scales"] = tuple(values["jitter_scales"])
    return MultigridConfig(**values)


def _find_milestones(
    pl_module: pl.LightningModule, configs: Sequence[Any], steps_per_epoch: int, max_epochs: int
) -> tuple[int, ...]:
    """Baseline epochs where LR stages start, from the module or the user's step schedulers."""
    declared = getattr(pl_module, "lr_milestones", None)
    if declared is not None:
        return tuple(int(m) for m in declared)
    found: set[int] = set()
    for config in configs:
        per_epoch = steps_per_epoch / config.frequency if config.interval == "step" else 1 / config.frequency
        horizon = max_epochs * per_epoch
        for milestone in _scheduler_milestones(config.scheduler, horizon):
            found.add(round(milestone / per_epoch))
    milestones = tuple(sorted(m for m in found if 0 < m < max_epochs))
    if not milestones:
        rank_zero_info(
            "multigrid: no LR milestones found (no MultiStepLR/StepLR): the long cycle runs once over "
            "the whole training. Pass `MultigridCallback(milestones=[...])` for a step-like schedule."
        )
    return milestones


def _scheduler_milestones(scheduler: Any, horizon: float, offset: int = 0) -> list[int]:
    """Scheduler steps where a step scheduler decays the LR, in its own units."""
    if isinstance(scheduler, MultiStepLR):
        return [offset + m for m in sorted(scheduler.milestones)]
    if isinstance(scheduler, StepLR):
        return list(range(offset + scheduler.step_size, math.ceil(horizon), scheduler.step_size))
    if isinstance(scheduler, SequentialLR):
        starts = [0, *scheduler._milestones]  # no public accessor
        return [
            m
            for inner, start in zip(scheduler._schedulers, starts)
            for m in _scheduler_milestones(inner, horizon, offset + start)
        ]
    return []

