"""``benchmarks/gpu.py``'s model sections: the model's clips/s per grid (``model``, ``transformer:model``),
``precision``, ``compile`` and ``batch_sizing``; and the training step the other sections time.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, cast

import torch
import torch.nn.functional as F
from grids import bn_plans, drawn_grids, selected_grids
from harness import Setup, synchronize

from lightning_multigrid.module import VideoClassifier
from lightning_multigrid.norm import apply_bn_plan, convert_batchnorm
from lightning_multigrid.schedule import BNPlan, GridShape, MultigridSchedule


def bn_plan(schedule: MultigridSchedule, shape: GridShape) -> BNPlan:
    """Multigrid's BatchNorm grouping at a grid: the plan it first trains with (plain BatchNorm off the schedule)."""
    return bn_plans(schedule).get(shape, BNPlan())


def build_model(setup: Setup, channels_last: bool = False, backbone: str | None = None) -> torch.nn.Module:
    model = VideoClassifier(num_classes=4, backbone=backbone or setup.backbone, tiny_width=8, dropout_rate=0.0)
    converted = convert_batchnorm(model).to(setup.device)
    return converted.to(memory_format=torch.channels_last_3d) if channels_last else converted


def step_rate(
    model: torch.nn.Module, setup: Setup, shape: GridShape, plan: BNPlan, precision: str, steps: int,
    channels_last: bool = False,
) -> float:
    """Clips/s of training steps (forward, backward, SGD) on one batch already on the device."""
    video = torch.randn(shape.batch_size, 3, shape.num_frames, shape.crop_size, shape.crop_size, device=setup.device)
    if channels_last:
        video = video.contiguous(memory_format=torch.channels_last_3d)
    labels = torch.randint(0, 4, (shape.batch_size,), device=setup.device)
    step = training_step(model, setup, plan, precision)
    for _ in range(3):
        step(video, labels)
    synchronize(setup)
    start = time.perf_counter()
    for _ in range(steps):
        step(video, labels)
    synchronize(setup)
    return steps * shape.batch_size / (time.perf_counter() - start)


