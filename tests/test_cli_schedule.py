"""`lightning-multigrid schedule`: the JSON contract, the table, the figure, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

KINETICS_ARGS = (
    "--batch-size 8 --devices 8 --num-frames 32 --crop-size 224 --sampling-rate 2 "
    "--milestones 94 154 196 --max-epochs 239 --dataset-size 240000"
).split()


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lightning_multigrid.cli", "schedule", *args], capture_output=True, text=True
    )


def test_json_contract_kinetics():
    result = run_cli(*KINETICS_ARGS, "--format", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["max_epochs"] == 358
    assert len(data["epochs"]) == 358
    first = data["epochs"][0]
    assert first == {
        "epoch": 0,
        "lr_stage": 0,
        "batch_size": 64,
        "num_frames": 8,
        "crop_size": 158,
        "lr_factor": 8,
        "relative_lr": 8.0,
        "bn": {"mode": "split", "num_splits": 8},
        "sampling_rate": [2.0, 8.0],
        "short_cycle": [
            {"batch_size": 128, "crop_size": 112},
            {"batch_size": 64, "crop_size": 158},
            {"batch_size": 64, "crop_size": 158},
        ],
    }
    # Shape changes happen exactly at the reference's stage ends.
    changes = [
        e["epoch"] for e, prev in zip(data["epochs"][1:], data["epochs"])
        if (e["num_frames"], e["crop_size"], e["lr_stage"]) != (prev["num_frames"], prev["crop_size"], prev["lr_stage"])
    ]
    assert changes == [73, 110, 142, 158, 205, 228, 248, 259, 291, 308, 322, 343]
    last = data["epochs"][-1]
    assert (last["lr_stage"], last["batch_size"], last["bn"]) == (3, 8, {"mode": "plain"})
    assert last["relative_lr"] == pytest.approx(0.001)
    iterations = data["iterations"]
    assert iterations["baseline"] == 239 * 3750
    assert iterations["saving"] == pytest.approx(3.42, abs=0.02)
    assert iterations["saving"] == pytest.approx(iterations["baseline"] / iterations["multigrid"])


def test_json_short_cycle_only():
    data = json.loads(run_cli(*KINETICS_ARGS, "--no-long-cycle", "--format", "json").stdout)
    assert data["max_epochs"] == 358
    drops = [e["epoch"] for e, prev in zip(data["epochs"][1:], data["epochs"]) if e["lr_stage"] != prev["lr_stage"]]
    assert drops == [141, 231, 294]


def test_short_cycle_only_milestones_are_the_references():
    # PySlowFast truncates: int(45 * 1.5) = 67, int(75 * 1.5) = 112, int(95 * 1.5) = 142.
    args = ("--batch-size 8 --num-frames 32 --crop-size 224 --milestones 45 75 --max-epochs 95 --no-long-cycle "
            "--format json").split()
    data = json.loads(run_cli(*args).stdout)
    drops = [e["epoch"] for e, prev in zip(data["epochs"][1:], data["epochs"]) if e["lr_stage"] != prev["lr_stage"]]
    assert (drops, data["max_epochs"]) == ([67, 112], 142)


def test_json_long_cycle_only_has_empty_short_cycle():
    data = json.loads(run_cli(*KINETICS_ARGS, "--no-short-cycle", "--format", "json").stdout)
    assert all(e["short_cycle"] == [] for e in data["epochs"])


def test_table_and_plot(tmp_path):
    figure = tmp_path / "schedule.png"
    result = run_cli(*KINETICS_ARGS, "--plot", str(figure))
    assert result.returncode == 0, result.stderr
    assert "329-343 (fine-tune)" in result.stdout
    assert "64 x 8 x 158" in result.stdout
    assert "3.42x fewer" in result.stdout
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--batch-size", "0"], "`--batch-size` must be a positive integer, got 0."),
        (["--milestones", "154", "94"], "`--milestones` must be strictly increasing"),
        (["--milestones", "300"], "must be < `--max-epochs`=239"),
        (["--epoch-factor", "0"], "`--epoch-factor` must be a positive number, got 0.0."),
        (["--dataset-size", "-5"], "`--dataset-size` must be a positive integer, got -5."),
        (["--plot", "schedule.txt"], "`--plot` schedule.txt: cannot write a figure as '.txt'"),
        (["--plot", "/nonexistent/schedule.png"], "its folder /nonexistent does not exist"),
    ],
)
def test_bad_settings_are_one_line_errors(args, message):
    result = run_cli(*KINETICS_ARGS, *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_short_schedule_warning_is_printed():
    result = run_cli("--batch-size", "8", "--num-frames", "16", "--crop-size", "112", "--max-epochs", "5", "--milestones", "2", "4")
    assert result.returncode == 0
    assert result.stderr.startswith("warning: 8 multigrid epochs are too few")


SMALL_ARGS = (
    "--batch-size 8 --num-frames 8 --crop-size 32 --sampling-rate 2 --milestones 12 14 --max-epochs 16 "
    "--dataset-size 960"
).split()


def test_json_grids_small():
    data = json.loads(run_cli(*SMALL_ARGS, "--format", "json").stdout)
    grids = {(g["batch_size"], g["num_frames"], g["crop_size"]): (g["iterations"], g["clips"]) for g in data["grids"]}
    # 9 epochs of the coarsest shape x (4 iterations, 512 clips) at 128@16; 5 epochs of the
    # full shape x (17 iterations, 136 clips) at 8 x 8 x 32 (tests/test_schedule.py spells it out).
    assert grids[(128, 2, 16)] == (36, 4608)
    assert grids[(8, 8, 32)] == (85, 680)
    assert sum(i for i, _ in grids.values()) == data["iterations"]["multigrid"] == 591
    assert set(data["grids"][0]) == {"batch_size", "num_frames", "crop_size", "iterations", "clips"}
    # 85 full-grid iterations: under 10,000 and under 10% of the baseline's 1920.
    assert len(data["warnings"]) == 1 and "`full_grid_share`" in data["warnings"][0]


def test_table_per_grid_counts_and_warning():
    result = run_cli(*SMALL_ARGS)
    row = next(line for line in result.stdout.splitlines() if line.startswith("8 x 8 x 32 (full grid)"))
    assert row.split()[-3:] == ["85", "680", "14.4%"]  # 85 of 591 iterations
    assert "warning: the full grid (8 frames x 32px) gets 85 iterations, 4.4% of the baseline's 1920" in result.stdout


def test_full_grid_share_flag_removes_the_warning():
    data = json.loads(run_cli(*SMALL_ARGS, "--full-grid-share", "0.25", "--format", "json").stdout)
    full = next(g for g in data["grids"] if (g["num_frames"], g["crop_size"]) == (8, 32))
    # 4 fine-tuning epochs x 120 iterations + 3 long-cycle epochs x 17 = 531.
    assert full["iterations"] == 531
    assert data["warnings"] == []
    assert data["max_epochs"] == 27


def test_kinetics_full_grid_is_not_warned():
    # 33705 full-grid iterations: over 10,000, so the paper's own setting passes.
    data = json.loads(run_cli(*KINETICS_ARGS, "--format", "json").stdout)
    assert data["warnings"] == []
    full = [g for g in data["grids"] if (g["num_frames"], g["crop_size"]) == (32, 224)]
    assert [(g["batch_size"], g["iterations"]) for g in full] == [(8, 33705)]


def test_batchnorm_column_says_what_training_does_without_the_long_cycle():
    """The preview showed "split" BatchNorm for --no-long-cycle, where training leaves the model's BN alone."""
    table = run_cli(*KINETICS_ARGS, "--no-long-cycle", "--batch-size", "32").stdout
    assert "model's own" in table and "split" not in table and "sync" not in table
    data = json.loads(run_cli(*KINETICS_ARGS, "--no-long-cycle", "--format", "json").stdout)
    assert {e["bn"]["mode"] for e in data["epochs"]} == {"model"}
    assert "split 8" in run_cli(*KINETICS_ARGS, "--batch-size", "64").stdout


