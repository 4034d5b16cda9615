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


@pytest.mark.slow
@pytest.mark.parametrize(
    ("options", "match"),
    [
        (["--max-epochs", "1"], "`milestones` must be < `max_epochs`=1, got [2]"),
        (["--max-epochs", "3", "--limit-train-batches", "0.2"], "0.2 * 1 < 1. Please increase the `limit_train_batches`"),
    ],
    ids=["milestones_beyond_max_epochs", "multigrid_epoch_without_a_batch"],
)
def test_compare_refuses_before_the_baseline_trains(tmp_path, options, match):
    """Failure 13: the whole baseline trained, then the multigrid run failed."""
    config = tmp_path / "tiny.yaml"
    config.write_text(CONFIG.format(data=tmp_path / "synthetic"))
    result = run_compare("--config", str(config), *options, "--plot", str(tmp_path / "curves.png"))
    assert result.returncode == 2, result.stderr[-3000:]
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("lightning-multigrid compare: error: the multigrid run would fail at its start, so nothing")
    assert match in error
    assert "max_epochs=" not in result.stdout + result.stderr.replace(error, "")  # no run reached its end
    assert not (tmp_path / "curves.png").exists()


def test_compare_refuses_an_unwritable_plot_first(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(CONFIG.format(data=tmp_path / "synthetic"))
    for plot, match in ((tmp_path / "no" / "c.png", "does not exist"), (tmp_path / "c.txt", "cannot write a figure")):
        result = run_compare("--config", str(config), "--plot", str(plot))
        assert result.returncode == 2 and "`--plot`" in result.stderr and match in result.stderr
    assert not (tmp_path / "synthetic").exists()  # refused before the data was even generated
