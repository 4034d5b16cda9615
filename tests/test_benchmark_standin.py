"""`benchmarks/standin.py`: the CPU stand-in for the GPU, its rates and its report's arithmetic."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "standin.py"
H200_RESULTS = Path(__file__).resolve().parents[2] / "shared" / "results" / "h200-2026-11-28" / "gpu-all-sections.json"


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # as `python benchmarks/standin.py` has it
    return importlib.import_module("standin")


def test_rates_file_names_its_source_and_estimates_the_unmeasured_grids_by_the_frames_ratio(standin: ModuleType) -> None:
    description, rates = standin.load_rates()
    assert "gpu-all-sections.json" in description["source"] and description["base"] == "8 x 16 x 112"
    by_grid = {rate.grid: rate for rate in rates}
    # The schedule's eight grids at base 8 x 16 x 112; five measured on the H200.
    assert len(by_grid) == 8 and sum(rate.source == "measured" for rate in rates) == 5
    # An estimate is the measured grid of the same crop times its frames over the estimated grid's.
    assert by_grid["64 x 8 x 56"].clips_per_s == pytest.approx(by_grid["128 x 4 x 56"].clips_per_s * 4 / 8, abs=0.1)
    assert by_grid["32 x 16 x 56"].clips_per_s == pytest.approx(by_grid["128 x 4 x 56"].clips_per_s * 4 / 16, abs=0.1)
    assert by_grid["16 x 16 x 79"].clips_per_s == pytest.approx(by_grid["32 x 8 x 79"].clips_per_s * 8 / 16, abs=0.1)
    assert by_grid["16 x 16 x 79"].source.startswith("estimated: the measured 32 x 8 x 79")
    # The end-to-end runs were contiguous: the base's rate is the contiguous one (477.6), not the faster 631.6.
    assert by_grid["8 x 16 x 112"].clips_per_s == pytest.approx(477.6)


@pytest.mark.skipif(not H200_RESULTS.exists(), reason="the shared H200 results are not beside this checkout")
def test_rates_file_holds_the_h200_figures(standin: ModuleType) -> None:
    measured = {tuple(row["shape"]): row for row in json.loads(H200_RESULTS.read_text())["model"]}
    for rate in standin.load_rates()[1]:
        shape = tuple(int(n) for n in rate.grid.split(" x "))
        if rate.source == "measured":
            assert rate.clips_per_s == pytest.approx(measured[shape]["contiguous_clips_per_s"], abs=0.1)


def test_step_times_scale_the_h200_rate_of_the_same_relative_grid(standin: ModuleType) -> None:
    description, rates = standin.load_rates()
    assert standin.rates_base(description) == (16, 112)
    times = standin.StepTimes(rates, (16, 112), (16, 112), scale=7.0)
    # 128 clips at the coarsest grid: 128 / 5135.7 s on the H200, 7x here.
    assert times.seconds(128, 4, 56) == pytest.approx(128 * 7 / 5135.7)
    # A base of the same proportions (8 frames, crop 32) maps its grids onto the H200's.
    smaller = standin.StepTimes(rates, (16, 112), (8, 32), scale=1.0)
    assert smaller.rate_at(2, 16).grid == "128 x 4 x 56" and smaller.rate_at(8, 32).grid == "8 x 16 x 112"
    with pytest.raises(ValueError, match="no H200 rate for the grid 16 x 40"):
        times.rate_at(16, 40)
    with pytest.raises(ValueError, match="`--scale` must be > 0"):
        standin.StepTimes(rates, (16, 112), (16, 112), scale=0.0)


def _check_run(run: dict[str, Any]) -> None:
    totals, grids, epochs = run["totals"], run["grids"], run["epochs"]
    # Model-only is the sum of the per-grid model times, each clips / (the H200 rate / scale).
    assert totals["model_s"] == pytest.approx(sum(row["model_s"] for row in grids))
    for row in grids:
        assert row["model_s"] == pytest.approx(row["clips"] * run["scale"] / row["h200_clips_per_s"])
        assert row["scaled_clips_per_s"] == pytest.approx(row["h200_clips_per_s"] / run["scale"])
        assert row["efficiency"] == pytest.approx(row["model_s"] / row["e2e_s"])
        # A sleep lasts at least what was asked; the iteration at least its step.
        assert row["step_ms_per_iteration"] >= 1000 * row["model_s"] / row["iterations"] * 0.999
        assert row["outside_step_ms_per_iteration"] == pytest.approx(
            sum(row[f"{name}_ms_per_iteration"] for name in ("fetch", "callback", "loop")))
        assert row["fetch_ms_per_iteration"] > 0 and row["transfer_ms_per_iteration"] > 0
    # End to end: the iterations (epoch starts included) plus the tail after the last step.
    assert totals["efficiency"] == pytest.approx(totals["model_s"] / totals["e2e_s"])
    assert totals["e2e_s"] == pytest.approx(sum(row["e2e_s"] for row in grids) + totals["tail_s"])
    assert totals["iterations"] == sum(row["iterations"] for row in grids)
    assert totals["clips"] == sum(row["clips"] for row in grids)
    assert 0 < totals["efficiency"] < 1 and totals["tail_s"] >= 0 and totals["cpu_s"] > 0
    # One row per epoch, its first iteration's wait within the iteration.
    assert [row["epoch"] for row in epochs] == list(range(totals["epochs"]))
    for row in epochs:
        assert 0 < row["first_wait_s"] < row["first_iteration_s"]
        assert row["first_iteration_ratio"] == pytest.approx(row["first_iteration_s"] / row["steady_iteration_s"])
        assert row["steady_source"] in ("measured", "step + median outside")
    assert totals["first_waits_s"] == pytest.approx(sum(row["first_wait_s"] for row in epochs))
    assert totals["max_first_iteration_ratio"] == pytest.approx(max(row["first_iteration_ratio"] for row in epochs))


@pytest.mark.slow
def test_smoke_run_reports_consistent_figures_for_both_paths_and_runs(tmp_path: Path) -> None:
    root = str(SCRIPT.parents[1])
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(tmp_path)], check=True, timeout=120,
                          capture_output=True, text=True, cwd=tmp_path, env={"PYTHONPATH": root, "PATH": ""})
    report = json.loads((tmp_path / "standin.json").read_text())
    assert report["machine"]["workers"] == 2 and report["rates"]["file"] == "h200_rates.json"
    runs = {(run["decode"], run["run"]): run for run in report["runs"]}
    assert set(runs) == {(d, r) for d in ("workers", "device") for r in ("baseline", "multigrid")}
    for run in runs.values():
        assert run["scale"] == 7.0  # 14 workers on the H200 machine / 2 here
        _check_run(run)
    for decode in ("workers", "device"):
        baseline, multigrid = runs[decode, "baseline"]["totals"], runs[decode, "multigrid"]["totals"]
        assert multigrid["iterations"] < baseline["iterations"] and multigrid["epochs"] > baseline["epochs"]
        assert [row["h200_grid"] for row in runs[decode, "baseline"]["grids"]] == ["8 x 16 x 112"]
        # The multigrid run draws short-cycle grids the H200 did not measure: marked as estimated.
        assert any(row["h200_source"].startswith("estimated") for row in runs[decode, "multigrid"]["grids"])
    assert "efficiency" in done.stdout and "* estimated" in done.stdout
