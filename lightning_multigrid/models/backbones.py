"""The backbones :class:`~lightning_multigrid.module.VideoClassifier` knows by name.

Built without pretrained weights and multigrid-compatible, usable from a plain PyTorch loop.
pytorchvideo is imported only by the builders that need it.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from types import ModuleType

import torch
from torch import nn
from torchvision.models import video as tv_video

from lightning_multigrid._checks import check_positive_int
from lightning_multigrid.models.heads import make_multigrid_compatible

__all__ = ["BACKBONES", "TWO_PATHWAY_BACKBONES", "TinyVideoNet", "build_backbone", "build_tiny_swin3d"]


def _pytorchvideo(module: str) -> ModuleType:
    with warnings.catch_warnings():
        # pytorchvideo 0.1.5 calls `torch.jit.script` at import time; the deprecation warning is
        # about its internals, not about anything a user of this package can change.
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*", category=FutureWarning)
        return importlib.import_module(f"pytorchvideo.models.{module}")


class TinyVideoNet(nn.Module):
    """A small 3D CNN for demos and tests: fast on CPU, takes any grid.

    A stem ``Conv3d(3x7x7, stride 1x2x2)`` and ``num_blocks - 1`` blocks ``Conv3d(3x3x3)``, each
    followed by ``BatchNorm3d`` and ``ReLU``; the blocks halve the crop (and, after the first,
    the frames) and double the width. Then global average pooling, dropout and a ``Linear``.

    Args:
        num_classes: output logits per clip.
        width: channels of the stem; block ``i`` has ``width * 2**i``.
        num_blocks: convolution blocks including the stem, at least 1.
        in_channels: input channels ``C``.
        dropout_rate: dropout before the classifier.

    Input ``(N, C, T, H, W)``, output ``(N, num_classes)`` logits.
    """

    def __init__(
        self,
        num_classes: int,
        width: int = 16,
        num_blocks: int = 4,
        in_channels: int = 3,
        dropout_rate: float = 0.0,
    ) -> None:
        super().__init__()
        for name, value in (("num_classes", num_classes), ("width", width), ("num_blocks", num_blocks)):
            check_positive_int(name, value)
        layers: list[nn.Module] = [
            nn.Conv3d(in_channels, width, (3, 7, 7), stride=(1, 2, 2), padding=(1, 3, 3), bias=False),
            nn.BatchNorm3d(width),
            nn.ReLU(inplace=True),
        ]
        channels = width
        for i in range(num_blocks - 1):
            # Keep all frames in the first block: coarse grids have as few as 2 of them.
            stride = (1, 2, 2) if i == 0 else (2, 2, 2)
            layers += [
                nn.Conv3d(channels, channels * 2, 3, stride=stride, padding=1, bias=False),
                nn.BatchNorm3d(channels * 2),
                nn.ReLU(inplace=True),
            ]
            channels *= 2
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool3d(1)
        self.dropout = nn.Dropout(dropout_rate)
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.features(x)).flatten(1)
        return self.fc(self.dropout(x))


def build_tiny_swin3d(num_classes: int, width: int = 16) -> nn.Module:
    """A small Video Swin Transformer for demos and tests: torchvision's ``SwinTransformer3d``, fast on CPU.

    ``swin3d_t``'s patches (``2x4x4``) with two stages of two blocks each (the second block of a
    stage attends in shifted windows), ``width`` and ``2 * width`` channels with one and two heads,
    and ``2x4x4`` windows (``swin3d_t``: 96 channels, depths 2/2/6/2, ``8x7x7`` windows). Swin pads
    the token grid to its windows and shrinks a window to a smaller grid, so it takes every grid.
    No stochastic depth: a model this shallow needs none.

    Args:
        num_classes: output logits per clip.
        width: channels of the patch embedding (``embed_dim``).

    Input ``(N, 3, T, H, W)``, output ``(N, num_classes)`` logits.
    """
    for name, value in (("num_classes", num_classes), ("width", width)):
        check_positive_int(name, value)
    return tv_video.SwinTransformer3d(
        patch_size=[2, 4, 4],
        embed_dim=width,
        depths=[2, 2],
        num_heads=[1, 2],
        window_size=[2, 4, 4],
        stochastic_depth_prob=0.0,
        num_classes=num_classes,
    )


def _x3d(clip_length: int, crop_size: int) -> Callable[[int, float], nn.Module]:
    # The hub's X3D heads end in a softmax; a classifier trained with cross-entropy needs logits.
    def build(num_classes: int, dropout_rate: float) -> nn.Module:
        return _pytorchvideo("x3d").create_x3d(
            input_clip_length=clip_length,
            input_crop_size=crop_size,
            model_num_class=num_classes,
            dropout_rate=dropout_rate,
            head_activation=None,
        )

    return build


def _slow_r50(num_classes: int, dropout_rate: float) -> nn.Module:
    return _pytorchvideo("resnet").create_resnet(
        model_depth=50,
        stem_conv_kernel_size=(1, 7, 7),
        head_pool_kernel_size=(8, 7, 7),
        model_num_class=num_classes,
        dropout_rate=dropout_rate,
    )


def _i3d_r50(num_classes: int, dropout_rate: float) -> nn.Module:
    return _pytorchvideo("resnet").create_resnet(
        model_depth=50,
        stem_conv_kernel_size=(5, 7, 7),
        stage1_pool=nn.MaxPool3d,
        stage_conv_a_kernel_size=(
            (3, 1, 1),
            [(3, 1, 1), (1, 1, 1)],
            [(3, 1, 1), (1, 1, 1)],
            [(1, 1, 1), (3, 1, 1)],
        ),
        model_num_class=num_classes,
        dropout_rate=dropout_rate,
    )


def _slowfast_r50(num_classes: int, dropout_rate: float) -> nn.Module:
    return _pytorchvideo("slowfast").create_slowfast(
        model_depth=50,
        slowfast_fusion_conv_kernel_size=(7, 1, 1),
        model_num_class=num_classes,
        dropout_rate=dropout_rate,
    )


def _torchvision(builder: Callable[..., nn.Module]) -> Callable[[int, float], nn.Module]:
    def build(num_classes: int, dropout_rate: float) -> nn.Module:
        # weights=None: never download; num_classes sizes the classifier directly.
        return builder(weights=None, num_classes=num_classes)

    return build


def _s3d(num_classes: int, dropout_rate: float) -> nn.Module:
    return tv_video.s3d(weights=None, num_classes=num_classes, dropout=dropout_rate)


def _mvit(builder: Callable[..., nn.Module]) -> Callable[[int, float], nn.Module]:
    def build(num_classes: int, dropout_rate: float) -> nn.Module:
        # MViT's `dropout` is the one before its classifier.
        return builder(weights=None, num_classes=num_classes, dropout=dropout_rate)

    return build


# name -> builder(num_classes, dropout_rate). Hyper-parameters follow pytorchvideo's hub
# definitions (pytorchvideo/models/hub/*.py) and torchvision's, without pretrained weights.
_BUILDERS: dict[str, Callable[[int, float], nn.Module]] = {
    "x3d_xs": _x3d(4, 160),
    "x3d_s": _x3d(13, 160),
    "x3d_m": _x3d(16, 224),
    "slow_r50": _slow_r50,
    "slowfast_r50": _slowfast_r50,
    "i3d_r50": _i3d_r50,
    "r3d_18": _torchvision(tv_video.r3d_18),
    "mc3_18": _torchvision(tv_video.mc3_18),
    "r2plus1d_18": _torchvision(tv_video.r2plus1d_18),
    "s3d": _s3d,
    "swin3d_t": _torchvision(tv_video.swin3d_t),
    "mvit_v1_b": _mvit(tv_video.mvit_v1_b),
    "mvit_v2_s": _mvit(tv_video.mvit_v2_s),
}

BACKBONES: tuple[str, ...] = ("tiny", "tiny_swin3d", *_BUILDERS)
"""Names :func:`build_backbone` accepts."""

TWO_PATHWAY_BACKBONES: dict[str, int] = {"slowfast_r50": 4}
"""Backbones that take ``[slow, fast]`` input, with their ``slowfast_alpha``."""


def build_backbone(
    name: str,
    num_classes: int,
    *,
    dropout_rate: float = 0.5,
    tiny_width: int = 16,
) -> nn.Module:
    """Build a video backbone by name, randomly initialised and multigrid-compatible.

    Args:
        name: one of :data:`BACKBONES`: ``tiny`` (:class:`TinyVideoNet`), ``tiny_swin3d``
            (:func:`build_tiny_swin3d`); pytorchvideo's
            ``x3d_xs``, ``x3d_s``, ``x3d_m``, ``slow_r50``, ``slowfast_r50``, ``i3d_r50``
            (hub hyper-parameters, logits out); torchvision's ``r3d_18``, ``mc3_18``,
            ``r2plus1d_18``, ``s3d`` and the transformers ``swin3d_t``, ``mvit_v1_b``, ``mvit_v2_s``
            (MViT as :class:`~lightning_multigrid.models.mvit.MultigridMViT`: any frames and crop).
        num_classes: outputs of the classifier.
        dropout_rate: dropout before the classifier (not used by torchvision's ResNets and Swin3D).
        tiny_width: stem width of ``tiny``, patch-embedding width of ``tiny_swin3d``.

    Returns:
        A model mapping ``(N, 3, T, H, W)`` (``[slow, fast]`` for :data:`TWO_PATHWAY_BACKBONES`)
        to ``(N, num_classes)`` logits, with head pooling made adaptive.

    Raises:
        ValueError: for an unknown ``name`` (the message lists the known ones) or a
            non-positive ``num_classes``.
    """
    check_positive_int("num_classes", num_classes)
    if name == "tiny":
        model: nn.Module = TinyVideoNet(num_classes, width=tiny_width, dropout_rate=dropout_rate)
    elif name == "tiny_swin3d":
        model = build_tiny_swin3d(num_classes, width=tiny_width)
    elif name in _BUILDERS:
        model = _BUILDERS[name](num_classes, dropout_rate)
    else:
        raise ValueError(f"Unknown `backbone` {name!r}: choose one of {', '.join(BACKBONES)}, or pass an nn.Module.")
    return make_multigrid_compatible(model)
