"""Batches sized by measured cost (``batch_sizing``): the pure arithmetic, with the expected values worked out."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json

import pytest

from lightning_multigrid.cli.commands import main
from lightning_multigrid.grid import GridShape
from lightning_multigrid.schedule import build_schedule
from lightning_multigrid.schedule.config import ClipCost, MultigridConfig, MultigridOptions, ShortRun
from lightning_multigrid.schedule.preview import GridSizing, format_table, grid_sizings, schedule_to_dict
from lightning_multigrid.schedule.stages import BNPlan

# Base 4 x 8 x 32, two long-cycle shapes (4 x 32, then the base), no short cycle. The 4-frame clip
# costs 0.3 of a base clip (0.6 / 2.0: costs are read relative to the base grid's, in any unit).
TWO_SHAPES = MultigridConfig(
    base=GridShape(batch_size=4, num_frames=8, crop_size=32),
    max_epochs=10,
    options=MultigridOptions(
        long_cycle_factors=((0.5, 1.0), (1.0, 1.0)), short_cycle=False, bn_base_size=16, batch_sizing="flops"
    ),
    clip_costs=(ClipCost(8, 32, 2.0), ClipCost(4, 32, 0.6)),
)


def test_sized_batch_is_the_base_batch_over_the_relative_cost():
    assert TWO_SHAPES.relative_cost(4, 32) == pytest.approx(0.3)
    assert TWO_SHAPES.sized_batch(4, 32) == 13  # round(4 / 0.3) = round(13.33)
    assert TWO_SHAPES.sized_batch(8, 32) == 4
    # Equation 1 for the same grid: round(8 * 32^2 / (4 * 32^2)) = 2 -> 8 clips.
    assert TWO_SHAPES.relative_batch(4, 32) == 2


def test_stages_lr_factor_and_epochs_follow_the_sized_batch():
    schedule = build_schedule(TWO_SHAPES)
    coarse, base = schedule.stages
    assert coarse.shape == GridShape(13, 4, 32) and base.shape == GridShape(4, 8, 32)
    assert coarse.lr_factor == pytest.approx(13 / 4) and base.lr_factor == 1
    assert coarse.bn == base.bn == BNPlan()  # 13 and 4 clips: under bn_base_size=16 on one device
    # Epochs follow the average batch, so each shape gets the same iterations: 10 baseline epochs
    # split 3.25 : 1 -> 7.647 and 2.353, times epoch_factor 1.5 -> cumulative end round(11.47) = 11, then 15.
    assert [(s.start_epoch, s.end_epoch) for s in schedule.stages] == [(0, 11), (11, 15)]
    # Equation 1's schedule splits 2 : 1 -> ends round(10.0) = 10, 15.
    paper = build_schedule(TWO_SHAPES.with_equation1_batches())
    assert [(s.start_epoch, s.end_epoch) for s in paper.stages] == [(0, 10), (10, 15)]
    assert schedule.relative_lr_at(0) == pytest.approx(3.25)


def test_batchnorm_groups_follow_the_sized_batch_and_divide_it():
    config = dataclasses.replace(TWO_SHAPES, options=dataclasses.replace(TWO_SHAPES.options, bn_base_size=4))
    coarse, base = build_schedule(config).stages
    # 13 clips over groups of about bn_base_size=4: round(13 / 4) = 3 groups (Equation 1's 8 clips: 2);
    # the batch is rounded to a multiple of them, 3 * round(13 / 3) = 12, so every group has 4 clips.
    assert coarse.bn == BNPlan("split", num_splits=3) and base.bn == BNPlan()
    assert coarse.shape.batch_size == 12 and coarse.lr_factor == 3
    # The short cycle keeps the long cycle's groups: its batches are rounded to multiples of them too.
    config = MultigridConfig(
        base=GridShape(4, 8, 32), max_epochs=10,
        options=MultigridOptions(long_cycle_factors=((0.5, 1.0), (1.0, 1.0)), bn_base_size=4, batch_sizing="flops"),
        clip_costs=(ClipCost(8, 32, 1.0), ClipCost(8, 16, 0.2), ClipCost(8, 23, 0.45),
                    ClipCost(4, 32, 0.3), ClipCost(4, 16, 0.1), ClipCost(4, 23, 0.2)),
    )
    coarse = build_schedule(config).stages[0]
    # round(4 / 0.1) = 40, round(4 / 0.2) = 20, 12 as above (3 groups): 3 * round(40 / 3) = 39, 3 * round(20 / 3) = 21.
    assert [g.batch_size for g in coarse.short_cycle] == [39, 21, 12] and coarse.bn.num_splits == 3


def test_short_cycle_batches_are_sized_by_their_own_cost():
    # One long-cycle shape (the base), short-cycle crops round(0.5 * 32) = 16 and round(32 / sqrt 2) = 23.
    config = MultigridConfig(
        base=GridShape(4, 8, 32), max_epochs=10,
        options=MultigridOptions(long_cycle_factors=((1.0, 1.0),), batch_sizing="time"),
        clip_costs=(ClipCost(8, 32, 1.0), ClipCost(8, 16, 0.2), ClipCost(8, 23, 0.45)),
    )
    (stage,) = build_schedule(config).stages
    # round(4 / 0.2) = 20, round(4 / 0.45) = round(8.89) = 9, the base 4 (Equation 1: 16, 8, 4).
    assert [(g.batch_size, g.crop_size) for g in stage.short_cycle] == [(20, 16), (9, 23), (4, 32)]
    assert stage.lr_factor == 1  # the long-cycle batch's, never the short cycle's


def test_short_run_caps_the_sized_batch():
    config = dataclasses.replace(TWO_SHAPES, options=dataclasses.replace(
        TWO_SHAPES.options, short_run=ShortRun(coarse_share=0.5, max_lr_factor=2)))
    stages = build_schedule(config).stages
    # The 4-frame grid is coarse (1 / 0.3 > 1): floor(0.5 * 10) = 5 epochs at min(13, 4 * 2) = 8 clips.
    assert [(s.start_epoch, s.end_epoch, s.shape.batch_size, s.lr_factor) for s in stages] == [
        (0, 5, 8, 2.0), (5, 10, 4, 1)]


def test_cost_grids_are_every_grid_at_equation_1s_batch():
    config = MultigridConfig(base=GridShape(8, 8, 64), max_epochs=40, milestones=(30, 36),
                             options=MultigridOptions(batch_sizing="flops"))
    # The base first, its short-cycle crops 32 and 45, then the long-cycle shapes 2 x 45, 4 x 45, 4 x 64
    # (with their short-cycle crops) in the paper's order.
    assert [(g.batch_size, g.num_frames, g.crop_size) for g in config.cost_grids()] == [
        (8, 8, 64), (32, 8, 32), (16, 8, 45), (64, 2, 45), (128, 2, 32), (32, 4, 45), (64, 4, 32), (16, 4, 64)]
    short_run = dataclasses.replace(config, options=dataclasses.replace(config.options, short_run=ShortRun()))
    assert [(g.num_frames, g.crop_size) for g in short_run.cost_grids()] == [(8, 64), (2, 45), (4, 45), (4, 64)]


def test_preview_shows_both_batches_and_the_relative_costs():
    assert grid_sizings(TWO_SHAPES) == (
        # 4 x 32: Equation 1's 8 clips cost 8 * 0.3 / 4 = 0.6 of a base iteration; 13 clips 0.975.
        GridSizing(4, 32, pytest.approx(0.3), 8, pytest.approx(0.6), 13, pytest.approx(0.975), ((4, 32),)),
        GridSizing(8, 32, 1.0, 4, 1.0, 4, 1.0, ((8, 32),)),
    )
    text = format_table(build_schedule(TWO_SHAPES), dataset_size=100)
    assert "Batches sized by measured flops" in text
    assert "4 x 32                4 x 32    0.300          8            0.60            13                0.97" in text
    data = schedule_to_dict(build_schedule(TWO_SHAPES))
    assert data["batch_sizing"]["method"] == "flops"
    assert data["batch_sizing"]["grids"][0]["sized_batch"] == 13
    assert data["epochs"][0]["lr_factor"] == pytest.approx(3.25)


def test_checkpoint_round_trip_keeps_the_costs():
    values = TWO_SHAPES.to_dict()
    assert values["clip_costs"] == [
        {"num_frames": 8, "crop_size": 32, "cost_per_clip": 2.0}, {"num_frames": 4, "crop_size": 32, "cost_per_clip": 0.6}]
    assert MultigridConfig.from_dict(values) == TWO_SHAPES
    # A checkpoint from before the option: Equation 1, no costs.
    old = {k: v for k, v in values.items() if k != "clip_costs"}
    old["options"] = {k: v for k, v in values["options"].items() if k != "batch_sizing"}
    restored = MultigridConfig.from_dict(old)
    assert restored.options.batch_sizing == "equation1" and restored.clip_costs == ()


@pytest.mark.parametrize(
    "change, match",
    [
        ({"clip_costs": (ClipCost(8, 32, 1.0),)}, r"no cost for the 4 x 32 grid .*measured: 8 x 32"),
        ({"clip_costs": (ClipCost(4, 32, 1.0),)}, r"no cost for the 8 x 32 grid"),
        ({"clip_costs": ()}, r"no cost for the 4 x 32 grid .*measured: none"),
    ],
)
def test_missing_costs_are_refused_naming_the_grid(change, match):
    with pytest.raises(ValueError, match=match):
        build_schedule(dataclasses.replace(TWO_SHAPES, **change))


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: MultigridOptions(batch_sizing="fast"), r"`batch_sizing` must be one of 'equation1', 'flops', 'time', got 'fast'"),
        (lambda: ClipCost(8, 32, 0.0), r"`cost_per_clip` must be a positive number, got 0.0"),
        (lambda: ClipCost(8, 0, 1.0), r"`crop_size` must be a positive integer"),
        (lambda: dataclasses.replace(TWO_SHAPES, options=MultigridOptions()),
         r"`clip_costs` are given \(2 grids\) but `batch_sizing`='equation1' does not read them"),
        (lambda: dataclasses.replace(TWO_SHAPES, clip_costs=(ClipCost(8, 32, 1.0), ClipCost(8, 32, 2.0))),
         r"names the 8 x 32 grid \(frames x crop\) twice"),
    ],
)
def test_invalid_settings_are_refused(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def _cli(*args: str) -> tuple[str, str, int]:
    stdout, stderr = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            main(["schedule", "--batch-size", "8", "--num-frames", "8", "--crop-size", "64", "--max-epochs", "40",
                  "--milestones", "30", "36", *args])
        except SystemExit as exit_:
            code = int(exit_.code or 0)
    return stdout.getvalue(), stderr.getvalue(), code


def test_cli_measures_the_cost_model():
    stdout, _, code = _cli("--batch-sizing", "flops", "--cost-model", "tiny", "--format", "json")
    assert code == 0
    grids = {(g["num_frames"], g["crop_size"]): g for g in json.loads(stdout)["batch_sizing"]["grids"]}
    assert grids[(8, 64)]["relative_cost"] == 1.0 and grids[(8, 64)]["sized_batch"] == 8
    assert 0.2 < grids[(8, 32)]["relative_cost"] < 0.3  # the tiny CNN's FLOPs: about frames x pixels


@pytest.mark.parametrize(
    "args, match",
    [
        (("--batch-sizing", "flops"), "name the model with `--cost-model BACKBONE`"),
        (("--cost-model", "tiny"), "`--cost-model tiny` is measured only with `--batch-sizing flops` or `time`"),
    ],
)
def test_cli_refuses_a_cost_model_without_sizing_and_the_reverse(args, match):
    _, stderr, code = _cli(*args)
    assert code == 2 and match in stderr
