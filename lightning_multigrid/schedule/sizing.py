"""How each grid's batch is sized (``batch_sizing``): Equation 1, or each grid's measured cost per clip.

A sizer is one value, picked once from the options by
:attr:`~lightning_multigrid.schedule.config.MultigridConfig.sizer`; the stage builder, the two allocations
and the preview ask it and never ask which one it is. :class:`Equation1Sizer` is the paper's
(frames x pixels); :class:`CostSizer` reads each grid's measured cost per clip
(:mod:`lightning_multigrid.schedule.cost` measures it). Pure Python, no torch.

Example::

    sizer = Equation1Sizer(GridShape(batch_size=8, num_frames=16, crop_size=224))
    sizer.stage_batches(4, 112, short_crops=(56,), max_lr_factor=None, bn_groups=lambda batch: 1)
    # StageBatches(batch_size=128, lr_factor=16, short_cycle=(512,)): 8 * round(16*224^2 / (4*112^2))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from lightning_multigrid.grid import GridShape

__all__ = ["BatchSizer", "CostSizer", "Equation1Sizer", "StageBatches", "cost_sized_batch", "scaled_size"]

# A long-cycle batch -> the BatchNorm groups its statistics are split into (the stage's BNPlan).
BNGroups = Callable[[int], int]


def scaled_size(size: int, factor: float) -> int:
    """A base size (frames, or a crop in pixels) scaled by ``factor``, in whole units, at least 1."""
    return max(1, round(size * factor))


def cost_sized_batch(batch_size: int, relative_cost: float) -> int:
    """Clips per device so an iteration costs what a base iteration of ``batch_size`` clips costs.

    ``round(B / relative_cost)``, at least 1: e.g. ``B = 8`` and a clip that costs 0.3 of a base
    clip -> ``round(8 / 0.3) = round(26.67) = 27``.
    """
    return max(1, round(batch_size / relative_cost))


@dataclass(frozen=True, slots=True)
class StageBatches:
    """The batches of one stage, clips per device.

    Attributes:
        batch_size: the long-cycle batch.
        lr_factor: the long-cycle batch over the base batch; the learning rate is multiplied by it
            (Equation 1's relative batch ``r``, an integer; any ratio with batches sized by cost).
        short_cycle: the batches of the smaller short-cycle crops, in their order.
    """

    batch_size: int
    lr_factor: float
    short_cycle: tuple[int, ...]


class BatchSizer(Protocol):
    """What the schedule asks of a batch sizing: :class:`Equation1Sizer` or :class:`CostSizer`."""

    @property
    def measure(self) -> Literal["flops", "time"] | None:
        """The cost per clip the sizing reads (``clip_costs``): FLOPs, step time, or ``None`` (Equation 1)."""
        ...

    def relative_cost(self, num_frames: int, crop_size: int) -> float:
        """Measured cost of one clip of a grid relative to one base-grid clip."""
        ...

    def cost_ratio(self, num_frames: int, crop_size: int) -> float:
        """How many times cheaper a clip of the grid is than a base clip: the saving the short-run mode weighs."""
        ...

    def stage_batches(
        self, num_frames: int, crop_size: int, short_crops: Sequence[int], max_lr_factor: int | None, bn_groups: BNGroups
    ) -> StageBatches:
        """The batches of a stage at a long-cycle grid with ``short_crops`` (empty: no short cycle).

        ``max_lr_factor`` caps the batch growth (the short-run mode); ``bn_groups`` are the BatchNorm
        groups of a long-cycle batch.
        """
        ...

    def average_relative_batch(
        self, num_frames: int, crop_size: int, short_cycle_factors: Sequence[float], bn_groups: BNGroups
    ) -> float:
        """A long-cycle grid's batch averaged over its short cycle (``short_cycle_factors``; empty: off),
        relative to the base batch: its share of an LR stage's epochs follows it (the paper's allocation)."""
        ...


@dataclass(frozen=True, slots=True)
class Equation1Sizer:
    """The paper's sizing (Equation 1): a grid's batch grows as its clips shrink in frames x pixels.

    ``B * round(T*S^2 / (t*s^2))`` for a ``t x s`` grid of a ``B x T x S`` base grid; a short-cycle
    crop ``c`` of that grid multiplies its batch by ``round((s/c)^2)``, as the reference implementation.
    """

    base: GridShape

    @property
    def measure(self) -> None:
        return None

    def relative_batch(self, num_frames: int, crop_size: float) -> int:
        """Equation 1: batch relative to the baseline so every iteration costs about the same."""
        ratio = self.base.num_frames * self.base.crop_size**2 / (num_frames * crop_size**2)
        return max(1, round(ratio))

    def relative_cost(self, num_frames: int, crop_size: int) -> float:
        """Refused: Equation 1 measures no cost (the error :class:`CostSizer` gives for a grid it lacks)."""
        raise _missing_cost((num_frames, crop_size), "equation1", {})

    def cost_ratio(self, num_frames: int, crop_size: int) -> float:
        return self.relative_batch(num_frames, crop_size)

    def stage_batches(
        self, num_frames: int, crop_size: int, short_crops: Sequence[int], max_lr_factor: int | None, bn_groups: BNGroups
    ) -> StageBatches:
        # The paper's batches are multiples of the base batch, not rounded to the BatchNorm groups.
        lr_factor = self.relative_batch(num_frames, crop_size)
        if max_lr_factor is not None:
            lr_factor = min(lr_factor, max_lr_factor)
        batch_size = self.base.batch_size * lr_factor
        return StageBatches(batch_size, lr_factor, tuple(batch_size * round((crop_size / c) ** 2) for c in short_crops))

    def average_relative_batch(
        self, num_frames: int, crop_size: int, short_cycle_factors: Sequence[float], bn_groups: BNGroups
    ) -> float:
        # As in the reference implementation, short-cycle crops enter unrounded here.
        crops = [f * self.base.crop_size for f in short_cycle_factors] + [crop_size]
        return sum(self.relative_batch(num_frames, c) for c in crops) / len(crops)


@dataclass(frozen=True, slots=True)
class CostSizer:
    """Batches sized by each grid's measured cost per clip, so an iteration costs what a base iteration costs.

    A grid's batch is :func:`cost_sized_batch` of its cost relative to the base grid's, capped by the
    short-run mode, then rounded to a multiple of the stage's BatchNorm groups (a batch its groups do
    not divide takes BatchNorm's slow path, about 1.6x: docs/benchmarks.md), the short cycle's too.

    Args:
        base: the base grid ``B x T x S``.
        measure: what the costs are: ``"flops"`` or ``"time"`` (``batch_sizing``).
        costs: cost per clip by ``(num_frames, crop_size)``, in one unit; the base grid's included.
    """

    base: GridShape
    measure: Literal["flops", "time"]
    costs: Mapping[tuple[int, int], float]

    def relative_cost(self, num_frames: int, crop_size: int) -> float:
        """Raises: ValueError when ``costs`` lack the grid or the base grid."""
        grid, base = (num_frames, crop_size), (self.base.num_frames, self.base.crop_size)
        for key in (grid, base):
            if key not in self.costs:
                raise _missing_cost(key, self.measure, self.costs)
        return self.costs[grid] / self.costs[base]

    def sized_batch(self, num_frames: int, crop_size: int) -> int:
        return cost_sized_batch(self.base.batch_size, self.relative_cost(num_frames, crop_size))

    def cost_ratio(self, num_frames: int, crop_size: int) -> float:
        return 1 / self.relative_cost(num_frames, crop_size)

    def stage_batches(
        self, num_frames: int, crop_size: int, short_crops: Sequence[int], max_lr_factor: int | None, bn_groups: BNGroups
    ) -> StageBatches:
        batch_size = self.sized_batch(num_frames, crop_size)
        if max_lr_factor is not None:
            batch_size = min(batch_size, self.base.batch_size * max_lr_factor)
        groups = bn_groups(batch_size)
        batch_size, *short_batches = (
            max(groups, groups * round(batch / groups))
            for batch in (batch_size, *(self.sized_batch(num_frames, c) for c in short_crops))
        )
        return StageBatches(batch_size, batch_size / self.base.batch_size, tuple(short_batches))

    def average_relative_batch(
        self, num_frames: int, crop_size: int, short_cycle_factors: Sequence[float], bn_groups: BNGroups
    ) -> float:
        # The batches training uses: the stage's, short-cycle crops rounded as it rounds them.
        short_crops = [scaled_size(self.base.crop_size, f) for f in short_cycle_factors]
        batches = self.stage_batches(num_frames, crop_size, short_crops, None, bn_groups)
        cycle = (*batches.short_cycle, batches.batch_size)
        return sum(cycle) / len(cycle) / self.base.batch_size


def _missing_cost(grid: tuple[int, int], method: str, costs: Mapping[tuple[int, int], float]) -> ValueError:
    measured = ", ".join(f"{t} x {s}" for t, s in costs) or "none"
    return ValueError(
        f"`clip_costs` has no cost for the {grid[0]} x {grid[1]} grid (frames x crop), which "
        f"`batch_sizing`={method!r} needs (measured: {measured}). Measure every grid "
        "of `config.cost_grids()` (`lightning_multigrid.schedule.cost.measure_clip_costs`), or use "
        "`batch_sizing`='equation1'."
    )
