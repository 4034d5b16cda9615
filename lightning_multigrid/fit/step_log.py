"""What MultigridCallback logs, and when: nothing measurable per step.

The ``multigrid/*`` values are logged on Lightning's logging steps (``Trainer(log_every_n_steps)``,
through ``LightningModule.log``: loggers, ``callback_metrics`` and the progress bar) and, at the
first step of every stage (a new long-cycle shape, LR factor or BatchNorm plan), written straight
to the loggers, so a change never waits for the next logging step. Between them nothing is
computed: the grid of any step is ``schedule.grid_at(epoch, batch_idx)``. ``multigrid/lr`` is
the LR the logged step trained with; ``multigrid/data_wait`` the share of the iterations since the
previous logging step spent waiting for data (:mod:`~lightning_multigrid.fit.meter`).

``multigrid/skipped_videos`` counts each skipped video once over all ranks: every rank keeps the
paths it skipped, and at logging steps and epoch ends the ranks exchange the paths new since the
last exchange (one ``all_gather_object``, lists usually empty) and count their union. Summing the
ranks' own counts counted a video twice as soon as both ranks drew it: shards change every epoch,
and a replacement draw may land on a video another rank already skipped.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from lightning_multigrid._internals import is_logging_step, logger_step
from lightning_multigrid._lightning import pl
from lightning_multigrid.contracts import SkipCountingDataModule
from lightning_multigrid.fit.meter import DataWaitMeter
from lightning_multigrid.schedule.build import MultigridSchedule
from lightning_multigrid.schedule.lr import MultigridLR
from lightning_multigrid.schedule.stages import Stage

__all__ = ["StepLog"]

# Shown in the progress bar; the others go to the loggers only.
_SHOWN = frozenset({"multigrid/batch_size", "multigrid/num_frames", "multigrid/crop_size"})


class StepLog:
    """Logs the ``multigrid/*`` values of one fit.

    Args:
        schedule: the fit's schedule (the grid and stage of each step).
        manages_batchnorm: whether the callback sets the BatchNorm grouping (else 1 group, no sync).
        lr: the callback's LR mapping, ``None`` when it leaves the LR to the user.
        skips: the DataModule, when it names the videos it skipped.
        meter: the data-wait meter whose share is logged.
    """

    def __init__(
        self, schedule: MultigridSchedule, *, manages_batchnorm: bool, lr: MultigridLR | None,
        skips: SkipCountingDataModule | None, meter: DataWaitMeter,
    ) -> None:
        self.schedule = schedule
        self.manages_batchnorm = manages_batchnorm
        self.lr = lr
        self.skips = skips
        self.meter = meter
        self._logged_stage: Stage | None = None
        self._skipped: set[str] = set()  # the union over ranks, as of the last exchange

    @property
    def skipped_videos(self) -> int:
        """Distinct videos skipped on any rank, as of the last logging step or epoch end."""
        return len(self._skipped)

    def after_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, epoch: int, batch_idx: int) -> None:
        """Called from ``on_train_batch_end``: log on logging steps and at a stage's first step."""
        logging_step = is_logging_step(trainer)
        stage = self.schedule.stage_at(epoch)
        if not logging_step and stage is self._logged_stage:
            return  # the common case: two attribute reads, nothing logged
        self._logged_stage = stage
        values = self._values(stage, epoch, batch_idx)
        if not logging_step:
            _write(trainer, values)
            return
        if self.skips is not None:
            values["multigrid/skipped_videos"] = float(self._exchange_skipped())
        if (share := self.meter.take_window_share()) is not None:
            values["multigrid/data_wait"] = share
        batch_size = int(values["multigrid/batch_size"])
        for key, value in values.items():
            pl_module.log(key, value, on_step=True, on_epoch=False, prog_bar=key in _SHOWN, batch_size=batch_size)

    def at_epoch_end(self, trainer: pl.Trainer) -> None:
        """Called from ``on_train_epoch_end`` on every rank: the skip count of the whole epoch."""
        if self.skips is not None:
            _write(trainer, {"multigrid/skipped_videos": float(self._exchange_skipped())})

    def _values(self, stage: Stage, epoch: int, batch_idx: int) -> dict[str, float]:
        grid = self.schedule.grid_at(epoch, batch_idx)
        values = {
            "multigrid/batch_size": float(grid.batch_size),
            "multigrid/num_frames": float(grid.num_frames),
            "multigrid/crop_size": float(grid.crop_size),
            "multigrid/lr_factor": float(stage.lr_factor),
            "multigrid/bn_groups": float(stage.bn.num_splits if self.manages_batchnorm else 1),
            "multigrid/bn_sync_ranks": float(stage.bn.group_size if self.manages_batchnorm else 1),
        }
        if self.lr is not None and (lr := self.lr.effective_lr) is not None:
            values["multigrid/lr"] = lr
        return values

    def _exchange_skipped(self) -> int:
        """Add the paths every rank skipped since the last exchange; the number of distinct ones."""
        assert self.skips is not None
        new = [path for path in self.skips.skipped_video_paths if path not in self._skipped]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, new)
            new = [path for paths in gathered for path in paths]
        self._skipped.update(new)
        return len(self._skipped)


def _write(trainer: pl.Trainer, values: dict[str, float]) -> None:
    """Straight to the loggers at Lightning's step for this training step (rank 0 writes)."""
    step = logger_step(trainer)
    for logger in trainer.loggers:
        logger.log_metrics(values, step=step)
