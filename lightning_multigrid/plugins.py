"""Lightning plugin that installs :class:`~lightning_multigrid.norm.MultigridBatchNorm`.

``Trainer(plugins=[MultigridBatchNormSync()], strategy="ddp")`` converts every BatchNorm of the
LightningModule before DDP wraps it (and before the optimizers are built) and reverts it at the
end of ``fit``; in a LightningCLI config::

    trainer:
      strategy: ddp
      plugins:
        - class_path: lightning_multigrid.plugins.MultigridBatchNormSync

Lightning applies ``LayerSync`` plugins only under multi-process strategies (DDP, FSDP) and only
for ``fit``: on a single device the plugin does nothing and the layers must be converted with
:func:`~lightning_multigrid.norm.convert_batchnorm` (the multigrid callback does that).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn
from typing_extensions import override

from lightning_multigrid._internals import layer_sync_of
from lightning_multigrid._lightning import LayerSync, either_package, pl
from lightning_multigrid.norm import convert_batchnorm, revert_batchnorm

__all__ = ["MultigridBatchNormSync", "check_no_torch_sync_batchnorm"]


class MultigridBatchNormSync(LayerSync):
    """Replace the model's BatchNorm layers with ``MultigridBatchNorm`` for the duration of ``fit``.

    The layers start in plain mode (``nn.BatchNorm`` numerics); the multigrid callback sets their
    grouping (split or sync) per epoch with :func:`~lightning_multigrid.norm.apply_bn_plan`.
    Parameters and buffers are shared, not copied, so checkpoints keep their keys.

    Cannot be combined with ``Trainer(sync_batchnorm=True)`` (Lightning refuses two layer-sync
    plugins): drop ``sync_batchnorm=True``; sync is done by these layers, over the rank groups
    the schedule asks for.

    Args:
        exclude: qualified module names to leave alone, with everything inside them, as in
            ``model.named_modules()`` (e.g. ``["head"]``).
    """

    def __init__(self, exclude: Sequence[str] | None = None) -> None:
        self.exclude = list(exclude) if exclude is not None else None

    @override
    def apply(self, model: nn.Module) -> nn.Module:
        """Convert every BatchNorm of ``model`` (in place) to ``MultigridBatchNorm``."""
        return convert_batchnorm(model, exclude=self.exclude)

    @override
    def revert(self, model: nn.Module) -> nn.Module:
        """Turn every ``MultigridBatchNorm`` of ``model`` back into the layer it replaced."""
        return revert_batchnorm(model)


def check_no_torch_sync_batchnorm(trainer: pl.Trainer) -> None:
    """Raise if ``trainer`` will replace BatchNorm layers with ``torch.nn.SyncBatchNorm``.

    ``Trainer(sync_batchnorm=True)`` converts every BatchNorm subclass, ``MultigridBatchNorm``
    included, to ``torch.nn.SyncBatchNorm``, which syncs over all ranks whatever the schedule
    says (and does not run on CPU). Call this from a callback's ``setup()``, which runs before
    the strategy converts the layers. On a single device Lightning ignores ``sync_batchnorm``,
    and so does this check.

    Raises:
        ValueError: naming ``sync_batchnorm=True`` and the fix.
    """
    # Both packages' class: a Trainer of the other Lightning package installs its own.
    if isinstance(layer_sync_of(trainer.strategy), either_package("plugins.layer_sync.TorchSyncBatchNorm")):
        raise ValueError(
            "`Trainer(sync_batchnorm=True)` replaces every BatchNorm with torch.nn.SyncBatchNorm, "
            "which syncs over all ranks and overrides the multigrid BatchNorm plan. Remove "
            "`sync_batchnorm=True` and pass `plugins=[MultigridBatchNormSync()]` (from "
            "lightning_multigrid.plugins) instead: it syncs over the rank groups the schedule needs."
        )
