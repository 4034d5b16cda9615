"""`lightning-multigrid compare`: baseline and multigrid from one config, side by side.

Before a week of GPU time, a user wants to know whether multigrid keeps accuracy on their data.
This trains the config twice (``--multigrid.enabled false``, then ``true``) with the same seed,
optionally for fewer epochs and on a fraction of each epoch, and reports training wall-clock,
iterations and the last validation metrics of each, with both validation curves over wall-clock
as a PNG. Validation (and precise BN) time is left out of the wall-clock.

Each run logs into the run folder (``trainer.default_root_dir``; ``--run-dir``):
``<run folder>/baseline/version_N/`` and ``<run folder>/multigrid/version_N/`` hold the metrics
(CSV, and TensorBoard when installed) and the run's ``config.yaml``; the figure goes to
``<run folder>/compare-version_N.png`` (the multigrid run's version) unless another path is given.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_multigrid._lightning import pl
from lightning_multigrid._tables import table_lines

if TYPE_CHECKING:
    from lightning_multigrid.cli.trainer import MultigridCLI

__all__ = [
    "Comparison", "RunResult", "TrainingClock", "format_comparison", "keep_a_batch_per_epoch", "plot_curves", "run_compare",
]


class TrainingClock(pl.Callback):
    """Training wall-clock without validation and precise BN, and the validation curve.

    Put it first in the Trainer's callbacks: its ``on_validation_start`` must stop the clock
    before the multigrid callback's precise BN runs.

    Args:
        report: called with a one-line summary after each validation (e.g. ``print``), or ``None``.
        name: the run's name in those lines.

    Attributes:
        train_seconds: wall-clock seconds spent training so far.
        train_cpu_seconds: CPU seconds of this process spent training so far (steadier than
            wall-clock on a shared machine, and complete when the loader has no workers).
        curve: one ``{"epoch", "step", "seconds", "top1"}`` per validation (``epoch``: epochs
            trained; ``top1`` from ``val/top1``, NaN when the module logs none).
    """

    def __init__(self, report: Callable[[str], None] | None = None, name: str = "") -> None:
        self.report = report
        self.name = name
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
        fitting = trainer.state.fn == "fit"
        top1 = float(trainer.callback_metrics.get("val/top1", float("nan")))
        epochs = trainer.current_epoch + 1 if fitting else trainer.current_epoch
        self.curve.append({"epoch": epochs, "step": trainer.global_step, "seconds": self.train_seconds, "top1": top1})
        if self.report is not None:
            shown = "no val/top1" if math.isnan(top1) else f"val/top1 {top1:.3f}"
            self.report(f"{self.name} epoch {epochs}: {shown} after {self.train_seconds:.1f} s of training")
        if fitting:
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
    """One training run of a comparison.

    Attributes:
        log_dir: the folder of the run's metrics and ``config.yaml``, or ``None`` without a logger.
        chance: top-1 of a constant guess (1 / classes), ``None`` when the DataModule has no
            ``num_classes``.
    """

    name: str
    epochs: int
    iterations: int
    train_seconds: float
    metrics: dict[str, float]
    curve: list[dict[str, float]] = field(default_factory=list)
    log_dir: str | None = None
    chance: float | None = None


@dataclass
class Comparison:
    """Baseline and multigrid runs of one config, and the run folder they logged into."""

    baseline: RunResult
    multigrid: RunResult
    run_dir: Path = Path(".")

    @property
    def figure_name(self) -> str:
        """``compare-version_N.png`` after the multigrid run's log folder, so a later comparison in
        the same run folder does not overwrite this one's figure; ``compare.png`` without logs."""
        log_dir = self.multigrid.log_dir
        return f"compare-{Path(log_dir).name}.png" if log_dir else "compare.png"

    @property
    def speedup(self) -> float:
        """Baseline training wall-clock over multigrid's."""
        return self.baseline.train_seconds / self.multigrid.train_seconds if self.multigrid.train_seconds else math.nan


