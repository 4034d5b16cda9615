"""`benchmarks/step.py --smoke`: the step benchmark runs every section end to end on CPU with tiny sizes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "step.py"


@pytest.mark.slow
def test_smoke_run_measures_every_grid(tmp_path: Path) -> None:
    root = str(SCRIPT.parents[1])
    subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(tmp_path)], check=True, timeout=300,
                   capture_output=True, cwd=tmp_path, env={"PYTHONPATH": root, "OMP_NUM_THREADS": "1", "PATH": ""})
    report = json.loads((tmp_path / "step.json").read_text())
    (base,) = report["bases"]
    grids = [row["grid"] for row in base["grids"]]
    assert base["base"] == "2 x 4 x 16" in grids and len(grids) == len(set(grids)) > 3
    for row in base["grids"]:
        assert row["gflop"] > 0 and row["eager_ms"] > 0 and row["channels_last_3d_ms"] > 0
        assert row["per_grid_ms"] > 0 and row["dynamic_ms"] > 0 and row["per_grid_compile_s"] >= 0
    assert next(r for r in base["grids"] if r["grid"] == "2 x 4 x 16")["ms_per_gflop_rel"] == pytest.approx(1.0)
    # Cost-sized batches (FLOPs in the smoke run) for the tiny CNN and the tiny transformer, every grid timed.
    assert [(s["backbone"], s["method"]) for s in base["batch_sizing"]] == [("tiny", "flops"), ("tiny_swin3d", "flops")]
    for sizing in base["batch_sizing"]:
        assert len(sizing["grids"]) > 3 and all(r["sized_ms"] > 0 and r["sized_batch"] >= 1 for r in sizing["grids"])
    assert "cost-sized batches by flops, tiny_swin3d" in (tmp_path / "step.txt").read_text()
    cost = base["callback"]
    assert cost["on_us"] > cost["off_us"] > 0
    assert "GFLOP" in (tmp_path / "step.txt").read_text()
