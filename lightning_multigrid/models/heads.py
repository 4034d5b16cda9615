"""Head pooling surgery: make a video model take every multigrid grid.

Most video backbones are fully convolutional up to the classification head, but pytorchvideo's
heads (and torchvision's S3D) pool with a fixed ``AvgPool3d`` kernel sized for the training
input: on a coarser grid the kernel is larger than the feature map and the forward fails; on a
finer grid it pools sliding windows instead of the whole clip. :func:`make_multigrid_compatible`
swaps those head pools for adaptive (global) pooling.

Example::

    model = make_multigrid_compatible(create_x3d(input_clip_length=4, input_crop_size=160))
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable

from torch import nn

__all__ = ["convert_head_pooling", "find_fixed_head_pools", "make_multigrid_compatible"]

log = logging.getLogger(__name__)

# Pools whose output size follows their input size; the ones a head must not use.
_FIXED_POOLS = (nn.AvgPool3d, nn.MaxPool3d)
# Layers that do not mix positions, skipped when looking at what follows a pool.
_PASS_THROUGH = (nn.Dropout, nn.Identity, nn.ReLU, nn.SiLU, nn.GELU, nn.Sigmoid, nn.Softmax)


def find_fixed_head_pools(model: nn.Module) -> list[str]:
    """Names of the fixed-size head pools :func:`convert_head_pooling` would replace.

    Args:
        model: any ``nn.Module``.

    Returns:
        Qualified module names (as in ``model.named_modules()``), in registration order.
    """
    return [_join(parent_name, key) for parent_name, _, key in _head_pool_slots(model)]


def convert_head_pooling(model: nn.Module) -> list[str]:
    """Replace fixed-size pooling in classification heads by adaptive pooling, in place.

    A pool is a *head pool* when it is an ``AvgPool3d``/``MaxPool3d`` in one of these positions
    (found by module type and position, not by name):

    ================================================  ==========================================
    container                                         pool(s) replaced
    ================================================  ==========================================
    pytorchvideo ``ResNetBasicHead`` (create_resnet,  ``head.pool``
    create_csn, create_r2plus1d, ...)
    pytorchvideo ``ProjectedPool`` (X3D head)         ``head.pool.pool`` (between the two convs)
    pytorchvideo ``PoolConcatPathway`` (SlowFast)     each pathway's ``pool[i]``
    torchvision ``S3D``                               ``avgpool``
    any module                                        a pool whose next sibling (skipping
                                                      dropout, identity, activations) is a
                                                      ``Flatten`` or ``Linear``
    ================================================  ==========================================

    ``AvgPool3d`` becomes ``AdaptiveAvgPool3d(1)`` and ``MaxPool3d`` ``AdaptiveMaxPool3d(1)``.
    The output size is 1 because these heads are built so that, at the base shape, the kernel
    covers the whole feature map and the pool outputs ``1x1x1``: adaptive pooling to 1 computes
    exactly the same there, and the global average (or maximum) at every other grid. This is
    also what the reference multigrid code does (it builds the heads with
    ``AdaptiveAvgPool3d((1, 1, 1))`` when multigrid is on). Where a head was configured with a
    kernel smaller than its base feature map, its sliding-window average becomes a global
    average; a ``Linear`` that relied on a larger pooled grid then fails, and :func:`preflight`
    names it.

    Pools in the body (stem, stage pooling, Inception branches) are left alone: they are
    followed by convolutions, which take any size. Adaptive pools (torchvision's ResNets) are
    already shape-agnostic and are not touched. The replacement has no parameters or buffers,
    so optimizers and checkpoints are unaffected. Running it twice changes nothing.

    Args:
        model: the model to change in place.

    Returns:
        The qualified names of the replaced pools (empty when nothing needed replacing).
    """
    slots = list(_head_pool_slots(model))
    for _, container, key in slots:
        setattr(container, key, _adaptive(getattr(container, key)))
    return [_join(parent_name, key) for parent_name, _, key in slots]


def make_multigrid_compatible(model: nn.Module) -> nn.Module:
    """Make ``model`` take every grid of a multigrid schedule (in place), and return it.

    Replaces fixed-size head pooling by adaptive pooling (see :func:`convert_head_pooling` for
    the patterns and why output size 1 is right) and torchvision's ``MViT`` by a
    :class:`~lightning_multigrid.models.mvit.MultigridMViT` over the same Parameters (token grid
    read from the input, positional tables interpolated to it; see
    :func:`~lightning_multigrid.models.mvit.convert_mvit`), and logs what it replaced at INFO level.
    Models that are already shape-agnostic, such as torchvision's R3D/MC3/R(2+1)D and Swin3D
    (which pads the token grid to its windows), are returned unchanged.

    Args:
        model: the model to change in place.

    Returns:
        ``model`` itself, or, when ``model`` is itself an ``MViT``, the ``MultigridMViT`` that
        replaces it (same Parameters and state-dict keys): use the return value.

    Example::

        model = make_multigrid_compatible(create_resnet(model_depth=50, model_num_class=400))
        # INFO: replaced fixed-size head pooling by adaptive pooling: blocks.5.pool
    """
    # torchvision's model zoo, loaded only when a model is converted
    from torchvision.models.video import MViT

    from lightning_multigrid.models.mvit import convert_mvit

    replaced = convert_head_pooling(model)
    if replaced:
        log.info("Replaced fixed-size head pooling by adaptive pooling: %s", ", ".join(replaced))
    mvits = [name or "the model" for name, module in model.named_modules() if isinstance(module, MViT)]
    if mvits:
        log.info("Made MViT read its token grid from the input (positional tables interpolated): %s", ", ".join(mvits))
    return convert_mvit(model)


def _pytorchvideo_heads() -> tuple[tuple[type[nn.Module], ...], tuple[type[nn.Module], ...]]:
    """pytorchvideo's ``(PoolConcatPathway,)`` and ``(ResNetBasicHead, ProjectedPool)`` classes.

    Read from ``sys.modules`` rather than imported: a model can only hold instances of these
    classes if pytorchvideo was imported to build it, and importing it here would cost every
    user a slow import (it scripts functions at import time) for models that never use it.
    """
    head = sys.modules.get("pytorchvideo.models.head")
    slowfast = sys.modules.get("pytorchvideo.models.slowfast")
    x3d = sys.modules.get("pytorchvideo.models.x3d")
    concat: tuple[type[nn.Module], ...] = (slowfast.PoolConcatPathway,) if slowfast is not None else ()
    heads: tuple[type[nn.Module], ...] = (head.ResNetBasicHead,) if head is not None else ()
    if x3d is not None:
        heads += (x3d.ProjectedPool,)
    return concat, heads


def _head_pool_slots(model: nn.Module) -> Iterable[tuple[str, nn.Module, str]]:
    """Yield ``(parent name, container, key)`` for each fixed head pool, ``container.key``."""
    pool_concat_pathway, pool_heads = _pytorchvideo_heads()
    from torchvision.models.video import S3D  # the model zoo, loaded only when a model is walked

    for parent_name, parent in model.named_modules():
        if isinstance(parent, pool_concat_pathway):
            # The per-pathway pools live in a ModuleList (entries may be None).
            if isinstance(parent.pool, nn.ModuleList):
                pools = parent.pool
                yield from ((_join(parent_name, "pool"), pools, key) for key in _fixed_pools(pools, lambda _: True))
        elif isinstance(parent, pool_heads):
            # X3D's ResNetBasicHead holds a ProjectedPool as `pool`, which is not a fixed pool
            # itself; its inner `pool` is found when the walk reaches the ProjectedPool.
            yield from ((parent_name, parent, key) for key in _fixed_pools(parent, lambda key: key == "pool"))
        elif isinstance(parent, S3D):
            # S3D pools with (2, 7, 7), then a 1x1x1 conv classifier and a mean.
            yield from ((parent_name, parent, key) for key in _fixed_pools(parent, lambda key: key == "avgpool"))
        else:
            children = list(parent.named_children())
            for i, (key, child) in enumerate(children):
                if isinstance(child, _FIXED_POOLS) and _feeds_classifier(m for _, m in children[i + 1 :]):
                    yield parent_name, parent, key


def _fixed_pools(container: nn.Module, wanted: Callable[[str], bool]) -> list[str]:
    """Keys of ``container``'s direct children that are fixed pools and ``wanted``."""
    return [key for key, child in container.named_children() if wanted(key) and isinstance(child, _FIXED_POOLS)]


def _feeds_classifier(following: Iterable[nn.Module]) -> bool:
    """Whether the first position-mixing sibling after a pool is a ``Flatten`` or ``Linear``."""
    for module in following:
        if isinstance(module, _PASS_THROUGH):
            continue
        return isinstance(module, (nn.Flatten, nn.Linear))
    return False


def _adaptive(pool: nn.Module) -> nn.Module:
    if isinstance(pool, nn.MaxPool3d):
        return nn.AdaptiveMaxPool3d(1)
    return nn.AdaptiveAvgPool3d(1)


def _join(parent_name: str, key: str) -> str:
    return f"{parent_name}.{key}" if parent_name else key

