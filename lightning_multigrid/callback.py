"""MultigridCallback: the only class that changes the Trainer's settings.

It builds one schedule when fitting starts, from the DataModule's own base grid, hands it to the
DataModule (``serve``), and then only reads Trainer state, asks the schedule and applies the answer:
the epoch budget (``fit_loop.max_epochs``), the grid (the callback asks Lightning to reload the
train loader where the grids change), the learning rate (:mod:`~lightning_multigrid.lr`), BatchNorm
grouping, precise BN and logging. What it needs from a DataModule is :class:`GridDataModule`;
what it can use besides are the capability Protocols of :mod:`~lightning_multigrid.contracts`.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable
from typing import Any

from torch.nn.modules.batchnorm import _BatchNorm
from typing_extensions import override

from lightning_multigrid._checks import check_bool, check_int
from lightning_multigrid._internals import (
    drop_train_loader,
    ensure_train_loader,
    max_epochs_filled_in,
    setting_owner,
    watch_train_fetches,
)
from lightning_multigrid._lightning import Callback, either_package, pl, rank_zero_info, rank_zero_warn
from lightning_multigrid.batch_grid import BatchGridCheck
from lightning_multigrid.config import (
    DEFAULTS,
    BatchSizing,
    MultigridConfig,
    MultigridOptions,
    ShortRun,
    check_milestones,
    default_long_cycle_factors,
)
from lightning_multigrid.contracts import (
    GridDataModule,
    LoadingAdviceDataModule,
    MilestonesModule,
    PathwayDataModule,
    PreciseBNDataModule,
    PreflightModule,
    PretrainedModule,
    SizedDataModule,
    SkipCountingDataModule,
)
from lightning_multigrid.grid import GridShape
from lightning_multigrid.limits import check_val_interval, map_baseline_limits
from lightning_multigrid.lr import MultigridLR, check_schedulers, find_milestones
from lightning_multigrid.meter import DataWaitMeter
from lightning_multigrid.norm import (
    apply_bn_plan,
    convert_batchnorm,
    create_sync_groups,
)
from lightning_multigrid.plugins import check_no_torch_sync_batchnorm
from lightning_multigrid.preview import format_table
from lightning_multigrid.resume import check_same_base, check_same_length, resumed_pretrained_choice, start_resumed_fit
from lightning_multigrid.rng import EpochBoundaryRNG, gather_rng_states
from lightning_multigrid.schedule import MultigridSchedule, build_schedule
from lightning_multigrid.stages import BNPlan, Stage
from lightning_multigrid.step_log import StepLog

__all__ = ["MultigridCallback"]


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
        convert_batchnorm: replace the model's BatchNorm layers with :class:`~lightning_multigrid.norm.MultigridBatchNorm`
            so their grouping follows the schedule; off: plain BatchNorm (statistics vary with the
            batch). Nothing is converted with ``long_cycle=False``.
        manage_lr: map each step onto the baseline LR timeline and scale by the long-cycle
            factor. Turn off to leave the LR entirely to the user.
        precise_bn_batches: before a validation, when the weights changed since the last
            recomputation, recompute BatchNorm statistics at the base shape over this many
            training batches (0 turns it off). Needs a DataModule with ``precise_bn_dataloader()``.
        preflight: run one tiny forward per grid when fitting starts, to fail before training.
        long_cycle_factors: ``(t_factor, s_factor)`` per long-cycle shape, coarsest first. With
            the short cycle on, every long-cycle crop must be at least the short-cycle crops.
            ``None``: the paper's four, or for a short run from pretrained weights (a
            :class:`~lightning_multigrid.contracts.PretrainedModule` that says so) the pretrained
            default (:func:`~lightning_multigrid.config.default_long_cycle_factors`).
        short_cycle_factors: crop factors of the two smaller short-cycle iterations (``None``: the paper's).
        full_grid_share: at least this fraction of the baseline's iterations at the full grid,
            in a fine-tuning phase without short cycle (``0``: the paper's schedule).
        scale_bn_base_size: scale ``bn_base_size`` with each grid's relative batch, so BatchNorm
            statistics cover as many values on every grid.
        short_run: the short-run mode for runs of a few thousand optimizer steps: coarse grids at
            (about) the base batch first, then the full grid, over the baseline's epochs and LR
            schedule (``docs/finetuning-and-short-runs.md``). ``True``: with its default settings
            (``False`` or ``None``: off); a :class:`~lightning_multigrid.config.ShortRun` sets them
            (``coarse_share``: at most this fraction of the epochs on coarse grids;
            ``max_lr_factor``: largest batch growth, and LR factor, of a coarse grid); in YAML
            ``short_run: {coarse_share: 0.3}``.
        pretrained: whether the model starts from pretrained weights: picks the warm-up rule (the
            pretrained rule ramps a warm-up over its share of the baseline timeline; the
            from-scratch rule over the baseline warm-up's optimizer steps, safe for 8x batches at
            8x the LR from random weights) and the short-run default shapes. ``None``: the
            LightningModule's ``pretrained`` attribute says (``VideoClassifier`` has one); a module
            without one is taken as from scratch. The summary names the rule used. A checkpoint keeps the
            rule it trained with and a resume keeps it (a module that says otherwise is told; this
            argument asking for the other rule is refused before the first step).
        batch_sizing: ``"equation1"`` (the paper's batches, by frames x pixels); ``"flops"`` or
            ``"time"``: each grid's batch sized by its cost per clip for this model, measured once when
            fitting starts (:mod:`~lightning_multigrid.cost`), so an iteration costs what a base
            iteration costs; the LR factor and BatchNorm groups follow that batch. The costs are kept
            in the checkpoint (a resumed run does not measure again) and ranks use rank 0's.

    The multigrid options are checked here and kept as one value, :attr:`options` (a
    :class:`~lightning_multigrid.config.MultigridOptions`, which describes each and holds its
    default: the defaults above are read from it). Trainer settings are checked in
    ``setup``/``on_fit_start``, before the first step. Those changed for the fit (``max_epochs``:
    the multigrid count; ``max_steps``, ``val_check_interval``: mapped) get the user's values back
    after it, also when fit raises. How every Trainer setting is read, mapped or refused
    (precision, resume, a second ``fit``, ``BackboneFinetuning``...): ``docs/trainer.md``.

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
        # The schedule's own checks run as the options are built; those that need the base grid or
        # the Trainer run in setup.
        self.options = MultigridOptions(
            long_cycle=long_cycle,
            short_cycle=short_cycle,
            epoch_factor=epoch_factor,
            long_cycle_factors=DEFAULTS.long_cycle_factors if long_cycle_factors is None else long_cycle_factors,
            short_cycle_factors=DEFAULTS.short_cycle_factors if short_cycle_factors is None else short_cycle_factors,
            bn_base_size=bn_base_size,
            full_grid_share=full_grid_share,
            scale_bn_base_size=scale_bn_base_size,
            short_run=_short_run(short_run),
            pretrained=pretrained,
            batch_sizing=batch_sizing,
        )
        self._long_cycle_factors_given = long_cycle_factors is not None  # a user's choice always wins
        if milestones is not None:
            check_milestones(milestones)
        check_int("precise_bn_batches", precise_bn_batches, 0)
        for name, flag in (
            ("enabled", enabled), ("convert_batchnorm", convert_batchnorm), ("manage_lr", manage_lr),
            ("preflight", preflight),
        ):
            check_bool(name, flag)
        self.enabled = enabled
        self.milestones = milestones
        self.convert_batchnorm = convert_batchnorm
        self.manage_lr = manage_lr
        self.precise_bn_batches = precise_bn_batches
        self.preflight = preflight
        self._restored_config: dict[str, Any] | None = None
        self._restored_pretrained: bool | None = None  # the warm-up rule the checkpoint trained with
        self._restored_rng: list[dict[str, Any]] | None = None  # every rank's random state at the save
        self._lr: MultigridLR | None = None
        self._unwatch_fetches: Callable[[], None] | None = None  # undoes the meter's view of the loader's fetches
        self._reset_fit_state()

    def _reset_fit_state(self) -> None:
        """Forget everything a previous ``fit`` left (the object may serve another Trainer and model)."""
        self.schedule: MultigridSchedule | None = None
        self._baseline_max_epochs = 0
        if self._lr is not None:
            self._lr.detach()
        self._lr = None
        self._applied_bn: BNPlan | None = None
        self._precise_bn_done: tuple[int, int] | None = None  # (id of the module, global step)
        self._meter = DataWaitMeter()
        self._log: StepLog | None = None  # built with the schedule
        self._grid_check = BatchGridCheck()
        self._rng = EpochBoundaryRNG()
        self._pretrained_used: bool | None = None  # this fit's warm-up rule, kept in its checkpoints
        # Trainer settings the callback changes during fit, with their values to restore.
        self._trainer_settings: dict[str, Any] = {}

    # ---------------------------------------------------------------- set-up

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit" or not self.enabled:
            return
        self._reset_fit_state()
        # A checkpoint's state arrives after setup, in load_state_dict.
        self._restored_config = self._restored_pretrained = self._restored_rng = None
        _check_max_epochs(trainer)
        check_no_torch_sync_batchnorm(trainer)
        if not isinstance(trainer.datamodule, GridDataModule):
            raise ValueError(
                f"MultigridCallback needs a DataModule that serves multigrid grids, got "
                f"{type(trainer.datamodule).__name__}. Use `MultigridVideoDataModule`, or give yours "
                "`base_shape`, `clip_sampling` and `serve(plan)` and build its train loader with "
                "`ShortCycleBatchSampler(sampler, plan)` (see `GridDataModule`)."
            )
        if self.precise_bn_batches and not isinstance(trainer.datamodule, PreciseBNDataModule):
            rank_zero_warn(
                f"MultigridCallback(precise_bn_batches={self.precise_bn_batches}) recomputes BatchNorm statistics "
                f"at the base shape with the DataModule's `precise_bn_dataloader()`, which "
                f"{type(trainer.datamodule).__name__} does not have: validation uses the statistics of the last "
                "grid trained. Add `precise_bn_dataloader()`, or pass `precise_bn_batches=0` to silence this."
            )
        check_val_interval(trainer.val_check_interval, trainer.check_val_every_n_epoch)
        self._baseline_max_epochs = trainer.max_epochs
        if self._manages_batchnorm:
            convert_batchnorm(pl_module)

    @property
    def _manages_batchnorm(self) -> bool:
        # Without the long cycle the batch never changes, and the reference implementation keeps
        # the model's BatchNorm as it is: so do we (DESIGN.md section 1).
        return self.convert_batchnorm and self.options.long_cycle

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # After configure_optimizers: the user's schedulers exist and describe the baseline run.
        if not self.enabled:
            return
        datamodule = trainer.datamodule
        configs = trainer.lr_scheduler_configs
        check_schedulers(configs, manage_lr=self.manage_lr, milestones_given=self.milestones is not None)
        stepwise = any(c.interval == "step" for c in configs)
        needs_length = stepwise or trainer.max_steps != -1 or isinstance(trainer.val_check_interval, int)
        needs_length |= not self._long_cycle_factors_given and self._pretrained(pl_module)  # is the run short?
        batches_per_epoch = self._baseline_batches_per_epoch(trainer) if needs_length else 1
        steps_per_epoch = max(1, math.ceil(batches_per_epoch / trainer.accumulate_grad_batches))
        for name, value in map_baseline_limits(
            max_steps=trainer.max_steps, val_check_interval=trainer.val_check_interval,
            batches_per_epoch=batches_per_epoch, steps_per_epoch=steps_per_epoch, max_epochs=self._baseline_max_epochs,
        ).items():
            self._change(trainer, name, value)
        config = self._build_config(trainer, pl_module, steps_per_epoch)
        if config.sizes_by_cost and not config.clip_costs:  # a resumed run has the checkpoint's
            config = self._measure_clip_costs(trainer, pl_module, config)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.schedule = build_schedule(config)
        for warning in caught:
            rank_zero_info(f"multigrid: {warning.message}")

        self._change(trainer, "max_epochs", self.schedule.max_epochs)
        datamodule.serve(self.schedule)
        drop_train_loader(trainer)  # one built before now serves the baseline grid
        self._unwatch_fetches = watch_train_fetches(trainer, self._meter.fetch_start)
        if trainer.world_size > 1 and self._manages_batchnorm:
            create_sync_groups(s.bn.group_size for s in self.schedule.stages if s.bn.mode == "sync")
        if self.manage_lr:
            self._lr = MultigridLR.for_optimizers(
                self.schedule, trainer.optimizers, trainer.lr_scheduler_configs, steps_per_epoch, share=(pl_module, trainer),
                warmup_in_steps=not self._pretrained(pl_module),
            )
        self._pretrained_used = self._pretrained(pl_module)
        self._log = StepLog(
            self.schedule, manages_batchnorm=self._manages_batchnorm, lr=self._lr, meter=self._meter,
            skips=datamodule if isinstance(datamodule, SkipCountingDataModule) else None,
        )
        if self.preflight and not config.sizes_by_cost:  # with measured costs, checked before measuring
            self._preflight(pl_module, datamodule, self.schedule.distinct_grids())
        rank_zero_info(self._summary(datamodule, pl_module, trainer))

    def _build_config(self, trainer: pl.Trainer, pl_module: pl.LightningModule, steps_per_epoch: int) -> MultigridConfig:
        datamodule: GridDataModule = trainer.datamodule
        options = self.options
        if not self._long_cycle_factors_given:
            factors = default_long_cycle_factors(self._pretrained(pl_module), self._baseline_max_epochs * steps_per_epoch)
            options = dataclasses.replace(options, long_cycle_factors=factors)
        config = MultigridConfig(
            base=datamodule.base_shape,
            max_epochs=self._baseline_max_epochs,
            milestones=self._milestones(trainer, pl_module, steps_per_epoch),
            sampling_rate=datamodule.clip_sampling.sampling_rate,
            devices=trainer.world_size,
            jitter_scales=datamodule.clip_sampling.jitter_scales,
            options=options,
        )
        if self._restored_config is not None:
            # The checkpoint fixes the epochs (they must not move under a resumed run); the
            # BatchNorm plan follows the devices this run has, which may differ from the saved run's.
            restored = dataclasses.replace(MultigridConfig.from_dict(self._restored_config), devices=trainer.world_size)
            check_same_base(restored, config)
            check_same_length(restored, config)
            if dataclasses.replace(restored, clip_costs=()) != config:
                rank_zero_info(
                    "multigrid: the checkpoint's schedule settings differ from this run's; resuming "
                    f"the checkpoint's schedule ({restored})."
                )
            return restored
        return config

    def _milestones(self, trainer: pl.Trainer, pl_module: pl.LightningModule, steps_per_epoch: int) -> tuple[int, ...]:
        """The baseline's LR milestones: given, declared by the module (``lr_milestones``), or found."""
        if self.milestones is not None:
            return tuple(self.milestones)
        if isinstance(pl_module, MilestonesModule) and pl_module.lr_milestones is not None:
            return tuple(int(m) for m in pl_module.lr_milestones)
        found = find_milestones(trainer.lr_scheduler_configs, steps_per_epoch, self._baseline_max_epochs)
        if not found:
            rank_zero_info(
                "multigrid: no LR milestones found (no MultiStepLR/StepLR): the long cycle runs once over "
                "the whole training. Pass `MultigridCallback(milestones=[...])` for a step-like schedule."
            )
        return found

    def _baseline_batches_per_epoch(self, trainer: pl.Trainer) -> int:
        # Called before the schedule is attached, so this is the baseline loader's length (with
        # `limit_train_batches`), as the user's configure_optimizers saw it.
        ensure_train_loader(trainer)  # if nothing has yet
        return max(1, int(trainer.num_training_batches))

    def _change(self, trainer: pl.Trainer, name: str, value: Any) -> None:
        """Set a Trainer setting for this fit; :meth:`teardown` puts the user's value back."""
        owner = setting_owner(trainer, name)
        self._trainer_settings.setdefault(name, getattr(owner, name))
        setattr(owner, name, value)

    def _measure_clip_costs(self, trainer: pl.Trainer, pl_module: pl.LightningModule, config: MultigridConfig) -> MultigridConfig:
        """``config`` with each grid's measured cost per clip: rank 0's, so every rank builds the same schedule."""
        from lightning_multigrid.cost import implausible_costs_warning, measure_clip_costs

        datamodule = trainer.datamodule
        grids = config.cost_grids()
        if self.preflight:  # a grid the model cannot take fails here with the layer named, not while measuring
            self._preflight(pl_module, datamodule, grids)
        alpha = datamodule.slowfast_alpha if isinstance(datamodule, PathwayDataModule) else None
        method = config.options.batch_sizing
        assert method != "equation1"
        costs = measure_clip_costs(
            pl_module, grids, method, slowfast_alpha=alpha, device=pl_module.device,
            context=trainer.precision_plugin.forward_context,
        )
        config = dataclasses.replace(config, clip_costs=trainer.strategy.broadcast(costs, src=0))
        warning = implausible_costs_warning(config)
        if warning is not None:
            rank_zero_warn(f"multigrid: {warning}")
        return config

    def _preflight(self, pl_module: pl.LightningModule, datamodule: GridDataModule, grids: tuple[GridShape, ...]) -> None:
        from lightning_multigrid.models import preflight

        if isinstance(pl_module, PreflightModule):
            pl_module.preflight(grids)  # the module knows its own input format (e.g. pathways)
        elif any(type(pl_module).forward is getattr(module, "forward", None) for module in either_package("LightningModule")):
            rank_zero_info("multigrid: skipped the preflight check: the LightningModule has no `forward`.")
        else:
            alpha = datamodule.slowfast_alpha if isinstance(datamodule, PathwayDataModule) else None
            preflight(pl_module, grids, slowfast_alpha=alpha, device=pl_module.device)

    def _pretrained_choice(self, pl_module: pl.LightningModule) -> tuple[bool | None, str]:
        """Whether the run starts from pretrained weights (``None``: nobody says) and who says it: a resumed
        checkpoint's choice, else the callback's ``pretrained``, else the module's."""
        asked, source = self._asked_pretrained(pl_module)
        return resumed_pretrained_choice(
            self._restored_pretrained, asked, source, given_to_callback=self.options.pretrained is not None
        )

    def _asked_pretrained(self, pl_module: pl.LightningModule) -> tuple[bool | None, str]:
        """This fit's own choice of :meth:`_pretrained_choice` and who made it."""
        if self.options.pretrained is not None:
            return self.options.pretrained, f"`MultigridCallback(pretrained={self.options.pretrained})`"
        if isinstance(pl_module, PretrainedModule):
            return bool(pl_module.pretrained), f"the module's `pretrained` ({bool(pl_module.pretrained)})"
        return None, (
            f"{type(pl_module).__name__} has no `pretrained` attribute; pass `MultigridCallback(pretrained=True)` "
            "if it starts from pretrained weights"
        )

    def _pretrained(self, pl_module: pl.LightningModule) -> bool:
        """Whether the run starts from pretrained weights (from scratch when nobody says)."""
        return bool(self._pretrained_choice(pl_module)[0])

    def _summary(self, datamodule: GridDataModule, pl_module: pl.LightningModule, trainer: pl.Trainer) -> str:
        assert self.schedule is not None
        size = datamodule.train_dataset_size if isinstance(datamodule, SizedDataModule) else None
        pretrained, _ = self._pretrained_choice(pl_module)
        dataset_size = size if isinstance(size, int) and size > 0 else None
        hint = f"give {type(datamodule).__name__} a `train_dataset_size` property (its training clips)"
        has_batchnorm = any(isinstance(module, _BatchNorm) for module in pl_module.modules())
        table = format_table(
            self.schedule, dataset_size, self.convert_batchnorm, pretrained, size_hint=hint, has_batchnorm=has_batchnorm,
            limit_train_batches=trainer.limit_train_batches if trainer.limit_train_batches is not None else 1.0,
        )
        return "Multigrid schedule\n" + table + ("" if self._lr is None else "\n" + self._warmup_rule(pl_module))

    def _warmup_rule(self, pl_module: pl.LightningModule) -> str:
        """The summary line naming the warm-up rule and who chose it, or saying there is no warm-up."""
        assert self._lr is not None
        search = self._lr.warmup_search
        if search is not None and search.warmup is None:
            return f"warm-up: none ({search.describe()}), so no warm-up rule applies."
        found = "" if search is None else f"{search.describe()}; "
        pretrained, source = self._pretrained_choice(pl_module)
        if pretrained:
            return f"warm-up: pretrained rule ({found}a warm-up covers its share of the baseline timeline; {source})."
        return f"warm-up: from-scratch rule ({found}a warm-up lasts the baseline warm-up's optimizer steps; {source})."

    # ------------------------------------------------------------- training

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.schedule is None:
            return
        # On resume the train loader was built while `current_epoch` still named the checkpoint's
        # epoch, not the one about to run: ask for a rebuild (a no-op for a fresh run at epoch 0).
        self._change(trainer, "reload_dataloaders_every_n_epochs", 1)
        start_resumed_fit(trainer, has_multigrid_state=self._restored_config is not None)
        if self._restored_rng is not None:
            self._resume_rng(trainer, self._restored_rng)
        elif self._restored_config is not None and trainer.global_step > 0:
            rank_zero_info(
                "multigrid: the checkpoint holds no random state (saved by an earlier version): a model that draws "
                "random numbers in training (dropout) goes on with other draws than the uninterrupted run."
            )

    def _resume_rng(self, trainer: pl.Trainer, states: list[dict[str, Any]]) -> None:
        """Restore this rank's random state of the checkpoint before the first step (mind: each rank its own)."""
        if len(states) != trainer.world_size:
            rank_zero_info(
                f"multigrid: the checkpoint holds the random state of {len(states)} processes and this fit has "
                f"{trainer.world_size}: not restored (on another device count the resumed run cannot be exact anyway)."
            )
            return
        self._rng.resume_from(states[trainer.global_rank])

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
        stage = self._stage(epoch)
        if self._manages_batchnorm and stage.bn != self._applied_bn:
            apply_bn_plan(pl_module, stage.bn)
            self._applied_bn = stage.bn

    def _stage(self, epoch: int) -> Stage:
        assert self.schedule is not None, "MultigridCallback: the schedule is built in on_fit_start."
        return self.schedule.stage_at(epoch)

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
        # Reload the train loader only where the long-cycle shape (or the short cycle: a
        # `full_grid_share` fine-tuning drops it) changes, so Lightning reads the new epoch length
        # there; the DataModule decides whether that needs a new loader.
        if self.schedule is None:
            return
        if self._log is not None:
            self._log.at_epoch_end(trainer)
        epoch = trainer.current_epoch
        changes = self.schedule.cycle_at(epoch) != self.schedule.cycle_at(epoch + 1)
        self._change(trainer, "reload_dataloaders_every_n_epochs", 1 if changes else 0)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._meter.pause()  # validation is not time spent waiting for training data
        if trainer.sanity_checking or not self.precise_bn_batches or self.schedule is None:
            return
        datamodule = trainer.datamodule
        if not isinstance(datamodule, PreciseBNDataModule):
            return  # warned in setup
        # Only when the weights changed since the last run (a second validation at the same
        # step, or `trainer.validate()` after fit, would only redraw the statistics).
        done = (id(pl_module), trainer.global_step)
        if done == self._precise_bn_done:
            return
        from lightning_multigrid.precise_bn import update_bn_stats

        update_bn_stats(trainer, pl_module, datamodule.precise_bn_dataloader(), self.precise_bn_batches)
        self._precise_bn_done = done
        # Precise BN ran at the base shape in plain mode; training resumes with its own plan.
        self._applied_bn = None

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
        # Give the Trainer back the baseline's settings, so a second `fit` sees what the user
        # set, not the multigrid run's epochs.
        for name, value in self._trainer_settings.items():
            setattr(setting_owner(trainer, name), name, value)
        self._trainer_settings.clear()
        datamodule = trainer.datamodule
        if self.schedule is not None and isinstance(datamodule, GridDataModule):
            datamodule.serve(None)

    # --------------------------------------------------------------- resume

    @override
    def state_dict(self) -> dict[str, Any]:
        if self.schedule is None:
            return {}
        # Lightning saves checkpoints on every rank (only rank 0 writes): every rank's random state is gathered.
        rng = gather_rng_states(self._rng.state())
        return {"config": self.schedule.config.to_dict(), "pretrained": self._pretrained_used, "rng": rng}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restored_config = state_dict.get("config")
        self._restored_pretrained = state_dict.get("pretrained")
        self._restored_rng = state_dict.get("rng")


