"""`lightning-multigrid fit | validate | test`: LightningCLI with the multigrid callback built in.

The model (``--model``, default :class:`VideoClassifier`), the data (``--data``, default
:class:`MultigridVideoDataModule`) and the Trainer come from YAML or flags as in any LightningCLI;
``--multigrid.*`` configures :class:`MultigridCallback`, and ``--multigrid.enabled false`` runs
the baseline with the same config, for comparison.

Runs write into a run folder, ``trainer.default_root_dir`` (default ``runs``): with the Trainer's
default ``logger: true`` the metrics go to a CSV file (and to TensorBoard as well when it is
installed) in ``<default_root_dir>/lightning_logs/version_N/``, beside the run's ``config.yaml``.
Nothing is written into the working directory unless ``default_root_dir`` points there.
"""

from __future__ import annotations

import importlib.util
import logging
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lightning_multigrid._lightning import RANK_ZERO_LOGGERS, LightningCLI, MisconfigurationException, pl
from lightning_multigrid.callback import MultigridCallback
from lightning_multigrid.cli.renamed_options import renamed_hint
from lightning_multigrid.data.datamodule import MultigridVideoDataModule
from lightning_multigrid.module import VideoClassifier

__all__ = [
    "DEFAULT_ROOT_DIR", "MultigridCLI", "SettingsError", "build_cli", "check_fit_starts", "default_loggers", "package_notes",
    "quiet_lightning", "run", "setting_flags",
]

# Where runs go when the config names no `trainer.default_root_dir` (Lightning's default is the
# working directory, where LightningCLI would also drop a `config.yaml` when logging is off).
DEFAULT_ROOT_DIR = "runs"


def default_loggers(save_dir: str | Path, name: str = "lightning_logs") -> list[pl.loggers.Logger]:
    """A CSV logger in ``save_dir/name/version_N``, and TensorBoard into the same folder when installed.

    Both share the version, so a run's metrics, ``hparams.yaml`` and ``config.yaml`` sit in one
    folder; ``trainer.log_dir`` is that folder (the first logger's).
    """
    csv = pl.loggers.CSVLogger(save_dir, name=name)
    loggers: list[pl.loggers.Logger] = [csv]
    if importlib.util.find_spec("tensorboard") is not None or importlib.util.find_spec("tensorboardX") is not None:
        loggers.append(pl.loggers.TensorBoardLogger(save_dir, name=name, version=csv.version, default_hp_metric=False))
    return loggers


class MultigridCLI(LightningCLI):
    """LightningCLI that adds ``--multigrid.*``, logs into a run folder and prints a summary after ``fit``.

    Args:
        log_name: folder of the default loggers' versions inside ``trainer.default_root_dir``.
        *args, **kwargs: LightningCLI's.
    """

    def __init__(self, *args: Any, log_name: str = "lightning_logs", **kwargs: Any) -> None:
        self.log_name = log_name  # read while LightningCLI.__init__ builds the Trainer
        super().__init__(*args, **kwargs)

    def init_parser(self, **kwargs: Any) -> Any:
        """LightningCLI's parser, whose errors name the new key of a previous release's option."""
        parser = super().init_parser(**kwargs)
        error = parser.error

        def error_with_renamed_keys(message: str, *args: Any, **kwargs: Any) -> Any:
            return error(message + renamed_hint(message), *args, **kwargs)

        parser.error = error_with_renamed_keys
        return parser

    def instantiate_classes(self) -> None:
        """LightningCLI's, where a value a class refuses while it is built is a :class:`SettingsError` naming its flag."""
        try:
            super().instantiate_classes()
        except (ValueError, TypeError) as error:
            config = self.config[self.subcommand] if self.subcommand else self.config
            raise SettingsError(setting_flags(_refusal(error), config.keys())) from error

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_lightning_class_args(MultigridCallback, "multigrid")
        parser.set_defaults({"trainer.default_root_dir": DEFAULT_ROOT_DIR})
        # The classifier's head must match the data's classes.
        parser.link_arguments("data.num_classes", "model.init_args.num_classes", apply_on="instantiate")

    def instantiate_trainer(self, **kwargs: Any) -> pl.Trainer:
        """The Trainer, with :func:`default_loggers` where the config keeps the default logger.

        The Trainer's ``logger`` defaults to ``None``, which means ``True``: Lightning's default logger.
        """
        config = self.config_init[self.subcommand] if self.subcommand else self.config_init
        trainer_config = config.get("trainer") or {}
        if "logger" not in kwargs and trainer_config.get("logger") in (None, True):
            kwargs["logger"] = default_loggers(trainer_config.get("default_root_dir") or ".", self.log_name)
        return super().instantiate_trainer(**kwargs)

    def before_fit(self) -> None:
        self._fit_started = time.perf_counter()

    def after_fit(self) -> None:
        elapsed = time.perf_counter() - self._fit_started
        trainer = self.trainer
        if not trainer.is_global_zero:
            return
        callback = next((c for c in trainer.callbacks if isinstance(c, MultigridCallback)), None)
        mode = "multigrid" if callback is not None and callback.schedule is not None else "baseline"
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        shown = ", ".join(f"{k} {v:.3f}" for k, v in sorted(metrics.items())) or "no validation metrics"
        chance = f" (chance {1 / self.datamodule.num_classes:.3f})" if hasattr(self.datamodule, "num_classes") else ""
        print(
            f"\n{mode} training finished: {trainer.current_epoch} epochs, {trainer.global_step} optimizer steps, "
            f"{elapsed:.0f} s wall-clock; {shown}{chance}"
        )
        if trainer.log_dir and any(Path(trainer.log_dir).glob("*.csv")):  # not under fast_dev_run
            print(f"logs: {trainer.log_dir}")


