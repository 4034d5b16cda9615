"""`benchmarks/gpu.py --smoke`: the GPU benchmark's code runs end to end on CPU with tiny sizes."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu.py"
GRIDS = {"coarsest", "base"}
# The smoke schedule's grids (base 4 x 8 x 32): long-cycle shapes and their short cycles.
DRAWN_GRIDS = ((64, 2, 16), (32, 2, 23), (32, 4, 16), (16, 4, 23), (8, 4, 32), (16, 8, 16), (8, 8, 23), (4, 8, 32))


def run_smoke(out: Path, *args: str) -> dict[str, Any]:
    subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(out), *args], check=True, timeout=600,
                   capture_output=True)
    return json.loads((out / "gpu.json").read_text())


@pytest.mark.slow
def test_smoke_run_measures_every_section(tmp_path: Path) -> None:
    report = run_smoke(tmp_path, "--budget-s", "600")
    errors = {name: section["error"] for name, section in report.items() if isinstance(section, dict) and "error" in section}
    assert not errors
    env = report["env"]
    assert env["jpeg_decoder"] in ("torchcodec", "torchvision")
    assert {"date", "python", "torch", "torchvision", "simplejpeg", "av", "lightning_package"} <= set(env)
    drawn = {tuple(shape) for shape in DRAWN_GRIDS}
    for key, backbone in (("model", "tiny"), ("transformer:model", "tiny_swin3d")):
        # Every grid the schedule draws, long and short cycle: the model-only times need each one.
        assert {tuple(row["shape"]) for row in report[key]} == drawn and GRIDS <= {row["grid"] for row in report[key]}
        assert all(row["model_clips_per_s"] > 0 and row["backbone"] == backbone for row in report[key])
    # (a) the store decoded in the workers, (b) decoded on the device ahead of use.
    assert {(row["source"], row["grid"]) for row in report["loader"]} == {
        (source, grid) for source in ("store (workers)", "store (device decode)") for grid in GRIDS}
    assert all(row["loader_clips_per_s"] > 0 for row in report["loader"])
    for row in report["stages"]:
        for path in ("workers", "device"):
            stages = row[path]
            assert all(stages[stage] > 0 for stage in ("read", "decode", "crop_resize", "transfer"))
            assert stages["delivered"] > 0 and isinstance(stages["short"], str)
    nvjpeg = report["nvjpeg"]
    assert nvjpeg["public_gpx_per_s"] == 2.9 and nvjpeg["best_gpx_per_s"] > 0
    assert {row["grid"] for row in nvjpeg["store_per_grid"]} == GRIDS
    assert [row["grid"] for row in report["overlap"]] == ["coarsest", "base"]
    for row in report["overlap"]:
        assert row["source"] == "store"
        assert min(row["step_alone_ms"], row["decode_then_step_ms"], row["overlapped_ms"]) > 0
        assert row["inflation"] == pytest.approx(row["overlapped_ms"] / row["step_alone_ms"])
    for key, backbone, decode in (
        ("end_to_end:store", "tiny", "workers"), ("end_to_end:store-device", "tiny", "device"),
        ("transformer:end_to_end", "tiny_swin3d", "workers"), ("end_to_end:frames", "tiny", "device"),
        ("end_to_end:frames-serial", "tiny", "device"), ("end_to_end:mp4", "tiny", "workers"),
    ):
        result = report[key]
        baseline, multigrid = result["baseline"], result["multigrid"]
        assert result["backbone"] == backbone and result["decode"] == decode
        assert baseline["iterations"] > multigrid["iterations"] > 0  # the schedule saves iterations
        assert 0 <= multigrid["data_wait_share"] <= 1 and 0 <= baseline["top1"] <= 1
        assert baseline["data_wait_grids"] == {} and isinstance(multigrid["data_wait_grids"], dict)
        _check_model_only(result)
    assert "to fit the time budget" in report["transformer:end_to_end"]["sized_to_fit"]
    assert [entry["backbone"] for entry in report["batch_sizing"]] == ["tiny", "tiny_swin3d"]
    for entry in report["batch_sizing"]:
        assert entry["method"] == "flops" and all(r["sized_batch"] >= 1 and r["sized_ms"] > 0 for r in entry["grids"])
    assert {(row["source"], row["grid"]) for row in report["read"]} == {
        (source, grid) for source in ("frames", "store") for grid in GRIDS}
    assert all(row["read_frames_per_s"] > row["read_clips_per_s"] > 0 for row in report["read"])
    for row in report["decode"]:
        assert all(row[f"{stage}_{method}_clips_per_s"] > 0 for stage in ("decode", "resize") for method in ("per_clip", "batched"))
    assert {row["source"] for row in report["loader:other"]} == {
        "mp4 gop250 (workers)", "mp4 gop12 (workers)", "frames (workers)", "frames (device decode)"}
    assert [row["precision"] for row in report["precision"]] == ["32-true"] * 4
    assert report["seconds"]["total"] >= report["seconds"]["model"] > 0
    markdown = (tmp_path / "gpu.md").read_text()
    assert "| coarsest (64 x 2 x 16) |" in markdown and "| multigrid |" in markdown
    assert "tiny_swin3d consumes" in markdown and "| store | coarsest |" in markdown and "| inflation |" in markdown
    assert "Gpx/s" in markdown and "Stages of the store, device decode" in markdown
    assert "| efficiency |" in markdown and "Batches sized by flops, tiny_swin3d" in markdown
    # The model's rates in the form benchmarks/standin.py --rates reads, every grid measured.
    rates = json.loads((tmp_path / "standin_rates.json").read_text())
    assert rates["base"] == "4 x 8 x 32" and {(g["batch_size"], g["num_frames"], g["crop_size"]) for g in rates["grids"]} == drawn
    assert all(g["source"] == "measured" and g["contiguous_clips_per_s"] > 0 for g in rates["grids"])


def _check_model_only(result: dict[str, Any]) -> None:
    """Each run's model-only time is the sum of its grids' clips over the model's clips/s, its efficiency
    that over its training time; the baseline draws the base grid only."""
    only = result["model_only"]
    assert only["missing"] == [] and only["layout"] == "contiguous"
    for run in ("baseline", "multigrid"):
        grids = [g for g in only["grids"] if g["run"] == run]
        assert only[f"{run}_s"] == pytest.approx(sum(g["clips"] / g["contiguous_clips_per_s"] for g in grids))
        assert result[run]["pipeline_efficiency"] == pytest.approx(only[f"{run}_s"] / result[run]["seconds"])
    assert [g["grid"] for g in only["grids"] if g["run"] == "baseline"] == ["base"]
    assert len({g["grid"] for g in only["grids"] if g["run"] == "multigrid"}) > 2
    assert result["speedup_of_model_ratio"] == pytest.approx(result["speedup"] / (only["baseline_s"] / only["multigrid_s"]))


@pytest.mark.slow
def test_sections_past_the_budget_are_skipped_and_say_so(tmp_path: Path) -> None:
    # The budget counts from the process start: the imports alone pass 1 second.
    report = run_smoke(tmp_path, "--budget-s", "1", "--sections", "env,model,transformer:model", "--skip", "transformer")
    assert "loader_manifests" in report["data"]  # the data is always made
    for name in ("env", "model"):
        assert report[name]["skipped"].startswith("time budget:")
    assert "transformer:model" not in report
    assert "- `model`: time budget:" in (tmp_path / "gpu.md").read_text()


def test_markdown_names_the_short_stage_and_the_data_wait_per_grid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # as `python benchmarks/gpu.py` has it: its sibling modules import
    gpu, gpu_loader = importlib.import_module("gpu"), importlib.import_module("gpu_loader")
    assert gpu_loader.short_stage(100.0, 120.0, {}) == "none"
    stages = {"read": 500.0, "decode": 80.0, "crop_resize": 300.0, "transfer": 900.0, "decode_then_crop_resize": 62.0}
    assert gpu_loader.short_stage(100.0, 60.0, stages) == "decode"
    assert gpu_loader.short_stage(70.0, 60.0, stages, "decode_then_crop_resize") == "decode then crop resize"
    assert gpu_loader.short_stage(50.0, 40.0, stages).startswith("no single stage (slowest: decode)")
    run = {"epochs": 3, "iterations": 9, "seconds": 1.0, "top1": 0.5, "data_wait_share": 0.25, "data_wait_grids": {}}
    waits = {"16 x 4 x 56": {"iterations": 40, "wait_s": 1.0, "total_s": 4.0, "share": 0.25}}
    report = {"end_to_end:store": {"backbone": "r3d_18", "baseline": run, "multigrid": {**run, "data_wait_grids": waits},
                                   "speedup": 1.0, "iteration_saving": 1.0},
              "transformer:end_to_end": {"skipped": "time budget: 470 s of 480 s used"}}
    text = gpu.markdown(report)
    assert "| end_to_end:store | 16 x 4 x 56 | 40 | 25% |" in text
    assert "- `transformer:end_to_end`: time budget: 470 s of 480 s used" in text
