"""Where a clip comes from: frame indices, resize, crop box and flip, as plain numbers.

Pure functions, no decoding and no torch (the last step, :func:`assemble_clip`, is numpy), in the
draw-then-apply style of torchvision's
transforms v2: :func:`sample_clip_params` draws every random number of a training clip from
``random.Random(request.seed)`` (so a seeded run is the same whatever the number of workers),
:func:`eval_clip_params` places the deterministic views of validation and test, and
:meth:`lightning_multigrid.data.decoding.video.VideoReader.read` applies the result.

Training draws, in this order (DESIGN.md, "Sampling grids"):

1. ``sampling_rate = rng.uniform(*request.sampling_rate_range)`` (source frames at the video's own rate);
2. ``start = rng.randint(0, max(N - span, 0))`` with ``span = floor((T - 1) * sampling_rate) + 1``
   frames, ``N`` the video's frames; frame ``k`` is ``min(start + floor(k * sampling_rate), N - 1)``, so a
   video shorter than the span gives all it has and repeats its last frame (as the reference does);
3. ``short_side = rng.randint(*request.scale_range)`` (at least the crop);
4. ``crop_x = rng.randint(0, width' - crop)``, ``crop_y = rng.randint(0, height' - crop)`` in the
   resized frame;
5. ``flip = rng.random() < 0.5`` (always drawn, then dropped where flipping is off).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from lightning_multigrid.grid import ClipSampling, EvalViews, GridShape

__all__ = [
    "ClipParams",
    "assemble_clip",
    "distinct_frames",
    "ClipRequest",
    "ClipSource",
    "check_clip_params",
    "check_request",
    "eval_clip_params",
    "eval_short_side",
    "frame_indices",
    "resized_size",
    "sample_clip_params",
    "span_frames",
]


class ClipRequest(NamedTuple):
    """One training clip to decode, travelling from the batch sampler to a worker.

    The worker draws every random parameter of the clip (span start, stride, short-side scale,
    crop box, flip) from ``random.Random(seed)``, so a seeded run is reproducible whatever the
    number of workers.

    ``TrainVideoDataset(...)[request]`` returns the clip as uint8 ``(3, num_frames, crop_size,
    crop_size)``; the order of the draws is in this module's docstring. A ``sampling_rate_range``
    is the frame stride in source frames at the video's own frame rate (the plan's
    ``sampling_rate_range_at(epoch)``); a ``scale_range`` is usually its ``jitter_scales_for(crop_size)``
    (:class:`~lightning_multigrid.grid.GridPlan`).
    """

    index: int  # type: ignore[assignment]  # video index in the dataset (shadows tuple.index)
    num_frames: int
    crop_size: int  # pixels, square
    sampling_rate_range: tuple[float, float]  # (min, max) frame stride, in source frames
    scale_range: tuple[int, int]  # (min, max) short side in pixels before the crop
    seed: int


class ClipSource(Protocol):
    """What sampling reads of a video: a video file's ``VideoMetadata`` or a ``FrameFolder``."""

    @property
    def width(self) -> int: ...

    @property
    def height(self) -> int: ...

    @property
    def num_frames(self) -> int: ...


@dataclass(frozen=True, slots=True)
class ClipParams:
    """Everything random about one clip, drawn; decoding only applies it.

    Attributes:
        frame_indices: 0-based source frames in display order, one per output frame
            (repeats allowed).
        resize_width: frame width in pixels after the resize, before the crop.
        resize_height: frame height in pixels after the resize, before the crop.
        crop_x: left edge of the square crop in the resized frame, pixels.
        crop_y: top edge of the crop, pixels.
        crop_size: side of the crop, pixels.
        flip: mirror left-right after cropping.
    """

    frame_indices: tuple[int, ...]
    resize_width: int
    resize_height: int
    crop_x: int
    crop_y: int
    crop_size: int
    flip: bool = False


def span_frames(num_frames: int, sampling_rate: float) -> int:
    """Source frames from the first to the last sampled frame, both included."""
    return math.floor((num_frames - 1) * sampling_rate) + 1