def test_short_run_flag_and_regime():
    data = json.loads(run_cli(*SMALL_ARGS, "--short-run", "--no-pretrained", "--format", "json").stdout)
    assert data["max_epochs"] == 16 and data["iterations"]["multigrid"] == 1920
    regime = data["regime"]
    assert (regime["baseline_steps"], regime["multigrid_steps"], regime["full_grid_steps"]) == (1920, 1920, 960)
    # clips x frames x pixels: (960 x 2 x 23^2 + 1920 x 4 x 23^2 + 4800 x 4 x 32^2 + 7680 x 8 x 32^2)
    # / (16 epochs x 960 clips x 8 x 32^2) = 87,653,760 / 125,829,120.
    assert regime["relative_compute"] == pytest.approx(87_653_760 / 125_829_120)
    assert regime["pretrained"] is False and regime["below_validated"]
    assert regime["advice"].startswith("from scratch: BELOW the validated regime (1920 baseline steps < 10000")


def test_table_states_the_regime():
    text = run_cli(*SMALL_ARGS).stdout
    assert "regime: 1920 baseline optimizer steps per device; this run 591 (3.25x fewer), 85 of them at the full grid" in text
    assert "if from scratch: BELOW the validated regime" in text and "VideoClassifier(weights=...)" in text
    pretrained = run_cli(*SMALL_ARGS, "--pretrained").stdout
    assert "fine-tuning from pretrained weights" in pretrained and "BELOW" not in pretrained
    kinetics = json.loads(run_cli(*KINETICS_ARGS, "--format", "json").stdout)["regime"]
    # 239 epochs x ceil(30000 clips per device / 8) = 896,250 baseline steps: within the regime.
    assert kinetics["baseline_steps"] == 896_250 and not kinetics["below_validated"]
    assert kinetics["advice"].startswith("if from scratch: within the validated regime")
    assert "regime: give `--dataset-size` (the training clips) to see" in run_cli(*SMALL_ARGS[:-2]).stdout


