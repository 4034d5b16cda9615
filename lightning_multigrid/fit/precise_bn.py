"""Precise BatchNorm: recompute running statistics at the validation shape before validating.

After a coarse-grid epoch the running statistics describe small, short clips; validation runs at
the base shape. As in the reference implementation, the statistics are recomputed as a true
average over a number of training batches (at the base shape here) and averaged over ranks.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from lightning_multigrid._lightning import pl
from lightning_multigrid.contracts import PreciseBNDataModule
from lightning_multigrid.norm import apply_bn_plan
from lightning_multigrid.schedule.stages import BNPlan

__all__ = ["PreciseBN", "update_bn_stats"]


class PreciseBN:
    """When ``MultigridCallback`` recomputes the statistics: before a validation of changed weights.

    A second validation at the same step, or ``trainer.validate()`` after fit, would only redraw them.
    """

    def __init__(self) -> None:
        self._done: tuple[int, int] | None = None  # (id of the module, global step)

    def before_validation(self, trainer: pl.Trainer, pl_module: pl.LightningModule, num_batches: int) -> bool:
        """Recompute the statistics over ``num_batches`` of the DataModule's ``precise_bn_dataloader()`` when
        due (not in the sanity check, nor without that loader); whether it did."""
        datamodule = trainer.datamodule
        if trainer.sanity_checking or not num_batches or not isinstance(datamodule, PreciseBNDataModule):
            return False
        done = (id(pl_module), trainer.global_step)
        if done == self._done:
            return False
        update_bn_stats(trainer, pl_module, datamodule.precise_bn_dataloader(), num_batches)
        self._done = done
        return True


@torch.no_grad()
def update_bn_stats(trainer: pl.Trainer, pl_module: pl.LightningModule, loader: Iterable[Any], num_batches: int) -> int:
    """Replace BatchNorm running statistics by their average over ``num_batches`` batches.

    Batches are dicts with a ``"video"`` entry; they go through the strategy's ``batch_to_device``,
    which also runs the transfer hooks (the DataModule's normalisation), as in training. BatchNorm runs in plain mode (one
    group per device); the other layers run in train mode without gradients.

    Returns:
        The number of batches used (fewer than ``num_batches`` when the loader is shorter).
    """
    layers = [m for m in pl_module.modules() if isinstance(m, _BatchNorm) and m.track_running_stats]
    if not layers:
        return 0
    saved = [(m.momentum, m.num_batches_tracked.clone()) for m in layers]  # type: ignore[union-attr]
    for layer in layers:
        layer.reset_running_stats()
        layer.momentum = None  # cumulative average: every batch weighs the same
    apply_bn_plan(pl_module, BNPlan())
    was_training = pl_module.training
    pl_module.train()
    forward = _forward_module(trainer, pl_module)
    used = 0
    for batch in loader:
        if used >= num_batches:
            break
        video = trainer.strategy.batch_to_device(batch)["video"]
        with trainer.precision_plugin.forward_context():  # autocast as in training
            forward(video)
        used += 1
    pl_module.train(was_training)
    for layer, (momentum, tracked) in zip(layers, saved):
        layer.momentum = momentum
        layer.num_batches_tracked.copy_(tracked)  # type: ignore[union-attr]
        if trainer.world_size > 1:
            for stat in (layer.running_mean, layer.running_var):
                assert stat is not None
                stat.copy_(trainer.strategy.reduce(stat, reduce_op="mean"))
    return used


def _forward_module(trainer: pl.Trainer, pl_module: pl.LightningModule) -> torch.nn.Module:
    """What runs a forward pass as training does: under FSDP its wrapper, which gathers the parameters
    and casts them to the dtype it gave the BatchNorm buffers; otherwise the LightningModule itself
    (DDP's wrapper would run ``training_step``)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    model = trainer.strategy.model
    return model if isinstance(model, FullyShardedDataParallel) else pl_module
