"""Multigrid training for video models (Wu et al., CVPR 2020) as a PyTorch Lightning plugin."""

from lightning_multigrid.schedule import (
    BNPlan,
    GridShape,
    MultigridConfig,
    MultigridSchedule,
    ShortScheduleWarning,
    Stage,
    build_schedule,
)

__version__ = "0.1.0.dev0"

__all__ = [
    "BNPlan",
    "GridShape",
    "MultigridConfig",
    "MultigridSchedule",
    "ShortScheduleWarning",
    "Stage",
    "build_schedule",
]
