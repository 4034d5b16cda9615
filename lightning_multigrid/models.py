"""Make video models take every multigrid grid, and check that they do before training.

Multigrid trains one model on many grids (e.g. ``4x79``, ``8x79``, ``8x112``, ``16x112`` frames x
crop, plus short-cycle crops). Most video backbones are fully convolutional up to the
classification head, but pytorchvideo's heads (and torchvision's S3D) pool with a fixed
``AvgPool3d`` kernel sized for the training input: on a coarser grid the kernel is larger than the
feature map and the forward fails; on a finer grid it pools sliding windows instead of the whole
clip. :func:`make_multigrid_compatible` swaps those head pools for adaptive (global) pooling, and
:func:`preflight` runs one tiny forward per grid so a model that still cannot take a grid fails
before the first training step, with the layer named.

The backbones :class:`~lightning_multigrid.module.VideoClassifier` knows by name are built here
too (:func:`build_backbone`), so a plain PyTorch loop can use them without Lightning.

Example::

    model = make_multigrid_compatible(create_x3d(input_clip_length=4, input_crop_size=160))
    preflight(model, schedule.distinct_grids())
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import torch
from torch import nn
from torchvision.models import video as tv_video

with warnings.catch_warnings():
    # pytorchvideo 0.1.5 calls `torch.jit.script` at import time; the deprecation warning is
    # about its internals, not about anything a user of this package can change.
    warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*", category=FutureWarning)
    from pytorchvideo.models.head import ResNetBasicHead
    from pytorchvideo.models.resnet import create_resnet
    from pytorchvideo.models.slowfast import PoolConcatPathway, create_slowfast
    from pytorchvideo.models.x3d import ProjectedPool, create_x3d

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

log = logging.getLogger(__name__)

# Pools whose output size follows their input size; the ones a head must not use.
_FIXED_POOLS = (nn.AvgPool3d, nn.MaxPool3d)
# Layers that do not mix positions, skipped when looking at what follows a pool.
_PASS_THROUGH = (nn.Dropout, nn.Identity, nn.ReLU, nn.SiLU, nn.GELU, nn.Sigmoid, nn.Softmax)


class FixedHeadPoolWarning(UserWarning):
    """A model still pools with a fixed kernel in its head: grids other than the base misbehave."""


class _Grid(Protocol):
    """What :func:`preflight` reads from a grid (:class:`~lightning_multigrid.schedule.GridShape`)."""

    @property
    def num_frames(self) -> int: ...

    @property
    def crop_size(self) -> int: ...


# --------------------------------------------------------------------------------------------
# Head pooling surgery
# --------------------------------------------------------------------------------------------


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
    the patterns and why output size 1 is right) and logs the replaced layers at INFO level.
    Models that are already shape-agnostic, such as torchvision's R3D/MC3/R(2+1)D, are returned
    unchanged.

    Args:
        model: the model to change in place.

    Returns:
        ``model`` itself.

    Example::

        model = make_multigrid_compatible(create_resnet(model_depth=50, model_num_class=400))
        # INFO: replaced fixed-size head pooling by adaptive pooling: blocks.5.pool
    """
    replaced = convert_head_pooling(model)
    if replaced:
        log.info("Replaced fixed-size head pooling by adaptive pooling: %s", ", ".join(replaced))
    return model


def _head_pool_slots(model: nn.Module) -> Iterable[tuple[str, nn.Module, str]]:
    """Yield ``(parent name, container, key)`` for each fixed head pool, ``container.key``."""
    for parent_name, parent in model.named_modules():
        if isinstance(parent, PoolConcatPathway):
            # The per-pathway pools live in a ModuleList (entries may be None).
            if isinstance(parent.pool, nn.ModuleList):
                for key, pool in parent.pool.named_children():
                    if isinstance(pool, _FIXED_POOLS):
                        yield _join(parent_name, "pool"), parent.pool, key
            continue
        if isinstance(parent, (ResNetBasicHead, ProjectedPool)):
            # X3D's ResNetBasicHead holds a ProjectedPool as `pool`, which is not a fixed pool
            # itself; its inner `pool` is found when the walk reaches the ProjectedPool.
            if isinstance(getattr(parent, "pool", None), _FIXED_POOLS):
                yield parent_name, parent, "pool"
            continue
        if isinstance(parent, tv_video.S3D):
            # S3D pools with (2, 7, 7), then a 1x1x1 conv classifier and a mean.
            if isinstance(parent.avgpool, _FIXED_POOLS):
                yield parent_name, parent, "avgpool"
            continue
        children = list(parent.named_children())
        for i, (key, child) in enumerate(children):
            if isinstance(child, _FIXED_POOLS) and _feeds_classifier(m for _, m in children[i + 1 :]):
                yield parent_name, parent, key


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


# --------------------------------------------------------------------------------------------
# Preflight
# --------------------------------------------------------------------------------------------


