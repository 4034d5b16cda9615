"""`lightning-multigrid fit | validate | test`: LightningCLI with the multigrid callback built in.

The model (``--model``, default :class:`VideoClassifier`), the data (``--data``, default
:class:`MultigridVideoDataModule`) and the Trainer come from YAML or flags as in any LightningCLI;
``--multigrid.*`` configures :class:`MultigridCallback`, and ``--multigrid.enabled false`` runs
the baseline with the same config, for comparison.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Sequence

import pytorch_lightning as pl
from pytorch_lightning.cli import LightningCLI

from lightning_multigrid.callback import MultigridCallback
from lightning_multigrid.data.datamodule import MultigridVideoDataModule
from lightning_multigrid.module import VideoClassifier

__all__ = ["MultigridCLI", "check_fit_starts", "run"]


class MultigridCLI(LightningCLI):
    """LightningCLI that adds ``--multigrid.*`` and prints a summary after ``fit``."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_lightning_class_args(MultigridCallback, "multigrid")
        # The classifier's head must match the data's classes.
        parser.link_arguments("data.num_classes", "model.init_args.num_classes", apply_on="instantiate")

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


class _StopBeforeTraining(Exception):
    """Raised by :class:`_StopAtTrainStart` once everything before the first step has run."""


class _StopAtTrainStart(pl.Callback):
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        raise _StopBeforeTraining


def check_fit_starts(args: Sequence[str]) -> None:
    """Go through everything ``fit`` does before its first step, for the run ``args`` describe, and stop.

    That is the callbacks' ``setup`` and ``on_fit_start`` (the multigrid schedule is built and
    checked there), ``configure_optimizers`` and the first training loader (Lightning's
    ``limit_train_batches`` check): what would fail at the start of a run fails here, before an
    earlier run spends its time.

    Raises:
        ValueError: with what the run would have failed with.
    """
    from lightning_fabric.utilities.exceptions import MisconfigurationException

    cli = MultigridCLI(
        VideoClassifier, MultigridVideoDataModule, subclass_mode_model=True, subclass_mode_data=True,
        args=list(args), run=False, save_config_callback=None,
    )
    cli.trainer.callbacks.append(_StopAtTrainStart())
    logging.disable(logging.INFO)  # the real run prints the schedule and the Trainer's notes
    try:
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    except _StopBeforeTraining:
        return
    except MisconfigurationException as error:
        raise ValueError(str(error)) from None
    finally:
        logging.disable(logging.NOTSET)


def run(args: Sequence[str] | None = None) -> None:
    """Run LightningCLI on ``args`` (``fit ...``, ``validate ...``, ``test ...``; default ``sys.argv``)."""
    # Lightning 2.6 with torch >= 2.10 warns about a deprecated pytree call on every batch.
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    MultigridCLI(
        VideoClassifier,
        MultigridVideoDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        args=None if args is None else list(args),
        save_config_kwargs={"overwrite": True},
    )
