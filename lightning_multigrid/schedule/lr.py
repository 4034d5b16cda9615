"""The learning rate of a multigrid run: the user's scheduler, read on the baseline timeline.

The user's scheduler was written for the baseline run (its epochs, its step count). Multigrid maps
each of its own steps to a baseline position (:meth:`MultigridSchedule.baseline_epoch_at`) and asks
here what the user's scheduler would give there. We answer by stepping a *shadow* copy of the
scheduler, bound to a parameter-free copy of the optimizer, forward to that position. Positions
only grow during training, so each shadow step is taken once; no closed form is needed, so step,
cosine, warm-up chains, ``LambdaLR`` and ``OneCycleLR`` all work.

:class:`MultigridLR` applies it: for one optimizer step at a time, the baseline LR at the step's
position times the long-cycle factor, set in an optimizer step pre-hook and undone in the
post-hook, so the user's scheduler keeps stepping the LRs it set (DESIGN.md section 4: no
Lightning hook runs between ``optimizer.step()`` and ``scheduler.step()``).

A warm-up is the exception (:class:`Warmup`, :func:`find_warmup`): as in the reference
implementation (PySlowFast ``lr_policy.get_lr_at_epoch``: ``start + progress * (end - start)``,
with ``end`` the *scaled* LR where the warm-up ends), the LR rises linearly from the user's
unscaled start LR to the scaled LR, so the first step runs at the baseline's first LR, not ``r``
times it. And it lasts as many optimizer steps as the baseline's warm-up: the reference counts it in
multigrid epochs, which at ``r = 8`` pass in an eighth of the baseline's steps (r3d_18 from scratch
then climbed to the peak LR in 12 steps instead of 90 and never recovered: docs/accuracy.md).

:func:`find_milestones` reads the baseline's LR stages from the user's step schedulers.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import warnings
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch.optim.lr_scheduler import MultiStepLR, ReduceLROnPlateau, SequentialLR, StepLR
from torch.utils.hooks import RemovableHandle

from lightning_multigrid._internals import sequential_lr_parts
from lightning_multigrid.schedule.build import MultigridSchedule

__all__ = [
    "BaselineLR", "MultigridLR", "Warmup", "WarmupSearch", "baseline_epochs_worked", "check_schedulers", "find_milestones",
    "find_warmup", "search_warmup",
]

# A warm-up is the LR's initial rise when it ends within this share of the baseline run; a longer
# rise (OneCycleLR's, 30% by default) is the schedule itself and stays on the baseline timeline.
WARMUP_MAX_SHARE = 0.25
# At most this many scheduler steps are read ahead to find where the rise ends.
_WARMUP_MAX_SCAN = 100_000


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
        # A second, untouched copy: find_warmup reads ahead with it, leaving the shadow's position alone.
        probe_memo: dict[int, Any] = {id(obj): obj for obj in share}
        self._probe = None if self._shadow is None else copy.deepcopy((self._shadow_optimizer, self._shadow), probe_memo)
        # OneCycleLR extrapolates (to negative LRs) at its last step and raises after it.
        total_steps = getattr(scheduler, "total_steps", None)
        self._max_steps = total_steps - 1 if isinstance(total_steps, int) else None

    def epoch_of_step(self, step: int) -> float:
        """The baseline epoch at which the scheduler has taken ``step`` steps."""
        per_epoch = self.steps_per_epoch / self.frequency if self.interval == "step" else 1 / self.frequency
        return step / per_epoch

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


@dataclasses.dataclass(frozen=True)
class Warmup:
    """The baseline's warm-up: the LR's initial rise.

    Attributes:
        end_epoch: baseline epoch where the rise ends (the LR peaks), > 0.
        start_lrs: each parameter group's LR at the first step.
        end_lrs: each parameter group's LR where the rise ends.
    """

    end_epoch: float
    start_lrs: tuple[float, ...]
    end_lrs: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class WarmupSearch:
    """What :func:`search_warmup` found at the start of the baseline's LR.

    Attributes:
        warmup: the warm-up, or ``None`` when there is none.
        rising_steps: scheduler steps over which the LR rises from the first step: 0 when it does
            not rise; ``None`` when it still rises past ``WARMUP_MAX_SHARE`` of the run (a rise that
            long, as ``OneCycleLR``'s, is the schedule itself, not a warm-up).
    """

    warmup: Warmup | None
    rising_steps: int | None

    def describe(self) -> str:
        """Why there is no warm-up (for the summary), or where it ends."""
        if self.warmup is not None:
            return f"the baseline's LR rises over its first {self.warmup.end_epoch:g} epochs"
        if self.rising_steps is None:
            return (
                f"the baseline's LR still rises after {WARMUP_MAX_SHARE:.0%} of its epochs (as `OneCycleLR`'s does): "
                "a rise that long is the schedule itself, followed on the baseline timeline and scaled"
            )
        return "the baseline's LR does not rise at its start"


def search_warmup(baseline: BaselineLR, max_epochs: int) -> WarmupSearch:
    """The warm-up of ``baseline``'s scheduler, its LR's initial rise, and how long the LR rises.

    The rise (of the first parameter group's LR) ends at the last step before the LR first stops
    rising; it is a warm-up when it ends within ``WARMUP_MAX_SHARE`` of the ``max_epochs``
    baseline epochs, the end included: the scan takes one step past that share, to see a rise that
    ends exactly there stop (``warmup_epochs=2`` of ``max_epochs=8``). Any scheduler works
    (``LinearLR`` in a ``SequentialLR``, a ``LambdaLR`` ramp, ``ConstantLR``); the scheduler copy
    read ahead is ``baseline``'s own untouched one.
    """
    if baseline._probe is None:
        return WarmupSearch(None, 0)
    optimizer, scheduler = baseline._probe
    horizon = min(_WARMUP_MAX_SCAN, math.floor(max_epochs * WARMUP_MAX_SHARE / baseline.epoch_of_step(1) + 1e-6))
    limit = horizon + 1  # one more step, to see a rise that ends at the horizon stop
    if baseline._max_steps is not None:
        limit = min(limit, baseline._max_steps)
    history = [tuple(g["lr"] for g in optimizer.param_groups)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(limit):
            scheduler.step()
            history.append(tuple(g["lr"] for g in optimizer.param_groups))
            if history[-1][0] <= history[-2][0] * (1 + 1e-9):
                break
        else:
            return WarmupSearch(None, None)  # still rising past the horizon: not a warm-up
    peak = len(history) - 2
    if peak == 0:
        return WarmupSearch(None, 0)
    return WarmupSearch(Warmup(baseline.epoch_of_step(peak), history[0], history[peak]), peak)


def find_warmup(baseline: BaselineLR, max_epochs: int) -> Warmup | None:
    """The warm-up of ``baseline``'s scheduler (see :func:`search_warmup`), or ``None`` when it has none."""
    return search_warmup(baseline, max_epochs).warmup


def baseline_epochs_worked(schedule: MultigridSchedule, epoch: float) -> float:
    """Optimizer steps taken before multigrid position ``epoch``, in baseline epochs of steps.

    A multigrid epoch whose iterations average ``b`` clips takes ``B / b`` of a baseline epoch's
    steps (``B``: the base batch); the long cycle's coarse epochs take 1/8 of them at ``r = 8``.
    """
    worked = 0.0
    for stage in schedule.stages:
        if stage.start_epoch >= epoch:
            break
        cycle = stage.short_cycle or (stage.shape,)
        share = schedule.config.batch_size * len(cycle) / sum(grid.batch_size for grid in cycle)
        worked += (min(epoch, stage.end_epoch) - stage.start_epoch) * share
    return worked


def _warmup_end_epoch(schedule: MultigridSchedule, warmup: Warmup) -> float:
    """The multigrid position where the optimizer steps of ``warmup`` are taken, or the run's end."""
    worked = 0.0
    for stage in schedule.stages:
        cycle = stage.short_cycle or (stage.shape,)
        share = schedule.config.batch_size * len(cycle) / sum(grid.batch_size for grid in cycle)
        if worked + stage.num_epochs * share >= warmup.end_epoch:
            return stage.start_epoch + (warmup.end_epoch - worked) / share
        worked += stage.num_epochs * share
    return float(schedule.max_epochs)


class MultigridLR:
    """Scale every optimizer step of a multigrid run onto the baseline's LR timeline.

    The LR of a step at multigrid position ``epoch + batch_idx / num_batches`` is the user's
    scheduler's at :meth:`MultigridSchedule.baseline_epoch_at` of it, times the stage's long-cycle
    ``lr_factor``. Parameter groups added after :meth:`attach` (e.g. by ``BackboneFinetuning``)
    are not in the baseline copy: their current LR, set by whatever manages them, is scaled.

    Under a warm-up (:func:`find_warmup`), until the run has taken as many optimizer steps as the
    baseline's warm-up (:func:`baseline_epochs_worked`) and at most to the end of the first LR stage,
    the LR is the reference implementation's: ``start + progress * (r * end - start)``, with
    ``start``/``end`` the user's LR at the warm-up's first step and end, ``r`` the ``lr_factor``
    where the warm-up ends and ``progress`` the share of the warm-up's optimizer steps taken.
    With ``warmup_in_steps=False`` the same ramp covers the warm-up's share of the baseline timeline
    instead (fewer steps at the coarse grids), as for pretrained weights: held in steps, the warm-up
    spent the coarse grids at a low LR and a fine-tuned model lost 13 points (docs/accuracy.md).

    Args:
        schedule: the multigrid schedule.
        warmup_in_steps: hold a warm-up for the baseline warm-up's optimizer steps (from scratch:
            8x the batch at 8x the LR after a dozen steps blew r3d_18 up), else for its share of the
            baseline timeline.

    Example::

        lr = MultigridLR(schedule)
        lr.attach(optimizer, BaselineLR(optimizer, scheduler))
        for epoch in range(schedule.max_epochs):
            for batch_idx, batch in enumerate(loader):
                lr.set_position(epoch, batch_idx, len(loader))
                ...  # forward, backward, optimizer.step(): the step uses the mapped LR
            scheduler.step()
        lr.detach()
    """

    def __init__(self, schedule: MultigridSchedule, warmup_in_steps: bool = True) -> None:
        self.schedule = schedule
        self.warmup_in_steps = warmup_in_steps
        self._baselines: list[tuple[torch.optim.Optimizer, BaselineLR]] = []
        # Per BaselineLR: its warm-up and the multigrid position where that warm-up ends.
        self._warmups: dict[int, tuple[Warmup, float] | None] = {}
        self._handles: list[RemovableHandle] = []
        self._user_lrs: dict[int, list[float]] = {}  # per optimizer, during its step only
        self._epoch = 0.0  # multigrid position, in (fractional) epochs
        self.warmup_search: WarmupSearch | None = None
        """What :func:`search_warmup` found for the first optimizer attached (``None`` before :meth:`attach`)."""

    @classmethod
    def for_optimizers(
        cls,
        schedule: MultigridSchedule,
        optimizers: Sequence[torch.optim.Optimizer],
        scheduler_configs: Sequence[Any],
        steps_per_epoch: int,
        share: tuple[object, ...] = (),
        warmup_in_steps: bool = True,
    ) -> MultigridLR:
        """Map every optimizer's steps, each with the scheduler of Lightning's config that drives it (if any).

        Args:
            schedule: the multigrid schedule.
            optimizers: the user's optimizers.
            scheduler_configs: Lightning's scheduler configs (``scheduler``, ``interval``, ``frequency``).
            steps_per_epoch: baseline optimizer steps per epoch.
            share: objects the scheduler copies must reference, not copy (see :class:`BaselineLR`).
            warmup_in_steps: see :class:`MultigridLR`.
        """
        lr = cls(schedule, warmup_in_steps)
        by_optimizer = {id(c.scheduler.optimizer): c for c in scheduler_configs}
        for optimizer in optimizers:
            config = by_optimizer.get(id(optimizer))
            baseline = BaselineLR(
                optimizer,
                None if config is None else config.scheduler,
                interval="step" if config is not None and config.interval == "step" else "epoch",
                frequency=1 if config is None else config.frequency,
                steps_per_epoch=steps_per_epoch,
                share=share,
            )
            lr.attach(optimizer, baseline)
        return lr

    def attach(self, optimizer: torch.optim.Optimizer, baseline: BaselineLR) -> None:
        """Map ``optimizer``'s steps from now on, with ``baseline`` giving the user's LRs."""
        self._baselines.append((optimizer, baseline))
        search = search_warmup(baseline, self.schedule.config.max_epochs)
        if self.warmup_search is None:
            self.warmup_search = search
        warmup = search.warmup
        if warmup is not None:
            # Never past the first LR stage: a decay that comes first is the user's to keep.
            end = min(self._warmup_end(warmup), float(self.schedule.lr_stage_starts[1]))
            self._warmups[id(baseline)] = (warmup, end)
        self._handles.append(optimizer.register_step_pre_hook(functools.partial(self._scale, baseline)))
        self._handles.append(optimizer.register_step_post_hook(self._restore))

    def detach(self) -> None:
        """Remove the hooks: the optimizers step with their own LRs again."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._baselines.clear()
        self._warmups.clear()
        self._user_lrs.clear()

    def set_position(self, epoch: int, batch_idx: int, num_batches: int) -> None:
        """Where the next optimizer step happens: batch ``batch_idx`` of ``num_batches`` in multigrid ``epoch``."""
        self._epoch = epoch + batch_idx / max(1, num_batches)

    def lrs(self, baseline: BaselineLR, current: list[float]) -> list[float]:
        """The LR of each parameter group at the current position; ``current`` holds the groups' LRs now."""
        factor = self.schedule.stage_at(int(self._epoch)).lr_factor
        warming = self._warmups.get(id(baseline))
        if warming is not None and self._epoch < warming[1]:
            return self._warmup_lrs(*warming, current)
        mapped = baseline.lrs_at(self.schedule.baseline_epoch_at(self._epoch))
        return [(mapped[i] if i < len(mapped) else lr) * factor for i, lr in enumerate(current)]

    def _warmup_end(self, warmup: Warmup) -> float:
        """The multigrid position where ``warmup`` ends (it is capped to the first LR stage, where the
        timeline is linear)."""
        if self.warmup_in_steps:
            return _warmup_end_epoch(self.schedule, warmup)
        first_stage_end = self.schedule.lr_stage_starts[1]
        return first_stage_end * warmup.end_epoch / self.schedule.config.lr_stage_bounds(0)[1]

    def _warmup_lrs(self, warmup: Warmup, end_epoch: float, current: list[float]) -> list[float]:
        """The reference's linear warm-up, over the baseline warm-up's optimizer steps."""
        end_factor = self.schedule.stage_at(max(0, math.ceil(end_epoch) - 1)).lr_factor  # the stage it ends in
        if self.warmup_in_steps:
            progress = baseline_epochs_worked(self.schedule, self._epoch) / warmup.end_epoch
        else:
            progress = self.schedule.baseline_epoch_at(self._epoch) / warmup.end_epoch
        lrs = [start + progress * (end * end_factor - start) for start, end in zip(warmup.start_lrs, warmup.end_lrs)]
        # Groups added after attach ramp with the first group's progress on their own LR.
        first = lrs[0] / warmup.end_lrs[0] if warmup.end_lrs[0] else 1.0
        return [lrs[i] if i < len(lrs) else lr * first for i, lr in enumerate(current)]

    @property
    def effective_lr(self) -> float | None:
        """The first optimizer's first parameter group's LR at the current position (for logging:
        ``LearningRateMonitor`` shows the scheduler's unscaled value); ``None`` before :meth:`attach`."""
        if not self._baselines:
            return None
        optimizer, baseline = self._baselines[0]
        return self.lrs(baseline, [g["lr"] for g in optimizer.param_groups])[0]

    def _scale(self, baseline: BaselineLR, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        current = [group["lr"] for group in optimizer.param_groups]
        self._user_lrs[id(optimizer)] = current
        for group, lr in zip(optimizer.param_groups, self.lrs(baseline, current)):
            group["lr"] = lr

    def _restore(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        for group, lr in zip(optimizer.param_groups, self._user_lrs.pop(id(optimizer), [])):
            group["lr"] = lr


def find_milestones(configs: Sequence[Any], steps_per_epoch: int, max_epochs: int) -> tuple[int, ...]:
    """Baseline epochs (0-based) where LR stages start, read from the user's step schedulers.

    Args:
        configs: Lightning's scheduler configs (``scheduler``, ``interval``, ``frequency``).
        steps_per_epoch: baseline optimizer steps per epoch (for ``interval="step"``).
        max_epochs: baseline epochs; milestones outside ``(0, max_epochs)`` are dropped.

    Returns:
        The decay epochs of every ``MultiStepLR``/``StepLR`` (also inside ``SequentialLR``),
        sorted; ``()`` when there is none.
    """
    found: set[int] = set()
    for config in configs:
        per_epoch = steps_per_epoch / config.frequency if config.interval == "step" else 1 / config.frequency
        for milestone in _scheduler_milestones(config.scheduler, max_epochs * per_epoch):
            found.add(round(milestone / per_epoch))
    return tuple(sorted(m for m in found if 0 < m < max_epochs))


def check_schedulers(configs: Sequence[Any], *, manage_lr: bool, milestones_given: bool) -> None:
    """Refuse a ``ReduceLROnPlateau`` unless the LR is left to the user and the milestones are given.

    Raises:
        ValueError: naming the scheduler and the settings that keep it.
    """
    if any(isinstance(c.scheduler, ReduceLROnPlateau) for c in configs) and (manage_lr or not milestones_given):
        raise ValueError(
            "ReduceLROnPlateau reacts to metrics, so multigrid cannot map it onto the baseline "
            "run. Use a step or cosine schedule, or pass `MultigridCallback(manage_lr=False, "
            "milestones=[...])` to keep it and scale nothing."
        )


def _scheduler_milestones(scheduler: Any, horizon: float, offset: int = 0) -> list[int]:
    """Scheduler steps where a step scheduler decays the LR, in its own units."""
    if isinstance(scheduler, MultiStepLR):
        return [offset + m for m in sorted(scheduler.milestones)]
    if isinstance(scheduler, StepLR):
        return list(range(offset + scheduler.step_size, math.ceil(horizon), scheduler.step_size))
    if isinstance(scheduler, SequentialLR):
        schedulers, milestones = sequential_lr_parts(scheduler)
        return [
            m
            for inner, start in zip(schedulers, [0, *milestones])
            for m in _scheduler_milestones(inner, horizon, offset + start)
        ]
    return []
