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


def run_smoke(out: Path, *args: str) -> dict[str, Any]:
    subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(out), *args], check=True, timeout=300,
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
    for key, backbone in (("model", "tiny"), ("transformer:model", "tiny_swin3d")):
        assert {row["grid"] for row in report[key]} == GRIDS
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
    for key, backbone in (("end_to_end:store", "tiny"), ("transformer:end_to_end", "tiny_swin3d"),
                          ("end_to_end:frames", "tiny"), ("end_to_end:frames-serial", "tiny"), ("end_to_end:mp4", "tiny")):
        result = report[key]
        baseline, multigrid = result["baseline"], result["multigrid"]
        assert result["backbone"] == backbone
        assert baseline["iterations"] > multigrid["iterations"] > 0  # the schedule saves iterations
        assert 0 <= multigrid["data_wait_share"] <= 1 and 0 <= baseline["top1"] <= 1
        assert baseline["data_wait_grids"] == {} and isinstance(multigrid["data_wait_grids"], dict)
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
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    gpu = importlib.import_module("gpu")
    assert gpu.short_stage(100.0, 120.0, {}) == "none"
    stages = {"read": 500.0, "decode": 80.0, "crop_resize": 300.0, "transfer": 900.0, "decode_then_crop_resize": 62.0}
    assert gpu.short_stage(100.0, 60.0, stages) == "decode"
    assert gpu.short_stage(70.0, 60.0, stages, "decode_then_crop_resize") == "decode then crop resize"
    assert gpu.short_stage(50.0, 40.0, stages).startswith("no single stage (slowest: decode)")
    run = {"epochs": 3, "iterations": 9, "seconds": 1.0, "top1": 0.5, "data_wait_share": 0.25, "data_wait_grids": {}}
    waits = {"16 x 4 x 56": {"iterations": 40, "wait_s": 1.0, "total_s": 4.0, "share": 0.25}}
    report = {"end_to_end:store": {"backbone": "r3d_18", "baseline": run, "multigrid": {**run, "data_wait_grids": waits},
                                   "speedup": 1.0, "iteration_saving": 1.0},
              "transformer:end_to_end": {"skipped": "time budget: 470 s of 480 s used"}}
    text = gpu.markdown(report)
    assert "| end_to_end:store | 16 x 4 x 56 | 40 | 25% |" in text
    assert "- `transformer:end_to_end`: time budget: 470 s of 480 s used" in text