def test_long_cycle_factors_option():
    data = json.loads(run_cli(*KINETICS_ARGS, "--long-cycle-factors", "0.5,0.7071", "1,1", "--format", "json").stdout)
    assert [(e["num_frames"], e["crop_size"]) for e in data["epochs"]][:1] == [(16, 158)]
    assert {(e["num_frames"], e["crop_size"]) for e in data["epochs"]} == {(16, 158), (32, 224)}
    result = run_cli(*KINETICS_ARGS, "--long-cycle-factors", "0.5")
    assert result.returncode == 2
    assert "'0.5' is not a T,S pair of factors" in result.stderr


def test_pretrained_short_run_takes_the_pretrained_default(monkeypatch, capsys):
    from lightning_multigrid.cli.commands import main
    from lightning_multigrid.schedule import config

    monkeypatch.setattr(config, "PRETRAINED_LONG_CYCLE_FACTORS", ((0.5, 1.0), (1.0, 1.0)))
    short = "--batch-size 8 --num-frames 16 --crop-size 112 --max-epochs 24 --milestones 18 21 --format json".split()

    def grids(*args: str) -> set[tuple[int, int]]:
        main(["schedule", *short, *args])
        return {(e["num_frames"], e["crop_size"]) for e in json.loads(capsys.readouterr().out)["epochs"]}

    # 800 clips: 24 x 100 = 2,400 baseline steps, a short run.
    assert grids("--dataset-size", "800", "--pretrained") == {(8, 112), (16, 112)}
    assert grids("--dataset-size", "800", "--no-pretrained") == {(4, 79), (8, 79), (8, 112), (16, 112)}
    assert grids("--pretrained") == {(4, 79), (8, 79), (8, 112), (16, 112)}  # length unknown: the paper's
    assert grids("--dataset-size", "800", "--pretrained", "--long-cycle-factors", "0.25,0.7071", "1,1") == {
        (4, 79), (16, 112)}