def build_cli(args: Sequence[str], **kwargs: Any) -> MultigridCLI:
    """A :class:`MultigridCLI` (model and data as ``fit`` takes them, ``run=False``) parsed from ``args`` alone.

    The command line of the process (``compare``'s own options) is not this run's: LightningCLI,
    seeing both, warns about them, so ``sys.argv`` holds only the program name while it parses.
    """
    saved = sys.argv
    sys.argv = saved[:1]
    try:
        return MultigridCLI(
            VideoClassifier, MultigridVideoDataModule, subclass_mode_model=True, subclass_mode_data=True,
            args=list(args), run=False, **kwargs,
        )
    finally:
        sys.argv = saved


class SettingsError(ValueError):
    """A parsed value that its class refused while LightningCLI built it (``--multigrid.epoch_factor -1``): a
    settings error, reported in one line naming the flag, not a traceback through jsonargparse."""


def setting_flags(message: str, keys: Iterable[str]) -> str:
    """``message`` with each `name` in backticks that ends one config key written as that key's flag.

    The classes' errors name their Python arguments (`epoch_factor`); the user typed a flag or a YAML
    key (``--multigrid.epoch_factor``, ``--model.weights``). A name that ends several keys is written
    as each of them; one that ends none stays as it is.

    Args:
        message: the error's text.
        keys: the parsed config's dotted keys (``multigrid.epoch_factor``, ``model.init_args.weights``).
    """
    flags: dict[str, list[str]] = {}
    for key in keys:
        parts = key.replace(".init_args.", ".").split(".")
        for start in range(1, len(parts)):  # `epoch_factor`, and a grouped option's `short_run.coarse_share`
            flags.setdefault(".".join(parts[start:]), []).append("--" + ".".join(parts))

    def as_flag(match: re.Match[str]) -> str:
        found = flags.get(match[1])
        return " or ".join(f"`{flag}`" for flag in found) if found else match[0]

    return re.sub(r"`(\w+(?:\.\w+)*)`", as_flag, message)


def _refusal(error: BaseException) -> str:
    """The class's own words for the value it refused, from jsonargparse's wrapping of them.

    jsonargparse wraps a subclass-mode class's refusal (``--model.lr -1``) in a chain of errors, and a
    union-typed option's (``short_run: bool | ShortRun | None``) in one error listing each subtype's:
    the refusal is the listed error that is not a type mismatch ("Expected a <class 'bool'>"), else
    the value or type error that started the chain.
    """
    first = error
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, (ValueError, TypeError)):
            first = cause
            own = [line[4:] for line in str(cause).splitlines() if line.startswith("  - ") and not line.startswith("  - Expected a ")]
            if own:
                return own[0]
        cause = cause.__cause__ or cause.__context__
    return str(first)


