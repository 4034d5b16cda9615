"""One stage of a multigrid schedule: its grid (batches from the config's sizer), short cycle and BatchNorm grouping.

Both builders (:mod:`~lightning_multigrid.schedule.allocation`, the paper's; :mod:`~lightning_multigrid.schedule.short_run`)
decide which long-cycle shape runs over which epochs and LR stage; :func:`build_stage` turns that
into a :class:`Stage`. Pure Python, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Literal

from lightning_multigrid.grid import GridShape
from lightning_multigrid.schedule.config import MultigridConfig

__all__ = ["BNPlan", "Stage", "batchnorm_groups", "build_stage", "plan_batchnorm"]


@dataclass(frozen=True, slots=True)
class BNPlan:
    """How BatchNorm groups samples for one epoch.

    ``plain``: statistics over the device's batch. ``split``: over ``num_splits`` interleaved
    groups of the device's batch. ``sync``: over the batches of ``group_size`` consecutive ranks.
    """

    mode: Literal["plain", "split", "sync"] = "plain"
    num_splits: int = 1
    group_size: int = 1

    def to_dict(self) -> dict[str, object]:
        if self.mode == "split":
            return {"mode": "split", "num_splits": self.num_splits}
        if self.mode == "sync":
            return {"mode": "sync", "group_size": self.group_size}
        return {"mode": "plain"}


@dataclass(frozen=True, slots=True)
class Stage:
    """A run of whole epochs ``[start_epoch, end_epoch)`` with one grid and one LR stage.

    Attributes:
        lr_stage: index of the baseline LR stage whose learning rate is used.
        shape: the long-cycle grid (per-device batch, frames, crop).
        lr_factor: long-cycle relative batch ``r`` (the stage's batch over the base batch: an
            integer by Equation 1, any ratio with batches sized by cost); the learning rate is
            multiplied by it.
        short_cycle: grids of iterations ``i % 3 == 0, 1, 2``; empty when the short cycle is off.
        bn: BatchNorm grouping, decided by the long-cycle batch (the short cycle keeps it).
        sampling_rate: ``(min, max)`` frame stride for clips of ``shape.num_frames`` frames.
        fine_tuning: whether this is (a half of) the fine-tuning phase.
    """

    start_epoch: int
    end_epoch: int
    lr_stage: int
    shape: GridShape
    lr_factor: float
    short_cycle: tuple[GridShape, ...]
    bn: BNPlan
    sampling_rate: tuple[float, float]
    fine_tuning: bool = False

    @property
    def num_epochs(self) -> int:
        return self.end_epoch - self.start_epoch


def plan_batchnorm(batch_size: int, bn_base_size: int, devices: int) -> BNPlan:
    """BatchNorm grouping so statistics cover about ``bn_base_size`` clips.

    Args:
        batch_size: long-cycle clips per device.
        bn_base_size: target clips per statistics group.
        devices: number of ranks.

    Raises:
        ValueError: when a cross-rank group of the needed size does not divide ``devices``.
    """
    if batch_size > bn_base_size:
        num_splits = round(batch_size / bn_base_size)
        return BNPlan("split", num_splits=num_splits) if num_splits > 1 else BNPlan()
    group_size = min(round(bn_base_size / batch_size), devices)
    if group_size <= 1:
        return BNPlan()
    if devices % group_size:
        raise ValueError(
            f"A batch of {batch_size} clips per device cannot be grouped into BatchNorm statistics of "
            f"`bn_base_size`={bn_base_size}: that needs groups of {group_size} ranks, which do not "
            f"divide `devices`={devices}. Choose a `bn_base_size` that is a multiple of the batch "
            "and whose ratio divides the device count."
        )
    return BNPlan("sync", group_size=group_size)


def build_stage(
    config: MultigridConfig,
    factors: tuple[float, float],
    start: int,
    end: int,
    lr_stage: int,
    *,
    full_grid: bool = False,
    fine_tuning: bool = False,
) -> Stage:
    """The stage of the long-cycle shape ``factors`` (``(t_factor, s_factor)``) over epochs ``[start, end)``.

    Args:
        full_grid: no short cycle (every iteration at the stage's shape), even where it is on.
        fine_tuning: the stage is (a half of) the fine-tuning phase.

    The batches, the short cycle's too, are the config's sizer's
    (:class:`~lightning_multigrid.schedule.sizing.BatchSizer`: Equation 1, or each grid's measured cost), the
    batch growth capped by the short-run mode; the LR factor and the BatchNorm grouping follow the
    long-cycle batch.
    """
    options = config.options
    num_frames, crop_size = config.grid_size(*factors)
    short_crops = config.short_cycle_crops() if options.trains_short_cycle and not full_grid else ()
    batches = config.sizer.stage_batches(
        num_frames, crop_size, short_crops, options.max_lr_factor, partial(batchnorm_groups, config)
    )
    shape = GridShape(batches.batch_size, num_frames, crop_size)
    short_cycle: tuple[GridShape, ...] = ()
    if short_crops:
        short_cycle = tuple(
            GridShape(batch, num_frames, short_crop) for batch, short_crop in zip(batches.short_cycle, short_crops)
        ) + (shape,)
    return Stage(
        start_epoch=start,
        end_epoch=end,
        lr_stage=lr_stage,
        shape=shape,
        lr_factor=batches.lr_factor,
        short_cycle=short_cycle,
        bn=_plan_batchnorm(config, shape.batch_size, batches.lr_factor),
        sampling_rate=config.clip_sampling.sampling_rate_range_for(num_frames, config.num_frames),
        fine_tuning=fine_tuning,
    )


def batchnorm_groups(config: MultigridConfig, batch_size: int) -> int:
    """The BatchNorm groups a long-cycle batch of ``batch_size`` clips is split into (1: not split)."""
    return _plan_batchnorm(config, batch_size, batch_size / config.batch_size).num_splits


def _plan_batchnorm(config: MultigridConfig, batch_size: int, lr_factor: float) -> BNPlan:
    """The BatchNorm grouping of a long-cycle batch (``bn_base_size`` scaled by ``lr_factor`` where asked)."""
    options = config.options
    bn_base_size = round(options.bn_base_size * (lr_factor if options.scale_bn_base_size else 1))
    return plan_batchnorm(batch_size, bn_base_size, config.devices)
