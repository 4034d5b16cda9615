"""What the DataModule's loaders are built for, read from the Trainer it serves (or its absence).

One read of the Trainer per loader hook: the 0-based epoch, the rank and world size, the batches of a
resumed epoch already trained, whether the fit goes on from a checkpoint, and the training device.
Without a Trainer (a loader built by hand) every fact is the single-process start. No Lightning
import: a stand-in with the same attributes serves as well.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from lightning_multigrid._internals import iterations_done_in_epoch

__all__ = ["TrainerFacts", "trainer_facts"]


class TrainerFacts(NamedTuple):
    """Where the Trainer stands, as the loaders see it."""

    epoch: int  # 0-based current epoch
    rank: int  # 0-based global rank
    world_size: int
    start_iteration: int  # batches of `epoch` already trained (a mid-epoch resume), else 0
    resumed: bool  # a restored position: a checkpoint's fit goes on
    device: torch.device | None  # the strategy's root device; None without a strategy


def trainer_facts(trainer: Any) -> TrainerFacts:
    """The facts of ``trainer`` (``None``: epoch 0 on one process, no device)."""
    if trainer is None:
        return TrainerFacts(0, 0, 1, 0, False, None)
    epoch = int(trainer.current_epoch)
    strategy = getattr(trainer, "strategy", None)
    return TrainerFacts(
        epoch, int(trainer.global_rank), int(trainer.world_size), iterations_done_in_epoch(trainer),
        # The loops are restored after `on_fit_start` (where the callback may build a loader before
        # it serves its schedule): only a restored position counts as resuming.
        getattr(trainer, "global_step", 0) > 0 or epoch > 0,
        strategy.root_device if strategy is not None else None,
    )