def preflight(
    model: nn.Module,
    grids: Iterable[_Grid],
    *,
    num_channels: int = 3,
    slowfast_alpha: int | None = None,
    batch_size: int = 1,
    device: torch.device | str | None = None,
) -> None:
    """Run one tiny forward per distinct grid and fail early if the model cannot take one.

    Each distinct ``(num_frames, crop_size)`` runs once, with a zero clip of ``batch_size``
    (not the grid's batch: the shapes are what matters, and it keeps the check cheap). The model
    runs in eval mode under ``torch.no_grad()`` (BatchNorm in train mode cannot normalise a batch
    of one clip), and every submodule's train/eval mode is restored afterwards. The outputs must
    keep the batch dimension and have the same shape otherwise at every grid.

    Also warns with :class:`FixedHeadPoolWarning` when the model still has fixed-size head
    pooling: it may run at every grid yet pool sliding windows instead of the whole clip.

    Args:
        model: the model to check; its parameters are not changed.
        grids: objects with ``num_frames`` and ``crop_size`` (pixels), e.g.
            ``schedule.distinct_grids()``.
        num_channels: input channels ``C`` of the ``(N, C, T, H, W)`` clip.
        slowfast_alpha: for a two-pathway (SlowFast) model, the frame-rate ratio: the input is
            ``[clip[:, :, ::alpha], clip]`` (slow, fast). ``None`` for one-pathway models.
        batch_size: clips per check forward.
        device: where to run; default: the device of the model's first parameter (CPU when it
            has none).

    Raises:
        ValueError: naming the grid, the input shape and the layer that failed, when the model
            cannot take a grid; when a grid is too short for the slow pathway
            (``num_frames // slowfast_alpha < 1``); when the output shape changes with the grid;
            or when ``grids`` is empty or invalid.
    """
    shapes = _distinct_shapes(grids)
    for name, value in (("num_channels", num_channels), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
    if slowfast_alpha is not None and (
        isinstance(slowfast_alpha, bool) or not isinstance(slowfast_alpha, int) or slowfast_alpha <= 0
    ):
        raise ValueError(f"`slowfast_alpha` must be a positive integer or None, got {slowfast_alpha!r}.")
    if slowfast_alpha is not None:
        for num_frames, crop_size in shapes:
            if num_frames // slowfast_alpha < 1:
                raise ValueError(
                    f"Grid {num_frames}x{crop_size} (frames x crop) is too short for the slow pathway: "
                    f"{num_frames} frames // `slowfast_alpha`={slowfast_alpha} = 0 slow frames. Give the "
                    f"coarsest grid at least {slowfast_alpha} frames (raise the base `num_frames` or the "
                    "smallest long-cycle t_factor) or lower `slowfast_alpha`."
                )

    fixed = find_fixed_head_pools(model)
    if fixed:
        warnings.warn(
            f"The model pools with a fixed kernel in its head ({', '.join(fixed)}): on grids other than "
            "the one it was built for, it fails or pools sliding windows instead of the whole clip. "
            "Call `make_multigrid_compatible(model)` first.",
            FixedHeadPoolWarning,
            stacklevel=2,
        )

    parameter = next(model.parameters(), None)
    if device is None:
        device = parameter.device if parameter is not None else torch.device("cpu")
    dtype = parameter.dtype if parameter is not None and parameter.is_floating_point() else torch.float32

    # The innermost module entered and not yet left is the one that raised.
    entered: list[tuple[str, nn.Module]] = []
    handles = []
    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(_enter_hook(entered, name, module)))
        handles.append(module.register_forward_hook(_leave_hook(entered, module)))
    modes = {module: module.training for module in model.modules()}
    first_output: tuple[tuple[int, int], tuple[int, ...]] | None = None
    try:
        model.eval()
        for num_frames, crop_size in shapes:
            clip = torch.zeros(batch_size, num_channels, num_frames, crop_size, crop_size, device=device, dtype=dtype)
            inputs: torch.Tensor | list[torch.Tensor] = (
                clip if slowfast_alpha is None else [clip[:, :, ::slowfast_alpha], clip]
            )
            described = _describe(inputs)
            entered.clear()
            try:
                with torch.no_grad():
                    output = model(inputs)
            except Exception as error:  # noqa: BLE001 - re-raised with the layer and shape named
                layer, module = entered[-1] if entered else ("", model)
                where = f"layer `{layer}` ({type(module).__name__})" if layer else f"the model ({type(module).__name__})"
                raise ValueError(
                    f"The model cannot take grid {num_frames}x{crop_size} (frames x crop): input {described} "
                    f"failed in {where}: {error}. Make that layer shape-agnostic (adaptive pooling "
                    "instead of a fixed kernel or a fixed-size Linear; `make_multigrid_compatible` does "
                    "this for pytorchvideo heads), or change the schedule so this grid is not used."
                ) from error
            if not isinstance(output, torch.Tensor):
                raise ValueError(
                    f"Preflight expects the model to return a tensor, got {type(output).__name__} for "
                    f"input {described}."
                )
            shape = tuple(output.shape)
            if not shape or shape[0] != batch_size:
                raise ValueError(
                    f"The model's output {shape} for input {described} does not keep the batch of "
                    f"{batch_size} clips in dimension 0."
                )
            if first_output is None:
                first_output = ((num_frames, crop_size), shape)
            elif shape[1:] != first_output[1][1:]:
                (t0, s0), shape0 = first_output
                raise ValueError(
                    f"The model's output shape changes with the grid: {shape} at {num_frames}x{crop_size} "
                    f"but {shape0} at {t0}x{s0} (frames x crop). A layer depends on the input size "
                    "(fixed-size pooling without a global average?); make it adaptive, e.g. with "
                    "`make_multigrid_compatible`."
                )
    finally:
        for handle in handles:
            handle.remove()
        for module, training in modes.items():
            module.training = training


