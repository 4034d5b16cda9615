"""The batch sizers: Equation 1's and the measured costs', with the arithmetic written out."""

from __future__ import annotations

import dataclasses

import pytest

from lightning_multigrid.grid import GridShape
from lightning_multigrid.schedule.config import ClipCost, MultigridConfig, MultigridOptions, ShortRun
from lightning_multigrid.schedule.sizing import (
    CostSizer,
    Equation1Sizer,
    StageBatches,
    cost_sized_batch,
    scaled_size,
)

BASE = GridShape(batch_size=8, num_frames=16, crop_size=224)
EQUATION1 = Equation1Sizer(BASE)
# Costs per clip in one unit; the base grid's is 1.
COSTS = CostSizer(BASE, "flops", {(16, 224): 1.0, (4, 112): 0.3, (4, 56): 0.1, (4, 79): 0.2})


def no_groups(batch_size: int) -> int:
    return 1


def test_equation1_batch_of_a_grid():
    # 8 * round(16 * 224^2 / (4 * 112^2)) = 8 * round(16) = 128 clips.
    assert EQUATION1.relative_batch(4, 112) == 16
    assert EQUATION1.stage_batches(4, 112, (), None, no_groups) == StageBatches(128, 16, ())
    # 16 * 224^2 / (8 * 158^2) = 4.02 -> 4: 32 clips.
    assert EQUATION1.stage_batches(8, 158, (), None, no_groups) == StageBatches(32, 4, ())
    assert EQUATION1.stage_batches(16, 224, (), None, no_groups) == StageBatches(8, 1, ())
    assert EQUATION1.relative_batch(32, 448) == 1  # a grid above the base: at least the base batch


def test_equation1_short_cycle_multiplies_the_stage_batch():
    # Crops 56 and 79 of the 4 x 112 grid: 128 * round((112/56)^2) = 512, 128 * round((112/79)^2) = 128 * 2 = 256.
    batches = EQUATION1.stage_batches(4, 112, (56, 79), None, no_groups)
    assert batches == StageBatches(128, 16, (512, 256))


def test_equation1_cap_and_lr_factor_stay_integers():
    # The short-run mode's cap: min(16, 2) = 2, 8 * 2 = 16 clips; the LR factor an integer (JSON writes 2, not 2.0).
    batches = EQUATION1.stage_batches(4, 112, (), 2, no_groups)
    assert batches == StageBatches(16, 2, ())
    assert isinstance(batches.lr_factor, int)


def test_equation1_ignores_batchnorm_groups():
    # The paper's batches are multiples of the base batch, never rounded to the BatchNorm groups.
    sizer = Equation1Sizer(GridShape(5, 16, 224))
    assert sizer.stage_batches(8, 224, (), None, lambda batch: 2) == StageBatches(10, 2, ())


def test_equation1_average_relative_batch_uses_unrounded_short_crops():
    # As the reference: crops 0.5 * 224 = 112 and 0.7071 * 224 = 158.39 of the 8 x 224 shape:
    # round(16*224^2 / (8*112^2)) = 8, round(16*224^2 / (8*158.39^2)) = round(4.0) = 4, round(2) = 2 -> 14 / 3.
    factors = (0.5, 0.5**0.5)
    assert EQUATION1.average_relative_batch(8, 224, factors, no_groups) == pytest.approx(14 / 3)
    assert EQUATION1.average_relative_batch(8, 224, (), no_groups) == 2


def test_equation1_cost_ratio_is_the_relative_batch():
    assert EQUATION1.cost_ratio(4, 112) == 16
    assert EQUATION1.measure is None


def test_equation1_has_no_measured_cost():
    with pytest.raises(ValueError, match=r"no cost for the 4 x 112 grid .*'equation1' needs \(measured: none\)"):
        EQUATION1.relative_cost(4, 112)


def test_cost_sized_batch():
    # round(8 / 0.3) = round(26.67) = 27; at least one clip.
    assert cost_sized_batch(8, 0.3) == 27
    assert cost_sized_batch(8, 100.0) == 1
    assert COSTS.relative_cost(4, 112) == pytest.approx(0.3)
    assert COSTS.sized_batch(4, 112) == 27
    assert COSTS.cost_ratio(4, 112) == pytest.approx(1 / 0.3)
    assert COSTS.measure == "flops"


def test_cost_stage_batches_round_to_the_batchnorm_groups():
    # 27 clips in 2 groups -> 2 * round(13.5) = 28; the short cycle's round(8 / 0.1) = 80 and round(8 / 0.2) = 40
    # stay multiples of 2. The LR factor is the ratio 28 / 8 = 3.5.
    batches = COSTS.stage_batches(4, 112, (56, 79), None, lambda batch: 2)
    assert batches == StageBatches(28, 3.5, (80, 40))
    assert COSTS.stage_batches(4, 112, (), None, no_groups) == StageBatches(27, 27 / 8, ())


def test_cost_stage_batches_capped_before_grouping():
    # min(27, 8 * 2) = 16 clips, the groups asked for 16: 3 groups -> 3 * round(16 / 3) = 15.
    asked = []
    batches = COSTS.stage_batches(4, 112, (), 2, lambda batch: asked.append(batch) or 3)
    assert asked == [16] and batches == StageBatches(15, 15 / 8, ())


def test_cost_average_relative_batch_is_the_stage_batches():
    # Short crops round(0.25 * 224) = 56 and round(0.3527 * 224) = 79: (80 + 40 + 27) / 3 / 8.
    assert COSTS.average_relative_batch(4, 112, (0.25, 0.3527), no_groups) == pytest.approx(147 / 3 / 8)


def test_cost_sizer_names_a_missing_grid():
    with pytest.raises(ValueError, match=r"no cost for the 8 x 112 grid .*'flops' needs \(measured: 16 x 224, 4 x 112"):
        COSTS.relative_cost(8, 112)
    without_base = CostSizer(BASE, "time", {(4, 112): 0.3})
    with pytest.raises(ValueError, match=r"no cost for the 16 x 224 grid .*'time' needs"):
        without_base.relative_cost(4, 112)


def test_scaled_size():
    assert scaled_size(224, 0.5**0.5) == 158  # 158.39
    assert scaled_size(16, 0.25) == 4
    assert scaled_size(3, 0.1) == 1  # at least 1


def test_the_config_picks_the_sizer_once():
    config = MultigridConfig(base=BASE, max_epochs=10)
    assert config.sizer == Equation1Sizer(BASE) and not config.sizes_by_cost
    costs = tuple(ClipCost(g.num_frames, g.crop_size, g.num_frames * g.crop_size**2) for g in config.cost_grids())
    measured = dataclasses.replace(config, options=MultigridOptions(batch_sizing="time"), clip_costs=costs)
    assert isinstance(measured.sizer, CostSizer) and measured.sizer.measure == "time" and measured.sizes_by_cost
    assert measured.sized_batch(4, 158) == measured.sizer.sized_batch(4, 158) == round(8 * 16 * 224**2 / (4 * 158**2))
    assert measured.with_equation1_batches().sizer == Equation1Sizer(BASE)


def test_short_run_options_cap_the_batch_and_drop_the_short_cycle():
    options = MultigridOptions(short_run=ShortRun(coarse_share=0.5, max_lr_factor=2))
    assert options.max_lr_factor == 2 and not options.trains_short_cycle
    assert MultigridOptions().max_lr_factor is None and MultigridOptions().trains_short_cycle
    assert not MultigridOptions(short_cycle=False).trains_short_cycle
