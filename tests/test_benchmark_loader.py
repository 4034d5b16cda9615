"""`benchmarks/loader.py --smoke`: the loader benchmark runs frames and the store end to end, with the decode ceiling."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "loader.py"


@pytest.mark.slow
def test_smoke_run_prints_the_decode_ceiling(tmp_path: Path) -> None:
    root = str(SCRIPT.parents[1])
    result = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--json", str(tmp_path / "loader.json")],
                            check=True, timeout=300, capture_output=True, text=True, cwd=tmp_path,
                            env={"PYTHONPATH": root, "OMP_NUM_THREADS": "1", "PATH": ""})
    rows = [r for r in json.loads((tmp_path / "loader.json").read_text())["rows"] if "grid" in r and "decode" in r]
    assert {(r["format"], r["grid"]) for r in rows} == {(f, g) for f in ("frames", "store") for g in ("base", "coarsest")}
    for row in rows:
        stages = row["stage_cpu_us_per_frame"]
        assert set(stages) == {"params", "read", "decode", "resize_crop", "assemble", "collate", "transfer"}
        assert row["bare_decode_cpu_us_per_frame"] == pytest.approx(stages["decode"], abs=0.1)
        assert stages["decode"] > 0
        assert row["worker_over_bare_decode"] == pytest.approx(
            row["worker_cpu_us_per_frame"] / row["bare_decode_cpu_us_per_frame"], rel=0.02)
    assert "worker / bare" in result.stdout and "coarsest/base" in result.stdout
