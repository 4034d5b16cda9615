"""The multigrid schedule (Wu et al., CVPR 2020): pure Python, no torch.

A schedule is built once from the baseline run's settings and the multigrid options
(:class:`~lightning_multigrid.schedule.config.MultigridConfig`) and answers, for any 0-based epoch (and
iteration, for the short cycle), which grid to train on, with which learning-rate factor and
which BatchNorm grouping. Everything here is plain numbers; the Lightning callback and the data
module only read it.

Example::

    schedule = build_schedule(MultigridConfig(
        base=GridShape(batch_size=8, num_frames=32, crop_size=224), sampling_rate=2,
        milestones=(94, 154, 196), max_epochs=239, devices=8))
    schedule.max_epochs                # 358
    schedule.stage_at(0).shape         # GridShape(batch_size=64, num_frames=8, crop_size=158)
    schedule.grid_at(0, 0)             # GridShape(batch_size=128, num_frames=8, crop_size=112)

Where the parts live: the options and the config in :mod:`~lightning_multigrid.schedule.config`, a stage
(its grid, short cycle and BatchNorm plan) in :mod:`~lightning_multigrid.schedule.stages`, the paper's
allocation of epochs in :mod:`~lightning_multigrid.schedule.allocation`, the short-run mode in
:mod:`~lightning_multigrid.schedule.short_run`; this module holds the schedule value, its queries and
:func:`build_schedule`, and re-exports the names users import from it. The grid facts
(``GridShape``, ``ClipSampling``, ``count_batches``) live in :mod:`lightning_multigrid.grid`; a
``MultigridSchedule`` is a :class:`~lightning_multigrid.grid.GridPlan`.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from lightning_multigrid.grid import ClipSampling, GridShape, count_batches
from lightning_multigrid.schedule.allocation import ShortScheduleWarning, allocate_stages
from lightning_multigrid.schedule.config import (
    DEFAULT_LONG_CYCLE_FACTORS,
    DEFAULT_SHORT_CYCLE_FACTORS,
    PRETRAINED_LONG_CYCLE_FACTORS,
    SHORT_RUN_BASELINE_STEPS,
    MultigridConfig,
    MultigridOptions,
    ShortRun,
    check_milestones,
    default_long_cycle_factors,
)
from lightning_multigrid.schedule.short_run import short_run_stages
from lightning_multigrid.schedule.stages import BNPlan, Stage, plan_batchnorm

__all__ = [
    # Defined here.
    "GridCount",
    "MultigridSchedule",
    "build_schedule",
    "grid_counts",
    # Re-exported where users import them from (defined in config, stages, allocation, grid).
    "DEFAULT_LONG_CYCLE_FACTORS",
    "DEFAULT_SHORT_CYCLE_FACTORS",
    "PRETRAINED_LONG_CYCLE_FACTORS",
    "SHORT_RUN_BASELINE_STEPS",
    "BNPlan",
    "GridShape",
    "MultigridConfig",
    "MultigridOptions",
    "ShortRun",
    "ShortScheduleWarning",
    "Stage",
    "check_milestones",
    "default_long_cycle_factors",
    "plan_batchnorm",
]


@dataclass(frozen=True, slots=True)
class GridCount:
    """What one grid gets over a whole multigrid run, per device.

    Attributes:
        grid: the grid (per-device batch, frames, crop).
        iterations: optimizer steps on this grid.
        clips: clips trained on this grid (the sum of its batches; an epoch's last batch may
            be partial).
    """

    grid: GridShape
    iterations: int
    clips: int


@dataclass(frozen=True, slots=True)
class MultigridSchedule:
    """The whole multigrid training plan: contiguous, non-empty stages covering all epochs.

    A :class:`~lightning_multigrid.grid.GridPlan`: the batch sampler and the DataModule read it
    as they read the baseline's :class:`~lightning_multigrid.grid.FixedGrid`.

    Build it with :func:`build_schedule`. All epochs and iterations are 0-based.
    """

    config: MultigridConfig
    stages: tuple[Stage, ...]
    # Multigrid epoch where each baseline LR stage starts, plus the end; maps LR progress.
    lr_stage_starts: tuple[int, ...]
    _stage_ends: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_stage_ends", tuple(s.end_epoch for s in self.stages))

    @property
    def max_epochs(self) -> int:
        """Multigrid epochs in total."""
        return self.stages[-1].end_epoch

    @property
    def base_shape(self) -> GridShape:
        """The baseline grid the schedule was built from."""
        return self.config.base

    @property
    def clip_sampling(self) -> ClipSampling:
        """The baseline frame stride and jitter scales."""
        return self.config.clip_sampling

    def epoch_spans(self) -> tuple[tuple[int, int | None], ...]:
        """Each stage's epochs ``[start_epoch, end_epoch)``."""
        return tuple((s.start_epoch, s.end_epoch) for s in self.stages)

    def stage_at(self, epoch: int) -> Stage:
        """The stage that contains ``epoch``; epochs past the end stay in the last stage."""
        if epoch < 0:
            raise ValueError(f"`epoch` must be >= 0, got {epoch!r}.")
        index = bisect.bisect_right(self._stage_ends, epoch)
        return self.stages[min(index, len(self.stages) - 1)]

    def grid_at(self, epoch: int, iteration: int) -> GridShape:
        """The grid of 0-based ``iteration`` of ``epoch``: its short-cycle grid, or the stage's shape without one."""
        cycle = self.cycle_at(epoch)
        return cycle[iteration % len(cycle)]

    def sampling_rate_range_at(self, epoch: int) -> tuple[float, float]:
        """``(min, max)`` frame stride of ``epoch``'s clips: the stage's ``sampling_rate``."""
        return self.stage_at(epoch).sampling_rate

    def relative_lr_at(self, epoch: int) -> float:
        """``gamma ** lr_stage * lr_factor``: the reference implementation's relative LR."""
        stage = self.stage_at(epoch)
        return self.config.gamma**stage.lr_stage * stage.lr_factor

    def jitter_scales_for(self, crop_size: int) -> tuple[int, int]:
        """Short-side range in pixels for a crop: the minimum scales with the crop, the maximum not."""
        return self.config.clip_sampling.jitter_scales_for(crop_size, self.config.crop_size)

    def baseline_epoch_at(self, epoch: float) -> float:
        """Map a (fractional) multigrid epoch onto the baseline run's timeline.

        Multigrid LR stage ``i`` (``lr_stage_starts[i]`` to ``lr_stage_starts[i+1]``) covers
        baseline LR stage ``i`` linearly, so a schedule written for the baseline (step, cosine,
        warm-up, one-cycle) sees baseline progress.
        """
        starts = self.lr_stage_starts
        epoch = min(max(epoch, 0.0), float(starts[-1]))
        i = min(bisect.bisect_right(starts, epoch) - 1, len(starts) - 2)
        base_start, base_end = self.config.lr_stage_bounds(i)
        progress = (epoch - starts[i]) / (starts[i + 1] - starts[i])
        return base_start + progress * (base_end - base_start)

    def iterations_in_epoch(self, epoch: int, dataset_size: int) -> int:
        """Iterations per device of ``epoch`` over ``dataset_size`` clips, equal on every rank.

        Each rank gets ``ceil(dataset_size / devices)`` clips (padded, as ``DistributedSampler``
        does); the last batch may be partial.
        """
        return sum(c.iterations for c in self.epoch_grid_counts(epoch, dataset_size))

    def epoch_grid_counts(self, epoch: int, dataset_size: int) -> tuple[GridCount, ...]:
        """Iterations and clips per device of each grid of ``epoch``, in short-cycle order.

        Iteration ``i`` runs grid ``i % len(cycle)``; the epoch ends when its
        ``ceil(dataset_size / devices)`` clips are served, so the last batch may be partial.
        """
        if dataset_size <= 0:
            raise ValueError(f"`dataset_size` must be a positive integer, got {dataset_size!r}.")
        cycle = self.cycle_at(epoch)
        clips = math.ceil(dataset_size / self.config.devices)
        counts = count_batches(clips, [grid.batch_size for grid in cycle])
        return tuple(GridCount(grid, iterations, served) for grid, (iterations, served) in zip(cycle, counts))

    def cycle_at(self, epoch: int) -> tuple[GridShape, ...]:
        """The grids iterations of ``epoch`` go through in turn: the short cycle, or the stage's shape."""
        stage = self.stage_at(epoch)
        return stage.short_cycle or (stage.shape,)

    def grids_change_after(self, epoch: int) -> bool:
        """Whether ``epoch + 1`` iterates other grids than ``epoch`` (a new long-cycle shape, or the short cycle
        that a fine-tuning phase drops): where a train loader must be built again."""
        return self.cycle_at(epoch) != self.cycle_at(epoch + 1)

    def sync_group_sizes(self) -> tuple[int, ...]:
        """The rank counts whose BatchNorm statistics are synchronised in some stage (``BNPlan`` mode "sync")."""
        return tuple(stage.bn.group_size for stage in self.stages if stage.bn.mode == "sync")

    def total_iterations(self, dataset_size: int) -> int:
        """Iterations per device over the whole multigrid run."""
        return sum(s.num_epochs * self.iterations_in_epoch(s.start_epoch, dataset_size) for s in self.stages)

    def baseline_iterations(self, dataset_size: int) -> int:
        """Iterations per device of the baseline run (fixed base shape, ``max_epochs`` epochs)."""
        clips = math.ceil(dataset_size / self.config.devices)
        return self.config.max_epochs * math.ceil(clips / self.config.batch_size)

    def distinct_grids(self) -> tuple[GridShape, ...]:
        """Every grid training will see, in order of first use."""
        grids: dict[GridShape, None] = {}
        for stage in self.stages:
            for grid in self.cycle_at(stage.start_epoch):
                grids[grid] = None
        return tuple(grids)


