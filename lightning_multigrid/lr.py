"""The user's learning rate at a point of the baseline run, for any PyTorch LR scheduler.

The user's scheduler was written for the baseline run (its epochs, its step count). Multigrid maps
each of its own steps to a baseline position (:meth:`MultigridSchedule.baseline_epoch_at`) and asks
here what the user's scheduler would give there. We answer by stepping a *shadow* copy of the
scheduler, bound to a parameter-free copy of the optimizer, forward to that position. Positions
only grow during training, so each shadow step is taken once; no closed form is needed, so step,
cosine, warm-up chains, ``LambdaLR`` and ``OneCycleLR`` all work.
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any, Literal

import torch

__all__ = ["BaselineLR"]


class BaselineLR:
    """Learning rates of one optimizer's parameter groups along the baseline timeline.

    Args:
        optimizer: the user's optimizer.
        scheduler: its LR scheduler as first built, or ``None`` for a constant LR.
        interval: ``"epoch"`` or ``"step"``: how often Lightning steps the scheduler.
        frequency: Lightning steps the scheduler every ``frequency`` intervals.
        steps_per_epoch: baseline optimizer steps per epoch (for ``interval="step"``).
        share: objects the copy must reference, not copy (a LightningModule whose bound method
            is a ``LambdaLR`` lambda, say).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        scheduler: Any | None,
        interval: Literal["epoch", "step"] = "epoch",
        frequency: int = 1,
        steps_per_epoch: int = 1,
        share: tuple[object, ...] = (),
    ) -> None:
        if interval not in ("epoch", "step"):
            raise ValueError(f"`interval` must be 'epoch' or 'step', got {interval!r}.")
        self.interval = interval
        self.frequency = max(1, frequency)
        self.steps_per_epoch = max(1, steps_per_epoch)
        self._shadow_optimizer = _parameter_free_copy(optimizer)
        # The memo makes the copy (and any schedulers nested in it) drive the shadow optimizer.
        memo: dict[int, Any] = {id(obj): obj for obj in share}
        memo[id(optimizer)] = self._shadow_optimizer
        self._shadow = None if scheduler is None else copy.deepcopy(scheduler, memo)
        self._steps_taken = 0
        # OneCycleLR extrapolates (to negative LRs) at its last step and raises after it.
        total_steps = getattr(scheduler, "total_steps", None)
        self._max_steps = total_steps - 1 if isinstance(total_steps, int) else None

    def lrs_at(self, baseline_epoch: float) -> list[float]:
        """The LR of every parameter group at a (fractional) baseline epoch."""
        if self.interval == "epoch":
            intervals = math.floor(baseline_epoch + 1e-9)
        else:
            intervals = math.floor(baseline_epoch * self.steps_per_epoch + 1e-6)
        target = intervals // self.frequency
        if self._max_steps is not None:
            target = min(target, self._max_steps)
        if self._shadow is not None and self._steps_taken < target:
            with warnings.catch_warnings():
                # The shadow optimizer never steps; torch would warn about the order of calls.
                warnings.simplefilter("ignore", UserWarning)
                while self._steps_taken < target:
                    self._shadow.step()
                    self._steps_taken += 1
        return [group["lr"] for group in self._shadow_optimizer.param_groups]


def _parameter_free_copy(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """An SGD optimizer with the same group settings and one dummy tensor per group.

    Schedulers only read and write group entries (``lr``, ``initial_lr``, ``momentum``...), so
    a copy of the groups is enough and no model parameter or optimizer state is duplicated.
    """
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [torch.zeros(1)]} for g in optimizer.param_groups]
    shadow = torch.optim.SGD(groups, lr=groups[0]["lr"])
    for shadow_group, group in zip(shadow.param_groups, optimizer.param_groups):
        # Keep keys the user's optimizer has and SGD does not (betas for a one-cycle momentum).
        shadow_group.update({k: v for k, v in group.items() if k != "params"})
    return shadow
