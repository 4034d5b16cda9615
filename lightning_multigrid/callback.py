"""MultigridCallback: the only class that changes the Trainer's settings.

When fitting starts it reads the run (:mod:`~lightning_multigrid.fit.facts`), asks for the fit's plan
(:mod:`~lightning_multigrid.fit.plan`) and applies it; then its hooks only read Trainer state, ask the
schedule and apply the answer. A DataModule must be a :class:`~lightning_multigrid.contracts.GridDataModule`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from typing_extensions import override

from lightning_multigrid._checks import check_bool, check_int
from lightning_multigrid._internals import drop_train_loader, setting_owner, watch_train_fetches
from lightning_multigrid._lightning import Callback, pl, rank_zero_info
from lightning_multigrid.contracts import GridDataModule, LoadingAdviceDataModule, SkipCountingDataModule
from lightning_multigrid.fit.batch_grid import BatchGridCheck
from lightning_multigrid.fit.facts import check_trainer, preflight_grids, read_fit, with_measured_costs
from lightning_multigrid.fit.meter import DataWaitMeter
from lightning_multigrid.fit.plan import FitPlan, plan_fit, short_run_option
from lightning_multigrid.fit.precise_bn import PreciseBN
from lightning_multigrid.fit.resume import restore_rng, start_resumed_fit
from lightning_multigrid.fit.rng import EpochBoundaryRNG, gather_rng_states
from lightning_multigrid.fit.step_log import StepLog
from lightning_multigrid.norm import apply_bn_plan, convert_batchnorm, create_sync_groups
from lightning_multigrid.schedule.build import MultigridSchedule
from lightning_multigrid.schedule.config import DEFAULTS, BatchSizing, MultigridOptions, ShortRun, check_milestones
from lightning_multigrid.schedule.lr import MultigridLR, check_schedulers
from lightning_multigrid.schedule.stages import BNPlan

__all__ = ["MultigridCallback"]


class MultigridCallback(Callback):
    """Train on the multigrid schedule: add it to a Trainer that trains a baseline.

    The Trainer's ``max_epochs`` and the user's optimizer and LR scheduler describe the baseline run;
    the callback turns it into ``epoch_factor``-times as many cheaper epochs. The LightningModule must take
    any grid (:func:`~lightning_multigrid.models.make_multigrid_compatible`). The multigrid options are one
    value, :attr:`options` (:class:`~lightning_multigrid.schedule.config.MultigridOptions` describes each in full);
    how each Trainer setting is read, mapped, restored after fit or refused: ``docs/trainer.md``.

    Args:
        enabled: ``False`` turns the callback into a no-op, so one config runs the baseline too.
        long_cycle: vary frames and crop over epochs (paper, Section 3.2).
        short_cycle: vary the crop every iteration.
        epoch_factor: multigrid epochs relative to the baseline's ``max_epochs``.
        milestones: baseline epochs where LR stages start (``None``: the module's, or its ``MultiStepLR``/``StepLR``'s).
        bn_base_size: clips over which BatchNorm computes statistics.
        convert_batchnorm: group BatchNorm as the schedule says (:class:`~lightning_multigrid.norm.MultigridBatchNorm`).
        manage_lr: map each step onto the baseline LR timeline, scaled by the long-cycle factor.
        precise_bn_batches: batches of ``precise_bn_dataloader()`` that recompute BatchNorm before validating (0: off).
        preflight: one tiny forward per grid when fitting starts, to fail before training.
        long_cycle_factors: ``(t_factor, s_factor)`` per long-cycle shape, coarsest first (``None``: the default).
        short_cycle_factors: crop factors of the two smaller short-cycle iterations (``None``: the paper's).
        full_grid_share: at least this fraction of the baseline's iterations at the full grid.
        scale_bn_base_size: scale ``bn_base_size`` with each grid's relative batch.
        short_run: the short-run mode: ``True`` with its defaults, or a :class:`~lightning_multigrid.schedule.config.ShortRun`.
        pretrained: the model starts from pretrained weights (the warm-up rule; ``None``: the module says).
        batch_sizing: ``"equation1"`` (the paper's batches), or by each grid's measured ``"flops"`` or ``"time"``.

    Example::

        trainer = Trainer(max_epochs=100, callbacks=[MultigridCallback()])
        trainer.fit(model, datamodule=MultigridVideoDataModule(...))
    """

    def __init__(
        self,
        enabled: bool = True,
        long_cycle: bool = DEFAULTS.long_cycle,
        short_cycle: bool = DEFAULTS.short_cycle,
        epoch_factor: float = DEFAULTS.epoch_factor,
        milestones: list[int] | None = None,
        bn_base_size: int = DEFAULTS.bn_base_size,
        convert_batchnorm: bool = True,
        manage_lr: bool = True,
        precise_bn_batches: int = 200,
        preflight: bool = True,
        long_cycle_factors: list[tuple[float, float]] | None = None,
        short_cycle_factors: tuple[float, float] | None = None,
        full_grid_share: float = DEFAULTS.full_grid_share,
        scale_bn_base_size: bool = DEFAULTS.scale_bn_base_size,
        short_run: bool | ShortRun | None = DEFAULTS.short_run,
        pretrained: bool | None = DEFAULTS.pretrained,
        batch_sizing: BatchSizing = DEFAULTS.batch_sizing,
    ) -> None:
        # The options check themselves; what needs the base grid or the Trainer is checked in setup.
        self.options = MultigridOptions(
            long_cycle=long_cycle, short_cycle=short_cycle, epoch_factor=epoch_factor,
            long_cycle_factors=DEFAULTS.long_cycle_factors if long_cycle_factors is None else long_cycle_factors,
            short_cycle_factors=DEFAULTS.short_cycle_factors if short_cycle_factors is None else short_cycle_factors,
            bn_base_size=bn_base_size, full_grid_share=full_grid_share, scale_bn_base_size=scale_bn_base_size,
            short_run=short_run_option(short_run), pretrained=pretrained, batch_sizing=batch_sizing,
        )
        self._long_cycle_factors_given = long_cycle_factors is not None  # a user's choice always wins
        if milestones is not None:
            check_milestones(milestones)
        check_int("precise_bn_batches", precise_bn_batches, 0)
        flags = {"enabled": enabled, "convert_batchnorm": convert_batchnorm, "manage_lr": manage_lr, "preflight": preflight}
        for name, flag in flags.items():
            check_bool(name, flag)
        self.enabled = enabled
        self.milestones = milestones
        self.convert_batchnorm = convert_batchnorm
        self.manage_lr = manage_lr
        self.precise_bn_batches = precise_bn_batches
        self.preflight = preflight
        self._restored: dict[str, Any] = {}  # the checkpoint's state (load_state_dict), for this fit
        self._lr: MultigridLR | None = None
        self._unwatch_fetches: Callable[[], None] | None = None  # undoes the meter's view of the loader's fetches
        self._reset_fit_state()

    def _reset_fit_state(self) -> None:
        """Forget everything a previous ``fit`` left (the object may serve another Trainer and model)."""
        self._plan: FitPlan | None = None
        self._baseline_max_epochs = 0
        if self._lr is not None:
            self._lr.detach()
        self._lr = None
        self._applied_bn: BNPlan | None = None
        self._precise_bn = PreciseBN()
        self._meter = DataWaitMeter()
        self._log: StepLog | None = None  # built with the schedule
        self._grid_check = BatchGridCheck()
        self._rng = EpochBoundaryRNG()
        self._trainer_settings: dict[str, Any] = {}  # those changed for this fit, with the user's values

    @property
    def schedule(self) -> MultigridSchedule | None:
        """This fit's schedule, built when fitting starts (``None`` before, and when disabled)."""
        return None if self._plan is None else self._plan.schedule

    @property
    def _manages_batchnorm(self) -> bool:
        return self.options.manages_batchnorm(self.convert_batchnorm)

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit" or not self.enabled:
            return
        self._reset_fit_state()
        self._restored = {}  # a checkpoint's state arrives after setup, in load_state_dict
        check_trainer(trainer, self.precise_bn_batches)
        self._baseline_max_epochs = trainer.max_epochs
        if self._manages_batchnorm:
            convert_batchnorm(pl_module)

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # After configure_optimizers: the user's schedulers exist and describe the baseline run.
        if not self.enabled:
            return
        check_schedulers(trainer.lr_scheduler_configs, manage_lr=self.manage_lr, milestones_given=self.milestones is not None)
        given = self._long_cycle_factors_given
        facts = read_fit(trainer, pl_module, self._restored, self._baseline_max_epochs, self.options, long_cycle_factors_given=given)
        plan = plan_fit(facts, self.options, milestones=self.milestones, long_cycle_factors_given=given)
        plan = with_measured_costs(trainer, pl_module, plan, preflight=self.preflight)
        for note in plan.notes:
            rank_zero_info(f"multigrid: {note}")
        self._plan = plan
        schedule = self.schedule
        assert schedule is not None
        for name, value in plan.trainer_settings.items():
            self._change(trainer, name, value)
        datamodule = trainer.datamodule
        datamodule.serve(schedule)
        drop_train_loader(trainer)  # one built before now serves the baseline grid
        self._unwatch_fetches = watch_train_fetches(trainer, self._meter.fetch_start)
        if trainer.world_size > 1 and self._manages_batchnorm:
            create_sync_groups(schedule.sync_group_sizes())
        if self.manage_lr:
            self._lr = MultigridLR.for_optimizers(
                schedule, trainer.optimizers, trainer.lr_scheduler_configs, plan.steps_per_epoch,
                share=(pl_module, trainer), warmup_in_steps=not plan.uses_pretrained,
            )
        self._log = StepLog(
            schedule, manages_batchnorm=self._manages_batchnorm, lr=self._lr, meter=self._meter,
            skips=datamodule if isinstance(datamodule, SkipCountingDataModule) else None,
        )
        if self.preflight and plan.config.sizer.measure is None:  # with measured costs, checked before measuring
            preflight_grids(pl_module, datamodule, schedule.distinct_grids())
        search = None if self._lr is None else self._lr.warmup_search
        rank_zero_info(plan.summary(convert_batchnorm=self.convert_batchnorm, manage_lr=self.manage_lr, warmup_search=search))

    def _change(self, trainer: pl.Trainer, name: str, value: Any) -> None:
        """Set a Trainer setting for this fit; :meth:`teardown` puts the user's value back."""
        owner = setting_owner(trainer, name)
        self._trainer_settings.setdefault(name, getattr(owner, name))
        setattr(owner, name, value)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.schedule is None:
            return
        # On resume the train loader was built while `current_epoch` still named the checkpoint's
        # epoch, not the one about to run: ask for a rebuild (a no-op for a fresh run at epoch 0).
        self._change(trainer, "reload_dataloaders_every_n_epochs", 1)
        start_resumed_fit(trainer, has_multigrid_state=self._restored.get("config") is not None)
        note = restore_rng(trainer, self._rng, self._restored)
        if note is not None:
            rank_zero_info(note)

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        if self.schedule is None:
            return
        self._meter.batch_start()  # first: the wait for this batch ends here
        self._rng.batch_start()  # an epoch's first step: the random state of the last one's end (or the checkpoint's)
        epoch = trainer.current_epoch
        self._grid_check(batch, self.schedule.grid_at(epoch, batch_idx), epoch=epoch, batch_idx=batch_idx)
        if self._lr is not None:
            self._lr.set_position(epoch, batch_idx, int(trainer.num_training_batches))
        stage = self.schedule.stage_at(epoch)
        if self._manages_batchnorm and stage.bn != self._applied_bn:
            apply_bn_plan(pl_module, stage.bn)
            self._applied_bn = stage.bn

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.schedule is None or self._log is None:
            return
        epoch = trainer.current_epoch
        self._rng.batch_end(trainer.is_last_batch)
        self._meter.batch_end(self.schedule.grid_at(epoch, batch_idx))
        self._log.after_step(trainer, pl_module, epoch, batch_idx)

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._meter.pause()  # a loader rebuilt, workers started: not one iteration's wait

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Reload the train loader only where the grids change (the long-cycle shape, or the short cycle
        # that a fine-tuning phase drops), so Lightning reads the new epoch length; the DataModule decides the rest.
        if self.schedule is None:
            return
        if self._log is not None:
            self._log.at_epoch_end(trainer)
        changes = self.schedule.grids_change_after(trainer.current_epoch)
        self._change(trainer, "reload_dataloaders_every_n_epochs", 1 if changes else 0)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._meter.pause()  # validation is not time spent waiting for training data
        if self.schedule is not None and self._precise_bn.before_validation(trainer, pl_module, self.precise_bn_batches):
            self._applied_bn = None  # it ran at the base shape in plain mode; training resumes with its own plan

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.schedule is not None:
            datamodule = trainer.datamodule
            advice = datamodule.loading_advice() if isinstance(datamodule, LoadingAdviceDataModule) else None
            rank_zero_info(self._meter.summary(advice))

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._end_fit(trainer)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # Lightning skips `teardown` when fit raises; the Trainer may still be fitted again.
        self._end_fit(trainer)

    def _end_fit(self, trainer: pl.Trainer) -> None:
        """Undo what the callback changed outside itself for this fit."""
        if self._lr is not None:
            self._lr.detach()
        if self._unwatch_fetches is not None:
            self._unwatch_fetches()
            self._unwatch_fetches = None
        # Give the Trainer back the baseline's settings: a second `fit` sees what the user set.
        for name, value in self._trainer_settings.items():
            setattr(setting_owner(trainer, name), name, value)
        self._trainer_settings.clear()
        datamodule = trainer.datamodule
        if self.schedule is not None and isinstance(datamodule, GridDataModule):
            datamodule.serve(None)

    @override
    def state_dict(self) -> dict[str, Any]:
        plan = self._plan
        if plan is None or plan.schedule is None:
            return {}
        # Lightning saves checkpoints on every rank (only rank 0 writes): every rank's random state is gathered.
        rng = gather_rng_states(self._rng.state())
        return {"config": plan.schedule.config.to_dict(), "pretrained": plan.uses_pretrained, "rng": rng}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restored = dict(state_dict)
