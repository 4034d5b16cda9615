"""The multigrid schedule: reference numbers, invariants, short schedules, bad settings."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
import warnings

import pytest

from lightning_multigrid.grid import GridShape
from lightning_multigrid.schedule import build_schedule, grid_counts
from lightning_multigrid.schedule.allocation import ShortScheduleWarning
from lightning_multigrid.schedule.config import MultigridConfig, MultigridOptions, ShortRun
from lightning_multigrid.schedule.stages import BNPlan, plan_batchnorm

OPTION_NAMES = {f.name for f in dataclasses.fields(MultigridOptions)}

# The Kinetics SlowFast 8x8 R50 configuration of the reference implementation.
KINETICS = dict(
    base=GridShape(8, 32, 224), devices=8, sampling_rate=2, milestones=(94, 154, 196), max_epochs=239,
)


def _ends(schedule):
    return [stage.end_epoch for stage in schedule.stages]


def test_kinetics_long_and_short_cycle_matches_reference():
    schedule = build_schedule(MultigridConfig(**KINETICS))
    assert schedule.max_epochs == 358
    long_cycle = [s for s in schedule.stages if not s.fine_tuning]
    assert [s.end_epoch for s in long_cycle] == [73, 110, 142, 158, 205, 228, 248, 259, 291, 308, 322, 329]
    fine_tuning = [s for s in schedule.stages if s.fine_tuning]
    # (329 + 358) // 2 = 343: the reference's LR drop inside fine-tuning.
    assert [(s.start_epoch, s.end_epoch, s.lr_stage) for s in fine_tuning] == [(329, 343, 2), (343, 358, 3)]
    saving = schedule.baseline_iterations(240_000) / schedule.total_iterations(240_000)
    assert saving == pytest.approx(3.42, abs=0.02)


def test_kinetics_shapes_lr_and_bn():
    schedule = build_schedule(MultigridConfig(**KINETICS))
    # T*S^2 = 32*224^2 = 1605632; 8*158^2*8 = 1597696 -> r = 8; 16*158^2 -> 4; 16*224^2 -> 2.
    first_cycle = schedule.stages[:4]
    assert [s.shape for s in first_cycle] == [
        GridShape(64, 8, 158), GridShape(32, 16, 158), GridShape(16, 16, 224), GridShape(8, 32, 224),
    ]
    assert [s.lr_factor for s in first_cycle] == [8, 4, 2, 1]
    # b / bn_base_size = 64/8, 32/8, 16/8, 8/8.
    assert [s.bn for s in first_cycle] == [BNPlan("split", 8), BNPlan("split", 4), BNPlan("split", 2), BNPlan()]
    # Stride in [tau, tau*T/t]: 2..8 for 8 frames, 2..4 for 16, 2..2 for 32.
    assert [s.sampling_rate for s in first_cycle] == [(2, 8), (2, 4), (2, 4), (2, 2)]
    assert schedule.relative_lr_at(0) == 8
    assert schedule.relative_lr_at(158) == pytest.approx(0.8)  # stage 1: 0.1 * 8
    assert schedule.relative_lr_at(330) == pytest.approx(0.01)  # fine-tuning, first half: 0.1**2
    assert schedule.relative_lr_at(357) == pytest.approx(0.001)


def test_short_cycle_order_and_batches():
    schedule = build_schedule(MultigridConfig(**KINETICS))
    # At crop 158: 112 gets round((158/112)^2) = 2x the batch, 158 gets 1x.
    assert [schedule.grid_at(0, i) for i in range(4)] == [
        GridShape(128, 8, 112), GridShape(64, 8, 158), GridShape(64, 8, 158), GridShape(128, 8, 112),
    ]
    # At crop 224: 4b at 112, 2b at 158, b at 224.
    assert [schedule.grid_at(150, i) for i in range(3)] == [
        GridShape(32, 32, 112), GridShape(16, 32, 158), GridShape(8, 32, 224),
    ]


def test_short_cycle_only_matches_reference():
    schedule = build_schedule(MultigridConfig(**KINETICS, options=MultigridOptions(long_cycle=False)))
    # Milestones x 1.5: 141, 231, 294; 239 x 1.5 = 358.5 -> 358.
    assert _ends(schedule) == [141, 231, 294, 358]
    assert {s.shape for s in schedule.stages} == {GridShape(8, 32, 224)}
    assert all(s.lr_factor == 1 for s in schedule.stages)


def test_short_cycle_only_truncates_as_the_reference():
    # PySlowFast's init_multigrid: STEPS = [int(s * EPOCH_FACTOR)], MAX_EPOCH = int(MAX_EPOCH * EPOCH_FACTOR):
    # 45 x 1.5 = 67.5 -> 67, 75 x 1.5 = 112.5 -> 112, 95 x 1.5 = 142.5 -> 142 (rounding gave 68, 112, 142).
    config = MultigridConfig(
        base=GridShape(8, 32, 224), sampling_rate=2, milestones=(45, 75), max_epochs=95,
        options=MultigridOptions(long_cycle=False),
    )
    assert _ends(build_schedule(config)) == [67, 112, 142]
    # A factor that is not a half: 45 x 1.3 = 58.5 -> 58, 75 x 1.3 = 97.5 -> 97, 95 x 1.3 = 123.5 -> 123.
    options = MultigridOptions(long_cycle=False, epoch_factor=1.3)
    assert _ends(build_schedule(dataclasses.replace(config, options=options))) == [58, 97, 123]


def test_long_cycle_only_runs_and_fine_tunes_on_base_shape():
    schedule = build_schedule(MultigridConfig(**KINETICS, options=MultigridOptions(short_cycle=False)))
    assert schedule.max_epochs == 358
    assert all(s.short_cycle == () for s in schedule.stages)
    assert schedule.stages[-1].shape == GridShape(8, 32, 224)
    assert schedule.stages[-1].fine_tuning
    assert schedule.grid_at(0, 0) == schedule.stage_at(0).shape
    # Without the short cycle each shape's share is proportional to r: 8/15 of 94 epochs first.
    assert schedule.stages[0].shape == GridShape(64, 8, 158)


def test_no_cycles_is_the_baseline():
    schedule = build_schedule(MultigridConfig(**KINETICS, options=MultigridOptions(long_cycle=False, short_cycle=False)))
    assert _ends(schedule) == [94, 154, 196, 239]
    assert schedule.baseline_iterations(240_000) == schedule.total_iterations(240_000) == 239 * 3750


@pytest.mark.parametrize("long_cycle", [True, False])
@pytest.mark.parametrize("short_cycle", [True, False])
@pytest.mark.parametrize(
    "max_epochs, milestones",
    [(239, (94, 154, 196)), (10, (4, 8)), (6, (2, 4)), (3, (1, 2)), (12, ()), (100, (30, 60, 90))],
)
def test_invariants(long_cycle, short_cycle, max_epochs, milestones):
    config = MultigridConfig(
        base=GridShape(4, 16, 112),
        max_epochs=max_epochs,
        milestones=milestones,
        options=MultigridOptions(long_cycle=long_cycle, short_cycle=short_cycle),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ShortScheduleWarning)
        schedule = build_schedule(config)
    # Contiguous, non-empty stages from epoch 0.
    assert schedule.stages[0].start_epoch == 0
    for before, after in zip(schedule.stages, schedule.stages[1:]):
        assert before.end_epoch == after.start_epoch
    assert all(s.num_epochs >= 1 for s in schedule.stages)
    # LR stages non-decreasing, each baseline stage used, so no duplicate or missing LR step.
    lr_stages = [s.lr_stage for s in schedule.stages]
    assert lr_stages == sorted(lr_stages)
    assert set(lr_stages) == set(range(len(milestones) + 1))
    # Equation 1: every long-cycle grid costs about the base grid (rounding of r aside).
    base_cost = 4 * 16 * 112**2
    for stage in schedule.stages:
        cost = stage.shape.batch_size * stage.shape.num_frames * stage.shape.crop_size**2
        assert 0.8 < cost / base_cost < 1.25
    # The multigrid LR stages tile the run and map onto the baseline's.
    assert schedule.baseline_epoch_at(0) == 0
    assert schedule.baseline_epoch_at(schedule.max_epochs) == max_epochs
    for i, start in enumerate(schedule.lr_stage_starts[:-1]):
        assert schedule.baseline_epoch_at(start) == pytest.approx(([0, *milestones])[i])


def test_short_schedule_ten_epochs():
    schedule = build_schedule(MultigridConfig(base=GridShape(8, 16, 112), max_epochs=10, milestones=(4, 8)))
    assert schedule.max_epochs == 15
    assert len(schedule.stages) == 10  # 2 cycles of 4 shapes, fine-tuning in two halves
    assert len({s.end_epoch for s in schedule.stages}) == len(schedule.stages)


def test_too_short_schedule_warns_and_drops_shapes():
    config = MultigridConfig(base=GridShape(8, 16, 112), max_epochs=5, milestones=(2, 4))
    with pytest.warns(ShortScheduleWarning, match="too few for every long-cycle shape") as caught:
        schedule = build_schedule(config)
    # Written as grids, as the schedule table writes them, not as factor tuples: the shortest stage
    # of each cycle is the base shape's (a shape's epochs follow its batch, and its batch is smallest).
    message = str(caught[0].message)
    assert "(batch x frames x crop: 8 x 16 x 112 in LR stage 0, 8 x 16 x 112 in LR stage 1)" in message, message
    # round(5 * 1.5) = 8 epochs for 8 long-cycle shapes + 2 fine-tuning halves: drop two.
    assert schedule.max_epochs == 8
    assert len(schedule.stages) == 8
    assert all(s.num_epochs == 1 for s in schedule.stages)


def test_fewer_epochs_than_lr_stages_is_an_error():
    options = MultigridOptions(epoch_factor=0.5)
    config = MultigridConfig(base=GridShape(8, 16, 112), max_epochs=4, milestones=(1, 2, 3), options=options)
    with pytest.raises(ValueError, match="fewer than its 4 LR stages"), warnings.catch_warnings():
        warnings.simplefilter("ignore", ShortScheduleWarning)
        build_schedule(config)


def test_baseline_epoch_mapping_kinetics():
    schedule = build_schedule(MultigridConfig(**KINETICS))
    # Multigrid LR stages start at 0, 158, 259, 343 and end at 358; baseline at 0, 94, 154, 196, 239.
    assert schedule.lr_stage_starts == (0, 158, 259, 343, 358)
    assert schedule.baseline_epoch_at(79) == pytest.approx(47)  # half of stage 0
    assert schedule.baseline_epoch_at(158) == pytest.approx(94)
    assert schedule.baseline_epoch_at(350.5) == pytest.approx(196 + 43 / 2)


def test_iterations_in_epoch():
    schedule = build_schedule(MultigridConfig(**KINETICS))
    # 240000 clips / 8 devices = 30000 per device; batches 128, 64, 64 -> 256 clips per 3 iterations:
    # 117 full cycles (29952 clips, 351 iterations), then 48 clips in one more batch.
    assert schedule.iterations_in_epoch(0, 240_000) == 352
    # Base shape: batches 32, 16, 8 -> 56 per cycle: 535 cycles (29960 clips), 40 more -> 2 batches.
    assert schedule.iterations_in_epoch(357, 240_000) == 535 * 3 + 2
    assert schedule.baseline_iterations(240_000) == 239 * 3750


@pytest.mark.parametrize(
    "batch_size, bn_base_size, devices, expected",
    [
        (64, 8, 8, BNPlan("split", num_splits=8)),
        (8, 8, 8, BNPlan()),
        (10, 8, 1, BNPlan()),  # round(10 / 8) = 1 group
        (12, 8, 1, BNPlan("split", num_splits=2)),
        (4, 8, 8, BNPlan("sync", group_size=2)),
        (2, 8, 8, BNPlan("sync", group_size=4)),
        (2, 8, 2, BNPlan("sync", group_size=2)),  # capped at the device count
        (4, 8, 1, BNPlan()),  # one device: nothing to sync with
    ],
)
def test_plan_batchnorm(batch_size, bn_base_size, devices, expected):
    assert plan_batchnorm(batch_size, bn_base_size, devices) == expected


def test_plan_batchnorm_that_cannot_be_split():
    with pytest.raises(ValueError, match="do not divide `devices`=3"):
        plan_batchnorm(4, 8, 3)
    with pytest.raises(ValueError, match="bn_base_size"):
        build_schedule(MultigridConfig(base=GridShape(4, 8, 64), max_epochs=10, devices=3))


def test_sync_group_in_schedule():
    schedule = build_schedule(MultigridConfig(base=GridShape(2, 16, 112), max_epochs=10, devices=4))
    # Coarse grids have b = 16 -> split 2; the base grid b = 2 -> sync over 4 ranks.
    assert schedule.stages[0].bn == BNPlan("split", num_splits=2)
    assert schedule.stages[-1].bn == BNPlan("sync", group_size=4)


def test_jitter_scales_follow_crop():
    schedule = build_schedule(MultigridConfig(**KINETICS))
    assert schedule.jitter_scales_for(224) == (256, 320)
    assert schedule.jitter_scales_for(112) == (128, 320)  # 256 * 112 / 224
    assert schedule.jitter_scales_for(158) == (181, 320)  # 256 * 158 / 224 = 180.57


def test_distinct_grids():
    schedule = build_schedule(MultigridConfig(**KINETICS))
    grids = schedule.distinct_grids()
    assert grids[0] == GridShape(128, 8, 112)
    assert GridShape(8, 32, 224) in grids
    # 8 frames: 128@112, 64@158; 16 frames: 64@112, 32@158 (shared by the 158 and 224 shapes),
    # 16@224; 32 frames: 32@112, 16@158, 8@224.
    assert len(grids) == len(set(grids)) == 8


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"base": (8, 32, 224)}, "`base` must be a GridShape"),
        ({"max_epochs": 0}, "`max_epochs`"),
        ({"devices": 0}, "`devices`"),
        ({"bn_base_size": 0}, "`bn_base_size`"),
        ({"sampling_rate": 0}, "`sampling_rate`"),
        ({"sampling_rate": 2.5}, "`sampling_rate` must be a positive integer"),
        ({"epoch_factor": 0}, "`epoch_factor` must be a positive number, got 0"),
        ({"epoch_factor": -1.5}, "`epoch_factor`"),
        ({"gamma": 0}, "`gamma`"),
        ({"milestones": (154, 94)}, r"`milestones` must be strictly increasing and > 0, got \[154, 94\]"),
        ({"milestones": (94, 94)}, "strictly increasing"),
        ({"milestones": (0, 94)}, "strictly increasing"),
        ({"milestones": (94, 239)}, "must be < `max_epochs`=239"),
        ({"long_cycle_factors": ((0.25, 1.5),)}, r"in \(0, 1\], got \(0.25, 1.5\)"),
        ({"long_cycle_factors": ((0.0, 1.0),)}, "long_cycle_factors"),
        ({"long_cycle_factors": ()}, "long_cycle_factors"),
        ({"short_cycle_factors": (0.5, 2.0)}, "short_cycle_factors"),
        ({"jitter_scales": (100, 320)}, "smaller than `crop_size`=224"),
        # s_factor 0.4 < 1/sqrt2: round(0.4 * 224) = 90 px is below the short cycle's
        # round(224 / sqrt2) = 158 px, which would give short-cycle batches of round((90/158)^2) = 0 clips.
        (
            {"long_cycle_factors": ((0.25, 0.4), (1.0, 1.0))},
            r"\(0\.25, 0\.4\) gives a 90-pixel crop, smaller than the 158-pixel short-cycle crop",
        ),
    ],
)
def test_bad_settings(overrides, match):
    options = {name: value for name, value in overrides.items() if name in OPTION_NAMES}
    baseline = {name: value for name, value in overrides.items() if name not in OPTION_NAMES}
    with pytest.raises((ValueError, TypeError), match=match):
        MultigridConfig(**{**KINETICS, **baseline}, options=MultigridOptions(**options))


def test_stage_at_rejects_negative_epoch_and_clamps_past_end():
    schedule = build_schedule(MultigridConfig(**KINETICS))
    with pytest.raises(ValueError, match="`epoch` must be >= 0"):
        schedule.stage_at(-1)
    assert schedule.stage_at(10_000) is schedule.stages[-1]


def test_schedule_module_imports_no_torch():
    code = (
        "import sys; import lightning_multigrid.schedule.build, lightning_multigrid.schedule.preview; "
        "bad = [m for m in ('torch', 'pytorch_lightning', 'lightning', 'numpy') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_equation_1_rounding_literal():
    # r = round(16 * 112^2 / (4 * 79^2)) = round(8.04) = 8; batch = 2 * 8.
    schedule = build_schedule(MultigridConfig(base=GridShape(2, 16, 112), max_epochs=20, milestones=(10,)))
    assert schedule.stages[0].shape == GridShape(16, 4, 79)
    assert math.isclose(schedule.stages[0].sampling_rate[1], 4.0)


# A small baseline: 16 epochs of 8 clips x 8 frames x 32 px over 960 clips (120 iterations an
# epoch, 1920 in all), LR steps at 12 and 14: the accuracy benchmark's short schedule.
SMALL = dict(base=GridShape(8, 8, 32), sampling_rate=2, max_epochs=16, milestones=(12, 14))


def test_grid_counts_small_schedule():
    schedule = build_schedule(MultigridConfig(**SMALL))
    counts = {(c.grid.batch_size, c.grid.num_frames, c.grid.crop_size): (c.iterations, c.clips)
              for c in grid_counts(schedule, 960)}
    # Coarsest shape 64 x 2 x 23, short cycle 128@16, 64@23, 64@23 (256 clips a cycle), epochs
    # 0-7 and 17-19, 9 epochs: 960 = 3 cycles (768) + 128 + 64, so per epoch 128 x 2 x 16 runs
    # 3 + 1 = 4 iterations (512 clips) and 64 x 2 x 23 runs 3 + 1 + 3 = 7 (448 clips).
    assert counts[(128, 2, 16)] == (9 * 4, 9 * 512)
    assert counts[(64, 2, 23)] == (9 * 7, 9 * 448)
    # Full shape 8 x 8 x 32, short cycle 32@16, 16@23, 8@32 (56 clips a cycle), epochs 15-17 and
    # 21-24, 5 epochs: 960 = 17 cycles (952) + 8, so 8 x 8 x 32 runs 17 iterations (136 clips).
    assert counts[(8, 8, 32)] == (5 * 17, 5 * 136)
    assert counts[(32, 8, 16)] == (5 * 18, 5 * (17 * 32 + 8))
    assert counts[(16, 8, 23)] == (5 * 17, 5 * 17 * 16)
    # Order of first use; totals agree with the epoch counts.
    assert list(counts) == [(128, 2, 16), (64, 2, 23), (64, 4, 16), (32, 4, 23), (16, 4, 32), (32, 8, 16),
                            (16, 8, 23), (8, 8, 32)]
    assert sum(i for i, _ in counts.values()) == schedule.total_iterations(960) == 591
    assert sum(c for _, c in counts.values()) == schedule.max_epochs * 960


def test_grid_counts_per_device_with_padding():
    # 2 devices, 101 clips: each rank serves ceil(101 / 2) = 51 clips an epoch, the last batch of 3.
    schedule = build_schedule(MultigridConfig(
        base=GridShape(8, 8, 32),
        max_epochs=4,
        devices=2,
        options=MultigridOptions(long_cycle=False, short_cycle=False),
    ))
    (count,) = grid_counts(schedule, 101)
    assert (count.grid, count.iterations, count.clips) == (GridShape(8, 8, 32), 4 * 7, 4 * 51)


def test_grid_counts_rejects_empty_dataset():
    with pytest.raises(ValueError, match="`dataset_size` must be a positive integer, got 0"):
        grid_counts(build_schedule(MultigridConfig(**SMALL)), 0)


def test_full_grid_share_small_schedule():
    schedule = build_schedule(MultigridConfig(**SMALL, options=MultigridOptions(full_grid_share=0.25)))
    # Fine-tuning: ceil(0.25 * 16) = 4 epochs (the paper's has 2), short cycle off, split at
    # (23 + 27) // 2 = 25 between LR stages 1 and 2. The stages before keep the paper's 22.x
    # exact epochs, rounded: 8, 13, 16, 18 | 20, 21, 22, 23.
    assert _ends(schedule) == [8, 13, 16, 18, 20, 21, 22, 23, 25, 27]
    fine_tuning = [s for s in schedule.stages if s.fine_tuning]
    assert [(s.start_epoch, s.end_epoch, s.lr_stage, s.short_cycle) for s in fine_tuning] == [
        (23, 25, 1, ()), (25, 27, 2, ()),
    ]
    counts = {c.grid: c.iterations for c in grid_counts(schedule, 960)}
    # 4 fine-tuning epochs x 120 iterations, plus 17 a long-cycle epoch at 8 x 8 x 32 in epochs
    # 16-18 and 22-23 (3 epochs): 480 + 51 = 531, over a quarter of the baseline's 1920.
    assert counts[GridShape(8, 8, 32)] == 4 * 120 + 3 * 17 == 531
    assert schedule.total_iterations(960) == 978
    assert schedule.lr_stage_starts == (0, 18, 25, 27)


def test_full_grid_share_zero_is_the_paper_schedule():
    paper = build_schedule(MultigridConfig(**KINETICS))
    explicit = build_schedule(MultigridConfig(**KINETICS, options=MultigridOptions(full_grid_share=0.0)))
    assert explicit.stages == paper.stages and paper.max_epochs == 358


def test_full_grid_share_kinetics():
    schedule = build_schedule(MultigridConfig(**KINETICS, options=MultigridOptions(full_grid_share=0.1)))
    # ceil(0.1 * 239) = 24 fine-tuning epochs (the paper's: 329-358, 29) -> the paper's 29 stay,
    # short cycle off: 29 x 3750 = 108750 full-grid iterations in fine-tuning.
    fine_tuning = [s for s in schedule.stages if s.fine_tuning]
    assert [(s.start_epoch, s.end_epoch, s.short_cycle) for s in fine_tuning] == [(329, 343, ()), (343, 358, ())]
    assert schedule.max_epochs == 358


def test_full_grid_share_without_milestones_adds_fine_tuning():
    config = MultigridConfig(base=GridShape(8, 8, 32), max_epochs=10, options=MultigridOptions(full_grid_share=0.5))
    schedule = build_schedule(config)
    # One long cycle over the paper's 15 epochs (1.5 x 10), then ceil(0.5 * 10) = 5 epochs at the
    # base shape, in the same (only) LR stage.
    last = schedule.stages[-1]
    assert (last.start_epoch, last.end_epoch, last.fine_tuning, last.short_cycle) == (15, 20, True, ())
    assert last.shape == GridShape(8, 8, 32) and last.lr_stage == 0
    assert schedule.stages[-2].end_epoch == 15


@pytest.mark.parametrize("share", [-0.1, 1.5, "0.2", True])
def test_full_grid_share_bad_values(share):
    with pytest.raises(ValueError, match="`full_grid_share` must be a number in \\[0, 1\\]"):
        MultigridConfig(**SMALL, options=MultigridOptions(full_grid_share=share))


def test_scale_bn_base_size_one_device():
    paper = build_schedule(MultigridConfig(**SMALL))
    scaled = build_schedule(MultigridConfig(**SMALL, options=MultigridOptions(scale_bn_base_size=True)))
    # Paper: groups of 8 clips: 64/8, 32/8, 16/8 splits. Scaled: 8 x r = 64, 32, 16, 8 clips, the
    # whole batch of every long-cycle shape, so plain BatchNorm throughout.
    assert [s.bn for s in paper.stages[:4]] == [BNPlan("split", 8), BNPlan("split", 4), BNPlan("split", 2), BNPlan()]
    assert {s.bn for s in scaled.stages} == {BNPlan()}
    assert [s.shape for s in scaled.stages] == [s.shape for s in paper.stages]


def test_scale_bn_base_size_syncs_across_ranks():
    config = dict(base=GridShape(2, 8, 32), devices=8, max_epochs=16, milestones=(12, 14))
    paper = build_schedule(MultigridConfig(**config))
    scaled = build_schedule(MultigridConfig(**config, options=MultigridOptions(scale_bn_base_size=True)))
    # Coarsest: 2 x 8 = 16 clips per device. Paper: 16 / 8 = 2 splits. Scaled: base size
    # 8 x 8 = 64 clips = 64 / 16 = 4 ranks, as the base shape's 8 / 2 = 4 ranks.
    assert (paper.stages[0].shape.batch_size, paper.stages[0].bn) == (16, BNPlan("split", 2))
    assert scaled.stages[0].bn == BNPlan("sync", group_size=4)
    assert scaled.stages[-1].bn == paper.stages[-1].bn == BNPlan("sync", group_size=4)


@pytest.mark.parametrize("value", [-1, 2, "false", 1.0, None])
@pytest.mark.parametrize("name", ["scale_bn_base_size", "long_cycle", "short_cycle"])
def test_switches_accept_only_real_booleans(name, value):
    """`scale_bn_base_size` accepted -1, 2 and "false", and each turned the scaling on."""
    with pytest.raises(ValueError, match=f"`{name}` must be True or False, got {value!r}"):
        MultigridOptions(**{name: value})


# --------------------------------------------------------------------------- short-run mode


def _stages(schedule):
    return [(s.start_epoch, s.end_epoch, s.lr_stage, s.shape, s.lr_factor) for s in schedule.stages]


def test_short_run_small_schedule():
    schedule = build_schedule(MultigridConfig(**SMALL, options=MultigridOptions(short_run=ShortRun())))
    # Coarse grids of the default long cycle, with Equation 1's r: 2 x 23 px r = round(8*32^2 / (2*23^2))
    # = round(7.74) = 8; 4 x 23 px r = round(3.87) = 4; 4 x 32 px r = 2. floor(0.5 * 16) = 8 coarse
    # epochs split in proportion to 1/8 : 1/4 : 1/2 (= 1 : 2 : 4): cumulative ends round(8/7) = 1,
    # round(24/7) = 3, 8 -> 1, 2 and 5 epochs, coarsest first, all at the base batch (LR factor 1).
    # Then the full grid for 8 epochs, broken at the baseline's milestones 12 and 14.
    assert _stages(schedule) == [
        (0, 1, 0, GridShape(8, 2, 23), 1),
        (1, 3, 0, GridShape(8, 4, 23), 1),
        (3, 8, 0, GridShape(8, 4, 32), 1),
        (8, 12, 0, GridShape(8, 8, 32), 1),
        (12, 14, 1, GridShape(8, 8, 32), 1),
        (14, 16, 2, GridShape(8, 8, 32), 1),
    ]
    assert all(s.short_cycle == () and s.bn == BNPlan() and not s.fine_tuning for s in schedule.stages)
    assert schedule.stages[0].sampling_rate == (2.0, 8.0)  # 2 of 8 frames: stride 2 to 2 * 8 / 2
    # The baseline's epochs and LR stages: multigrid epoch e is baseline epoch e.
    assert schedule.max_epochs == 16 and schedule.lr_stage_starts == (0, 12, 14, 16)
    assert schedule.baseline_epoch_at(5.5) == 5.5
    # 960 clips / 8 = 120 steps every epoch: the baseline's 1920 optimizer steps, 8 x 120 = 960 at the full grid.
    assert schedule.total_iterations(960) == schedule.baseline_iterations(960) == 1920
    counts = {c.grid: c.iterations for c in grid_counts(schedule, 960)}
    assert counts == {GridShape(8, 2, 23): 120, GridShape(8, 4, 23): 240, GridShape(8, 4, 32): 600, GridShape(8, 8, 32): 960}


def test_short_run_capped_lr_factor():
    schedule = build_schedule(MultigridConfig(**SMALL, options=MultigridOptions(short_run=ShortRun(max_lr_factor=2))))
    # Every coarse grid has r >= 2, so each gets batch 8 * min(r, 2) = 16 and LR factor 2, with
    # BatchNorm split in two groups of 8; 960 / 16 = 60 steps per coarse epoch: 8 x 60 + 8 x 120 = 1440.
    coarse = [s for s in schedule.stages if s.shape.num_frames < 8]
    assert [(s.shape.batch_size, s.lr_factor, s.bn) for s in coarse] == [(16, 2, BNPlan("split", num_splits=2))] * 3
    assert schedule.total_iterations(960) == 1440


def test_short_run_kinetics_splits_coarse_grids_at_milestones():
    config = MultigridConfig(**KINETICS, options=MultigridOptions(short_run=ShortRun(coarse_share=0.5)))
    schedule = build_schedule(config)
    # floor(0.5 * 239) = 119 coarse epochs in ratio 1 : 2 : 4 (r = 8, 4, 2): ends round(119/7) = 17,
    # round(357/7) = 51, 119. The 16 x 224 grid crosses milestone 94: two stages, LR stages 0 and 1.
    assert [(s.start_epoch, s.end_epoch, s.lr_stage, s.shape.num_frames, s.shape.crop_size) for s in schedule.stages] == [
        (0, 17, 0, 8, 158), (17, 51, 0, 16, 158), (51, 94, 0, 16, 224), (94, 119, 1, 16, 224),
        (119, 154, 1, 32, 224), (154, 196, 2, 32, 224), (196, 239, 3, 32, 224),
    ]
    assert {s.shape.batch_size for s in schedule.stages} == {8}


def test_short_run_drops_a_grid_that_rounds_to_no_epoch():
    schedule = build_schedule(MultigridConfig(**SMALL, options=MultigridOptions(short_run=ShortRun(coarse_share=0.25))))
    # floor(0.25 * 16) = 4 coarse epochs: ends round(4/7) = 1, round(12/7) = 2, 4 -> 1, 1, 2.
    assert [s.end_epoch for s in schedule.stages][:3] == [1, 2, 4]
    schedule = build_schedule(MultigridConfig(**SMALL, options=MultigridOptions(short_run=ShortRun(coarse_share=0.125))))
    # 2 coarse epochs: ends round(2/7) = 0, round(6/7) = 1, 2: the coarsest grid is left out.
    assert [(s.end_epoch, s.shape.num_frames, s.shape.crop_size) for s in schedule.stages][:2] == [(1, 4, 23), (2, 4, 32)]


def test_short_run_zero_share_is_the_baseline():
    schedule = build_schedule(MultigridConfig(**SMALL, options=MultigridOptions(short_run=ShortRun(coarse_share=0.0))))
    assert {s.shape for s in schedule.stages} == {GridShape(8, 8, 32)}
    assert _ends(schedule) == [12, 14, 16]


@pytest.mark.parametrize(
    "short_run, message",
    [
        (dict(coarse_share=1.0), r"`short_run.coarse_share` must be a number in \[0, 1\), got 1.0"),
        (dict(coarse_share=-0.1), r"`short_run.coarse_share` must be a number in \[0, 1\), got -0.1"),
        (dict(coarse_share=True), r"`short_run.coarse_share` must be a number in \[0, 1\), got True"),
        (dict(max_lr_factor=0), "`short_run.max_lr_factor` must be a positive integer, got 0"),
    ],
)
def test_short_run_bad_settings(short_run, message):
    with pytest.raises(ValueError, match=message):
        ShortRun(**short_run)


def test_short_run_and_full_grid_share_conflict():
    with pytest.raises(ValueError, match=r"`short_run` and `full_grid_share`=0.25.*Set `full_grid_share=0`"):
        MultigridOptions(short_run=ShortRun(), full_grid_share=0.25)


def test_config_to_dict_and_back():
    options = MultigridOptions(short_cycle=False, short_run=ShortRun(coarse_share=0.25, max_lr_factor=2))
    config = MultigridConfig(**KINETICS, jitter_scales=(256, 320), options=options)
    values = config.to_dict()
    assert values["base"] == {"batch_size": 8, "num_frames": 32, "crop_size": 224}
    assert values["options"]["short_run"] == {"coarse_share": 0.25, "max_lr_factor": 2}
    assert "_clip_sampling" not in values
    # As a checkpoint stores it: lists where the config holds tuples.
    listed = {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}
    listed["options"] = {**values["options"], "long_cycle_factors": [list(f) for f in options.long_cycle_factors],
                         "short_cycle_factors": list(options.short_cycle_factors)}
    assert MultigridConfig.from_dict(listed) == config


def test_config_from_a_checkpoint_with_flat_options():
    # What a checkpoint held before the options were one value (written by that version's to_dict).
    flat = {
        "base": {"batch_size": 8, "num_frames": 8, "crop_size": 32}, "max_epochs": 16, "milestones": (12, 14),
        "sampling_rate": 2, "gamma": 0.1, "devices": 1, "long_cycle": True, "short_cycle": True, "epoch_factor": 1.5,
        "long_cycle_factors": ((0.5, 0.7071067811865476), (1.0, 1.0)), "short_cycle_factors": (0.5, 0.7071067811865476),
        "bn_base_size": 4, "jitter_scales": None, "full_grid_share": 0.0, "scale_bn_base_size": True,
        "short_run": True, "short_run_coarse_share": 0.25, "short_run_max_lr_factor": 2,
    }
    options = MultigridOptions(
        long_cycle_factors=((0.5, 0.5**0.5), (1.0, 1.0)), bn_base_size=4, scale_bn_base_size=True,
        short_run=ShortRun(coarse_share=0.25, max_lr_factor=2),
    )
    assert MultigridConfig.from_dict(flat) == MultigridConfig(**SMALL, options=options)
    # The short-run mode off: its two settings are dropped with it; an option still older
    # checkpoints lack takes its default.
    off = {k: v for k, v in flat.items() if k not in ("scale_bn_base_size", "full_grid_share")} | {"short_run": False}
    expected = dataclasses.replace(options, short_run=None, scale_bn_base_size=False)
    assert MultigridConfig.from_dict(off) == MultigridConfig(**SMALL, options=expected)


def test_config_from_a_checkpoint_with_an_unknown_option():
    values = MultigridConfig(**SMALL).to_dict()
    values["options"]["short_run_share"] = 0.5  # a misspelt key is refused, not dropped
    with pytest.raises(TypeError, match="short_run_share"):
        MultigridConfig.from_dict(values)


def test_config_from_an_old_checkpoint():
    # Before the config held one GridShape and an int stride: flat sizes, a float sampling_rate.
    values = MultigridConfig(**KINETICS).to_dict()
    old = {**{k: v for k, v in values.items() if k != "base"}, **values["base"], "sampling_rate": 2.0}
    restored = MultigridConfig.from_dict(old)
    assert restored == MultigridConfig(**KINETICS)
    assert restored.sampling_rate == 2 and isinstance(restored.sampling_rate, int)


def test_where_the_grids_change_and_which_ranks_sync_batchnorm() -> None:
    # Stages start at epochs 0, 7, 10, 13: 64 x 4 x 158, 32 x 8 x 158, 16 x 8 x 224, 8 x 16 x 224.
    schedule = build_schedule(MultigridConfig(GridShape(8, 16, 224), max_epochs=10))
    assert [epoch for epoch in range(15) if schedule.grids_change_after(epoch)] == [6, 9, 12]
    assert schedule.sync_group_sizes() == ()  # 8 clips per device: BatchNorm never needs other ranks
    # 2 clips per device, bn_base_size 8, 4 devices: 4 x 8 x 224 syncs pairs of ranks, the base shape all 4.
    small = build_schedule(MultigridConfig(GridShape(2, 16, 224), max_epochs=10, devices=4))
    assert [stage.bn.mode for stage in small.stages] == ["split", "plain", "sync", "sync"]
    assert small.sync_group_sizes() == (2, 4)


@pytest.mark.parametrize(
    ("long_cycle", "convert_batchnorm", "manages"), [(True, True, True), (True, False, False), (False, True, False)]
)
def test_batchnorm_is_managed_with_the_long_cycle_only(long_cycle: bool, convert_batchnorm: bool, manages: bool) -> None:
    assert MultigridOptions(long_cycle=long_cycle).manages_batchnorm(convert_batchnorm) is manages
