"""Show a schedule before spending GPU time on it: JSON, a text table, a figure (paper, Fig. 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning_multigrid.schedule import GridCount, MultigridSchedule, grid_counts

__all__ = [
    "FULL_GRID_MIN_ITERATIONS",
    "FULL_GRID_MIN_SHARE",
    "format_table",
    "full_grid_count",
    "full_grid_warning",
    "plot_schedule",
    "schedule_to_dict",
]

# The preview warns when the full grid gets both fewer iterations than this and a smaller share
# of the baseline's. The paper's schedule gives the full grid about 4% of the baseline's
# iterations: 33,705 per device on Kinetics, where the paper keeps accuracy, and 85 on the accuracy
# benchmark's short schedule, where detail seen only at full resolution is not learnt
# (docs/accuracy.md). Where between the two the risk ends depends on model and data.
FULL_GRID_MIN_SHARE = 0.10
FULL_GRID_MIN_ITERATIONS = 10_000


def full_grid_count(schedule: MultigridSchedule, dataset_size: int) -> GridCount:
    """Iterations and clips per device at the full grid (the baseline's frames and crop)."""
    base = schedule.base_shape
    full = [c for c in grid_counts(schedule, dataset_size)
            if (c.grid.num_frames, c.grid.crop_size) == (base.num_frames, base.crop_size)]
    return GridCount(base, sum(c.iterations for c in full), sum(c.clips for c in full))


def full_grid_warning(schedule: MultigridSchedule, dataset_size: int) -> str | None:
    """A warning when the full grid gets few iterations: under ``FULL_GRID_MIN_ITERATIONS`` per
    device and under ``FULL_GRID_MIN_SHARE`` of the baseline's; ``None`` otherwise.

    Detail that only the full grid resolves is learnt in those iterations alone; the warning
    names ``full_grid_share``, the option that guarantees them.
    """
    full = full_grid_count(schedule, dataset_size).iterations
    baseline = schedule.baseline_iterations(dataset_size)
    if full >= FULL_GRID_MIN_ITERATIONS or full >= FULL_GRID_MIN_SHARE * baseline:
        return None
    return (
        f"the full grid ({schedule.base_shape.num_frames} frames x {schedule.base_shape.crop_size}px) gets "
        f"{full} iterations, {100 * full / baseline:.1f}% of the baseline's {baseline}: classes that differ "
        "only by detail visible at full resolution may not be learnt. Check with `lightning-multigrid "
        "compare` first. `full_grid_share` (e.g. 0.25) guarantees full-grid iterations; on short runs, "
        "more iterations in all mattered more (docs/accuracy.md)."
    )


def schedule_to_dict(schedule: MultigridSchedule, dataset_size: int | None = None) -> dict[str, Any]:
    """The schedule as plain data, one entry per epoch (the ``--format json`` contract)."""
    epochs = []
    for epoch in range(schedule.max_epochs):
        stage = schedule.stage_at(epoch)
        epochs.append(
            {
                "epoch": epoch,
                "lr_stage": stage.lr_stage,
                "batch_size": stage.shape.batch_size,
                "num_frames": stage.shape.num_frames,
                "crop_size": stage.shape.crop_size,
                "lr_factor": stage.lr_factor,
                "relative_lr": schedule.relative_lr_at(epoch),
                "bn": stage.bn.to_dict(),
                "sampling_rate": list(stage.sampling_rate),
                "short_cycle": [{"batch_size": g.batch_size, "crop_size": g.crop_size} for g in stage.short_cycle],
            }
        )
    result: dict[str, Any] = {"max_epochs": schedule.max_epochs, "epochs": epochs}
    if dataset_size is not None:
        baseline = schedule.baseline_iterations(dataset_size)
        multigrid = schedule.total_iterations(dataset_size)
        result["iterations"] = {"baseline": baseline, "multigrid": multigrid, "saving": baseline / multigrid}
        result["grids"] = [
            {
                "batch_size": c.grid.batch_size,
                "num_frames": c.grid.num_frames,
                "crop_size": c.grid.crop_size,
                "iterations": c.iterations,
                "clips": c.clips,
            }
            for c in grid_counts(schedule, dataset_size)
        ]
        result["warnings"] = [w for w in (full_grid_warning(schedule, dataset_size),) if w]
    return result


def format_table(schedule: MultigridSchedule, dataset_size: int | None = None) -> str:
    """A readable table, one row per stage, and a summary line.

    With ``dataset_size``, also a table of the iterations and clips per device of each distinct
    grid, and the full-grid warning of :func:`full_grid_warning` when it applies.
    """
    header = ("epochs", "LR stage", "rel. LR", "batch x frames x crop", "short cycle (batch@crop)", "BN", "stride")
    rows = [header]
    for stage in schedule.stages:
        shape = stage.shape
        short = " ".join(f"{g.batch_size}@{g.crop_size}" for g in stage.short_cycle) or "-"
        bn = {"plain": "plain", "split": f"split {stage.bn.num_splits}", "sync": f"sync {stage.bn.group_size}"}
        low, high = stage.sampling_rate
        rows.append(
            (
                f"{stage.start_epoch}-{stage.end_epoch}" + (" (fine-tune)" if stage.fine_tuning else ""),
                str(stage.lr_stage),
                f"{schedule.relative_lr_at(stage.start_epoch):g}",
                f"{shape.batch_size} x {shape.num_frames} x {shape.crop_size}",
                short,
                bn[stage.bn.mode],
                f"{low:g}-{high:g}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    config = schedule.config
    summary = f"{schedule.max_epochs} multigrid epochs for a {config.max_epochs}-epoch baseline"
    if dataset_size is not None:
        baseline = schedule.baseline_iterations(dataset_size)
        multigrid = schedule.total_iterations(dataset_size)
        summary += f"; {multigrid} iterations per device vs {baseline} ({baseline / multigrid:.2f}x fewer)"
        warning = full_grid_warning(schedule, dataset_size)
        return "\n".join(
            [*lines, "", summary, "", _format_grid_counts(schedule, dataset_size), *([f"warning: {warning}"] if warning else [])]
        )
    return "\n".join([*lines, "", summary])


def _format_grid_counts(schedule: MultigridSchedule, dataset_size: int) -> str:
    counts = grid_counts(schedule, dataset_size)
    base = schedule.base_shape
    header = ("grid (batch x frames x crop)", "iterations", "clips", "share of iterations")
    total = sum(c.iterations for c in counts)
    rows = [header]
    for c in counts:
        full = " (full grid)" if (c.grid.num_frames, c.grid.crop_size) == (base.num_frames, base.crop_size) else ""
        rows.append(
            (
                f"{c.grid.batch_size} x {c.grid.num_frames} x {c.grid.crop_size}{full}",
                str(c.iterations),
                str(c.clips),
                f"{100 * c.iterations / total:.1f}%",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(["Per grid, per device:", *lines])


def plot_schedule(schedule: MultigridSchedule, path: str | Path, dataset_size: int | None = None) -> None:
    """Draw per-iteration batch shapes over training with the relative LR overlaid (paper, Fig. 2).

    The black line is the batch of every iteration (the short cycle shows as its saw-tooth), the
    background colour the long-cycle shape, the red line the relative LR. Without
    ``dataset_size`` an epoch is 30 iterations of the base batch, enough to show the short cycle.
    """
    # A Figure without pyplot: no global backend switch, so notebooks keep theirs.
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    clips = dataset_size or 30 * schedule.config.batch_size * schedule.config.devices
    # Iteration where each epoch starts, then per-iteration batch sizes and the LR per epoch.
    epoch_starts = [0]
    for epoch in range(schedule.max_epochs):
        epoch_starts.append(epoch_starts[-1] + schedule.iterations_in_epoch(epoch, clips))
    batches = [
        schedule.short_cycle_at(epoch, i).batch_size
        for epoch in range(schedule.max_epochs)
        for i in range(epoch_starts[epoch + 1] - epoch_starts[epoch])
    ]
    lrs = [schedule.relative_lr_at(epoch) for epoch in range(schedule.max_epochs)]

    figure = Figure(figsize=(12, 4))
    axis = figure.subplots()
    shapes = sorted({(s.shape.num_frames, s.shape.crop_size) for s in schedule.stages})
    palette = colormaps["viridis"].resampled(max(len(shapes), 2))
    for stage in schedule.stages:
        key = (stage.shape.num_frames, stage.shape.crop_size)
        start, end = epoch_starts[stage.start_epoch], epoch_starts[stage.end_epoch]
        axis.axvspan(start, end, color=palette(shapes.index(key)), alpha=0.35, linewidth=0)
    for index, (num_frames, crop_size) in enumerate(shapes):
        axis.fill_between([], [], color=palette(index), alpha=0.35, label=f"{num_frames} frames x {crop_size}px")
    axis.stairs(batches, range(len(batches) + 1), color="black", linewidth=0.6, label="batch (short cycle)")
    axis.set_xlabel("iteration (per device)")
    axis.set_ylabel("clips per device")
    axis.set_xlim(0, len(batches))
    axis.set_ylim(0, max(batches) * 1.1)
    axis.legend(loc="upper right", fontsize=7)
    lr_axis = axis.twinx()
    lr_axis.stairs(lrs, epoch_starts, color="crimson", linewidth=1.5)
    lr_axis.set_yscale("log")
    lr_axis.set_ylabel("relative LR (log)", color="crimson")
    config = schedule.config
    axis.set_title(
        f"Multigrid schedule: {schedule.max_epochs} epochs (baseline {config.max_epochs}), "
        f"base {config.batch_size} x {config.num_frames} x {config.crop_size}"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=120)
