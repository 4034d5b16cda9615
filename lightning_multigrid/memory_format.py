"""Train each grid in the memory layout that runs it faster: contiguous or ``channels_last_3d``.

Which layout a 3D convolution runs faster in depends on the grid, not only on the model and the
GPU: on an H200, r3d_18 in bf16 ran the base grid 8 x 16 x 112 faster in ``channels_last_3d`` (632
against 478 clips/s) and every coarser grid slower (the coarsest 128 x 4 x 56: 3315 against 5136;
``../shared/results/h200-2026-11-28``). A run that keeps one layout leaves one side's speed on the
table, and multigrid changes grid every iteration (the short cycle).

:class:`GridMemoryFormat` is a Lightning callback, beside :class:`~lightning_multigrid.MultigridCallback`
or alone in a baseline run. With ``memory_format="fastest"`` it times, the first time a grid's batch
arrives, a few forward + backward passes of the model in each layout at that batch's shape (the
model is left as it was: :func:`~lightning_multigrid.schedule.cost.measure_clip_costs`' safeguards), keeps the
faster (rank 0's choice on every rank, so the ranks agree), and before every step puts the model's
5-D weights in the grid's layout when it differs from the last step's. Only the weights are
converted: a convolution runs in its weight's layout and converts its input itself (one copy, the
same one a converted batch would cost). The Parameters stay the same objects, so the optimizer and
checkpoints are unaffected.

``"channels_last_3d"`` or ``"contiguous"`` fix one layout for the whole run, without measuring.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from torch import nn

from lightning_multigrid._lightning import Callback, pl, rank_zero_info
from lightning_multigrid.fit.batch_grid import video_shapes
from lightning_multigrid.schedule.cost import fastest_seconds, model_kept

__all__ = ["LAYOUTS", "GridMemoryFormat", "convert_memory_format", "time_memory_formats"]

LAYOUTS: dict[str, torch.memory_format] = {
    "contiguous": torch.contiguous_format,
    "channels_last_3d": torch.channels_last_3d,
}
MemoryFormat = Literal["contiguous", "channels_last_3d", "fastest"]


def convert_memory_format(model: nn.Module, layout: str) -> None:
    """Put every 5-D parameter of ``model`` (the 3D convolutions' weights) in ``layout``, in place.

    The Parameter objects stay the same (their ``data`` changes), so an optimizer that holds them and
    a checkpoint that saves them are unaffected; gradients follow the layout from the next backward.
    """
    memory_format = LAYOUTS[layout]
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 5 and not parameter.is_contiguous(memory_format=memory_format):
                parameter.data = parameter.data.contiguous(memory_format=memory_format)


def time_memory_formats(
    model: nn.Module,
    shapes: Sequence[tuple[int, ...]],
    *,
    repeats: int = 3,
    warmup: int = 1,
    context: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """Seconds of one forward + backward of ``model`` on random clips of ``shapes``, in each layout.

    Args:
        model: takes ``(N, C, T, H, W)`` clips (one tensor per shape given: ``[slow, fast]`` pathways
            when two); left as it was, in the layout it had (its weights are not stepped; buffers,
            gradients, modes and the random generators are restored).
        shapes: the batch's video shape(s).
        repeats: timed passes per layout; the fastest counts (interference only adds time).
        warmup: untimed passes first, per layout (allocator, kernel selection).
        context: entered around each forward, e.g. the Trainer's precision (autocast) context.
        clock: the clock; ``time.process_time`` measures a CPU model without other processes' time.

    Returns:
        ``{"contiguous": seconds, "channels_last_3d": seconds}``.
    """
    parameter = next(model.parameters(), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    dtype = parameter.dtype if parameter is not None and parameter.is_floating_point() else torch.float32
    was_channels_last = _is_channels_last(model)
    seconds: dict[str, float] = {}
    try:
        with model_kept(model, device):
            for layout, memory_format in LAYOUTS.items():
                convert_memory_format(model, layout)
                clips = [torch.randn(shape, device=device, dtype=dtype).contiguous(memory_format=memory_format) for shape in shapes]
                inputs: torch.Tensor | list[torch.Tensor] = clips[0] if len(clips) == 1 else clips

                def step(inputs: torch.Tensor | list[torch.Tensor] = inputs) -> None:
                    with context():
                        output = model(inputs)
                    if isinstance(output, torch.Tensor) and output.requires_grad:
                        output.float().sum().backward()
                    model.zero_grad(set_to_none=True)

                seconds[layout] = fastest_seconds(step, device, repeats, warmup, clock)
    finally:
        convert_memory_format(model, "channels_last_3d" if was_channels_last else "contiguous")
    return seconds


def _is_channels_last(model: nn.Module) -> bool:
    weights = [p for p in model.parameters() if p.dim() == 5]
    return bool(weights) and all(
        p.is_contiguous(memory_format=torch.channels_last_3d) and not p.is_contiguous() for p in weights
    )


class GridMemoryFormat(Callback):
    """Before every training step, the model's 3D weights in the faster memory layout for the batch's grid.

    Args:
        memory_format: ``"fastest"`` (timed per grid at its first batch, see the module's docstring),
            or ``"contiguous"`` / ``"channels_last_3d"`` for the whole run.
        repeats: timed passes per layout and grid with ``"fastest"``.

    Example::

        trainer = pl.Trainer(callbacks=[MultigridCallback(), GridMemoryFormat("fastest")], ...)

    Raises:
        ValueError: for another ``memory_format``, or ``repeats`` < 1.
    """

    def __init__(self, memory_format: MemoryFormat = "fastest", repeats: int = 3) -> None:
        if memory_format not in (*LAYOUTS, "fastest"):
            raise ValueError(
                f"`memory_format` must be 'fastest', 'contiguous' or 'channels_last_3d', got {memory_format!r}."
            )
        if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
            raise ValueError(f"`repeats` (timed passes per layout and grid) must be an integer >= 1, got {repeats!r}.")
        self.memory_format = memory_format
        self.repeats = repeats
        self.choices: dict[tuple[tuple[int, ...], ...], str] = {}  # the batch's video shape(s) -> layout
        self.timings: dict[tuple[tuple[int, ...], ...], dict[str, float]] = {}
        self._applied: str | None = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._applied = None

    def state_dict(self) -> dict[str, Any]:
        """The choices made, so a resumed run trains each grid in the same layout (the same float rounding)."""
        return {"choices": [[[list(s) for s in key], layout] for key, layout in self.choices.items()]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.choices = {tuple(tuple(s) for s in key): layout for key, layout in state_dict.get("choices", [])}

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        layout = self.layout_for(trainer, pl_module, batch)
        if layout is not None and layout != self._applied:
            convert_memory_format(pl_module, layout)
            self._applied = layout

    def layout_for(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any) -> str | None:
        """The layout for ``batch``'s grid (timed on its first batch with ``"fastest"``); ``None`` without a video."""
        if self.memory_format != "fastest":
            return self.memory_format
        shapes = video_shapes(batch)
        if shapes is None:
            return None
        key = tuple(shapes)
        if key not in self.choices:
            seconds = time_memory_formats(
                pl_module, shapes, repeats=self.repeats, context=trainer.precision_plugin.forward_context
            )
            # rank 0's choice on every rank: the ranks' weights must not differ in layout
            self.choices[key] = trainer.strategy.broadcast(min(seconds, key=seconds.__getitem__), src=0)
            self.timings[key] = seconds
            rank_zero_info(
                f"GridMemoryFormat: {' + '.join(' x '.join(map(str, s)) for s in shapes)}: "
                + ", ".join(f"{name} {s * 1e3:.1f} ms" for name, s in seconds.items())
                + f" per forward + backward -> {self.choices[key]}"
            )
        return self.choices[key]
