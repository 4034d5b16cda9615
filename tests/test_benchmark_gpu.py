"""`benchmarks/gpu.py --smoke`: the GPU benchmark's code runs end to end on CPU with tiny sizes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu.py"


@pytest.mark.slow
def test_smoke_run_measures_every_section(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(tmp_path), "--budget-s", "600"], check=True, timeout=300,
                   capture_output=True)
    report = json.loads((tmp_path / "gpu.json").read_text())
    errors = {name: section["error"] for name, section in report.items() if isinstance(section, dict) and "error" in section}
    assert not errors
    assert report["env"]["jpeg_decoder"] in ("torchcodec", "torchvision")
    assert {row["grid"] for row in report["model"]} == {"coarsest", "base"}
    assert all(row["model_clips_per_s"] > 0 for row in report["model"])
    sources = {row["source"] for row in report["loader"]}
    assert sources == {"mp4 gop250 (workers)", "mp4 gop12 (workers)", "frames (workers)", "frames (device decode)"}
    assert all(row["loader_clips_per_s"] > 0 for row in report["loader"])
    for source in ("frames (device decode)", "mp4 (workers)"):
        result = report[f"end_to_end:{source}"]
        baseline, multigrid = result["baseline"], result["multigrid"]
        assert baseline["iterations"] > multigrid["iterations"] > 0  # the schedule saves iterations
        assert 0 <= multigrid["data_wait_share"] <= 1 and 0 <= baseline["top1"] <= 1
    assert {(row["source"], row["grid"]) for row in report["device_path:read"]} == {
        (source, grid) for source in ("frames", "store") for grid in ("coarsest", "base")}
    assert all(row["read_frames_per_s"] > row["read_clips_per_s"] > 0 for row in report["device_path:read"])
    for row in report["device_path:decode"]:
        assert all(row[f"{stage}_{method}_clips_per_s"] > 0 for stage in ("decode", "resize") for method in ("per_clip", "batched"))
    assert [row["grid"] for row in report["device_path:overlap"]] == ["coarsest", "base"]
    for row in report["device_path:overlap"]:
        assert min(row["step_alone_ms"], row["decode_then_step_ms"], row["overlapped_ms"]) > 0
        assert row["inflation"] == pytest.approx(row["overlapped_ms"] / row["step_alone_ms"])
    for name in ("frames (device decode, serial)", "store (device decode)"):
        run = report[f"end_to_end:{name}"]
        assert run["baseline"]["iterations"] > run["multigrid"]["iterations"] > 0
    assert [row["precision"] for row in report["gpu_path:precision"]] == ["32-true"] * 4
    markdown = (tmp_path / "gpu.md").read_text()
    assert "| coarsest (64 x 2 x 16) |" in markdown and "| multigrid |" in markdown
    assert "| frames | coarsest |" in markdown and "| inflation |" in markdown
