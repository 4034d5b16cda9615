"""The grid facts, owned once: pure Python, no torch.

:class:`GridShape` is one mini-batch's shape, :class:`ClipSampling` how training clips are drawn
around the base shape (frame stride, jitter scales and their default), :class:`EvalViews` the
views per validation/test video. Each validates itself on construction. :class:`GridPlan` is what
the batch sampler, the DataModule and its checks ask about the grids of a run: the multigrid
schedule (:class:`~lightning_multigrid.schedule.build.MultigridSchedule`) implements it, and so does
:class:`FixedGrid`, the baseline's plan (every epoch at the base shape).

Example::

    plan = FixedGrid(GridShape(batch_size=8, num_frames=16, crop_size=112), ClipSampling(sampling_rate=4))
    plan.grid_at(epoch=3, iteration=5)   # GridShape(batch_size=8, num_frames=16, crop_size=112)
    plan.jitter_scales_for(112)          # (128, 160): the default (256, 320) * 112 / 224
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from lightning_multigrid._checks import check_instance, check_positive_int

__all__ = [
    "DEFAULT_NUM_FRAMES",
    "DEFAULT_SAMPLING_RATE",
    "ClipSampling",
    "EvalViews",
    "FixedGrid",
    "GridPlan",
    "GridShape",
    "count_batches",
    "default_jitter_scales",
]

# The DataModule's default base clip (its `num_frames`, `sampling_rate`), which `check-data` also measures videos against.
DEFAULT_NUM_FRAMES = 16
DEFAULT_SAMPLING_RATE = 4


@dataclass(frozen=True, slots=True)
class GridShape:
    """The shape of one mini-batch: ``(batch_size, C, num_frames, crop_size, crop_size)``.

    Raises:
        ValueError: when a field is not a positive integer, naming it.
    """

    batch_size: int  # clips per device
    num_frames: int
    crop_size: int  # pixels, square

    def __post_init__(self) -> None:
        for name in ("batch_size", "num_frames", "crop_size"):
            check_positive_int(name, getattr(self, name))


def default_jitter_scales(crop_size: int) -> tuple[int, int]:
    """``(min, max)`` training short side for a base crop: 256-320 for 224 (Kinetics), scaled."""
    return round(256 * crop_size / 224), round(320 * crop_size / 224)


@dataclass(frozen=True, slots=True)
class ClipSampling:
    """How training clips are drawn around the base shape.

    Args:
        sampling_rate: baseline frame stride ``tau`` in source frames.
        jitter_scales: ``(min, max)`` short side in pixels before the base crop; ``None``:
            :func:`default_jitter_scales` of the base crop. Converted to a tuple of ints.

    Raises:
        ValueError: when ``sampling_rate`` is not a positive integer, or ``jitter_scales`` is not
            ``0 < min <= max``.
    """

    sampling_rate: int = 1
    jitter_scales: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        check_positive_int("sampling_rate", self.sampling_rate)
        scales: Any = self.jitter_scales
        if scales is None:
            return
        if (
            not isinstance(scales, Sequence) or len(scales) != 2
            or not all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in scales)
        ):
            raise ValueError(f"`jitter_scales` must be a (min, max) pair of pixel sizes or None, got {scales!r}.")
        low, high = int(scales[0]), int(scales[1])
        if not 0 < low <= high:
            raise ValueError(f"`jitter_scales` must be 0 < min <= max, got {scales!r}.")
        object.__setattr__(self, "jitter_scales", (low, high))

    def scales_for_base(self, base_crop_size: int) -> tuple[int, int]:
        """The ``(min, max)`` short side at the base crop: ``jitter_scales`` or the default."""
        return self.jitter_scales or default_jitter_scales(base_crop_size)

    def check_fits(self, base_crop_size: int) -> None:
        """Raise ``ValueError`` when the minimum short side is smaller than the base crop."""
        low = self.scales_for_base(base_crop_size)[0]
        if low < base_crop_size:
            raise ValueError(
                f"`jitter_scales` min {low} is smaller than `crop_size`={base_crop_size}: "
                "the crop would not fit; raise the min scale."
            )

    def sampling_rate_range_for(self, num_frames: int, base_num_frames: int) -> tuple[float, float]:
        """``(min, max)`` frame stride for clips of ``num_frames`` frames: from the base stride up to the
        stride at which they span as many source frames as the base clip (fewer frames: longer strides)."""
        return float(self.sampling_rate), self.sampling_rate * base_num_frames / num_frames

    def jitter_scales_for(self, crop_size: int, base_crop_size: int) -> tuple[int, int]:
        """Short-side range in pixels for a ``crop_size`` crop: the minimum scales with the crop, the maximum not."""
        low, high = self.scales_for_base(base_crop_size)
        return round(low * crop_size / base_crop_size), high


@dataclass(frozen=True, slots=True)
class EvalViews:
    """Views of every validation/test video.

    Args:
        num_views: temporal clips per video, uniformly spread.
        num_crops: spatial crops per clip: 1 (centre) or 3 (left/top, centre, right/bottom).

    Raises:
        ValueError: when ``num_views`` is not a positive integer or ``num_crops`` not 1 or 3.
    """

    num_views: int = 1
    num_crops: int = 1

    def __post_init__(self) -> None:
        check_positive_int("num_views", self.num_views)
        if isinstance(self.num_crops, bool) or self.num_crops not in (1, 3):
            raise ValueError(f"`num_crops` must be 1 or 3, got {self.num_crops!r}.")


@runtime_checkable
class GridPlan(Protocol):
    """The grids a run trains on, asked with explicit 0-based epochs and iterations."""

    @property
    def base_shape(self) -> GridShape:
        """The baseline grid; validation, test and precise BN run at it."""
        ...

    @property
    def clip_sampling(self) -> ClipSampling:
        """Frame stride and jitter scales at the base shape."""
        ...

    def epoch_spans(self) -> tuple[tuple[int, int | None], ...]:
        """Epochs ``[start, end)`` over which :meth:`cycle_at` stays the same; ``end=None``: to the end."""
        ...

    def cycle_at(self, epoch: int) -> tuple[GridShape, ...]:
        """The grids iterations of ``epoch`` go through in turn (one grid without short cycle)."""
        ...

    def grid_at(self, epoch: int, iteration: int) -> GridShape:
        """The grid of 0-based ``iteration`` of ``epoch``."""
        ...

    def sampling_rate_range_at(self, epoch: int) -> tuple[float, float]:
        """``(min, max)`` frame stride of ``epoch``'s clips (fewer frames: longer strides)."""
        ...

    def jitter_scales_for(self, crop_size: int) -> tuple[int, int]:
        """``(min, max)`` short side in pixels before a ``crop_size`` crop."""
        ...


