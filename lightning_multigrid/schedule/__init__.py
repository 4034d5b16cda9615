"""The schedule: pure functions of the baseline run and the multigrid options (no Lightning).

In the order a schedule is built: ``config`` (the options and the baseline's settings), ``sizing``
(how a grid's batch is sized: Equation 1 or measured cost), ``stages`` (one stage: its grids,
short cycle and BatchNorm plan), ``allocation`` (the paper's epochs per stage) and ``short_run``
(the short-run mode), ``build`` (the schedule value and ``build_schedule``); then what reads it:
``preview`` (table, JSON, figure), ``limits`` (the baseline's Trainer limits on the multigrid run),
``lr`` (the user's LR schedulers on the baseline timeline) and ``cost`` (measuring each grid's cost
per clip, with torch). Only ``lr`` and ``cost`` import torch.

``from lightning_multigrid.schedule import build_schedule, MultigridConfig`` keeps working: every name of
``build`` (the module this room replaced) is imported from it on first access.
"""

from __future__ import annotations

from typing import Any

from lightning_multigrid._lazy import lazy_attribute

# Every name the module ``schedule.py`` offered (``build.__all__``: its own and those it re-exported).
_NAMES = (
    "GridCount", "MultigridSchedule", "build_schedule", "grid_counts", "DEFAULT_LONG_CYCLE_FACTORS",
    "DEFAULT_SHORT_CYCLE_FACTORS", "PRETRAINED_LONG_CYCLE_FACTORS", "SHORT_RUN_BASELINE_STEPS", "BNPlan", "GridShape",
    "MultigridConfig", "MultigridOptions", "ShortRun", "ShortScheduleWarning", "Stage", "check_milestones",
    "default_long_cycle_factors", "plan_batchnorm",
)
_LAZY = dict.fromkeys(_NAMES, "lightning_multigrid.schedule.build")

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _LAZY, name)