def _distinct_shapes(grids: Iterable[_Grid]) -> list[tuple[int, int]]:
    shapes: dict[tuple[int, int], None] = {}
    for grid in grids:
        num_frames = getattr(grid, "num_frames", None)
        crop_size = getattr(grid, "crop_size", None)
        for name, value in (("num_frames", num_frames), ("crop_size", crop_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(
                    f"`grids` must hold objects with positive integer `num_frames` and `crop_size` "
                    f"(like GridShape); got {name}={value!r} in {grid!r}."
                )
        shapes[(num_frames, crop_size)] = None  # type: ignore[index]
    if not shapes:
        raise ValueError("`grids` is empty: pass the schedule's grids, e.g. `schedule.distinct_grids()`.")
    return list(shapes)


def _enter_hook(entered: list[tuple[str, nn.Module]], name: str, module: nn.Module) -> Callable[..., None]:
    def hook(_module: nn.Module, _args: Any) -> None:
        entered.append((name, module))

    return hook


def _leave_hook(entered: list[tuple[str, nn.Module]], module: nn.Module) -> Callable[..., None]:
    def hook(_module: nn.Module, _args: Any, _output: Any) -> None:
        # Pop this module's entry even if a caught exception deeper down left others behind.
        for i in range(len(entered) - 1, -1, -1):
            if entered[i][1] is module:
                del entered[i:]
                return

    return hook


def _describe(inputs: torch.Tensor | list[torch.Tensor]) -> str:
    if isinstance(inputs, torch.Tensor):
        return str(tuple(inputs.shape))
    return "[" + ", ".join(str(tuple(x.shape)) for x in inputs) + "] (slow, fast)"


# --------------------------------------------------------------------------------------------
# Backbones by name
# --------------------------------------------------------------------------------------------


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
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
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


def _x3d(clip_length: int, crop_size: int) -> Callable[[int, float], nn.Module]:
    # The hub's X3D heads end in a softmax; a classifier trained with cross-entropy needs logits.
    def build(num_classes: int, dropout_rate: float) -> nn.Module:
        return create_x3d(
            input_clip_length=clip_length,
            input_crop_size=crop_size,
            model_num_class=num_classes,
            dropout_rate=dropout_rate,
            head_activation=None,
        )

    return build


def _slow_r50(num_classes: int, dropout_rate: float) -> nn.Module:
    return create_resnet(
        model_depth=50,
        stem_conv_kernel_size=(1, 7, 7),
        head_pool_kernel_size=(8, 7, 7),
        model_num_class=num_classes,
        dropout_rate=dropout_rate,
    )


def _i3d_r50(num_classes: int, dropout_rate: float) -> nn.Module:
    return create_resnet(
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
    return create_slowfast(
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
}

BACKBONES: tuple[str, ...] = ("tiny", *_BUILDERS)
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
        name: one of :data:`BACKBONES`: ``tiny`` (:class:`TinyVideoNet`); pytorchvideo's
            ``x3d_xs``, ``x3d_s``, ``x3d_m``, ``slow_r50``, ``slowfast_r50``, ``i3d_r50``
            (hub hyper-parameters, logits out); torchvision's ``r3d_18``, ``mc3_18``,
            ``r2plus1d_18``, ``s3d``.
        num_classes: outputs of the classifier.
        dropout_rate: dropout before the classifier (not used by torchvision's ResNets).
        tiny_width: stem width of ``tiny``.

    Returns:
        A model mapping ``(N, 3, T, H, W)`` (``[slow, fast]`` for :data:`TWO_PATHWAY_BACKBONES`)
        to ``(N, num_classes)`` logits, with head pooling made adaptive.

    Raises:
        ValueError: for an unknown ``name`` (the message lists the known ones) or a
            non-positive ``num_classes``.
    """
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes <= 0:
        raise ValueError(f"`num_classes` must be a positive integer, got {num_classes!r}.")
    if name == "tiny":
        model: nn.Module = TinyVideoNet(num_classes, width=tiny_width, dropout_rate=dropout_rate)
    elif name in _BUILDERS:
        model = _BUILDERS[name](num_classes, dropout_rate)
    else:
        raise ValueError(f"Unknown `backbone` {name!r}: choose one of {', '.join(BACKBONES)}, or pass an nn.Module.")
    return make_multigrid_compatible(model)