def run_compare(
    config: str | Path,
    max_epochs: int | None = None,
    limit_train_batches: float | None = None,
    extra_args: list[str] | None = None,
    run_dir: str | Path | None = None,
    report: Callable[[str], None] | None = None,
) -> Comparison:
    """Train ``config`` as the baseline, then with multigrid, and measure both.

    Args:
        config: a ``lightning-multigrid fit`` YAML config.
        max_epochs: baseline epochs instead of the config's ``trainer.max_epochs``.
        limit_train_batches: fraction of each epoch's iterations to train (Lightning's
            ``limit_train_batches``), at least one (:func:`keep_a_batch_per_epoch`: a multigrid
            run's coarse epochs have few, large batches), for a quick look on a large dataset.
        extra_args: further LightningCLI arguments for both runs.
        run_dir: the run folder instead of the config's ``trainer.default_root_dir`` (whose
            default is ``runs``).
        report: called with a line when each run starts and after each of its validations
            (e.g. ``print``), or ``None`` for silence.

    Raises:
        FileNotFoundError: when ``config`` does not exist.
        ValueError: on out-of-range ``max_epochs`` or ``limit_train_batches``, or settings on
            which the multigrid run would fail at its start (milestones beyond ``max_epochs``):
            before anything trains.
    """
    if not Path(config).is_file():
        raise FileNotFoundError(f"`--config` {config} does not exist: pass a `lightning-multigrid fit` YAML file.")
    if max_epochs is not None and max_epochs < 1:
        raise ValueError(f"`--max-epochs` must be >= 1, got {max_epochs!r}.")
    if limit_train_batches is not None and not 0 < limit_train_batches <= 1:
        raise ValueError(f"`--limit-train-batches` must be in (0, 1], got {limit_train_batches!r}.")
    overrides = [
        "--trainer.enable_checkpointing", "false",
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
    ]
    if max_epochs is not None:
        overrides += ["--trainer.max_epochs", str(max_epochs)]
    if limit_train_batches is not None:
        overrides += ["--trainer.limit_train_batches", str(limit_train_batches)]
    if run_dir is not None:
        overrides += ["--trainer.default_root_dir", str(run_dir)]
    from lightning_multigrid.cli.trainer import quiet_lightning

    def prepare(cli: MultigridCLI) -> None:
        if limit_train_batches is not None:
            keep_a_batch_per_epoch(cli.trainer, cli.datamodule, limit_train_batches)

    with quiet_lightning():
        _check_multigrid_starts(["--config", str(config), *overrides, *(extra_args or []), "--multigrid.enabled", "true",
                                 "--trainer.logger", "false"], prepare)
        runs = []
        for name, enabled in (("baseline", "false"), ("multigrid", "true")):
            args = ["--config", str(config), *overrides, *(extra_args or []), "--multigrid.enabled", enabled]
            runs.append(_run_one(name, args, report, prepare))
    (baseline, root_dir), (multigrid, _) = runs
    return Comparison(baseline, multigrid, root_dir)


def keep_a_batch_per_epoch(trainer: pl.Trainer, datamodule: pl.LightningDataModule, fraction: float) -> None:
    """Train ``fraction`` of each epoch's batches, rounded down, and at least one.

    Lightning's fractional ``limit_train_batches`` refuses an epoch it leaves without a batch;
    a multigrid run's coarse epochs have few, large batches (3 in the demo's first epochs), so a
    fraction that suits the baseline's epochs would stop it. Each time the DataModule builds a train
    loader, this sets ``trainer.limit_train_batches`` (read right after) to ``fraction``, or to one
    batch where ``fraction`` leaves none.
    """
    build = datamodule.train_dataloader

    def train_dataloader() -> Any:
        loader = build()
        trainer.limit_train_batches = fraction if len(loader) * fraction >= 1 else 1
        return loader

    datamodule.train_dataloader = train_dataloader


def _check_multigrid_starts(args: list[str], prepare: Callable[[MultigridCLI], None]) -> None:
    """Refuse, before the baseline trains, settings on which the multigrid run would fail at its start."""
    from lightning_multigrid.cli.trainer import check_fit_starts

    try:
        check_fit_starts(args, prepare)
    except ValueError as error:
        raise ValueError(
            f"the multigrid run would fail at its start, so nothing was trained: {error} "
            "(check `--max-epochs` against the config's LR milestones)"
        ) from None