@contextmanager
def package_notes() -> Iterator[None]:
    """Show this package's INFO notes on stderr while the block runs, as Lightning shows its own.

    Python shows a logger's INFO records only through a handler, and a command line has none: the
    note of what ``VideoClassifier(weights=...)`` loaded ("Loaded N tensors ...") never appeared.
    Nothing is added when the application has configured a handler for the package or the root logger.
    """
    package = logging.getLogger(__name__.split(".")[0])
    if package.handlers or logging.getLogger().handlers:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level = package.level
    package.addHandler(handler)
    package.setLevel(logging.INFO)
    try:
        yield
    finally:
        package.removeHandler(handler)
        package.setLevel(level)


class _DropLightningTips(logging.Filter):
    """Lightning's advertisements for its cloud products ("💡 Tip: ... litlogger / litmodels")."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip:")




@contextmanager
def quiet_lightning() -> Iterator[None]:
    """Leave out of the console, while the block runs, two notes of Lightning's that are no news to a user.

    Lightning 2.6's own batch-moving code calls a pytree API that torch >= 2.10 deprecates (a
    ``FutureWarning`` about ``LeafSpec`` per run), and every Trainer logs a tip to install
    Lightning's cloud logging products. Only these two: every other warning and message stays.
    """
    tips = _DropLightningTips()
    loggers = [logging.getLogger(name) for name in RANK_ZERO_LOGGERS]
    for logger in loggers:
        logger.addFilter(tips)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message=r".*isinstance\(treespec, LeafSpec\)", module=re.escape(pl.__name__) + r"\.utilities\._pytree"
            )
            yield
    finally:
        for logger in loggers:
            logger.removeFilter(tips)


class _StopBeforeTraining(Exception):
    """Raised by :class:`_StopAtTrainStart` once everything before the first step has run."""


class _StopAtTrainStart(pl.Callback):
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        raise _StopBeforeTraining


def check_fit_starts(args: Sequence[str], prepare: Callable[[MultigridCLI], None] | None = None) -> None:
    """Go through everything ``fit`` does before its first step, for the run ``args`` describe, and stop.

    That is the callbacks' ``setup`` and ``on_fit_start`` (the multigrid schedule is built and
    checked there), ``configure_optimizers`` and the first training loader (Lightning's
    ``limit_train_batches`` check): what would fail at the start of a run fails here, before an
    earlier run spends its time. ``prepare`` gets the CLI before ``fit``, as the real run's does.

    Raises:
        ValueError: with what the run would have failed with.
    """
    cli: MultigridCLI | None = None
    logging.disable(logging.INFO)  # the real run prints the schedule and the Trainer's notes
    try:
        cli = build_cli(args, save_config_callback=None)
        if prepare is not None:
            prepare(cli)
        cli.trainer.callbacks.append(_StopAtTrainStart())
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    except _StopBeforeTraining:
        return
    except MisconfigurationException as error:
        raise ValueError(str(error)) from None
    finally:
        logging.disable(logging.NOTSET)
        if cli is not None:
            # Lightning skips the DataModule's teardown when fit raises: stop the loaders' workers
            # here, before the real run forks its own.
            cli.datamodule.teardown("fit")


def run(args: Sequence[str] | None = None) -> None:
    """Run LightningCLI on ``args`` (``fit ...``, ``validate ...``, ``test ...``; default ``sys.argv``).

    A manifest that is missing or malformed, and a value a class refuses while it is built
    (:class:`SettingsError`, naming its flag), is one line on stderr and exit status 2, as in
    ``check-data``; other errors keep their traceback. This package's notes show on stderr
    (:func:`package_notes`).
    """
    from lightning_multigrid.data.manifests.entries import ManifestError

    try:
        with quiet_lightning(), package_notes():
            MultigridCLI(
                VideoClassifier,
                MultigridVideoDataModule,
                subclass_mode_model=True,
                subclass_mode_data=True,
                args=None if args is None else list(args),
                save_config_kwargs={"overwrite": True},
            )
    except (FileNotFoundError, ManifestError, SettingsError) as error:
        command = (list(args) if args is not None else sys.argv[1:])[:1] or ["fit"]
        print(f"lightning-multigrid {command[0]}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
