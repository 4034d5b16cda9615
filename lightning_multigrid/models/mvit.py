"""MViT at every grid: the token grid read from the input, positional tables interpolated to it.

torchvision's :class:`~torchvision.models.video.MViT` (``mvit_v1_b``, ``mvit_v2_s``) takes only
the clip it was built for (16 x 224): its forward starts the blocks at the configured token grid
``(T/2, H/4, W/4)`` whatever the input, and v1 adds a positional embedding of exactly that many
tokens. Any other grid fails (``shape '[1, 96, 8, 56, 56]' is invalid``).

:func:`convert_mvit` replaces each ``MViT`` by a :class:`MultigridMViT` that holds the same
submodules and Parameters under the same names (state dicts of torchvision's architecture load
unchanged, torchvision's Kinetics weights included) and, at forward time:

- reads the token grid from the patch embedding's output;
- v1: interpolates the separable positional embedding (spatial table bilinearly, temporal table
  linearly) to that grid, as PySlowFast's MViT does for another input size (``_get_pos_embed``,
  trilinear on the summed table: the same numbers, since linear interpolation weights sum to one
  along each axis);
- v2: the relative-position tables need nothing more: torchvision's attention already
  interpolates them to the query/key grids it is given (``_add_rel_pos``, from PySlowFast's
  ``cal_rel_pos_spatial``); it was only ever given the wrong grid.

At the grid the model was built for nothing is interpolated, and the output equals torchvision's.

Example::

    model = convert_mvit(mvit_v2_s(weights="KINETICS400_V1"))
    model(torch.zeros(1, 3, 8, 112, 112))  # any frames and crop
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torchvision.models.video import MViT
from torchvision.models.video.mvit import PositionalEncoding

__all__ = ["GridPositionalEncoding", "MultigridMViT", "convert_mvit"]


class GridPositionalEncoding(nn.Module):
    """MViT's class token and (v1) positional embedding, interpolated to the token grid of the input.

    Holds the Parameters of a torchvision ``PositionalEncoding`` as the same objects under the same
    names: ``class_token`` and, for v1, ``spatial_pos`` (``(H0*W0, C)``), ``temporal_pos``
    (``(T0, C)``) and ``class_pos``; ``(T0, H0, W0)`` is the token grid they were made for.

    Args:
        encoding: torchvision's ``PositionalEncoding`` to take the Parameters from.
    """

    def __init__(self, encoding: PositionalEncoding) -> None:
        super().__init__()
        self.temporal_size: int = encoding.temporal_size
        self.spatial_size: tuple[int, int] = encoding.spatial_size
        self.class_token = encoding.class_token
        self.spatial_pos = encoding.spatial_pos
        self.temporal_pos = encoding.temporal_pos
        self.class_pos = encoding.class_pos

    def forward(self, x: torch.Tensor, thw: tuple[int, int, int]) -> torch.Tensor:
        """Prepend the class token to tokens ``(N, t*h*w, C)`` of grid ``thw`` and add the embedding."""
        class_token = self.class_token.expand(x.size(0), -1).unsqueeze(1)
        x = torch.cat((class_token, x), dim=1)
        if self.spatial_pos is None or self.temporal_pos is None or self.class_pos is None:
            return x  # v2: relative positions, added in the attention
        t, h, w = thw
        spatial = self.spatial_pos
        if (h, w) != self.spatial_size:
            grid = spatial.t().reshape(1, -1, *self.spatial_size)  # (1, C, H0, W0)
            spatial = F.interpolate(grid, size=(h, w), mode="bilinear", align_corners=False).flatten(2)[0].t()
        temporal = self.temporal_pos
        if t != self.temporal_size:
            temporal = F.interpolate(temporal.t()[None], size=t, mode="linear", align_corners=False)[0].t()
        # Token (i, j) of the t x (h*w) grid gets temporal[i] + spatial[j], as torchvision adds them.
        embedding = (temporal[:, None, :] + spatial[None, :, :]).reshape(t * h * w, -1)
        return x + torch.cat((self.class_pos[None], embedding))[None]


class MultigridMViT(nn.Module):
    """torchvision's MViT taking any frames and crop: the token grid comes from the input.

    Holds the submodules of the ``MViT`` it replaces as the same objects under the same names
    (``conv_proj``, ``pos_encoding``, ``blocks``, ``norm``, ``head``), so its state dict is
    the ``MViT``'s, key for key; only ``pos_encoding`` is a :class:`GridPositionalEncoding` (same
    Parameters).

    Args:
        mvit: the torchvision ``MViT`` to take the submodules from.

    Input ``(N, 3, T, H, W)``, output ``(N, num_classes)`` logits. The patch embedding (kernel
    ``3x7x7``, stride ``2x4x4``) makes a ``ceil(T/2) x ceil(H/4) x ceil(W/4)`` token grid.
    """

    def __init__(self, mvit: MViT) -> None:
        super().__init__()
        self.conv_proj = mvit.conv_proj
        self.pos_encoding = GridPositionalEncoding(mvit.pos_encoding)
        self.blocks = mvit.blocks
        self.norm = mvit.norm
        self.head = mvit.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_proj(x)  # (N, C, t, h, w)
        t, h, w = x.shape[2:]
        thw = (t, h, w)
        x = self.pos_encoding(x.flatten(2).transpose(1, 2), thw)
        for block in self.blocks:
            x, thw = block(x, thw)
        x = self.norm(x)
        return self.head(x[:, 0])  # the class token


def convert_mvit(module: nn.Module) -> nn.Module:
    """Replace every torchvision ``MViT`` in ``module`` by a :class:`MultigridMViT` over the same Parameters.

    Like ``nn.SyncBatchNorm.convert_sync_batchnorm``: children are replaced in place, and when
    ``module`` is itself an ``MViT`` the replacement is returned, so use the return value.
    Optimizers built before keep working (the Parameters are the same objects) and running it
    twice changes nothing.

    Args:
        module: a model that is or contains torchvision ``MViT`` s.

    Returns:
        ``module`` with its ``MViT`` children replaced, or the :class:`MultigridMViT` replacing it.
    """
    if isinstance(module, MViT):
        return MultigridMViT(module)
    for name, child in module.named_children():
        converted = convert_mvit(child)
        if converted is not child:
            setattr(module, name, converted)
    return module
