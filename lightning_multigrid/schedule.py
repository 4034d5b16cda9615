"""The multigrid schedule (Wu et al., CVPR 2020): pure Python, no torch.

A schedule is built once from the baseline run's settings and answers, for any 0-based epoch
(and iteration, for the short cycle), which grid to train on, with which learning-rate factor
and which BatchNorm grouping. Everything here is plain numbers; the Lightning callback and the
data module only read it.

Example::

    schedule = build_schedule(MultigridConfig(
        base=GridShape(batch_size=8, num_frames=32, crop_size=224), sampling_rate=2,
        milestones=(94, 154, 196), max_epochs=239, devices=8))
    schedule.max_epochs                # 358
    schedule.stage_at(0).shape         # GridShape(batch_size=64, num_frames=8, crop_size=158)
    schedule.grid_at(0, 0)             # GridShape(batch_size=128, num_frames=8, crop_size=112)

The grid facts (``GridShape``, ``ClipSampling``, ``count_batches``) live in
:mod:`lightning_multigrid.grid`; a ``MultigridSchedule`` is a :class:`~lightning_multigrid.grid.GridPlan`.
"""

from __future__ import annotations

import bisect
import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from lightning_multigrid._checks import check_bool, check_positive_int, check_positive_number, is_number
from lightning_multigrid.grid import ClipSampling, GridShape, count_batches

__all__ = [
    "DEFAULT_LONG_CYCLE_FACTORS",
    "DEFAULT_SHORT_CYCLE_FACTORS",
    "MULTIGRID_OPTIONS",
    "PRETRAINED_LONG_CYCLE_FACTORS",
    "SHORT_RUN_BASELINE_STEPS",
    "BNPlan",
    "GridCount",
    "GridShape",
    "MultigridConfig",
    "MultigridSchedule",
    "ShortScheduleWarning",
    "Stage",
    "build_schedule",
    "check_milestones",
    "check_options",
    "default_long_cycle_factors",
    "grid_counts",
    "plan_batchnorm",
]

# (t_factor, s_factor) of the long-cycle base shapes, coarsest first (paper, Section 3.2).
DEFAULT_LONG_CYCLE_FACTORS: tuple[tuple[float, float], ...] = (
    (0.25, 0.5**0.5),
    (0.5, 0.5**0.5),
    (0.5, 1.0),
    (1.0, 1.0),
)
# Crop factors of the first two short-cycle iterations, relative to the baseline crop.
DEFAULT_SHORT_CYCLE_FACTORS: tuple[float, float] = (0.5, 0.5**0.5)
# Runs of fewer baseline optimizer steps per device are short: below multigrid's published regime.
SHORT_RUN_BASELINE_STEPS = 10_000
# The default long-cycle shapes of a short run that starts from pretrained weights. To be chosen from
# the accuracy map (benchmarks/accuracy.py --map, docs/accuracy.md): the option that stays within 1
# point of the baseline on both fine-tuning tasks at the largest CPU saving. Until that map is taken
# on a quiet machine, the paper's shapes.
PRETRAINED_LONG_CYCLE_FACTORS: tuple[tuple[float, float], ...] = DEFAULT_LONG_CYCLE_FACTORS


