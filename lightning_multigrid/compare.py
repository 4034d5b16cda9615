"""`lightning-multigrid compare`: baseline and multigrid from one config, side by side.

Before a week of GPU time, a user wants to know whether multigrid keeps accuracy on their data.
This trains the config twice (``--multigrid.enabled false``, then ``true``) with the same seed,
optionally for fewer epochs and on a fraction of each epoch, and reports training wall-clock,
iterations and the last validation metrics of each, with both validation curves over wall-clock
as a PNG. Validation (and precise BN) time is left out of the wall-clock.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytorch_lightning as pl
from typing_extensions import override

__all__ = ["Comparison", "RunResult", "TrainingClock", "format_comparison", "plot_curves", "run_compare"]


class TrainingClock(pl.Callback):
    """Training wall-clock without validation and precise BN, and the validation curve.

    Put it first in the Trainer's callbacks: its ``on_validation_start`` must stop the clock
    before the multigrid callback's precise BN runs.

    Attributes:
        train_seconds: wall-clock seconds spent training so far.
        train_cpu_seconds: CPU seconds of this process spent training so far (steadier than
            wall-clock on a shared machine, and complete when the loader has no workers).
        curve: one ``{"epoch", "step", "seconds", "top1"}`` per validation (``top1`` from
            ``val/top1``, NaN when the module logs none).
    """

    def __init__(self) -> None:
        self.train_seconds = 0.0
        self.train_cpu_seconds = 0.0
        self.curve: list[dict[str, float]] = []
        self._started: tuple[float, float] | None = None

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._started = (time.perf_counter(), time.process_time())

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop()

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        top1 = float(trainer.callback_metrics.get("val/top1", float("nan")))
        self.curve.append(
            {"epoch": trainer.current_epoch, "step": trainer.global_step, "seconds": self.train_seconds, "top1": top1}
        )
        if trainer.state.fn == "fit":
            self._started = (time.perf_counter(), time.process_time())

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._started is not None:
            self.train_seconds += time.perf_counter() - self._started[0]
            self.train_cpu_seconds += time.process_time() - self._started[1]
            self._started = None


@dataclass
class RunResult:
    """One training run of a comparison."""

    name: str
    epochs: int
    iterations: int
    train_seconds: float
    metrics: dict[str, float]
    curve: list[dict[str, float]] = field(default_factory=list)


@dataclass
class Comparison:
    """Baseline and multigrid runs of one config."""

    baseline: RunResult
    multigrid: RunResult


def run_compare(
    config: str | Path,
    max_epochs: int | None = None,
    limit_train_batches: float | None = None,
    extra_args: list[str] | None = None,
) -> Comparison:
    """Train ``config`` as the baseline, then with multigrid, and measure both.

    Args:
        config: a ``lightning-multigrid fit`` YAML config.
        max_epochs: baseline epochs instead of the config's ``trainer.max_epochs``.
        limit_train_batches: fraction of each epoch's iterations to train (Lightning's
            ``limit_train_batches``), for a quick look on a large dataset.
        extra_args: further LightningCLI arguments for both runs.

    Raises:
        FileNotFoundError: when ``config`` does not exist.
        ValueError: on out-of-range ``max_epochs`` or ``limit_train_batches``, or settings on
            which the multigrid run would fail at its start (milestones beyond ``max_epochs``, an
            epoch that ``limit_train_batches`` leaves without a batch): before anything trains.
    """
    if not Path(config).is_file():
        raise FileNotFoundError(f"`--config` {config} does not exist: pass a `lightning-multigrid fit` YAML file.")
    if max_epochs is not None and max_epochs < 1:
        raise ValueError(f"`--max-epochs` must be >= 1, got {max_epochs!r}.")
    if limit_train_batches is not None and not 0 < limit_train_batches <= 1:
        raise ValueError(f"`--limit-train-batches` must be in (0, 1], got {limit_train_batches!r}.")
    overrides = [
        "--trainer.logger", "false", "--trainer.enable_checkpointing", "false",
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
    ]
    if max_epochs is not None:
        overrides += ["--trainer.max_epochs", str(max_epochs)]
    if limit_train_batches is not None:
        overrides += ["--trainer.limit_train_batches", str(limit_train_batches)]
    _check_multigrid_starts(["--config", str(config), *overrides, *(extra_args or []), "--multigrid.enabled", "true"])
    runs = [
        _run_one(name, ["--config", str(config), *overrides, *(extra_args or []), "--multigrid.enabled", enabled])
        for name, enabled in (("baseline", "false"), ("multigrid", "true"))
    ]
    return Comparison(runs[0], runs[1])


def _check_multigrid_starts(args: list[str]) -> None:
    """Refuse, before the baseline trains, settings on which the multigrid run would fail at its start."""
    from lightning_multigrid.trainer_cli import check_fit_starts

    try:
        check_fit_starts(args)
    except ValueError as error:
        raise ValueError(
            f"the multigrid run would fail at its start, so nothing was trained: {error} "
            "(check `--max-epochs` against the config's LR milestones, and `--limit-train-batches` against "
            "the multigrid epochs' batches)"
        ) from None


def _run_one(name: str, args: list[str]) -> RunResult:
    from lightning_multigrid.data.datamodule import MultigridVideoDataModule
    from lightning_multigrid.module import VideoClassifier
    from lightning_multigrid.trainer_cli import MultigridCLI

    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    # `compare`'s own arguments are in sys.argv; LightningCLI gets only `args`, on purpose.
    warnings.filterwarnings("ignore", message=r".*LightningCLI's args parameter is intended")
    cli = MultigridCLI(
        VideoClassifier,
        MultigridVideoDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        args=args,
        run=False,
        save_config_callback=None,
    )
    clock = TrainingClock()
    cli.trainer.callbacks.insert(0, clock)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    # The last epoch is validated whatever `check_val_every_n_epoch` says.
    results = cli.trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)
    metrics = {k: float(v) for k, v in (results[0] if results else {}).items()}
    if clock.curve:
        clock.curve[-1]["epoch"] = cli.trainer.current_epoch
    return RunResult(name, cli.trainer.current_epoch, cli.trainer.global_step, clock.train_seconds, metrics, clock.curve)


def format_comparison(comparison: Comparison) -> str:
    """The runs side by side, and the speed-up and metric differences."""
    base, multi = comparison.baseline, comparison.multigrid
    keys = sorted(set(base.metrics) | set(multi.metrics))
    header = ("run", "epochs", "iterations", "train s", *keys)
    rows = [header]
    for run in (base, multi):
        rows.append(
            (run.name, str(run.epochs), str(run.iterations), f"{run.train_seconds:.1f}",
             *(f"{run.metrics[k]:.3f}" if k in run.metrics else "-" for k in keys))
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    speed = base.train_seconds / multi.train_seconds if multi.train_seconds > 0 else float("nan")
    steps = base.iterations / multi.iterations if multi.iterations else float("nan")
    summary = f"multigrid: {speed:.2f}x wall-clock, {steps:.2f}x fewer iterations"
    for key in keys:
        if key in base.metrics and key in multi.metrics:
            summary += f"; {key} {multi.metrics[key] - base.metrics[key]:+.3f}"
    return "\n".join([*lines, "", summary])


def plot_curves(comparison: Comparison, path: str | Path) -> None:
    """Both validation top-1 curves over training wall-clock, as a PNG."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 4))
    axis = figure.subplots()
    for run in (comparison.baseline, comparison.multigrid):
        axis.plot([p["seconds"] for p in run.curve], [p["top1"] for p in run.curve], marker="o", label=run.name)
    axis.set_xlabel("training wall-clock (s, validation excluded)")
    axis.set_ylabel("val/top1")
    axis.grid(alpha=0.3)
    axis.legend()
    axis.set_title("baseline vs multigrid")
    figure.tight_layout()
    figure.savefig(path, dpi=110)

