"""The grid facts (lightning_multigrid/grid.py): values that validate themselves, the baseline's
FixedGrid, the one count of batches, and the schedule as the same GridPlan."""

from __future__ import annotations

import pytest

from lightning_multigrid.grid import (
    ClipSampling,
    EvalViews,
    FixedGrid,
    GridPlan,
    GridShape,
    count_batches,
    default_jitter_scales,
)
from lightning_multigrid.schedule import build_schedule
from lightning_multigrid.schedule.config import MultigridConfig, MultigridOptions


@pytest.mark.parametrize(
    "args, match",
    [
        ((0, -3, 0), "`batch_size` must be a positive integer, got 0"),
        ((8, -1, 224), "`num_frames` must be a positive integer, got -1"),
        ((8, 32, 2.5), "`crop_size` must be a positive integer, got 2.5"),
        ((True, 32, 224), "`batch_size` must be a positive integer, got True"),
    ],
)
def test_grid_shape_refuses_what_is_not_a_positive_int(args, match):
    with pytest.raises(ValueError, match=match):
        GridShape(*args)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"sampling_rate": 0}, "`sampling_rate` must be a positive integer, got 0"),
        ({"sampling_rate": 2.0}, "`sampling_rate` must be a positive integer, got 2.0"),
        ({"sampling_rate": False}, "`sampling_rate`"),
        ({"jitter_scales": (320, 256)}, r"`jitter_scales` must be 0 < min <= max, got \(320, 256\)"),
        ({"jitter_scales": (0, 256)}, "`jitter_scales` must be 0 < min <= max"),
        ({"jitter_scales": (256,)}, r"`jitter_scales` must be a \(min, max\) pair"),
        ({"jitter_scales": "256"}, r"`jitter_scales` must be a \(min, max\) pair"),
    ],
)
def test_clip_sampling_refuses_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ClipSampling(**kwargs)


def test_clip_sampling_jitter_ranges():
    assert default_jitter_scales(224) == (256, 320)
    assert default_jitter_scales(112) == (128, 160)
    sampling = ClipSampling(2, [256.0, 320])  # a YAML list becomes an int pair
    assert sampling.jitter_scales == (256, 320)
    # The minimum scales with the crop, the maximum not: 256 * 158 / 224 = 180.57.
    assert sampling.jitter_scales_for(158, base_crop_size=224) == (181, 320)
    assert ClipSampling().jitter_scales_for(56, base_crop_size=112) == (64, 160)  # default for 112: (128, 160)
    sampling.check_fits(224)
    with pytest.raises(ValueError, match="`jitter_scales` min 256 is smaller than `crop_size`=288"):
        sampling.check_fits(288)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_views": 0}, "`num_views` must be a positive integer"),
        ({"num_crops": 2}, "`num_crops` must be 1 or 3, got 2"),
        ({"num_crops": True}, "`num_crops` must be 1 or 3"),
    ],
)
def test_eval_views_refuse_bad_counts(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EvalViews(**kwargs)


def test_fixed_grid_is_the_base_shape_every_epoch():
    plan = FixedGrid(GridShape(8, 16, 112), ClipSampling(sampling_rate=4))
    assert isinstance(plan, GridPlan)
    assert plan.cycle_at(0) == plan.cycle_at(500) == (GridShape(8, 16, 112),)
    assert plan.grid_at(7, 3) == GridShape(8, 16, 112)
    assert plan.sampling_rate_range_at(3) == (4.0, 4.0)
    assert plan.jitter_scales_for(112) == (128, 160)
    assert plan.epoch_spans() == ((0, None),)
    with pytest.raises(ValueError, match="smaller than `crop_size`=112"):
        FixedGrid(GridShape(8, 16, 112), ClipSampling(jitter_scales=(100, 160)))
    with pytest.raises(TypeError, match="`base_shape` must be a GridShape"):
        FixedGrid((8, 16, 112))  # type: ignore[arg-type]


def test_the_schedule_is_a_grid_plan():
    schedule = build_schedule(MultigridConfig(base=GridShape(8, 32, 224), sampling_rate=2, max_epochs=239,
                                              milestones=(94, 154, 196), devices=8))
    assert isinstance(schedule, GridPlan)
    assert schedule.base_shape == GridShape(8, 32, 224)
    assert schedule.clip_sampling == ClipSampling(2)
    assert schedule.sampling_rate_range_at(0) == (2.0, 8.0)  # 8 of 32 frames: stride 2 to 2 * 32 / 8
    assert schedule.epoch_spans()[0] == (0, schedule.stages[0].end_epoch)
    # Without a short cycle, the grid of every iteration is the stage's shape.
    no_short = build_schedule(MultigridConfig(base=GridShape(8, 32, 224), max_epochs=239, options=MultigridOptions(short_cycle=False)))
    assert no_short.grid_at(0, 5) == no_short.stage_at(0).shape
    assert no_short.cycle_at(0) == (no_short.stage_at(0).shape,)


def test_count_batches_literal():
    # 10 clips, sizes (4, 2, 1): one full cycle (7 clips), then 3 clips in a partial batch of 4.
    assert count_batches(10, (4, 2, 1)) == ((2, 7), (1, 2), (1, 1))
    assert count_batches(10, (4, 2, 1), drop_last=True) == ((1, 4), (1, 2), (1, 1))
    # 14 clips: exactly two cycles, nothing partial to drop.
    assert count_batches(14, (4, 2, 1)) == count_batches(14, (4, 2, 1), drop_last=True) == ((2, 8), (2, 4), (2, 2))
    assert count_batches(0, (4,)) == ((0, 0),)
    with pytest.raises(ValueError, match="batch_sizes"):
        count_batches(3, ())
    with pytest.raises(ValueError, match="num_clips"):
        count_batches(-1, (4,))