class ShortScheduleWarning(UserWarning):
    """The schedule is too short for every long-cycle shape to get a whole epoch."""


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
        lr_factor: long-cycle relative batch ``r``; the learning rate is multiplied by it.
        short_cycle: grids of iterations ``i % 3 == 0, 1, 2``; empty when the short cycle is off.
        bn: BatchNorm grouping, decided by the long-cycle batch (the short cycle keeps it).
        sampling_rate: ``(min, max)`` frame stride for clips of ``shape.num_frames`` frames.
        fine_tuning: whether this is (a half of) the fine-tuning phase.
    """

    start_epoch: int
    end_epoch: int
    lr_stage: int
    shape: GridShape
    lr_factor: int
    short_cycle: tuple[GridShape, ...]
    bn: BNPlan
    sampling_rate: tuple[float, float]
    fine_tuning: bool = False

    @property
    def num_epochs(self) -> int:
        return self.end_epoch - self.start_epoch


@dataclass(frozen=True, slots=True)
class MultigridConfig:
    """The baseline run's settings and the multigrid options.

    Args:
        base: the baseline grid ``B x T x S``: clips per device, frames per clip, crop in pixels.
        max_epochs: baseline number of epochs.
        milestones: epochs (0-based) where the baseline LR stages after the first start,
            strictly increasing, each in ``(0, max_epochs)``.
        sampling_rate: baseline frame stride ``tau``, a positive integer.
        gamma: LR decay per baseline stage (used for ``relative_lr`` only).
        devices: number of devices (ranks) training together.
        long_cycle: vary frames and crop over epochs.
        short_cycle: vary the crop every iteration.
        epoch_factor: multigrid epochs relative to ``max_epochs``.
        long_cycle_factors: ``(t_factor, s_factor)`` per long-cycle shape, coarsest first,
            each factor in ``(0, 1]``; the last one is usually ``(1, 1)``.
        short_cycle_factors: crop factors of the two smaller short-cycle iterations, in
            ``(0, 1]``, relative to the baseline crop. With both cycles on, no short-cycle crop may
            exceed a long-cycle crop (the short cycle would enlarge the crop).
        bn_base_size: clips over which BatchNorm computes statistics.
        scale_bn_base_size: multiply ``bn_base_size`` by each long-cycle shape's relative batch
            ``r``, so a statistic covers as many values (clips x frames x pixels) on every grid
            as at the base shape; the paper keeps the clips fixed, so on the coarsest grid a
            statistic covers ``r`` times fewer values.
        jitter_scales: ``(min, max)`` short side in pixels before the baseline crop; default
            :func:`~lightning_multigrid.grid.default_jitter_scales` (``(256, 320) * S / 224``).
        full_grid_share: at least this fraction of the baseline's iterations run at the full
            grid (base batch, frames and crop): the fine-tuning phase drops the short cycle and
            lasts ``ceil(full_grid_share * max_epochs)`` epochs or the paper's length, whichever
            is longer (one is added when the schedule has none). ``0`` keeps the paper's
            schedule exactly. For data whose classes differ by detail that only the full grid
            resolves, on short schedules (docs/accuracy.md).
        short_run: the short-run mode, for runs of a few thousand iterations (progressive
            resizing, as Composer's ``ProgressiveResizing`` and FFCV do): the coarse grids of
            ``long_cycle_factors`` (those below the base shape) keep the base batch, or grow it by
            at most ``short_run_max_lr_factor`` (the LR factor); together they take at most
            ``short_run_coarse_share`` of the baseline's epochs, coarsest first, each grid's share
            proportional to ``1 / r`` (``r``: its Equation 1 cost ratio), so the mild grids get
            most of it and a coarse grid that rounds to no epoch is left out; the remaining epochs
            run at the full grid. ``max_epochs`` stays the baseline's and the LR stages stay at the
            baseline's milestones (the user's LR schedule maps one to one). The short cycle,
            ``epoch_factor`` and the fine-tuning phase are not used.
        short_run_coarse_share: at most this fraction of the baseline's epochs on coarse grids
            (short-run mode), in ``[0, 1)``.
        short_run_max_lr_factor: largest batch growth (= LR factor) of a coarse grid in the
            short-run mode, an integer >= 1 (1: every grid keeps the base batch and the run keeps
            the baseline's optimizer steps).
    """

    base: GridShape
    max_epochs: int
    milestones: tuple[int, ...] = ()
    sampling_rate: int = 1
    gamma: float = 0.1
    devices: int = 1
    long_cycle: bool = True
    short_cycle: bool = True
    epoch_factor: float = 1.5
    long_cycle_factors: tuple[tuple[float, float], ...] = DEFAULT_LONG_CYCLE_FACTORS
    short_cycle_factors: tuple[float, float] = DEFAULT_SHORT_CYCLE_FACTORS
    bn_base_size: int = 8
    jitter_scales: tuple[int, int] | None = None
    full_grid_share: float = 0.0
    scale_bn_base_size: bool = False
    short_run: bool = False
    short_run_coarse_share: float = 0.5
    short_run_max_lr_factor: int = 1
    _clip_sampling: ClipSampling = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.base, GridShape):
            raise TypeError(f"`base` must be a GridShape(batch_size, num_frames, crop_size), got {self.base!r}.")
        check_options(**{name: getattr(self, name) for name in MULTIGRID_OPTIONS})
        for name in ("max_epochs", "devices"):
            check_positive_int(name, getattr(self, name))
        check_positive_number("gamma", self.gamma)
        check_milestones(self.milestones, self.max_epochs)
        sampling = ClipSampling(self.sampling_rate, self.jitter_scales)
        sampling.check_fits(self.crop_size)
        object.__setattr__(self, "_clip_sampling", sampling)
        object.__setattr__(self, "jitter_scales", sampling.jitter_scales)
        object.__setattr__(self, "milestones", tuple(self.milestones))
        object.__setattr__(self, "long_cycle_factors", tuple(tuple(f) for f in self.long_cycle_factors))
        object.__setattr__(self, "short_cycle_factors", tuple(self.short_cycle_factors))
        if self.long_cycle and self.short_cycle:
            self._check_short_cycle_crops()

    @property
    def batch_size(self) -> int:
        """Baseline clips per device ``B``."""
        return self.base.batch_size

    @property
    def num_frames(self) -> int:
        """Baseline frames per clip ``T``."""
        return self.base.num_frames

    @property
    def crop_size(self) -> int:
        """Baseline crop ``S`` in pixels."""
        return self.base.crop_size

    @property
    def clip_sampling(self) -> ClipSampling:
        """``sampling_rate`` and ``jitter_scales`` as one value."""
        return self._clip_sampling

    def to_dict(self) -> dict[str, Any]:
        """The arguments as plain values (``base`` a dict), as checkpoints store them; see :meth:`from_dict`."""
        return {f.name: asdict(self.base) if f.name == "base" else getattr(self, f.name) for f in fields(self) if f.init}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> MultigridConfig:
        """Rebuild a config from :meth:`to_dict` (sequences become tuples on construction).

        Also reads checkpoints written before the config held one ``GridShape`` (flat
        ``batch_size``/``num_frames``/``crop_size``) or an integer ``sampling_rate`` (a float then).
        """
        values = dict(values)
        base = values.pop("base", None)
        if base is None:
            base = {name: values.pop(name) for name in ("batch_size", "num_frames", "crop_size")}
        values["base"] = GridShape(**base)
        rate = values.get("sampling_rate")
        if isinstance(rate, float) and rate.is_integer():
            values["sampling_rate"] = int(rate)
        return cls(**values)

    def _check_short_cycle_crops(self) -> None:
        """Every short-cycle crop at most every long-cycle crop, in pixels.

        The short cycle shrinks the long-cycle crop and grows the batch by ``round((long/short)^2)``;
        a short crop above the long crop would enlarge the crop instead, with the same batch or, below
        ``long/short = 1/sqrt(2)``, a batch of 0 clips.
        """
        largest_short = max(_short_cycle_crops(self))
        for t_factor, s_factor in self.long_cycle_factors:
            long_crop = _grid_size(self, t_factor, s_factor)[1]
            if long_crop < largest_short:
                raise ValueError(
                    f"`long_cycle_factors` entry ({t_factor}, {s_factor}) gives a {long_crop}-pixel crop, "
                    f"smaller than the {largest_short}-pixel short-cycle crop of `short_cycle_factors`="
                    f"{tuple(self.short_cycle_factors)} (of crop_size={self.crop_size}): the short cycle would "
                    f"enlarge the crop (and can give batches of no clips). Use s_factors >= "
                    f"{max(self.short_cycle_factors):.3f}, smaller `short_cycle_factors`, or `short_cycle=False`."
                )

    @property
    def num_lr_stages(self) -> int:
        return len(self.milestones) + 1

    def lr_stage_bounds(self, lr_stage: int) -> tuple[int, int]:
        """Baseline epochs ``[start, end)`` of an LR stage."""
        edges = (0, *self.milestones, self.max_epochs)
        return edges[lr_stage], edges[lr_stage + 1]


# The options a MultigridCallback takes too (same names), checked by `check_options` for both.
MULTIGRID_OPTIONS: tuple[str, ...] = (
    "long_cycle", "short_cycle", "epoch_factor", "long_cycle_factors", "short_cycle_factors", "bn_base_size",
    "full_grid_share", "scale_bn_base_size", "short_run", "short_run_coarse_share", "short_run_max_lr_factor",
)


def check_options(
    *,
    long_cycle: Any,
    short_cycle: Any,
    epoch_factor: Any,
    long_cycle_factors: Any,
    short_cycle_factors: Any,
    bn_base_size: Any,
    full_grid_share: Any,
    scale_bn_base_size: Any,
    short_run: Any,
    short_run_coarse_share: Any,
    short_run_max_lr_factor: Any,
) -> None:
    """Check the multigrid options that need neither the base shape nor the Trainer (see :class:`MultigridConfig`).

    Raises:
        ValueError: naming the option, its constraint and its value.
    """
    for name, flag in (
        ("long_cycle", long_cycle), ("short_cycle", short_cycle), ("scale_bn_base_size", scale_bn_base_size),
        ("short_run", short_run),
    ):
        check_bool(name, flag)
    check_positive_number("epoch_factor", epoch_factor)
    check_positive_int("bn_base_size", bn_base_size)
    check_positive_int("short_run_max_lr_factor", short_run_max_lr_factor)
    if not is_number(full_grid_share) or not 0 <= full_grid_share <= 1:
        raise ValueError(f"`full_grid_share` must be a number in [0, 1], got {full_grid_share!r}.")
    if not is_number(short_run_coarse_share) or not 0 <= short_run_coarse_share < 1:
        raise ValueError(f"`short_run_coarse_share` must be a number in [0, 1), got {short_run_coarse_share!r}.")
    if short_run and full_grid_share > 0:
        raise ValueError(
            f"`short_run=True` and `full_grid_share`={full_grid_share!r} both decide the full grid's "
            "share: the short-run mode runs the full grid for all but `short_run_coarse_share` of the epochs. "
            "Set `full_grid_share=0`, or `short_run=False`."
        )
    if not isinstance(long_cycle_factors, Sequence) or not long_cycle_factors:
        raise ValueError(f"`long_cycle_factors` must name at least one shape, got {long_cycle_factors!r}.")
    for pair in long_cycle_factors:
        if not isinstance(pair, Sequence) or len(pair) != 2 or not all(_is_factor(f) for f in pair):
            raise ValueError(f"`long_cycle_factors` must be (t_factor, s_factor) pairs in (0, 1], got {pair!r}.")
    if (
        not isinstance(short_cycle_factors, Sequence) or len(short_cycle_factors) != 2
        or not all(_is_factor(f) for f in short_cycle_factors)
    ):
        raise ValueError(f"`short_cycle_factors` must be two factors in (0, 1], got {short_cycle_factors!r}.")


def default_long_cycle_factors(pretrained: bool | None, baseline_steps: int | None) -> tuple[tuple[float, float], ...]:
    """The long-cycle shapes when the user names none.

    ``PRETRAINED_LONG_CYCLE_FACTORS`` for a short run (fewer than ``SHORT_RUN_BASELINE_STEPS``
    baseline optimizer steps per device) from pretrained weights; the paper's four shapes otherwise,
    and when either is not known (``None``).
    """
    if pretrained and baseline_steps is not None and baseline_steps < SHORT_RUN_BASELINE_STEPS:
        return PRETRAINED_LONG_CYCLE_FACTORS
    return DEFAULT_LONG_CYCLE_FACTORS


def check_milestones(milestones: Sequence[Any], max_epochs: int | None = None) -> None:
    """Raise ``ValueError`` unless ``milestones`` are integer epochs, strictly increasing, > 0 (and < ``max_epochs``)."""
    previous = 0
    for milestone in milestones:
        if not isinstance(milestone, int) or isinstance(milestone, bool):
            raise ValueError(f"`milestones` must be integers (epochs), got {milestones!r}.")
        if milestone <= previous:
            raise ValueError(f"`milestones` must be strictly increasing and > 0, got {list(milestones)!r}.")
        previous = milestone
    if max_epochs is not None and milestones and milestones[-1] >= max_epochs:
        raise ValueError(f"`milestones` must be < `max_epochs`={max_epochs}, got {list(milestones)!r}.")


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


def build_schedule(config: MultigridConfig) -> MultigridSchedule:
    """Build the multigrid schedule for ``config`` (DESIGN.md, section 1).

    Warns with :class:`ShortScheduleWarning` and drops the shortest long-cycle shapes when there
    are fewer epochs than shapes.

    Raises:
        ValueError: when a batch cannot be grouped for BatchNorm, or there are fewer multigrid
            epochs than baseline LR stages.
    """
    if config.short_run:
        return _build_short_run_schedule(config)
    if config.long_cycle:
        pieces, lengths = _long_cycle_pieces(config)
    else:
        pieces, lengths = _lr_stage_pieces(config)
    factor = 1.0 if not (config.long_cycle or config.short_cycle) else config.epoch_factor
    if config.full_grid_share > 0 and (config.long_cycle or config.short_cycle):
        pieces, ends = _allocate_with_full_grid(config, pieces, lengths, config.max_epochs * factor)
    else:
        # The reference truncates where the long cycle is off (`int(s * EPOCH_FACTOR)`: 45 x 1.5 -> 67)
        # and rounds the long cycle's cumulative ends.
        truncate = not config.long_cycle
        total_epochs = math.floor(config.max_epochs * factor + 1e-9) if truncate else round(config.max_epochs * factor)
        pieces, ends = _allocate_epochs(pieces, lengths, config.max_epochs * factor, total_epochs, truncate=truncate)

    stages: list[Stage] = []
    start = 0
    for piece, end in zip(pieces, ends):
        if piece.fine_tuning and piece.split_lr:
            # First half at the LR of stage L-2, second half at that of stage L-1.
            middle = (start + end) // 2
            stages.append(_make_stage(config, piece, start, middle, piece.lr_stage - 1))
            start = middle
        stages.append(_make_stage(config, piece, start, end, piece.lr_stage))
        start = end

    lr_starts = [next(s.start_epoch for s in stages if s.lr_stage == i) for i in range(config.num_lr_stages)]
    return MultigridSchedule(config, tuple(stages), (*lr_starts, stages[-1].end_epoch))


def _build_short_run_schedule(config: MultigridConfig) -> MultigridSchedule:
    """The short-run mode (see ``MultigridConfig.short_run``): coarse grids first, then the full grid.

    Stages break where the grid changes and at the baseline's milestones, so multigrid epoch ``e``
    is baseline epoch ``e`` and every stage has one LR stage.
    """
    grid_of_epoch = [(1.0, 1.0)] * config.max_epochs
    start = 0
    for factors, epochs in zip(_short_run_grids(config), _short_run_epochs(config)):
        grid_of_epoch[start : start + epochs] = [factors] * epochs
        start += epochs
    edges = (0, *config.milestones, config.max_epochs)
    breaks = sorted({*edges, *(e for e in range(1, config.max_epochs) if grid_of_epoch[e] != grid_of_epoch[e - 1])})
    stages = []
    for begin, end in zip(breaks, breaks[1:]):
        t_factor, s_factor = grid_of_epoch[begin]
        lr_stage = bisect.bisect_right(config.milestones, begin)
        piece = _Piece(lr_stage, t_factor, s_factor, full_grid=True)
        stages.append(_make_stage(config, piece, begin, end, lr_stage, max_lr_factor=config.short_run_max_lr_factor))
    return MultigridSchedule(config, tuple(stages), edges)


def _short_run_grids(config: MultigridConfig) -> list[tuple[float, float]]:
    """The coarse grids of the short-run mode, coarsest first: ``long_cycle_factors`` below the base shape."""
    coarse = {(t, s) for t, s in config.long_cycle_factors if _cost_ratio(config, t, s) > 1}
    return sorted(coarse, key=lambda f: -_cost_ratio(config, *f))


def _short_run_epochs(config: MultigridConfig) -> list[int]:
    """Whole epochs of each coarse grid (coarsest first), each share proportional to ``1 / r``.

    ``floor(short_run_coarse_share * max_epochs)`` epochs in all, split in proportion to ``1 / r``
    by rounding the cumulative ends, so a grid whose share rounds to nothing gets 0 epochs.
    """
    grids = _short_run_grids(config)
    total = math.floor(config.short_run_coarse_share * config.max_epochs + 1e-9)
    weights = [1 / _cost_ratio(config, t, s) for t, s in grids]
    ends = [round(total * sum(weights[: i + 1]) / sum(weights)) for i in range(len(weights))]
    return [end - start for start, end in zip([0, *ends], ends)]


def _cost_ratio(config: MultigridConfig, t_factor: float, s_factor: float) -> int:
    """Equation 1's relative batch ``r`` of a ``(t_factor, s_factor)`` grid: its cost saving per clip."""
    return _relative_batch(config, *_grid_size(config, t_factor, s_factor))


@dataclass(frozen=True, slots=True)
class _Piece:
    """A stage before whole epochs are assigned: LR stage, long-cycle factors, exact length."""

    lr_stage: int
    t_factor: float
    s_factor: float
    fine_tuning: bool = False
    split_lr: bool = False  # fine-tuning that spans two LR stages
    full_grid: bool = False  # no short cycle: every iteration at the base shape


def _long_cycle_pieces(config: MultigridConfig) -> tuple[list[_Piece], list[float]]:
    """One long cycle per LR stage but the last; the last is the fine-tuning phase.

    Each shape gets the same number of iterations within a stage, so its share of the stage's
    epochs is proportional to its average batch. Without milestones the whole run is one cycle.
    """
    avg_batches = [_average_relative_batch(config, t, s) for t, s in config.long_cycle_factors]
    edges = (0, *config.milestones, config.max_epochs)
    cycled_stages = max(config.num_lr_stages - 1, 1)
    pieces: list[_Piece] = []
    lengths: list[float] = []
    relative_iterations = 0.0
    for lr_stage in range(cycled_stages):
        stage_epochs = edges[lr_stage + 1] - edges[lr_stage]
        for (t, s), avg in zip(config.long_cycle_factors, avg_batches):
            epochs = stage_epochs * avg / sum(avg_batches)
            pieces.append(_Piece(lr_stage, t, s))
            lengths.append(epochs)
            relative_iterations += epochs / avg
    if config.num_lr_stages > 1:
        # The fine-tuning phase keeps the iteration saving of the cycled stages.
        saving = edges[-2] / relative_iterations
        last = config.num_lr_stages - 1
        pieces.append(_Piece(last, 1.0, 1.0, fine_tuning=True, split_lr=True))
        lengths.append((edges[-1] - edges[-2]) / saving * _average_relative_batch(config, 1.0, 1.0))
    return pieces, lengths


def _lr_stage_pieces(config: MultigridConfig) -> tuple[list[_Piece], list[float]]:
    """Without the long cycle, stages are the baseline LR stages at the base shape."""
    edges = (0, *config.milestones, config.max_epochs)
    pieces = [_Piece(i, 1.0, 1.0) for i in range(config.num_lr_stages)]
    return pieces, [float(edges[i + 1] - edges[i]) for i in range(config.num_lr_stages)]


def _allocate_epochs(
    pieces: list[_Piece], lengths: list[float], target: float, total_epochs: int, truncate: bool = False
) -> tuple[list[_Piece], list[int]]:
    """Scale exact lengths to ``target`` epochs and round (``truncate``: floor) the cumulative ends, as the reference.

    Then repair what rounding breaks on short schedules: every piece gets at least one epoch
    (fine-tuning two, one per LR half), taken from the longest pieces; when the epochs cannot
    cover every long-cycle shape, the shortest shapes are dropped (never an LR stage's last one).
    """
    pieces, lengths = list(pieces), list(lengths)
    dropped: list[_Piece] = []
    while sum(_minimum_epochs(p) for p in pieces) > total_epochs:
        droppable = [
            i for i, p in enumerate(pieces)
            if not p.fine_tuning and sum(q.lr_stage == p.lr_stage for q in pieces) > 1
        ]
        if not droppable:
            break
        index = min(droppable, key=lambda i: lengths[i])
        dropped.append(pieces.pop(index))
        lengths.pop(index)
    if pieces[-1].split_lr and sum(_minimum_epochs(p) for p in pieces) > total_epochs:
        pieces[-1] = _Piece(pieces[-1].lr_stage, 1.0, 1.0, fine_tuning=True, split_lr=False)
        warnings.warn(
            f"{total_epochs} multigrid epochs are too few to split fine-tuning over two LR stages; "
            "it runs at the last stage's LR only.",
            ShortScheduleWarning,
            stacklevel=3,
        )
    if len(pieces) > total_epochs:
        raise ValueError(
            f"The schedule has {total_epochs} multigrid epochs, fewer than its {len(pieces)} LR stages: "
            "raise `max_epochs` or `epoch_factor`, or use fewer `milestones`."
        )
    if dropped:
        warnings.warn(
            f"{total_epochs} multigrid epochs are too few for every long-cycle shape to get an epoch: "
            f"dropped {len(dropped)} of the shortest long-cycle stages "
            f"(LR stage, t_factor, s_factor: {[(p.lr_stage, p.t_factor, p.s_factor) for p in dropped]}). "
            "Raise `max_epochs` or `epoch_factor` to train every shape.",
            ShortScheduleWarning,
            stacklevel=3,
        )

    scale = target / sum(lengths)
    ends, cumulative = [], 0.0
    for length in lengths:
        cumulative += length * scale
        ends.append(math.floor(cumulative + 1e-9) if truncate else round(cumulative))
    ends[-1] = total_epochs
    epochs = [end - start for start, end in zip([0, *ends], ends)]
    minimum = [_minimum_epochs(p) for p in pieces]
    for i in range(len(epochs)):
        while epochs[i] < minimum[i]:
            donor = max(range(len(epochs)), key=lambda j: epochs[j] - minimum[j])
            epochs[donor] -= 1
            epochs[i] += 1
    ends = [sum(epochs[: i + 1]) for i in range(len(epochs))]
    return pieces, ends


def _allocate_with_full_grid(
    config: MultigridConfig, pieces: list[_Piece], lengths: list[float], target: float
) -> tuple[list[_Piece], list[int]]:
    """Whole epochs when fine-tuning must give the full grid ``full_grid_share`` of the iterations.

    The stages before fine-tuning keep the paper's epochs (its share of ``target``); fine-tuning,
    without short cycle, gets ``ceil(full_grid_share * max_epochs)`` epochs of base-shape
    iterations (each as many as a baseline epoch), or the paper's length if that is longer.
    """
    scale = target / sum(lengths)
    last = config.num_lr_stages - 1
    if pieces[-1].fine_tuning:
        paper_epochs = round(lengths[-1] * scale)
        fine_tuning = _Piece(last, 1.0, 1.0, fine_tuning=True, split_lr=pieces[-1].split_lr, full_grid=True)
        pieces, lengths = pieces[:-1], lengths[:-1]
    else:  # one long cycle (no milestones) or no long cycle: fine-tuning is added at the end
        paper_epochs = 0
        fine_tuning = _Piece(last, 1.0, 1.0, fine_tuning=True, full_grid=True)
    # The 1e-9 keeps a share that is an exact fraction of max_epochs from rounding up once more.
    epochs = max(math.ceil(config.full_grid_share * config.max_epochs - 1e-9), paper_epochs, _minimum_epochs(fine_tuning))
    rest = sum(lengths) * scale
    pieces, ends = _allocate_epochs(pieces, lengths, rest, round(rest))
    return [*pieces, fine_tuning], [*ends, ends[-1] + epochs]


def _minimum_epochs(piece: _Piece) -> int:
    return 2 if piece.split_lr else 1


def _make_stage(
    config: MultigridConfig, piece: _Piece, start: int, end: int, lr_stage: int, max_lr_factor: int | None = None
) -> Stage:
    """The stage of ``piece`` over epochs ``[start, end)``; ``max_lr_factor`` caps its batch growth (short-run mode)."""
    num_frames, crop_size = _grid_size(config, piece.t_factor, piece.s_factor)
    lr_factor = _relative_batch(config, num_frames, crop_size)
    if max_lr_factor is not None:
        lr_factor = min(lr_factor, max_lr_factor)
    shape = GridShape(config.batch_size * lr_factor, num_frames, crop_size)
    short_cycle: tuple[GridShape, ...] = ()
    if config.short_cycle and not piece.full_grid:
        short_cycle = tuple(
            GridShape(shape.batch_size * round((crop_size / short_crop) ** 2), num_frames, short_crop)
            for short_crop in _short_cycle_crops(config)
        ) + (shape,)
    return Stage(
        start_epoch=start,
        end_epoch=end,
        lr_stage=lr_stage,
        shape=shape,
        lr_factor=lr_factor,
        short_cycle=short_cycle,
        bn=plan_batchnorm(
            shape.batch_size,
            config.bn_base_size * (lr_factor if config.scale_bn_base_size else 1),
            config.devices,
        ),
        sampling_rate=config.clip_sampling.sampling_rate_range_for(num_frames, config.num_frames),
        fine_tuning=piece.fine_tuning,
    )


def _grid_size(config: MultigridConfig, t_factor: float, s_factor: float) -> tuple[int, int]:
    """Frames and crop (pixels) of a ``(t_factor, s_factor)`` shape of the base grid, at least 1 each."""
    return max(1, round(config.num_frames * t_factor)), max(1, round(config.crop_size * s_factor))


def _relative_batch(config: MultigridConfig, num_frames: int, crop_size: float) -> int:
    """Equation 1: batch relative to the baseline so every iteration costs about the same."""
    ratio = config.num_frames * config.crop_size**2 / (num_frames * crop_size**2)
    return max(1, round(ratio))


def _short_cycle_crops(config: MultigridConfig) -> tuple[int, ...]:
    return tuple(max(1, round(f * config.crop_size)) for f in config.short_cycle_factors)


def _average_relative_batch(config: MultigridConfig, t_factor: float, s_factor: float) -> float:
    """Average relative batch of a long-cycle shape over its short cycle (itself when off).

    As in the reference implementation, short-cycle crops enter unrounded here.
    """
    num_frames, crop_size = _grid_size(config, t_factor, s_factor)
    crops: list[float] = [crop_size]
    if config.short_cycle:
        crops = [f * config.crop_size for f in config.short_cycle_factors] + crops
    return sum(_relative_batch(config, num_frames, c) for c in crops) / len(crops)


def _is_factor(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1
