"""Module surgery: put :class:`~lightning_multigrid.norm.MultigridBatchNorm` into a model, take it
out again, and set every layer's grouping from a :class:`~lightning_multigrid.schedule.stages.BNPlan`.

Example::

    model = convert_batchnorm(model)                    # once, before building the optimizer
    apply_bn_plan(model, BNPlan("split", num_splits=4))  # whenever the schedule says so
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.lazy import LazyModuleMixin

from lightning_multigrid.norm.batchnorm import MultigridBatchNorm, check_grouping
from lightning_multigrid.norm.groups import get_sync_group
from lightning_multigrid.schedule.stages import BNPlan

__all__ = ["apply_bn_plan", "convert_batchnorm", "revert_batchnorm"]


def apply_bn_plan(module: nn.Module, plan: BNPlan) -> int:
    """Set the grouping of every :class:`MultigridBatchNorm` in ``module`` from ``plan``.

    ``plain``: ``nn.BatchNorm``; ``split``: ``plan.num_splits`` interleaved groups of the device's
    batch; ``sync``: the batches of ``plan.group_size`` consecutive ranks (the process group comes
    from :func:`get_sync_group`; its first use for a size is a collective, so call this on every
    rank, or create the groups beforehand with :func:`create_sync_groups`).

    Returns:
        How many layers were configured (0 when the model has not been converted).

    Raises:
        ValueError: when the plan is invalid, or asks for sync over more than one rank while
            ``torch.distributed`` is not initialised or has a single rank.
    """
    if plan.mode == "plain":
        num_splits, process_group = 1, None
    elif plan.mode == "split":
        num_splits, process_group = plan.num_splits, None
    elif plan.mode == "sync":
        num_splits, process_group = 1, get_sync_group(plan.group_size)
    else:
        raise ValueError(f"`plan.mode` must be 'plain', 'split' or 'sync', got {plan.mode!r}.")
    check_grouping(num_splits, process_group)
    count = 0
    for layer in module.modules():
        if isinstance(layer, MultigridBatchNorm):
            layer.set_grouping(num_splits, process_group)
            count += 1
    return count


def convert_batchnorm(module: nn.Module, exclude: Iterable[str] | str | None = None) -> nn.Module:
    """Replace every BatchNorm layer of ``module`` with a :class:`MultigridBatchNorm`.

    Converted: ``nn.BatchNorm1d/2d/3d``, other ``_BatchNorm`` subclasses that keep its
    ``forward`` (e.g. Lightning's reverted sync layers), and ``nn.SyncBatchNorm`` (whose
    whole-group sync would defeat the fixed statistics size; :func:`revert_batchnorm` restores it
    with its process group). The new layers share the old ones' Parameter and buffer objects, so
    optimizers built before keep working and ``state_dict`` keys and shapes do not change.
    Forward hooks on the old layers are not carried over.

    Left alone: other norms (``LayerNorm``, ``GroupNorm``, ``InstanceNorm*``: their statistics
    do not depend on the batch), layers already converted, and ``_BatchNorm`` subclasses with
    their own ``forward`` (their behaviour cannot be reproduced; a warning names them).

    Args:
        module: the model, changed in place; if it is itself a BatchNorm, the replacement is
            returned.
        exclude: qualified names (as in ``module.named_modules()``, e.g. ``"head.norm"``) of
            modules to leave alone, with everything inside them; a single string is one name.

    Returns:
        ``module`` (or its replacement).

    Raises:
        ValueError: when a name in ``exclude`` is not a module of ``module``, or a lazy
            BatchNorm has not been initialised by a forward pass yet.
    """
    excluded = _excluded_names(module, exclude)

    def convert(layer: nn.Module, name: str) -> nn.Module:
        if name in excluded:
            return layer
        new = layer
        if isinstance(layer, _BatchNorm) and not isinstance(layer, MultigridBatchNorm):
            if isinstance(layer, LazyModuleMixin) and layer.has_uninitialized_params():
                raise ValueError(
                    f"`{name or type(layer).__name__}` is a lazy BatchNorm that has not seen "
                    "input yet. Run one forward pass before `convert_batchnorm`."
                )
            if _keeps_batchnorm_forward(layer):
                new = MultigridBatchNorm.from_batchnorm(layer)
            else:
                warnings.warn(
                    f"`{name or type(layer).__name__}` ({type(layer).__name__}) has its own "
                    "forward(): left as is, so it does not follow the multigrid BatchNorm plan. "
                    "Pass its name in `exclude` to silence this.",
                    UserWarning,
                    stacklevel=3,
                )
        for child_name, child in layer.named_children():
            converted = convert(child, f"{name}.{child_name}" if name else child_name)
            if converted is not child or new is not layer:
                new.add_module(child_name, converted)
        return new

    return convert(module, "")


def revert_batchnorm(module: nn.Module) -> nn.Module:
    """Undo :func:`convert_batchnorm`: every :class:`MultigridBatchNorm` becomes the layer it replaced.

    The restored layers get the current Parameter and buffer objects, so training progress and
    ``state_dict`` keys carry over. A ``MultigridBatchNorm`` built directly (not converted)
    becomes a plain BatchNorm that accepts 2D to 5D input.

    Args:
        module: the model, changed in place; if it is itself a ``MultigridBatchNorm``, the
            replacement is returned.

    Returns:
        ``module`` (or its replacement).
    """
    new = module.to_batchnorm() if isinstance(module, MultigridBatchNorm) else module
    for name, child in module.named_children():
        reverted = revert_batchnorm(child)
        if reverted is not child or new is not module:
            new.add_module(name, reverted)
    return new


def _keeps_batchnorm_forward(layer: _BatchNorm) -> bool:
    forward = type(layer).forward
    return forward is _BatchNorm.forward or forward is nn.SyncBatchNorm.forward


def _excluded_names(module: nn.Module, exclude: Iterable[str] | str | None) -> set[str]:
    if exclude is None:
        return set()
    names = {exclude} if isinstance(exclude, str) else set(exclude)
    if not all(isinstance(name, str) for name in names):
        raise TypeError(f"`exclude` must be module names (strings), got {sorted(map(repr, names))}.")
    unknown = names - {name for name, _ in module.named_modules()}
    if unknown:
        raise ValueError(
            f"`exclude` names modules that are not in the model: {sorted(unknown)}. Use qualified "
            "names as listed by `model.named_modules()`, e.g. 'blocks.5.norm'."
        )
    return names
