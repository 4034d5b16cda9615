"""Multigrid training for video models (Wu et al., CVPR 2020) as a PyTorch Lightning plugin.

The grid values (pure Python, :mod:`lightning_multigrid.grid`) are imported eagerly; every other name
is imported on first use, so importing a module of the package (the batch sampler, say) loads only
what that module needs: no torch for the schedule, no schedule for the data pipeline.
"""

from __future__ import annotations

from typing import Any

from lightning_multigrid._lazy import lazy_attribute
from lightning_multigrid._moved import install as _install_moved_modules
from lightning_multigrid.grid import ClipSampling, EvalViews, FixedGrid, GridPlan, GridShape

__version__ = "0.1.0.dev0"

_install_moved_modules()  # the old module paths (lightning_multigrid.config, ...) still import

# name -> module that defines it, imported on first access.
_LAZY = {
    "MultigridConfig": "lightning_multigrid.schedule.config",
    "MultigridOptions": "lightning_multigrid.schedule.config",
    "ShortRun": "lightning_multigrid.schedule.config",
    "ClipCost": "lightning_multigrid.schedule.config",
    "measure_clip_costs": "lightning_multigrid.schedule.cost",
    "BNPlan": "lightning_multigrid.schedule.stages",
    "Stage": "lightning_multigrid.schedule.stages",
    "ShortScheduleWarning": "lightning_multigrid.schedule.allocation",
    "MultigridSchedule": "lightning_multigrid.schedule.build",
    "build_schedule": "lightning_multigrid.schedule.build",
    "MultigridCallback": "lightning_multigrid.callback",
    "GridMemoryFormat": "lightning_multigrid.memory_format",
    "MultigridVideoDataModule": "lightning_multigrid.data.datamodule",
    "ReaderSettings": "lightning_multigrid.data.reader_settings",  # the DataModule's `reader_settings`
    "VideoClassifier": "lightning_multigrid.module",
    "MultigridBatchNorm": "lightning_multigrid.norm",
    "apply_bn_plan": "lightning_multigrid.norm",
    "convert_batchnorm": "lightning_multigrid.norm",
    "revert_batchnorm": "lightning_multigrid.norm",
    "MultigridBatchNormSync": "lightning_multigrid.plugins",
    "make_multigrid_compatible": "lightning_multigrid.models",
    "preflight": "lightning_multigrid.models",
    "ShortCycleBatchSampler": "lightning_multigrid.data.sampler",
    "EpochShardSampler": "lightning_multigrid.data.sampler",
}

__all__ = ["ClipSampling", "EvalViews", "FixedGrid", "GridPlan", "GridShape", *_LAZY]


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _LAZY, name)
