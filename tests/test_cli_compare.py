"""`lightning-multigrid compare`: baseline and multigrid of one real config, side by side."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

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
    synthetic:
      path: {data}
      size: [24, 8]
    batch_size: 4
    num_frames: 4
    crop_size: 32
    sampling_rate: 2
    num_workers: 0
multigrid:
  precise_bn_batches: 2
"""


PNG = b"\x89PNG\r\n\x1a\n"


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lightning_multigrid.cli", *args], capture_output=True, text=True, cwd=cwd
    )


def run_compare(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli("compare", *args, cwd=cwd)


def tiny_config(tmp_path: Path) -> Path:
    """The tiny config, its synthetic data under ``tmp_path``."""
    config = tmp_path / "tiny.yaml"
    config.write_text(CONFIG.format(data=tmp_path / "synthetic"))
    return config


def work_dir(tmp_path: Path) -> Path:
    """An empty working directory for a command, to see what it leaves there."""
    work = tmp_path / "work"
    work.mkdir()
    return work


@pytest.mark.slow
def test_compare_tiny_config(tmp_path):
    """Side by side, the figure and both runs' logs in the run folder, nothing else in the working directory."""
    config, work = tiny_config(tmp_path), work_dir(tmp_path)
    result = run_compare("--config", str(config), "--max-epochs", "3", cwd=work)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    header = next(line.split() for line in lines if line.startswith("run "))
    assert header[:5] == ["run", "epochs", "iterations", "train", "s"]  # "train s" is two words
    assert header[5] == "speed-up"
    top1 = header.index("val/top1") - 1  # in the rows, "train s" is one cell
    assert "val/top5" not in header  # 4 classes: top-5 is always 1
    baseline = next(line.split() for line in lines if re.match(r"baseline +\d", line))
    multigrid = next(line.split() for line in lines if re.match(r"multigrid +\d", line))
    # 3 baseline epochs of ceil(24 / 4) = 6 iterations; multigrid runs round(1.5 * 3) = 4 epochs.
    assert baseline[1:3] == ["3", "18"]
    assert baseline[4] == "1.00x"
    assert multigrid[1] == "4"
    assert 0 < int(multigrid[2]) < 18
    assert float(multigrid[4].rstrip("x")) > 0
    assert 0 <= float(baseline[top1]) <= 1 and 0 <= float(multigrid[top1]) <= 1
    assert "x fewer iterations" in result.stdout and "(chance top-1 0.250)" in result.stdout
    # The first use of the data says so, once: a line before writing the videos and one after.
    assert result.stderr.count(f"writing 32 synthetic videos to {tmp_path / 'synthetic'} ...") == 1
    assert len(re.findall(r"wrote 32 synthetic videos in \d+\.\d s", result.stderr)) == 1
    # A line after each validation while it trains (the last epoch is validated).
    assert "baseline epoch 3: val/top1" in result.stdout and "multigrid epoch 4: val/top1" in result.stdout

    # The config names no default_root_dir: the run folder is `runs`.
    # Named after the runs' log versions: a second comparison in the run folder gets its own.
    assert "figure (val/top1 over training wall-clock): runs/compare-version_0.png" in result.stdout
    assert (work / "runs" / "compare-version_0.png").read_bytes()[:8] == PNG
    for name in ("baseline", "multigrid"):
        log_dir = work / "runs" / name / "version_0"
        assert (log_dir / "config.yaml").is_file() and (log_dir / "metrics.csv").is_file()
        assert "val/top1" in (log_dir / "metrics.csv").read_text().splitlines()[0]
    assert sorted(p.name for p in work.iterdir()) == ["runs"]  # no config.yaml, no lightning_logs


@pytest.mark.slow
def test_compare_run_dir_and_plot(tmp_path):
    config = tiny_config(tmp_path)
    figure = tmp_path / "figures" / "curves.png"
    result = run_compare(
        "--config", str(config), "--max-epochs", "3",
        "--run-dir", str(tmp_path / "mine"), "--plot", str(figure), cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert figure.read_bytes()[:8] == PNG
    assert (tmp_path / "mine" / "multigrid" / "version_0" / "config.yaml").is_file()
    assert not (tmp_path / "runs").exists() and not (tmp_path / "config.yaml").exists()


@pytest.mark.slow
def test_fit_logs_into_the_run_folder(tmp_path):
    """`fit` writes its metrics and config.yaml into runs/lightning_logs/version_N, not the working directory."""
    config, work = tiny_config(tmp_path), work_dir(tmp_path)
    args = ("fit", "--config", str(config), "--trainer.limit_train_batches", "2")
    for version in (0, 1):  # a second run gets its own folder
        result = run_cli(*args, cwd=work)
        assert result.returncode == 0, result.stderr[-3000:]
        log_dir = Path("runs") / "lightning_logs" / f"version_{version}"
        assert f"logs: {log_dir}" in result.stdout
        assert (work / log_dir / "config.yaml").is_file() and (work / log_dir / "metrics.csv").is_file()
    assert sorted(p.name for p in work.iterdir()) == ["runs"]
    assert sorted(p.name for p in (work / "runs").iterdir()) == ["lightning_logs"]


def test_compare_missing_config_is_a_one_line_error(tmp_path):
    result = run_compare("--config", str(tmp_path / "missing.yaml"))
    assert result.returncode == 2
    assert "`--config`" in result.stderr and "does not exist" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    ("options", "match"),
    [
        (["--max-epochs", "1"], "`milestones` must be < `--max-epochs`=1, got [2]"),
    ],
    ids=["milestones_beyond_max_epochs"],
)
def test_compare_refuses_before_the_baseline_trains(tmp_path, options, match):
    """Failure 13: the whole baseline trained, then the multigrid run failed."""
    config = tiny_config(tmp_path)
    result = run_compare("--config", str(config), *options, "--plot", str(tmp_path / "curves.png"))
    assert result.returncode == 2, result.stderr[-3000:]
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("lightning-multigrid compare: error: the multigrid run would fail at its start, so nothing")
    assert match in error
    assert "max_epochs=" not in result.stdout + result.stderr.replace(error, "")  # no run reached its end
    assert not (tmp_path / "curves.png").exists()


@pytest.mark.slow
def test_compare_limit_keeps_a_batch_per_epoch_and_the_summary_says_what_the_runs_did(tmp_path):
    """A fraction that leaves a coarse multigrid epoch without a batch keeps one there (it was refused);
    the schedule's summary gives the iterations the limited runs train, as the side-by-side table counts them."""
    config = tiny_config(tmp_path)
    result = run_compare("--config", str(config), "--max-epochs", "3", "--limit-train-batches", "0.2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    baseline = next(line.split() for line in lines if re.match(r"baseline +\d", line))
    multigrid = next(line.split() for line in lines if re.match(r"multigrid +\d", line))
    # Baseline: 3 epochs of int(0.2 * 6) = 1 batch. Multigrid: 4 epochs, each at least one batch.
    assert baseline[1:3] == ["3", "3"] and multigrid[1] == "4" and int(multigrid[2]) >= 4
    limited = re.search(r"this run, with `limit_train_batches=0.2`: (\d+) iterations per device vs (\d+)", result.stderr)
    assert limited is not None, result.stderr[-3000:]
    assert (limited[1], limited[2]) == (multigrid[2], baseline[2])
    help_text = run_compare("--help").stdout
    assert "at least one" in " ".join(help_text.split())


def test_compare_refuses_an_unwritable_plot_first(tmp_path):
    config = tiny_config(tmp_path)
    # A missing folder is made (under the config file, it cannot be).
    for plot, match in ((config / "no" / "c.png", "does not exist"), (tmp_path / "c.txt", "cannot write a figure")):
        result = run_compare("--config", str(config), "--plot", str(plot))
        assert result.returncode == 2 and "`--plot`" in result.stderr and match in result.stderr
    assert not (tmp_path / "synthetic").exists()  # refused before the data was even generated


@pytest.mark.slow
def test_compare_console_shows_only_what_a_user_needs(tmp_path):
    """The console of two runs with persistent workers, the demo's setting: none of Lightning's notes
    about `args` and `sys.argv`, its cloud-product tip or its pytree deprecation, and no traceback from
    the first run's workers shut down inside the second run's (`_MultiProcessingDataLoaderIter.__del__`)."""
    config, work = tiny_config(tmp_path), work_dir(tmp_path)
    config.write_text(config.read_text().replace("num_workers: 0", "num_workers: 2"))
    result = run_compare("--config", str(config), "--max-epochs", "3", cwd=work)
    assert result.returncode == 0, result.stderr[-3000:]
    console = result.stdout + result.stderr
    for unwanted in ("args parameter is intended", "sys.argv", "Tip:", "litlogger", "LeafSpec", "Traceback",
                     "can only test a child process", "Exception ignored"):
        assert unwanted not in console, f"{unwanted!r} in the console:\n{console[-3000:]}"
    assert "multigrid epoch 4: val/top1" in result.stdout and "x fewer iterations" in result.stdout
    # What stays: Lightning's own account of the hardware and the end of each fit, once per run.
    assert result.stderr.count("GPU available:") == 2 and "`Trainer.fit` stopped" in result.stderr


def test_fit_with_a_missing_manifest_is_a_one_line_error(tmp_path):
    """As check-data reports it, not a traceback."""
    result = run_cli(
        "fit", "--model", "VideoClassifier", "--model.backbone", "tiny", "--data.train_manifest",
        str(tmp_path / "missing.csv"), "--trainer.max_epochs", "1", "--trainer.accelerator", "cpu",
        "--trainer.default_root_dir", str(tmp_path / "runs"), cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"lightning-multigrid fit: error: Manifest {tmp_path / 'missing.csv'} does not exist: check the manifest path."
    )


def test_the_summary_says_slower_when_multigrid_was_slower():
    """A speed-up under 1 read "0.97x faster"."""
    from lightning_multigrid.cli.compare import Comparison, RunResult, format_comparison

    baseline = RunResult("baseline", 40, 1200, 38.4, {"val/top1": 1.0}, chance=0.25)
    slower = format_comparison(Comparison(baseline, RunResult("multigrid", 60, 357, 39.6, {"val/top1": 1.0})))
    assert "multigrid: 1.03x slower in training wall-clock, 3.36x fewer iterations; val/top1 +0.000" in slower
    assert "faster" not in slower
    faster = format_comparison(Comparison(baseline, RunResult("multigrid", 60, 357, 17.4, {"val/top1": 1.0})))
    assert "multigrid: 2.21x faster in training wall-clock" in faster


def test_the_schedule_summary_of_a_limited_run_gives_the_full_epochs_count_as_such():
    """Under `limit_train_batches` the summary's regime line said "this run 357" above the line saying the run
    trains 69 (the demo with `compare --limit-train-batches 0.2`)."""
    from lightning_multigrid import GridShape, MultigridConfig, build_schedule
    from lightning_multigrid.schedule.limits import limited_iterations
    from lightning_multigrid.schedule.preview import format_table

    demo = build_schedule(MultigridConfig(base=GridShape(8, 8, 64), sampling_rate=2, max_epochs=40, milestones=(30, 36)))
    limited = format_table(demo, 240, limit_train_batches=0.2)
    assert limited_iterations(demo, 240, 0.2) == (69, 240)
    assert "this run 357" not in limited
    assert "regime: 1200 baseline optimizer steps per device; multigrid (full epochs) 357 (3.36x fewer)" in limited
    assert limited.endswith(
        "this run, with `limit_train_batches=0.2`: 69 iterations per device vs 240 for its baseline "
        "(the counts above are of full epochs)"
    )
    assert "regime: 1200 baseline optimizer steps per device; this run 357 (3.36x fewer)" in format_table(demo, 240)