def _check_max_epochs(trainer: pl.Trainer) -> None:
    """Refuse a Trainer without the baseline's ``max_epochs`` (Lightning fills in 1000 or -1 before ``setup``)."""
    max_epochs = trainer.max_epochs
    if max_epochs_filled_in(trainer):
        raise ValueError(
            f"MultigridCallback needs the baseline's epochs as `Trainer(max_epochs=...)`, and it was not given: Lightning "
            f"filled in its default {max_epochs} (which would plan {max_epochs} baseline epochs). Pass `max_epochs`. "
            f"(Lightning keeps no record of what was given, so a given {max_epochs} reads the same: for a baseline of "
            f"exactly {max_epochs} epochs, give `max_steps` too, at least its optimizer steps.)"
        )
    if max_epochs is None or max_epochs < 1:
        raise ValueError(
            f"MultigridCallback needs the baseline's epochs as `Trainer(max_epochs=...)`, got {max_epochs!r} (no epoch "
            "limit: what Lightning sets when `max_epochs` is not given but `max_steps` is). Pass `max_epochs`; "
            "`max_steps` cannot set the schedule's length (docs/trainer.md)."
        )


def _short_run(short_run: bool | ShortRun | None) -> ShortRun | None:
    """The callback's ``short_run`` as the options hold it: ``True`` is the mode with its defaults."""
    if short_run is None or isinstance(short_run, ShortRun):
        return short_run
    if short_run is True:
        return ShortRun()
    if short_run is False:
        return None
    raise ValueError(
        f"`short_run` must be True, False or a ShortRun(coarse_share, max_lr_factor), got {short_run!r}."
    )
