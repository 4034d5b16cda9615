"""Clip sampling: pure functions, literal expected values with the arithmetic written out."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from lightning_multigrid.data.clip_params import (
    ClipParams,
    ClipRequest,
    eval_clip_params,
    eval_short_side,
    frame_indices,
    resized_size,
    sample_clip_params,
    span_frames,
)
from lightning_multigrid.data.decoding.metadata import FrameTimestamps, VideoMetadata
from lightning_multigrid.grid import ClipSampling, EvalViews, GridShape


def metadata(num_frames: int = 24, width: int = 64, height: int = 48) -> VideoMetadata:
    return VideoMetadata(
        width=width,
        height=height,
        num_frames=num_frames,
        fps=12.0,
        duration=num_frames / 12,
        time_base=Fraction(1, 12),
        timestamps=FrameTimestamps(0, 1, num_frames),
        keyframe_pts=(0,),
    )


def request(**changes: object) -> ClipRequest:
    base = ClipRequest(index=0, num_frames=4, crop_size=32, sampling_rate_range=(2.0, 2.0), scale_range=(48, 48), seed=0)
    return base._replace(**changes)


def test_exact_draws_for_seed_0() -> None:
    # random.Random(0) gives, in order:
    #   stride = uniform(2, 2)              = 2.0
    #   span   = floor((4 - 1) * 2.0) + 1   = 7 frames
    #   start  = randint(0, 24 - 7 = 17)    = 13  -> frames 13, 15, 17, 19
    #   short side = randint(48, 48)        = 48  -> 64x48 stays 64x48
    #   crop_x = randint(0, 64 - 32)        = 16
    #   crop_y = randint(0, 48 - 32)        = 16
    #   flip   = random() = 0.4859 < 0.5    = True
    assert sample_clip_params(request(), metadata()) == ClipParams((13, 15, 17, 19), 64, 48, 16, 16, 32, True)
    assert sample_clip_params(request(), metadata(), flip=False).flip is False


def test_exact_fractional_stride() -> None:
    # random.Random(0): stride = uniform(2, 4) = 2 + 2 * 0.8444 = 3.6888...
    # span = floor(3 * 3.6888) + 1 = 12; start = randint(0, 24 - 12) = 12 (the second draw)
    # frames = 12 + floor(k * 3.6888) for k = 0..3 = 12 + (0, 3, 7, 11) = 12, 15, 19, 23
    stride = random.Random(0).uniform(2.0, 4.0)
    assert span_frames(4, stride) == 12
    assert [int(k * stride) for k in range(4)] == [0, 3, 7, 11]
    params = sample_clip_params(request(sampling_rate_range=(2.0, 4.0)), metadata())
    assert params.frame_indices == (12, 15, 19, 23)


def test_short_video_repeats_last_frame() -> None:
    # span 7 > 5 frames: start = randint(0, 0) = 0, frames 0, 2, 4, then 6 -> clamped to 4.
    assert sample_clip_params(request(), metadata(num_frames=5)).frame_indices == (0, 2, 4, 4)
    assert frame_indices(video_frames=10, num_frames=4, sampling_rate=3, start=2) == (2, 5, 8, 9)
    assert frame_indices(video_frames=1, num_frames=3, sampling_rate=2, start=0) == (0, 0, 0)


def test_same_seed_same_params_different_seed_different() -> None:
    video = metadata(num_frames=300, width=320, height=240)
    ranges = {"sampling_rate_range": (2.0, 8.0), "scale_range": (128, 160), "crop_size": 112}
    first = sample_clip_params(request(seed=123, **ranges), video)
    assert first == sample_clip_params(request(seed=123, **ranges), video)
    others = {sample_clip_params(request(seed=s, **ranges), video) for s in range(20)}
    assert len(others) == 20


@pytest.mark.parametrize("seed", range(50))
def test_draws_stay_in_range(seed: int) -> None:
    video = metadata(num_frames=100, width=320, height=240)
    params = sample_clip_params(
        request(seed=seed, num_frames=8, crop_size=112, sampling_rate_range=(2.0, 6.0), scale_range=(128, 160)), video
    )
    steps = [b - a for a, b in zip(params.frame_indices, params.frame_indices[1:])]
    assert all(1 <= s <= 7 for s in steps)
    assert 128 <= params.resize_height <= 160
    assert params.resize_width == round(320 * params.resize_height / 240)
    assert 0 <= params.crop_x <= params.resize_width - 112
    assert 0 <= params.crop_y <= params.resize_height - 112


def test_scale_below_crop_is_raised_to_the_crop() -> None:
    # scale_range (20, 48) with a 32 crop: the short side is drawn in [32, 48].
    for seed in range(20):
        assert sample_clip_params(request(seed=seed, scale_range=(20, 48)), metadata()).resize_height >= 32


def test_resized_size_keeps_aspect() -> None:
    assert resized_size(320, 240, 128) == (171, 128)  # 320 * 128 / 240 = 170.67
    assert resized_size(240, 320, 128) == (128, 171)
    assert resized_size(100, 100, 64) == (64, 64)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"num_frames": 0}, "num_frames"),
        ({"sampling_rate_range": (0.0, 2.0)}, "sampling_rate_range"),
        ({"sampling_rate_range": (3.0, 2.0)}, "sampling_rate_range"),
        ({"scale_range": (0, 48)}, "scale_range"),
        ({"scale_range": (20, 24)}, "crop would not fit"),
    ],
)
def test_invalid_requests(changes: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        sample_clip_params(request(**changes), metadata())


# The base shape and sampling of the eval tests: 8 frames at stride 4, crops of 112 from a short side of 128.
BASE_SHAPE, SAMPLING = GridShape(1, 8, 112), ClipSampling(4, (128, 128))


def test_eval_temporal_clips_spread_uniformly() -> None:
    # 100 frames, 8 frames at stride 4: span = 7 * 4 + 1 = 29, room = 71.
    # 3 clips start at round(0 * 71 / 2) = 0, round(71 / 2) = 36, round(2 * 71 / 2) = 71.
    video = metadata(num_frames=100, width=320, height=240)
    starts = [
        eval_clip_params(video, BASE_SHAPE, SAMPLING, EvalViews(3, 1), temporal_index=i).frame_indices[0]
        for i in range(3)
    ]
    assert starts == [0, 36, 71]
    single = eval_clip_params(video, BASE_SHAPE, SAMPLING, EvalViews(1, 1))
    assert single.frame_indices == tuple(35 + 4 * k for k in range(8))  # room // 2 = 35


def test_eval_spatial_crops() -> None:
    # 320x240 -> short side 128: 171x128. Crops of 112: x in {0, (171-112)//2 = 29, 59}, y = 8.
    video = metadata(num_frames=100, width=320, height=240)
    boxes = [
        (p.crop_x, p.crop_y)
        for p in (eval_clip_params(video, BASE_SHAPE, SAMPLING, EvalViews(1, 3), spatial_index=s) for s in range(3))
    ]
    assert boxes == [(0, 8), (29, 8), (59, 8)]
    centre = eval_clip_params(video, BASE_SHAPE, SAMPLING, EvalViews(1, 1))
    assert (centre.resize_width, centre.resize_height, centre.crop_x, centre.crop_y) == (171, 128, 29, 8)
    portrait = metadata(num_frames=100, width=240, height=320)
    assert [
        eval_clip_params(portrait, BASE_SHAPE, SAMPLING, EvalViews(1, 3), spatial_index=s).crop_y for s in range(3)
    ] == [0, 29, 59]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"temporal_index": 3, "views": EvalViews(3, 1)}, "temporal_index"),
        ({"spatial_index": 1}, "spatial_index"),
    ],
)
def test_eval_invalid(kwargs: dict[str, object], match: str) -> None:
    args = {"base_shape": BASE_SHAPE, "clip_sampling": SAMPLING, "views": EvalViews()} | kwargs
    with pytest.raises(ValueError, match=match):
        eval_clip_params(metadata(), **args)  # type: ignore[arg-type]


def test_eval_short_side_is_the_minimum_training_short_side() -> None:
    # One owner: the jitter minimum at the base crop, 128 here; by default round(112 * 256 / 224) = 128 too.
    assert eval_short_side(BASE_SHAPE, SAMPLING) == 128
    assert eval_short_side(GridShape(1, 8, 112), ClipSampling(4)) == 128
    assert eval_short_side(GridShape(1, 8, 112), ClipSampling(4, (150, 200))) == 150
