"""Multigrid training for video models (Wu et al., CVPR 2020) as a PyTorch Lightning plugin.

The schedule (pure Python) is imported eagerly; everything that needs torch or Lightning is
imported on first use, so ``lightning_multigrid.schedule`` stays free of torch.
"""

from __future__ import annotations

import importlib
from typing import Any

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

# name -> module that defines it, imported on first access.
_LAZY = {
    "MultigridCallback": "lightning_multigrid.callback",
    "MultigridVideoDataModule": "lightning_multigrid.data.datamodule",
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

__all__ = [
    "BNPlan",
    "GridShape",
    "MultigridConfig",
    "MultigridSchedule",
    "ShortScheduleWarning",
    "Stage",
    "build_schedule",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lightning_multigrid' has no attribute {name!r}")
