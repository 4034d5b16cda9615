"""The schedule: pure functions of the baseline run and the multigrid options (no Lightning).

In the order a schedule is built: ``config`` (the options and the baseline's settings), ``sizing``
(how a grid's batch is sized: Equation 1 or measured cost), ``stages`` (one stage: its grids,
short cycle and BatchNorm plan), ``allocation`` (the paper's epochs per stage) and ``short_run``
(the short-run mode), ``build`` (the schedule value and ``build_schedule``); then what reads it:
``preview`` (table, JSON, figure), ``limits`` (the baseline's Trainer limits on the multigrid run),
``lr`` (the user's LR schedulers on the baseline timeline) and ``cost`` (measuring each grid's cost
per clip, with torch). Only ``lr`` and ``cost`` import torch.

``from lightning_multigrid.schedule import build_schedule`` keeps working: the names of ``build``
(the module this room replaced) are imported from it on first access.
"""

from __future__ import annotations

from typing import Any

from lightning_multigrid._lazy import lazy_attribute

_BUILD = "lightning_multigrid.schedule.build"
_LAZY = {name: _BUILD for name in ("GridCount", "MultigridSchedule", "build_schedule", "grid_counts")}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _LAZY, name)
