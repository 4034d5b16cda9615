"""What the batch sampler asks a worker for: one clip at one grid, with its random draws seeded."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["ClipRequest"]


class ClipRequest(NamedTuple):
    """One training clip to decode, travelling from the batch sampler to a worker.

    The worker draws every random parameter of the clip (span start, stride, short-side scale,
    crop box, flip) from ``random.Random(seed)``, so a seeded run is reproducible whatever the
    number of workers.

    ``TrainVideoDataset(...)[request]`` returns the clip as uint8 ``(3, num_frames, crop_size,
    crop_size)``; the order of the draws is in :mod:`lightning_multigrid.data.clip_params`. A
    ``stride_range`` is in source frames at the video's own frame rate (``Stage.sampling_rate``);
    a ``scale_range`` is usually ``MultigridSchedule.jitter_scales_for(crop_size)``.
    """

    index: int  # type: ignore[assignment]  # video index in the dataset (shadows tuple.index)
    num_frames: int
    crop_size: int  # pixels, square
    stride_range: tuple[float, float]  # (min, max) frame stride, in source frames
    scale_range: tuple[int, int]  # (min, max) short side in pixels before the crop
    seed: int