def _run_one(
    name: str, args: list[str], report: Callable[[str], None] | None, prepare: Callable[[MultigridCLI], None],
) -> tuple[RunResult, Path]:
    """One run of the comparison, and its ``trainer.default_root_dir``."""
    from lightning_multigrid.cli.trainer import build_cli

    cli = build_cli(args, save_config_kwargs={"overwrite": True}, log_name=name)
    prepare(cli)
    trainer = cli.trainer
    if report is not None:
        what = f"the baseline: {trainer.max_epochs} epochs" if name == "baseline" else (
            f"with {name}: the schedule of a {trainer.max_epochs}-epoch baseline"
        )
        report(f"training {what} ...")
    clock = TrainingClock(report, name)
    trainer.callbacks.insert(0, clock)
    trainer.fit(cli.model, datamodule=cli.datamodule)
    if clock.curve and clock.curve[-1]["epoch"] == trainer.current_epoch:
        # The last epoch was validated during fit: its metrics are the final ones.
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
    else:
        results = trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)
        metrics = {k: float(v) for k, v in (results[0] if results else {}).items()}
    num_classes = getattr(cli.datamodule, "num_classes", None)
    result = RunResult(
        name, trainer.current_epoch, trainer.global_step, clock.train_seconds, metrics, clock.curve,
        log_dir=trainer.log_dir if trainer.loggers else None,
        chance=1 / num_classes if isinstance(num_classes, int) and num_classes > 0 else None,
    )
    return result, Path(trainer.default_root_dir)


def format_comparison(comparison: Comparison) -> str:
    """The runs side by side, and the speed-up and metric differences."""
    base, multi = comparison.baseline, comparison.multigrid
    keys = sorted(set(base.metrics) | set(multi.metrics))
    if base.chance is not None and base.chance >= 0.2:  # 5 classes or fewer: top-5 is always 1
        keys = [k for k in keys if not k.endswith("top5")]
    header = ("run", "epochs", "iterations", "train s", "speed-up", *keys)
    rows = [header]
    for run in (base, multi):
        speedup = base.train_seconds / run.train_seconds if run.train_seconds > 0 else math.nan
        rows.append(
            (run.name, str(run.epochs), str(run.iterations), f"{run.train_seconds:.1f}", f"{speedup:.2f}x",
             *(f"{run.metrics[k]:.3f}" if k in run.metrics else "-" for k in keys))
        )
    lines = table_lines(rows)
    steps = base.iterations / multi.iterations if multi.iterations else math.nan
    summary = f"multigrid: {_faster_or_slower(comparison.speedup)} in training wall-clock, {steps:.2f}x fewer iterations"
    for key in keys:
        if key in base.metrics and key in multi.metrics and not key.endswith("loss"):
            summary += f"; {key} {multi.metrics[key] - base.metrics[key]:+.3f}"
    if base.chance is not None:
        summary += f" (chance top-1 {base.chance:.3f})"
    note = "train s: training wall-clock, validation and precise BN excluded"
    return "\n".join([*lines, "", summary, note])


def _faster_or_slower(speedup: float) -> str:
    """``2.20x faster``, or ``1.03x slower`` for a speed-up under 1 (not "0.97x faster")."""
    return f"{1 / speedup:.2f}x slower" if 0 < speedup < 1 else f"{speedup:.2f}x faster"


def plot_curves(comparison: Comparison, path: str | Path) -> None:
    """Both validation top-1 curves over training wall-clock, as a PNG (its folder is created)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 4))
    axis = figure.subplots()
    for run in (comparison.baseline, comparison.multigrid):
        axis.plot([p["seconds"] for p in run.curve], [p["top1"] for p in run.curve], marker="o", label=run.name)
    chance = comparison.baseline.chance
    if chance is not None:
        axis.axhline(chance, color="grey", linestyle=":", linewidth=1, label="chance")
    axis.set_xlabel("training wall-clock (s, validation excluded)")
    axis.set_ylabel("val/top1")
    axis.set_ylim(0, 1.05)
    axis.set_xlim(left=0)
    axis.grid(alpha=0.3)
    axis.legend(loc="lower right")
    axis.set_title(f"baseline vs multigrid: {_faster_or_slower(comparison.speedup)}")
    figure.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
