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
        (["--batch-size", "0"], "`batch_size` must be a positive integer, got 0."),
        (["--milestones", "154", "94"], "`milestones` must be strictly increasing"),
        (["--milestones", "300"], "must be < `max_epochs`=239"),
        (["--epoch-factor", "0"], "`epoch_factor` must be a positive number, got 0.0."),
        (["--dataset-size", "-5"], "`--dataset-size` must be a positive integer, got -5."),
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
