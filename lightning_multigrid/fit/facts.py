"""The run's side of a fit plan: what ``MultigridCallback`` reads from the Trainer, the module and the DataModule.

:func:`check_trainer` refuses in ``setup`` what cannot train multigrid; :func:`read_fit` reads, in
one place, everything :func:`~lightning_multigrid.fit.plan.plan_fit` decides from
(:class:`~lightning_multigrid.fit.plan.FitFacts`); :func:`with_measured_costs` measures the grids
the plan names, and :func:`preflight_grids` checks the model takes them. Deciding is the plan's job.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from torch.nn.modules.batchnorm import _BatchNorm

from lightning_multigrid._internals import ensure_train_loader, max_epochs_filled_in
from lightning_multigrid._lightning import either_package, pl, rank_zero_info, rank_zero_warn
from lightning_multigrid.contracts import (
    GridDataModule,
    MilestonesModule,
    PathwayDataModule,
    PreciseBNDataModule,
    PreflightModule,
    PretrainedModule,
    SizedDataModule,
)
from lightning_multigrid.fit.plan import FitFacts, FitPlan, needs_baseline_length
from lightning_multigrid.grid import GridShape
from lightning_multigrid.plugins import check_no_torch_sync_batchnorm
from lightning_multigrid.schedule.config import MultigridOptions
from lightning_multigrid.schedule.limits import check_val_interval
from lightning_multigrid.schedule.lr import find_milestones

__all__ = ["check_trainer", "preflight_grids", "read_fit", "with_measured_costs"]


def check_trainer(trainer: pl.Trainer, precise_bn_batches: int) -> None:
    """Refuse, before the first step, a Trainer or DataModule the callback cannot train with; warn on a
    missing precise-BN loader.

    Raises:
        ValueError: no baseline ``max_epochs``, ``sync_batchnorm=True`` with several devices, a DataModule
            that is not a :class:`~lightning_multigrid.contracts.GridDataModule`, or an integer
            ``val_check_interval`` counted across epochs.
    """
    _check_max_epochs(trainer)
    check_no_torch_sync_batchnorm(trainer)
    datamodule = trainer.datamodule
    if not isinstance(datamodule, GridDataModule):
        raise ValueError(
            f"MultigridCallback needs a DataModule that serves multigrid grids, got "
            f"{type(datamodule).__name__}. Use `MultigridVideoDataModule`, or give yours "
            "`base_shape`, `clip_sampling` and `serve(plan)` and build its train loader with "
            "`ShortCycleBatchSampler(sampler, plan)` (see `GridDataModule`)."
        )
    if precise_bn_batches and not isinstance(datamodule, PreciseBNDataModule):
        rank_zero_warn(
            f"MultigridCallback(precise_bn_batches={precise_bn_batches}) recomputes BatchNorm statistics "
            f"at the base shape with the DataModule's `precise_bn_dataloader()`, which "
            f"{type(datamodule).__name__} does not have: validation uses the statistics of the last "
            "grid trained. Add `precise_bn_dataloader()`, or pass `precise_bn_batches=0` to silence this."
        )
    check_val_interval(trainer.val_check_interval, trainer.check_val_every_n_epoch)


def read_fit(
    trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: Mapping[str, Any], max_epochs: int,
    options: MultigridOptions, *, long_cycle_factors_given: bool,
) -> FitFacts:
    """What the plan needs from the Trainer, the module, the DataModule and a resumed checkpoint.

    Called after ``configure_optimizers``, so the user's schedulers exist and describe the baseline.
    The baseline's batches per epoch are read only where :func:`~lightning_multigrid.fit.plan.needs_baseline_length`
    says, as reading them may build the train loader.

    Args:
        trainer: the Trainer, in ``on_fit_start``.
        pl_module: the LightningModule.
        checkpoint: the callback's state of a resumed checkpoint (empty for a fresh fit).
        max_epochs: the baseline's epochs, read in ``setup`` before the fit changes them.
        options: the callback's multigrid options.
        long_cycle_factors_given: whether the user named the long-cycle shapes.
    """
    datamodule: GridDataModule = trainer.datamodule
    configs = trainer.lr_scheduler_configs
    size = datamodule.train_dataset_size if isinstance(datamodule, SizedDataModule) else None
    milestones = pl_module.lr_milestones if isinstance(pl_module, MilestonesModule) else None
    facts = FitFacts(
        base=datamodule.base_shape, clip_sampling=datamodule.clip_sampling, max_epochs=max_epochs,
        devices=trainer.world_size, max_steps=trainer.max_steps, val_check_interval=trainer.val_check_interval,
        accumulate_grad_batches=trainer.accumulate_grad_batches,
        limit_train_batches=1.0 if trainer.limit_train_batches is None else trainer.limit_train_batches,
        stepwise_lr=any(c.interval == "step" for c in configs),
        module_name=type(pl_module).__name__,
        module_pretrained=bool(pl_module.pretrained) if isinstance(pl_module, PretrainedModule) else None,
        module_milestones=None if milestones is None else tuple(int(m) for m in milestones),
        has_batchnorm=any(isinstance(module, _BatchNorm) for module in pl_module.modules()),
        datamodule_name=type(datamodule).__name__,
        dataset_size=size if isinstance(size, int) and size > 0 else None,
        checkpoint_config=checkpoint.get("config"),
        checkpoint_pretrained=checkpoint.get("pretrained"),
    )
    if needs_baseline_length(facts, options, long_cycle_factors_given=long_cycle_factors_given):
        # Before the schedule is served: the baseline loader's length (with `limit_train_batches`),
        # as the user's configure_optimizers saw it.
        ensure_train_loader(trainer)  # if nothing has yet
        facts = dataclasses.replace(facts, batches_per_epoch=max(1, int(trainer.num_training_batches)))
    return dataclasses.replace(facts, scheduler_milestones=find_milestones(configs, facts.steps_per_epoch, max_epochs))


def with_measured_costs(trainer: pl.Trainer, pl_module: pl.LightningModule, plan: FitPlan, *, preflight: bool) -> FitPlan:
    """``plan`` with each grid of its ``grids_to_measure`` measured (:func:`~lightning_multigrid.schedule.cost.measure_clip_costs`):
    rank 0's costs, so every rank builds the same schedule. With ``preflight``, the model is checked on the grids first.
    ``plan`` itself when it names none (batches by Equation 1, or a resume, which has the checkpoint's costs)."""
    grids = plan.grids_to_measure
    if not grids:
        return plan
    from lightning_multigrid.schedule.cost import implausible_costs_warning, measure_clip_costs

    datamodule = trainer.datamodule
    if preflight:  # a grid the model cannot take fails here with the layer named, not while measuring
        preflight_grids(pl_module, datamodule, grids)
    alpha = datamodule.slowfast_alpha if isinstance(datamodule, PathwayDataModule) else None
    method = plan.config.sizer.measure
    assert method is not None, "grids to measure come from a sizing by measured cost"
    costs = measure_clip_costs(
        pl_module, grids, method, slowfast_alpha=alpha, device=pl_module.device,
        context=trainer.precision_plugin.forward_context,
    )
    plan = plan.with_clip_costs(trainer.strategy.broadcast(costs, src=0))
    warning = implausible_costs_warning(plan.config)
    if warning is not None:
        rank_zero_warn(f"multigrid: {warning}")
    return plan


def preflight_grids(pl_module: pl.LightningModule, datamodule: GridDataModule, grids: Sequence[GridShape]) -> None:
    """One tiny forward per grid, to fail before training (with the layer named) where the model cannot take one."""
    from lightning_multigrid.models import preflight

    if isinstance(pl_module, PreflightModule):
        pl_module.preflight(grids)  # the module knows its own input format (e.g. pathways)
    elif any(type(pl_module).forward is getattr(module, "forward", None) for module in either_package("LightningModule")):
        rank_zero_info("multigrid: skipped the preflight check: the LightningModule has no `forward`.")
    else:
        alpha = datamodule.slowfast_alpha if isinstance(datamodule, PathwayDataModule) else None
        preflight(pl_module, grids, slowfast_alpha=alpha, device=pl_module.device)


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
