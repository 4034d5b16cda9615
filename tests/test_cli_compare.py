"""`lightning-multigrid compare`: baseline and multigrid of one real config, side by side."""

from __future__ import annotations

import subprocess
import sys

import pytest

CONFIG = """\
seed_everything: 0
trainer:
  accelerator: cpu
  devices: 1
  max_epochs: 4
  num_sanity_val_steps: 0
model:
  class_path: lightning_multigrid.module.VideoClassifier
  init_args:
    backbone: tiny
    tiny_width: 4
    lr: 0.05
    milestones: [2]
data:
  class_path: lightning_multigrid.data.datamodule.MultigridVideoDataModule
  init_args:
    synthetic_dir: {data}
    synthetic_size: [24, 8]
    batch_size: 4
    num_frames: 4
    crop_size: 32
    sampling_rate: 2
    num_workers: 0
multigrid:
  precise_bn_batches: 2
"""


def run_compare(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lightning_multigrid.cli", "compare", *args], capture_output=True, text=True
    )


@pytest.mark.slow
def test_compare_tiny_config(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(CONFIG.format(data=tmp_path / "synthetic"))
    figure = tmp_path / "curves.png"
    result = run_compare("--config", str(config), "--max-epochs", "3", "--plot", str(figure))
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    header = next(line.split() for line in lines if line.startswith("run "))
    assert header[:4] == ["run", "epochs", "iterations", "train"]  # "train s" is two words
    top1 = header.index("val/top1") - 1  # in the rows, "train s" is one cell
    baseline = next(line.split() for line in lines if line.startswith("baseline "))
    multigrid = next(line.split() for line in lines if line.startswith("multigrid "))
    # 3 baseline epochs of ceil(24 / 4) = 6 iterations; multigrid runs round(1.5 * 3) = 4 epochs.
    assert baseline[1:3] == ["3", "18"]
    assert multigrid[1] == "4"
    assert 0 < int(multigrid[2]) < 18
    assert 0 <= float(baseline[top1]) <= 1 and 0 <= float(multigrid[top1]) <= 1
    assert "x fewer iterations" in result.stdout
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_missing_config_is_a_one_line_error(tmp_path):
    result = run_compare("--config", str(tmp_path / "missing.yaml"))
    assert result.returncode == 2
    assert "`--config`" in result.stderr and "does not exist" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
