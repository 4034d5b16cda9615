"""Trainer limits given for the baseline run, mapped onto the multigrid run: pure Python.

``max_steps`` and an integer ``val_check_interval`` count baseline steps and batches; a multigrid
run takes fewer, larger steps, so each is mapped (or refused) before the first step.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning_multigrid.schedule.build import MultigridSchedule

__all__ = ["check_val_interval", "limited_batches", "limited_iterations", "map_baseline_limits"]


def map_baseline_limits(
    *, max_steps: int, val_check_interval: float, batches_per_epoch: int, steps_per_epoch: int, max_epochs: int
) -> dict[str, Any]:
    """The Trainer settings a multigrid run needs instead of the baseline's.

    Args:
        max_steps: the Trainer's ``max_steps`` (``-1``: none).
        val_check_interval: the Trainer's; an ``int`` counts baseline batches.
        batches_per_epoch: baseline batches per epoch.
        steps_per_epoch: baseline optimizer steps per epoch.
        max_epochs: baseline epochs.

    Returns:
        ``{"max_steps": -1}`` when ``max_steps`` does not end the baseline early (it must not cut the
        multigrid run, whose step count differs), and ``{"val_check_interval": fraction}`` for an
        integer interval: every N baseline batches is the fraction ``N / batches_per_epoch`` of an
        epoch, which a multigrid epoch covers in fewer batches.

    Raises:
        ValueError: when ``max_steps`` ends the baseline before ``max_epochs``.
    """
    changes: dict[str, Any] = {}
    if max_steps != -1:
        if max_steps < steps_per_epoch * max_epochs:
            raise ValueError(
                f"`Trainer(max_steps={max_steps})` ends the baseline run after "
                f"{max_steps / steps_per_epoch:.2f} of its `max_epochs`={max_epochs} "
                f"epochs ({steps_per_epoch} steps each); multigrid plans whole baseline epochs and "
                "cannot end there. Remove `max_steps` and give the baseline's length as `max_epochs` "
                f"(e.g. max_epochs={max(1, round(max_steps / steps_per_epoch))})."
            )
        changes["max_steps"] = -1
    if isinstance(val_check_interval, int):
        changes["val_check_interval"] = min(1.0, val_check_interval / batches_per_epoch)
    return changes


def check_val_interval(val_check_interval: float, check_val_every_n_epoch: int | None) -> None:
    """Refuse an integer ``val_check_interval`` that counts steps across epochs (``check_val_every_n_epoch=None``).

    Raises:
        ValueError: naming both settings and the two that work.
    """
    if isinstance(val_check_interval, int) and check_val_every_n_epoch is None:
        raise ValueError(
            f"`Trainer(val_check_interval={val_check_interval}, check_val_every_n_epoch=None)` "
            "validates every so many baseline steps across epochs; multigrid takes fewer, larger "
            "steps, so that count has no equivalent. Use a float `val_check_interval` (a fraction "
            "of an epoch) or an integer one with `check_val_every_n_epoch` (both are mapped)."
        )


def limited_batches(batches: int, limit: float) -> int:
    """Batches trained of an epoch of ``batches`` under ``Trainer(limit_train_batches=limit)``.

    An ``int`` trains at most that many; a ``float`` that fraction, rounded down, at least one
    (Lightning refuses a fraction that leaves none; ``compare`` keeps one).
    """
    if isinstance(limit, int) and not isinstance(limit, bool):
        return min(batches, limit)
    return min(batches, max(1, int(batches * limit)))


def limited_iterations(schedule: MultigridSchedule, dataset_size: int, limit: float) -> tuple[int, int]:
    """Iterations per device of the multigrid run and of its baseline under ``limit_train_batches``.

    Args:
        schedule: the multigrid schedule.
        dataset_size: clips in the training set, over all devices.
        limit: the Trainer's ``limit_train_batches``.

    Returns:
        ``(multigrid, baseline)``, each epoch cut by :func:`limited_batches`.
    """
    multigrid = sum(
        s.num_epochs * limited_batches(schedule.iterations_in_epoch(s.start_epoch, dataset_size), limit)
        for s in schedule.stages
    )
    max_epochs = schedule.config.max_epochs
    baseline_epoch = math.ceil(schedule.baseline_iterations(dataset_size) / max_epochs)
    return multigrid, max_epochs * limited_batches(baseline_epoch, limit)