@dataclass(frozen=True, slots=True)
class FixedGrid:
    """The baseline's plan: every epoch and iteration at the base shape.

    Raises:
        TypeError: when ``base_shape`` or ``clip_sampling`` has the wrong type.
        ValueError: when the jitter minimum is smaller than the base crop.
    """

    base_shape: GridShape
    clip_sampling: ClipSampling = ClipSampling()

    def __post_init__(self) -> None:
        check_instance("base_shape", self.base_shape, GridShape)
        check_instance("clip_sampling", self.clip_sampling, ClipSampling)
        self.clip_sampling.check_fits(self.base_shape.crop_size)

    def epoch_spans(self) -> tuple[tuple[int, int | None], ...]:
        return ((0, None),)

    def cycle_at(self, epoch: int) -> tuple[GridShape, ...]:
        return (self.base_shape,)

    def grid_at(self, epoch: int, iteration: int) -> GridShape:
        return self.base_shape

    def sampling_rate_range_at(self, epoch: int) -> tuple[float, float]:
        frames = self.base_shape.num_frames
        return self.clip_sampling.sampling_rate_range_for(frames, frames)

    def jitter_scales_for(self, crop_size: int) -> tuple[int, int]:
        return self.clip_sampling.jitter_scales_for(crop_size, self.base_shape.crop_size)


def count_batches(num_clips: int, batch_sizes: Sequence[int], drop_last: bool = False) -> tuple[tuple[int, int], ...]:
    """Batches and clips at each cycle position when ``num_clips`` clips fill batches of ``batch_sizes[i % len]``.

    The one count of iterations: the schedule's per-epoch numbers and the batch sampler's
    ``len()`` both come from here. Example: 10 clips, sizes ``(4, 2, 1)``: ``4 + 2 + 1 = 7``
    clips in one batch each, then 3 clips left fill a partial batch of 4 ->
    ``((2, 7), (1, 2), (1, 1))``; with ``drop_last`` the partial batch goes: ``((1, 4), (1, 2), (1, 1))``.

    Returns:
        ``(batches, clips)`` per position of ``batch_sizes``.

    Raises:
        ValueError: when ``num_clips`` is negative or a batch size is not positive.
    """
    if num_clips < 0:
        raise ValueError(f"`num_clips` must be >= 0, got {num_clips!r}.")
    if not batch_sizes or any(size <= 0 for size in batch_sizes):
        raise ValueError(f"`batch_sizes` must be positive integers, got {list(batch_sizes)!r}.")
    full_cycles, remainder = divmod(num_clips, sum(batch_sizes))
    counts = []
    for size in batch_sizes:
        batches, clips = full_cycles, full_cycles * size
        if remainder >= size or (remainder > 0 and not drop_last):
            batches, clips = batches + 1, clips + min(size, remainder)
        remainder -= size
        counts.append((batches, clips))
    return tuple(counts)
