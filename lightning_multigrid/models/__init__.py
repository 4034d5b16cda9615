"""Video models for multigrid: head pooling made adaptive, a preflight over every grid, and
backbones by name.

- :mod:`~lightning_multigrid.models.heads`: :func:`make_multigrid_compatible` and the pooling surgery;
- :mod:`~lightning_multigrid.models.preflight`: :func:`preflight`, one tiny forward per grid;
- :mod:`~lightning_multigrid.models.backbones`: :func:`build_backbone`, :class:`TinyVideoNet`.
"""

from lightning_multigrid.models.backbones import BACKBONES, TWO_PATHWAY_BACKBONES, TinyVideoNet, build_backbone
from lightning_multigrid.models.heads import convert_head_pooling, find_fixed_head_pools, make_multigrid_compatible
from lightning_multigrid.models.preflight import FixedHeadPoolWarning, preflight

__all__ = [
    "BACKBONES",
    "TWO_PATHWAY_BACKBONES",
    "FixedHeadPoolWarning",
    "TinyVideoNet",
    "build_backbone",
    "convert_head_pooling",
    "find_fixed_head_pools",
    "make_multigrid_compatible",
    "preflight",
]
