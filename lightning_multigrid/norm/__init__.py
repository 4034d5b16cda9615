"""MultigridBatchNorm: BatchNorm whose statistics cover a fixed number of clips.

Multigrid changes the per-device batch by up to 8x (32x with the short cycle), but BatchNorm
should keep computing its statistics over about ``bn_base_size`` clips, or accuracy moves with the
schedule (Wu et al., CVPR 2020, Section 3.3). :class:`MultigridBatchNorm` is a drop-in for
``nn.BatchNorm1d/2d/3d`` whose grouping is two plain attributes that may change between any two
steps, without touching parameters, buffers or ``state_dict`` keys:

- ``num_splits = k > 1`` (*split*): statistics per interleaved group of the device's batch;
- ``process_group`` of ``g > 1`` ranks (*sync*): statistics over the union of their batches;
- neither (*plain*): exactly ``nn.BatchNorm``.

The reference implementation (PySlowFast ``SubBatchNorm3d``) bakes the split count into parameter
shapes, so it must rebuild the model and reload a checkpoint at every change; this module does not.

The package: :mod:`~lightning_multigrid.norm.batchnorm` (the layer),
:mod:`~lightning_multigrid.norm.functional` (its autograd functions),
:mod:`~lightning_multigrid.norm.groups` (process groups for sync) and
:mod:`~lightning_multigrid.norm.convert` (module surgery and BN plans).

Example::

    model = convert_batchnorm(model)                    # once, before building the optimizer
    apply_bn_plan(model, BNPlan("split", num_splits=4))  # whenever the schedule says so
"""

from lightning_multigrid.norm.batchnorm import MultigridBatchNorm
from lightning_multigrid.norm.convert import (
    apply_bn_plan,
    convert_batchnorm,
    revert_batchnorm,
)
from lightning_multigrid.norm.groups import create_sync_groups, get_sync_group

__all__ = [
    "MultigridBatchNorm",
    "apply_bn_plan",
    "convert_batchnorm",
    "create_sync_groups",
    "get_sync_group",
    "revert_batchnorm",
]