def grid_counts(schedule: MultigridSchedule, dataset_size: int) -> tuple[GridCount, ...]:
    """Iterations and clips per device that each distinct grid gets over the whole run.

    Grids are listed in order of first use; a grid used in several stages (the full grid in the
    last long-cycle shape and in fine-tuning) is counted once, with its totals.

    Args:
        schedule: the multigrid schedule.
        dataset_size: clips (videos) in the training set, over all devices.

    Raises:
        ValueError: when ``dataset_size`` is not positive.
    """
    totals: dict[GridShape, tuple[int, int]] = {}
    for stage in schedule.stages:
        for count in schedule.epoch_grid_counts(stage.start_epoch, dataset_size):
            iterations, clips = totals.get(count.grid, (0, 0))
            totals[count.grid] = (
                iterations + count.iterations * stage.num_epochs,
                clips + count.clips * stage.num_epochs,
            )
    return tuple(GridCount(grid, iterations, clips) for grid, (iterations, clips) in totals.items())


def build_schedule(config: MultigridConfig) -> MultigridSchedule:
    """Build the multigrid schedule for ``config`` (DESIGN.md, section 1).

    The short-run mode (:mod:`~lightning_multigrid.schedule.short_run`) when ``config.options.short_run``
    is set, the paper's allocation (:mod:`~lightning_multigrid.schedule.allocation`) otherwise.
    Warns with :class:`ShortScheduleWarning` and drops the shortest long-cycle shapes when there
    are fewer epochs than shapes.

    Raises:
        ValueError: when a batch cannot be grouped for BatchNorm, or there are fewer multigrid
            epochs than baseline LR stages.
    """
    short_run = config.options.short_run
    stages, lr_stage_starts = (
        short_run_stages(config, short_run) if short_run is not None else allocate_stages(config)
    )
    return MultigridSchedule(config, stages, lr_stage_starts)