def test_json_piped_into_head_ends_quietly():
    # `schedule --format json | head`: the reader leaves after a line. The JSON (about 160 kB) is larger
    # than a pipe's buffer, so the command is still writing when the pipe closes.
    command = [sys.executable, "-m", "lightning_multigrid.cli", "schedule", *KINETICS_ARGS, "--format", "json"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        assert process.stdout is not None and process.stderr is not None
        assert process.stdout.readline() == "{\n"
        process.stdout.close()
        errors = process.stderr.read()
        returncode = process.wait()
    assert errors == ""  # no BrokenPipeError traceback, no "Exception ignored" at exit
    assert returncode == 1  # as Python exits on a closed pipe (its `signal` documentation's recipe)


def test_cost_sizing_says_why_a_grid_is_listed_twice():
    """The `time` sizing table listed `4 x 16` and `4 x 23` twice with other batches and no word: each long-cycle
    shape rounds its short cycle's batches to a multiple of its own BatchNorm groups (costs as timed for `tiny`)."""
    import dataclasses

    from lightning_multigrid import ClipCost, GridShape, MultigridConfig, MultigridOptions, build_schedule
    from lightning_multigrid.schedule.preview import format_sizing, grid_sizings

    costs = {(8, 32): 1.0, (8, 16): 0.246, (8, 23): 0.552, (2, 23): 0.259, (2, 16): 0.129, (4, 23): 0.293,
             (4, 16): 0.138, (4, 32): 0.5}
    config = MultigridConfig(base=GridShape(8, 8, 32), sampling_rate=2, max_epochs=40, milestones=(30, 36),
                             options=MultigridOptions(batch_sizing="time"),
                             clip_costs=tuple(ClipCost(t, s, c) for (t, s), c in costs.items()))
    rows = {(g.num_frames, g.crop_size, g.sized_batch): g.shapes for g in grid_sizings(config)}
    # 4 x 23: 8 / 0.293 = 27.3 -> 27 clips, 3 BatchNorm groups: its short cycle's 4 x 16 (8 / 0.138 = 58) -> 57.
    # 4 x 32: 16 clips, 2 groups: 4 x 16 stays 58, 4 x 23's 27 -> 28.
    assert rows[(4, 16, 57)] == ((4, 23),) and rows[(4, 16, 58)] == ((4, 32),)
    assert rows[(4, 23, 27)] == ((4, 23),) and rows[(4, 23, 28)] == ((4, 32),)
    assert rows[(8, 32, 8)] == ((8, 32),)
    text = format_sizing(config)
    assert "4 x 16                4 x 23    0.138" in text and "4 x 16                4 x 32    0.138" in text
    assert text.endswith("each shape rounds its batches to a multiple of its BatchNorm groups.")
    stages = build_schedule(config).stages
    assert {(s.shape.num_frames, s.shape.crop_size): s.bn.num_splits for s in stages}[(4, 23)] == 3
    # With Equation 1 the same grid has the same batch in both shapes: listed once, with both.
    paper = dataclasses.replace(config, options=MultigridOptions(batch_sizing="flops"),
                                clip_costs=tuple(ClipCost(t, s, t * s * s) for (t, s) in costs))
    assert [g.shapes for g in grid_sizings(paper) if (g.num_frames, g.crop_size) == (4, 16)] == [((4, 23), (4, 32))]
    assert "listed twice" not in format_sizing(paper)


def test_the_per_grid_table_leaves_out_grids_without_iterations():
    """A grid of a short epoch's later short-cycle iterations gets none: it was a row of zeros."""
    text = run_cli("--batch-size", "4", "--num-frames", "4", "--crop-size", "32", "--sampling-rate", "2",
                   "--max-epochs", "4", "--milestones", "2", "--dataset-size", "24").stdout
    table = text.split("Per grid, per device:\n")[1].split("\nwarning")[0].splitlines()
    assert [row.split()[0:5] for row in table[2:-1]] == [
        ["64", "x", "1", "x", "16"], ["32", "x", "2", "x", "16"], ["16", "x", "4", "x", "16"], ["8", "x", "4", "x", "23"]]
    assert table[-1] == "no iteration (epochs too short to reach them): 32 x 1 x 23, 16 x 2 x 23, 8 x 2 x 32, 4 x 4 x 32 (full grid)"


def test_warnings_name_the_flags():
    """A short schedule's warning said "Raise `max_epochs` or `epoch_factor`", the Python names."""
    result = run_cli("--batch-size", "4", "--num-frames", "4", "--crop-size", "32", "--max-epochs", "2", "--milestones", "1")
    assert result.returncode == 0
    assert result.stderr.startswith("warning: 3 multigrid epochs are too few for every long-cycle shape to get an epoch")
    assert "Raise `--max-epochs` or `--epoch-factor` to train every shape." in result.stderr
    assert "regime: give `--dataset-size` (the training clips) to see the optimizer steps and the advice." in result.stdout


def test_json_says_which_epochs_max_epochs_counts():
    """`max_epochs` in the JSON is the multigrid run's (358), which a script could take for the baseline's (239)."""
    data = json.loads(run_cli(*KINETICS_ARGS, "--format", "json").stdout)
    assert list(data)[:3] == ["max_epochs", "baseline_max_epochs", "epochs"]
    assert (data["max_epochs"], data["baseline_max_epochs"], len(data["epochs"])) == (358, 239, 358)
    help_text = " ".join(run_cli("--help").stdout.split())
    assert "in the JSON, `max_epochs` is the multigrid run's epochs" in help_text and "`baseline_max_epochs`" in help_text
