"""Video models for multigrid: head pooling made adaptive, a preflight over every grid, and
backbones by name.

- :mod:`~lightning_multigrid.models.heads`: :func:`make_multigrid_compatible` and the pooling surgery;
- :mod:`~lightning_multigrid.models.preflight`: :func:`preflight`, one tiny forward per grid;
- :mod:`~lightning_multigrid.models.pathways`: :func:`slowfast_pathways`, the one ``[slow, fast]`` split;
- :mod:`~lightning_multigrid.models.backbones`: :func:`build_backbone`, :class:`TinyVideoNet`;
- :mod:`~lightning_multigrid.models.weights`: :func:`load_weights`, pretrained weights by name or file;
- :mod:`~lightning_multigrid.models.mvit`: :class:`MultigridMViT`, torchvision's MViT at any frames and crop.

The backbones and weights (which load torchvision's model zoo) are imported on first use: the data
pipeline imports :mod:`~lightning_multigrid.models.pathways` (torch only) and must not pay for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning_multigrid._lazy import lazy_attribute

# Torch only, and `preflight` is also a submodule's name: a lazy function would lose to the module.
from lightning_multigrid.models.heads import convert_head_pooling, find_fixed_head_pools, make_multigrid_compatible
from lightning_multigrid.models.pathways import check_slowfast_alpha, slowfast_pathways
from lightning_multigrid.models.preflight import FixedHeadPoolWarning, preflight

if TYPE_CHECKING:
    from lightning_multigrid.models.backbones import (
        BACKBONES,
        TWO_PATHWAY_BACKBONES,
        TinyVideoNet,
        build_backbone,
        build_tiny_swin3d,
    )
    from lightning_multigrid.models.mvit import MultigridMViT, convert_mvit
    from lightning_multigrid.models.weights import LoadedWeights, classifier_keys, load_weights, weights_names

# name -> module that defines it, imported on first access.
_LAZY = {
    "BACKBONES": "lightning_multigrid.models.backbones",
    "TWO_PATHWAY_BACKBONES": "lightning_multigrid.models.backbones",
    "TinyVideoNet": "lightning_multigrid.models.backbones",
    "build_backbone": "lightning_multigrid.models.backbones",
    "build_tiny_swin3d": "lightning_multigrid.models.backbones",
    "MultigridMViT": "lightning_multigrid.models.mvit",
    "convert_mvit": "lightning_multigrid.models.mvit",
    "LoadedWeights": "lightning_multigrid.models.weights",
    "classifier_keys": "lightning_multigrid.models.weights",
    "load_weights": "lightning_multigrid.models.weights",
    "weights_names": "lightning_multigrid.models.weights",
}

__all__ = [
    "BACKBONES",
    "TWO_PATHWAY_BACKBONES",
    "FixedHeadPoolWarning",
    "LoadedWeights",
    "MultigridMViT",
    "TinyVideoNet",
    "build_backbone",
    "build_tiny_swin3d",
    "check_slowfast_alpha",
    "classifier_keys",
    "convert_head_pooling",
    "convert_mvit",
    "find_fixed_head_pools",
    "load_weights",
    "make_multigrid_compatible",
    "preflight",
    "slowfast_pathways",
    "weights_names",
]


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _LAZY, name)
