"""Each grid's cost per clip for one model, measured once, for batches sized by cost (``batch_sizing``).

Equation 1 assumes a clip's cost grows with frames x pixels; attention does not, and hardware runs
some grids slower per FLOP (on CPU a 3D CNN's 2-frame grids cost 1.9x per FLOP, docs/benchmarks.md).
:func:`measure_clip_costs` runs the model on each grid and hands the schedule plain numbers
(:class:`~lightning_multigrid.schedule.config.ClipCost`), from which the config's
:class:`~lightning_multigrid.schedule.sizing.CostSizer` sizes each grid's batch:

- ``"flops"``: the FLOPs of one forward + backward (``torch.utils.flop_counter.FlopCounterMode``),
  per clip. Deterministic: every rank and every run count the same.
- ``"time"``: the wall-clock time of a forward + backward at the grid's batch, per clip (the fastest
  of a few passes: interference from other work only adds time), as Open-Sora's batch search times
  each bucket. A step also has a part that does not grow with the batch (per-layer launches, small
  tensors), so a cost per clip timed at Equation 1's batch misjudges the grid at the batch it will
  train with: each grid after the base is timed again at the batch that first cost sizes it to, and
  the second cost per clip is kept. It sees what FLOPs miss (kernels slower per FLOP,
  memory-bound layers), but is noisy: a run measures it once and keeps it (the callback stores it in
  its checkpoint state and ranks use rank 0's).

The model is left as it was: its weights are not stepped, its buffers (BatchNorm statistics), its
gradients, its train/eval modes and the random number generators are restored. Torch, no Lightning.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Literal

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from lightning_multigrid._checks import check_positive_int
from lightning_multigrid.grid import GridShape
from lightning_multigrid.models.pathways import slowfast_pathways
from lightning_multigrid.schedule.config import ClipCost, MultigridConfig
from lightning_multigrid.schedule.sizing import cost_sized_batch

__all__ = [
    "FLOP_BATCH_SIZE", "fastest_seconds", "implausible_costs_warning", "measure_backbone_costs", "measure_clip_costs",
    "model_kept",
]

# Clips per FLOP count: FLOPs grow linearly with the batch, and two clips keep BatchNorm in train
# mode defined where a layer sees one value per channel and clip.
FLOP_BATCH_SIZE = 2


def measure_clip_costs(
    model: nn.Module,
    grids: Sequence[GridShape],
    method: Literal["flops", "time"],
    *,
    num_channels: int = 3,
    slowfast_alpha: int | None = None,
    device: torch.device | str | None = None,
    repeats: int = 5,
    warmup: int = 1,
    context: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[ClipCost, ...]:
    """The cost of one clip of each grid for ``model``: FLOPs or seconds of a forward + backward.

    Args:
        model: maps ``(N, C, T, H, W)`` clips (``[slow, fast]`` with ``slowfast_alpha``) to a tensor;
            left as it was (see the module's docstring).
        grids: the grids to measure, the base grid first, e.g.
            :meth:`~lightning_multigrid.schedule.config.MultigridConfig.cost_grids`; ``"time"`` runs each at its
            ``batch_size``, then the others again at the batch sized from that cost;
            ``"flops"`` runs each at :data:`FLOP_BATCH_SIZE` clips. A ``(num_frames, crop_size)`` is
            measured once.
        method: ``"flops"`` or ``"time"``.
        num_channels: input channels ``C``.
        slowfast_alpha: for a two-pathway model, the frame-rate ratio of its input split.
        device: where to run; default: the device of the model's first parameter.
        repeats: timed forward + backward passes per grid (the fastest counts); ``"time"`` only.
        warmup: untimed passes first (allocator, kernel selection); ``"time"`` only.
        context: entered around each forward, e.g. the Trainer's precision (autocast) context.
        clock: seconds for ``"time"``: wall clock; ``time.process_time`` (this process's CPU time)
            measures a CPU model on one thread without the time other processes take.

    Returns:
        One :class:`~lightning_multigrid.schedule.config.ClipCost` per distinct grid, in order: FLOPs or
        seconds per clip.

    Raises:
        ValueError: for an unknown ``method``, no ``grids``, non-positive ``repeats``, or a model
            whose output is not a tensor.
    """
    _check_measure_args(method, repeats, warmup)
    distinct = {(g.num_frames, g.crop_size): g for g in reversed(grids)}  # the first of each size wins
    if not distinct:
        raise ValueError("`grids` is empty: pass the grids to measure, e.g. `config.cost_grids()`.")
    parameter = next(model.parameters(), None)
    device = torch.device(device) if device is not None else (
        parameter.device if parameter is not None else torch.device("cpu")
    )
    dtype = parameter.dtype if parameter is not None and parameter.is_floating_point() else torch.float32
    costs: list[ClipCost] = []
    with model_kept(model, device):
        for grid in (g for g in grids if distinct.get((g.num_frames, g.crop_size)) is g):
            batch_size = FLOP_BATCH_SIZE if method == "flops" else grid.batch_size
            inputs = _inputs(batch_size, num_channels, grid, device, dtype, slowfast_alpha)

            def step(inputs: torch.Tensor | list[torch.Tensor] = inputs) -> None:
                with context():
                    output = model(inputs)
                if not isinstance(output, torch.Tensor):
                    raise ValueError(
                        f"Measuring each grid's cost needs a model that returns a tensor, got {type(output).__name__}."
                    )
                if output.requires_grad:  # a fully frozen model only runs forward
                    output.float().sum().backward()
                model.zero_grad(set_to_none=True)

            if method == "flops":
                with FlopCounterMode(display=False) as counter:
                    step()
                cost = counter.get_total_flops() / batch_size
            else:
                cost = fastest_seconds(step, device, repeats, warmup, clock) / batch_size
                if costs:  # again at the batch this cost sizes the grid to (the base grid is the first)
                    sized = cost_sized_batch(grids[0].batch_size, cost / costs[0].cost_per_clip)
                    if sized != batch_size:
                        step = partial(step, _inputs(sized, num_channels, grid, device, dtype, slowfast_alpha))
                        cost = fastest_seconds(step, device, repeats, warmup, clock) / sized
            costs.append(ClipCost(grid.num_frames, grid.crop_size, float(cost)))
    return tuple(costs)


def _check_measure_args(method: str, repeats: int, warmup: int) -> None:
    if method not in ("flops", "time"):
        raise ValueError(f"`method` must be 'flops' or 'time' (how batches are sized by cost), got {method!r}.")
    check_positive_int("repeats", repeats)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"`warmup` must be an integer >= 0, got {warmup!r}.")


def _inputs(
    batch_size: int, num_channels: int, grid: GridShape, device: torch.device, dtype: torch.dtype, slowfast_alpha: int | None
) -> torch.Tensor | list[torch.Tensor]:
    """Random clips of ``grid``'s shape, ``batch_size`` of them (split into pathways with ``slowfast_alpha``)."""
    clip = torch.randn(batch_size, num_channels, grid.num_frames, grid.crop_size, grid.crop_size, device=device, dtype=dtype)
    return clip if slowfast_alpha is None else slowfast_pathways(clip, slowfast_alpha)


def fastest_seconds(
    step: Callable[[], None], device: torch.device, repeats: int, warmup: int, clock: Callable[[], float]
) -> float:
    """The fastest of ``repeats`` timed calls of ``step`` after ``warmup`` untimed ones (the device synchronised
    around each): interference from other work only adds time. Shared with :mod:`~lightning_multigrid.memory_format`."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        _synchronize(device)
        start = clock()
        step()
        _synchronize(device)
        times.append(clock() - start)
    return min(times)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def model_kept(model: nn.Module, device: torch.device) -> Iterator[None]:
    """Run in train mode; then put back buffers, gradients, modes and the random generators."""
    buffers = [(buffer, buffer.detach().clone()) for buffer in model.buffers()]
    grads = [(p, p.grad) for p in model.parameters()]
    modes = [(module, module.training) for module in model.modules()]
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            model.train()
            for parameter, _ in grads:
                parameter.grad = None
            yield
    finally:
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)
        for parameter, grad in grads:
            parameter.grad = grad
        for module, training in modes:
            module.training = training


def measure_backbone_costs(
    config: MultigridConfig, backbone: str, *, tiny_width: int = 16, device: torch.device | str | None = None
) -> tuple[ClipCost, ...]:
    """The cost per clip of every grid of ``config`` (:meth:`~MultigridConfig.cost_grids`) for a backbone by name.

    What the ``schedule`` preview measures (``--cost-model``): the backbone of
    :func:`~lightning_multigrid.models.build_backbone`, randomly initialised (weights do not change
    the cost). ``"flops"`` counts on the meta device (shapes only, no memory, seconds even for
    Kinetics-size grids); ``"time"`` runs on ``device`` (default: CUDA when available, else CPU) at
    each grid's Equation 1 batch, so it times this machine, not necessarily the one that will train.

    Raises:
        ValueError: when ``config`` sizes batches by Equation 1, or for an unknown ``backbone``.
    """
    from lightning_multigrid.models import TWO_PATHWAY_BACKBONES, build_backbone

    method = config.sizer.measure
    if method is None:
        raise ValueError("`batch_sizing`='equation1' sizes batches without measuring: pass 'flops' or 'time'.")
    if method == "flops":
        device = torch.device("meta")
    elif device is None:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with torch.device(device):
        model = build_backbone(backbone, num_classes=10, tiny_width=tiny_width)
    return measure_clip_costs(
        model, config.cost_grids(), method, slowfast_alpha=TWO_PATHWAY_BACKBONES.get(backbone), device=device
    )


def implausible_costs_warning(config: MultigridConfig) -> str | None:
    """A warning when a grid smaller than the base (fewer frames x pixels) measured at least a base clip's cost.

    No model makes a smaller clip cost more: a timed measurement disturbed by other work on the
    machine does, and the grid would train at a batch of about ``B`` or fewer clips. ``None`` otherwise.
    """
    base_size = config.num_frames * config.crop_size**2
    odd = {
        (c.num_frames, c.crop_size): config.relative_cost(c.num_frames, c.crop_size)
        for c in config.clip_costs
        if c.num_frames * c.crop_size**2 < base_size and config.relative_cost(c.num_frames, c.crop_size) >= 1
    }
    if not odd:
        return None
    listed = ", ".join(f"{t} x {s} ({cost:.2f}x, {config.sized_batch(t, s)} clips)" for (t, s), cost in odd.items())
    return (
        f"`batch_sizing`={config.sizer.measure!r} measured grids smaller than the base grid "
        f"({config.num_frames} x {config.crop_size}) at a base clip's cost or more: {listed} (frames x crop). "
        "Other work on the machine probably disturbed the measurement. Measure on a quiet machine, or use "
        "`batch_sizing`='flops' (deterministic)."
    )
