"""Preflight: run one tiny forward per grid before training, so a model that cannot take a grid
fails now, with the layer named, not at epoch 40.

Example::

    preflight(make_multigrid_compatible(model), schedule.distinct_grids())
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import torch
from torch import nn

from lightning_multigrid._checks import check_positive_int
from lightning_multigrid.models.heads import find_fixed_head_pools
from lightning_multigrid.models.pathways import slowfast_pathways

__all__ = ["FixedHeadPoolWarning", "preflight"]


class FixedHeadPoolWarning(UserWarning):
    """A model still pools with a fixed kernel in its head: grids other than the base misbehave."""


class _Grid(Protocol):
    """What :func:`preflight` reads from a grid (:class:`~lightning_multigrid.schedule.build.GridShape`)."""

    @property
    def num_frames(self) -> int: ...

    @property
    def crop_size(self) -> int: ...


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
            ``slowfast_pathways(clip, alpha)`` (slow, fast). ``None`` for one-pathway models.
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
    check_positive_int("num_channels", num_channels)
    check_positive_int("batch_size", batch_size)
    if slowfast_alpha is not None:
        _check_slow_pathway(shapes, slowfast_alpha)
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
    first: tuple[tuple[int, int], tuple[int, ...]] | None = None
    try:
        model.eval()
        for num_frames, crop_size in shapes:
            clip = torch.zeros(batch_size, num_channels, num_frames, crop_size, crop_size, device=device, dtype=dtype)
            inputs: torch.Tensor | list[torch.Tensor] = (
                clip if slowfast_alpha is None else slowfast_pathways(clip, slowfast_alpha)
            )
            shape = _output_shape(model, inputs, (num_frames, crop_size), entered)
            first = first or ((num_frames, crop_size), shape)
            _check_output(shape, batch_size, _describe(inputs), (num_frames, crop_size), first)
    finally:
        for handle in handles:
            handle.remove()
        for module, training in modes.items():
            module.training = training


def _check_slow_pathway(shapes: list[tuple[int, int]], slowfast_alpha: int) -> None:
    check_positive_int("slowfast_alpha", slowfast_alpha)
    for num_frames, crop_size in shapes:
        if num_frames // slowfast_alpha < 1:
            raise ValueError(
                f"Grid {num_frames}x{crop_size} (frames x crop) is too short for the slow pathway: "
                f"{num_frames} frames // `slowfast_alpha`={slowfast_alpha} = 0 slow frames. Give the "
                f"coarsest grid at least {slowfast_alpha} frames (raise the base `num_frames` or the "
                "smallest long-cycle t_factor) or lower `slowfast_alpha`."
            )


def _output_shape(
    model: nn.Module,
    inputs: torch.Tensor | list[torch.Tensor],
    grid: tuple[int, int],
    entered: list[tuple[str, nn.Module]],
) -> tuple[int, ...]:
    """The shape of ``model(inputs)``; a failure is re-raised naming the grid and the layer."""
    entered.clear()
    try:
        with torch.no_grad():
            output = model(inputs)
    except Exception as error:  # noqa: BLE001 - re-raised with the layer and shape named
        layer, module = entered[-1] if entered else ("", model)
        where = f"layer `{layer}` ({type(module).__name__})" if layer else f"the model ({type(module).__name__})"
        raise ValueError(
            f"The model cannot take grid {grid[0]}x{grid[1]} (frames x crop): input {_describe(inputs)} "
            f"failed in {where}: {error}. Make that layer shape-agnostic (adaptive pooling "
            "instead of a fixed kernel or a fixed-size Linear; `make_multigrid_compatible` does "
            "this for pytorchvideo heads, and for torchvision's MViT reads the token grid from the "
            "input), or change the schedule so this grid is not used."
        ) from error
    if not isinstance(output, torch.Tensor):
        raise ValueError(
            f"Preflight expects the model to return a tensor, got {type(output).__name__} for "
            f"input {_describe(inputs)}."
        )
    return tuple(output.shape)


def _check_output(
    shape: tuple[int, ...],
    batch_size: int,
    described: str,
    grid: tuple[int, int],
    first: tuple[tuple[int, int], tuple[int, ...]],
) -> None:
    """The output keeps the batch in dimension 0 and has the first grid's shape otherwise."""
    if not shape or shape[0] != batch_size:
        raise ValueError(
            f"The model's output {shape} for input {described} does not keep the batch of "
            f"{batch_size} clips in dimension 0."
        )
    (t0, s0), shape0 = first
    if shape[1:] != shape0[1:]:
        raise ValueError(
            f"The model's output shape changes with the grid: {shape} at {grid[0]}x{grid[1]} "
            f"but {shape0} at {t0}x{s0} (frames x crop). A layer depends on the input size "
            "(fixed-size pooling without a global average?); make it adaptive, e.g. with "
            "`make_multigrid_compatible`."
        )


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