def frame_indices(video_frames: int, num_frames: int, sampling_rate: float, start: int) -> tuple[int, ...]:
    """Frames ``start + floor(k * sampling_rate)`` for ``k < num_frames``, clamped to the last frame.

    Example::

        frame_indices(video_frames=10, num_frames=4, sampling_rate=3, start=2)   # (2, 5, 8, 9)
    """
    last = video_frames - 1
    return tuple(min(start + math.floor(k * sampling_rate), last) for k in range(num_frames))


def resized_size(width: int, height: int, short_side: int) -> tuple[int, int]:
    """``(width, height)`` after scaling so the short side is ``short_side``, aspect kept."""
    if width <= height:
        return short_side, max(short_side, round(height * short_side / width))
    return max(short_side, round(width * short_side / height)), short_side


def check_request(request: ClipRequest) -> None:
    """Raise a ``ValueError`` naming the field when a clip request cannot be sampled."""
    if request.num_frames < 1 or request.crop_size < 1:
        raise ValueError(
            f"`ClipRequest.num_frames` and `crop_size` must be >= 1, got "
            f"{request.num_frames} and {request.crop_size}."
        )
    low, high = request.sampling_rate_range
    if not 0 < low <= high:
        raise ValueError(
            f"`ClipRequest.sampling_rate_range` must be 0 < min <= max, got {request.sampling_rate_range!r}."
        )
    low_scale, high_scale = request.scale_range
    if not 0 < low_scale <= high_scale:
        raise ValueError(f"`ClipRequest.scale_range` must be 0 < min <= max, got {request.scale_range!r}.")
    if high_scale < request.crop_size:
        raise ValueError(
            f"`ClipRequest.scale_range` {request.scale_range!r} is below `crop_size`={request.crop_size}: "
            "the crop would not fit; use `MultigridSchedule.jitter_scales_for(crop_size)`."
        )


def sample_clip_params(request: ClipRequest, metadata: ClipSource, flip: bool = True) -> ClipParams:
    """Draw a training clip: random temporal span and stride, short-side scale, crop and flip.

    Args:
        request: the grid and ranges; its ``seed`` seeds every draw.
        metadata: the video the clip comes from.
        flip: allow a horizontal flip (off for direction-dependent labels).

    Raises:
        ValueError: when the request is invalid (see :func:`check_request`).
    """
    check_request(request)
    rng = random.Random(request.seed)
    sampling_rate = rng.uniform(*request.sampling_rate_range)
    span = span_frames(request.num_frames, sampling_rate)
    start = rng.randint(0, max(metadata.num_frames - span, 0))
    indices = frame_indices(metadata.num_frames, request.num_frames, sampling_rate, start)
    short_side = rng.randint(max(request.scale_range[0], request.crop_size), request.scale_range[1])
    width, height = resized_size(metadata.width, metadata.height, short_side)
    crop = request.crop_size
    crop_x = rng.randint(0, width - crop)
    crop_y = rng.randint(0, height - crop)
    flipped = rng.random() < 0.5
    return ClipParams(indices, width, height, crop_x, crop_y, crop, flipped and flip)


def eval_short_side(base_shape: GridShape, clip_sampling: ClipSampling) -> int:
    """The evaluation short side in pixels before the crop: the minimum training short side at the base crop."""
    return clip_sampling.scales_for_base(base_shape.crop_size)[0]