def training_step(model: torch.nn.Module, setup: Setup, plan: BNPlan, precision: str) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """One training step (forward, backward, SGD) of ``model`` with multigrid's BatchNorm ``plan``."""
    apply_bn_plan(model, plan)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler(setup.device, enabled=precision == "16-mixed")

    def step(video: torch.Tensor, labels: torch.Tensor) -> None:
        with torch.autocast(setup.device, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = F.cross_entropy(model(video), labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    return step


def model_table(
    setup: Setup, schedule: MultigridSchedule, backbone: str, layouts: tuple[bool, ...] = (False, True)
) -> list[dict[str, Any]]:
    """Per grid the schedule draws (all of them: the end-to-end runs' model-only times need each), clips/s of
    ``backbone``'s training steps in each memory layout of ``layouts`` (``True``: ``channels_last_3d``, model
    and input), the faster kept as ``model_clips_per_s``."""
    models = {channels_last: build_model(setup, channels_last, backbone) for channels_last in layouts}
    rows = []
    for grid in drawn_grids(schedule):
        plan = bn_plan(schedule, grid.shape)
        rates = {cl: step_rate(model, setup, grid.shape, plan, setup.precision, setup.model_steps, cl)
                 for cl, model in models.items()}
        best = max(rates, key=lambda cl: rates[cl])
        rows.append({"grid": grid.name, "backbone": backbone, "shape": list(asdict(grid.shape).values()),
                     "bn": plan.to_dict(), "model_clips_per_s": rates[best], "channels_last_3d": best,
                     **{("channels_last" if cl else "contiguous") + "_clips_per_s": r for cl, r in rates.items()}})
        print(f"  model {backbone} {grid.name}: {rates[best]:.0f} clips/s (channels_last_3d {best})", flush=True)
    return rows


def precision_and_layout(setup: Setup, schedule: MultigridSchedule) -> list[dict[str, Any]]:
    """16-mixed and channels_last_3d beside the main precision, at the coarsest and the base grid."""
    rows = []
    grids = [g for g in selected_grids(schedule, setup.grids) if g.name in ("coarsest", "base")]
    for grid, (precision, channels_last) in itertools.product(
        grids, [(setup.precision, False), ("16-mixed", False), (setup.precision, True)]
    ):
        if precision == "16-mixed" and setup.device != "cuda":
            continue  # float16 autocast with GradScaler is a CUDA path
        model = build_model(setup, channels_last)
        rate = step_rate(model, setup, grid.shape, bn_plan(schedule, grid.shape), precision, setup.model_steps,
                         channels_last)
        rows.append({"grid": grid.name, "precision": precision, "channels_last_3d": channels_last, "clips_per_s": rate})
    return rows


def compile_table(setup: Setup, schedule: MultigridSchedule, deadline: float) -> list[dict[str, Any]]:
    """``torch.compile`` with one static graph per grid (``dynamic=False``: each new grid compiles its own,
    as a multigrid run would with the recompile limit raised): per grid the schedule draws, the first
    steps (compile time included) and steady steps, against eager; grids that would start after
    ``deadline`` (``time.perf_counter()``) are left out and say so."""
    if setup.device != "cuda":
        return [{"skipped": "compiling on CPU takes minutes; the GPU run measures it"}]
    import torch._dynamo

    for name in ("recompile_limit", "cache_size_limit"):  # the name changed across torch versions
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)  # about 12 shapes per multigrid run
    started = time.perf_counter()
    eager = build_model(setup)
    compiled = cast(torch.nn.Module, torch.compile(build_model(setup), dynamic=False))
    print(f"  compile: models built in {time.perf_counter() - started:.1f} s", flush=True)
    rows: list[dict[str, Any]] = []
    for grid in drawn_grids(schedule):
        if time.perf_counter() > deadline:
            rows.append({"grid": grid.name, "skipped": "time budget"})
            continue
        plan = bn_plan(schedule, grid.shape)
        started = time.perf_counter()
        step_rate(compiled, setup, grid.shape, plan, setup.precision, 1)  # 3 warm-up steps compile it
        first = time.perf_counter() - started
        rows.append({
            "grid": grid.name, "first_steps_s": first,
            "compiled_clips_per_s": step_rate(compiled, setup, grid.shape, plan, setup.precision, setup.model_steps),
            "eager_clips_per_s": step_rate(eager, setup, grid.shape, plan, setup.precision, setup.model_steps),
        })
        print(f"  compile {grid.name}: {rows[-1]}", flush=True)
    return rows


def batch_sizing_table(setup: Setup) -> list[dict[str, Any]]:
    """Issue 34's figure on this device: per grid, the step time per iteration at Equation 1's batch and at
    the batch sized by the measured time (``batch_sizing="time"``), against the base iteration, for the CNN
    and the transformer (``benchmarks/step.py``'s ``sizing_rows``: fp32 steps, the fastest of
    ``sizing_repeats``). ``--smoke`` sizes by FLOPs: timed costs of its tiny grids are noise."""
    from step import sizing_rows

    args = argparse.Namespace(epochs=setup.epochs, milestones=list(setup.milestones), no_long_cycle=False,
                              no_short_cycle=False, width=8, repeats=setup.sizing_repeats,
                              warmup=2 if setup.sizing_repeats > 1 else 0)
    method = "time" if setup.device == "cuda" else "flops"
    rows = []
    for backbone in (setup.backbone, setup.transformer):
        entry = sizing_rows(args, setup.base, backbone, method, torch.device(setup.device))
        rows.append(entry)
        print(f"  batch sizing {backbone} by {method}: largest deviation from the base iteration, Equation 1 "
              f"{entry['equation1_max_deviation']:.0%}, sized {entry['sized_max_deviation']:.0%}", flush=True)
    return rows


# ---------------------------------------------------------------------------- Markdown


def markdown_sizing(report: dict[str, Any]) -> list[str]:
    entries = report.get("batch_sizing")
    if not isinstance(entries, list):
        return []
    lines: list[str] = []
    for entry in entries:
        lines += ["", f"Batches sized by {entry['method']}, {entry['backbone']}: step ms per iteration against the base "
                      f"iteration ({entry['base_ms']:.2f} ms):", "",
                  "| grid (frames x crop) | Eq. 1 batch | Eq. 1 rel. | sized batch | sized rel. |", "|---|---|---|---|---|"]
        lines += [f"| {r['grid']} | {r['equation1_batch']} | {r['equation1_rel']:.2f} | {r['sized_batch']} | "
                  f"{r['sized_rel']:.2f} |" for r in entry["grids"]]
    return lines