def eval_clip_params(
    metadata: ClipSource,
    base_shape: GridShape,
    clip_sampling: ClipSampling,
    views: EvalViews,
    temporal_index: int = 0,
    spatial_index: int = 0,
) -> ClipParams:
    """A deterministic view for validation and test (PySlowFast's multi-view testing).

    Temporal clip ``i`` of ``n = views.num_views`` starts at ``round(i * d / (n - 1))`` (at ``d // 2``
    when ``n == 1``), ``d = max(N - span, 0)``: clips spread uniformly from start to end. Spatially the
    short side is resized to :func:`eval_short_side`; one crop is centred, three crops are at the
    start, centre and end of the long side (centred on the short side).

    Args:
        metadata: the video.
        base_shape: the base shape: ``num_frames`` frames per clip, square ``crop_size`` crops.
        clip_sampling: the base frame stride ``sampling_rate`` and the ``jitter_scales`` whose minimum
            is the short side (at least the crop: ``ClipSampling.check_fits``, as ``FixedGrid`` and
            :class:`~lightning_multigrid.data.dataset.EvalVideoDataset` check it).
        views: temporal clips and spatial crops per video.
        temporal_index: 0-based temporal clip.
        spatial_index: 0-based spatial crop.

    Raises:
        ValueError: on out-of-range indices.
    """
    if not 0 <= temporal_index < views.num_views:
        raise ValueError(f"`temporal_index` must be in [0, {views.num_views}), got {temporal_index!r}.")
    if not 0 <= spatial_index < views.num_crops:
        raise ValueError(f"`spatial_index` must be in [0, {views.num_crops}), got {spatial_index!r}.")
    num_frames, crop_size, sampling_rate = base_shape.num_frames, base_shape.crop_size, clip_sampling.sampling_rate
    span = span_frames(num_frames, sampling_rate)
    room = max(metadata.num_frames - span, 0)
    if views.num_views == 1:
        start = room // 2
    else:
        start = round(temporal_index * room / (views.num_views - 1))
    indices = frame_indices(metadata.num_frames, num_frames, sampling_rate, start)
    width, height = resized_size(metadata.width, metadata.height, eval_short_side(base_shape, clip_sampling))
    centre_x, centre_y = (width - crop_size) // 2, (height - crop_size) // 2
    if views.num_crops == 1 or spatial_index == 1:
        x, y = centre_x, centre_y
    elif width >= height:
        x, y = (0 if spatial_index == 0 else width - crop_size), centre_y
    else:
        x, y = centre_x, (0 if spatial_index == 0 else height - crop_size)
    return ClipParams(indices, width, height, x, y, crop_size, False)


def check_clip_params(params: ClipParams, num_frames: int, source: str) -> None:
    """Raise unless ``params`` fit a source of ``num_frames`` frames (a video or a frame folder).

    Raises:
        ValueError: naming ``source`` when a frame index falls outside it, or the crop box outside
            the resized frame.
    """
    if not params.frame_indices:
        raise ValueError("`ClipParams.frame_indices` is empty: a clip needs at least one frame.")
    if min(params.frame_indices) < 0 or max(params.frame_indices) >= num_frames:
        raise ValueError(
            f"`ClipParams.frame_indices` {list(params.frame_indices)} fall outside the "
            f"{num_frames} frames of {source}; draw them from its metadata."
        )
    if (
        params.crop_x < 0
        or params.crop_y < 0
        or params.crop_x + params.crop_size > params.resize_width
        or params.crop_y + params.crop_size > params.resize_height
    ):
        raise ValueError(
            f"The crop box (x={params.crop_x}, y={params.crop_y}, size={params.crop_size}) does not fit "
            f"the resized frame {params.resize_width}x{params.resize_height}."
        )


def distinct_frames(params: ClipParams) -> tuple[list[int], tuple[int, ...]]:
    """``(wanted, order)``: the clip's distinct source frames, sorted (each is read once), and for
    each output frame its position in ``wanted``."""
    wanted = sorted(set(params.frame_indices))
    position = {index: k for k, index in enumerate(wanted)}
    return wanted, tuple(position[i] for i in params.frame_indices)


def assemble_clip(frames: np.ndarray, order: Sequence[int], flip: bool) -> np.ndarray:
    """The clip from its distinct decoded frames ``(K, H, W, C)``: frames in output ``order``, flipped
    left-right when ``flip``, as a contiguous ``(C, T, H, W)`` array."""
    clip = frames[list(order)]  # (T, H, W, C), a copy
    if flip:
        clip = clip[:, :, ::-1]
    return np.ascontiguousarray(clip.transpose(3, 0, 1, 2))
