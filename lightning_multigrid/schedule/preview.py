"""Show a schedule before spending GPU time on it: JSON, a text table, a figure (paper, Fig. 2)."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lightning_multigrid._tables import table_lines
from lightning_multigrid.schedule.build import GridCount, MultigridSchedule, grid_counts
from lightning_multigrid.schedule.config import SHORT_RUN_BASELINE_STEPS, MultigridConfig
from lightning_multigrid.schedule.limits import limited_iterations
from lightning_multigrid.schedule.stages import build_stage

__all__ = [
    "FULL_GRID_MIN_ITERATIONS",
    "FULL_GRID_MIN_SHARE",
    "GridSizing",
    "VALIDATED_MIN_STEPS",
    "Regime",
    "describe_regime",
    "format_regime",
    "format_sizing",
    "format_table",
    "full_grid_count",
    "full_grid_warning",
    "grid_sizings",
    "plot_schedule",
    "schedule_to_dict",
]

# The preview warns when the full grid gets both fewer iterations than this and a smaller share
# of the baseline's. The paper's schedule gives the full grid about 4% of the baseline's
# iterations: 33,705 per device on Kinetics, where the paper keeps accuracy, and 85 on the accuracy
# benchmark's short schedule, where detail seen only at full resolution is not learnt
# (docs/accuracy.md). Where between the two the risk ends depends on model and data. A count of
# full-grid iterations, not the regime threshold below (a count of baseline steps) that shares its number.
FULL_GRID_MIN_SHARE = 0.10
FULL_GRID_MIN_ITERATIONS = 10_000


# Below this many baseline optimizer steps per device, a run from scratch is outside the regime
# where multigrid has been shown to keep accuracy: published results run 28k (Charades) to 896k
# (Kinetics) iterations, none below about 10k; on the accuracy benchmark at 1,920 baseline steps
# the paper's schedule lost (docs/finetuning-and-short-runs.md). The same fact as a short run's
# threshold for the pretrained default, so the same constant.
VALIDATED_MIN_STEPS = SHORT_RUN_BASELINE_STEPS


@dataclass(frozen=True)
class Regime:
    """Where a run stands against multigrid's validated regime, with the numbers behind it.

    Attributes:
        baseline_steps: optimizer steps per device of the baseline run.
        multigrid_steps: optimizer steps per device of this schedule.
        full_grid_steps: steps at the full grid (the baseline's frames and crop).
        relative_compute: clips x frames x pixels over the run, relative to the baseline's.
        pretrained: whether the model starts from pretrained weights (``None``: not known).
        below_validated: from scratch (or not known) with under ``VALIDATED_MIN_STEPS`` baseline steps.
        advice: what to do, in one paragraph.
    """

    baseline_steps: int
    multigrid_steps: int
    full_grid_steps: int
    relative_compute: float
    pretrained: bool | None
    below_validated: bool
    advice: str


def describe_regime(schedule: MultigridSchedule, dataset_size: int, pretrained: bool | None = None) -> Regime:
    """The run's regime: step counts, whether it is from scratch below the validated regime, and advice.

    Args:
        schedule: the multigrid schedule.
        dataset_size: clips in the training set, over all devices.
        pretrained: whether the model starts from pretrained weights; ``None`` when not known.
    """
    baseline = schedule.baseline_iterations(dataset_size)
    base = schedule.base_shape
    compute = sum(c.clips * c.grid.num_frames * c.grid.crop_size**2 for c in grid_counts(schedule, dataset_size))
    baseline_compute = schedule.config.max_epochs * -(-dataset_size // schedule.config.devices) * (
        base.num_frames * base.crop_size**2
    )
    below = not pretrained and baseline < VALIDATED_MIN_STEPS
    return Regime(
        baseline_steps=baseline,
        multigrid_steps=schedule.total_iterations(dataset_size),
        full_grid_steps=full_grid_count(schedule, dataset_size).iterations,
        relative_compute=compute / baseline_compute,
        pretrained=pretrained,
        below_validated=below,
        advice=_advice(baseline, pretrained, below),
    )


def _advice(baseline_steps: int, pretrained: bool | None, below: bool) -> str:
    if pretrained:
        return (
            "fine-tuning from pretrained weights: the regime of multigrid's published small-data results "
            "(Charades, Something-Something V2, fine-tuned from Kinetics). " + FINETUNE_MEASURED
        )
    if not below:
        return (
            f"{'from scratch' if pretrained is False else 'if from scratch'}: within the validated regime "
            f"({baseline_steps} baseline steps >= {VALIDATED_MIN_STEPS}; published results run 28k-896k iterations)."
        )
    return (
        f"{'from scratch' if pretrained is False else 'if from scratch'}: BELOW the validated regime "
        f"({baseline_steps} baseline steps < {VALIDATED_MIN_STEPS}; published multigrid results run 28k-896k "
        "iterations, none below about 10k). " + SCRATCH_MEASURED + " What to do: start from pretrained weights "
        "(`VideoClassifier(weights=...)`); or compare both runs on your data first (`lightning-multigrid "
        "compare`); or train the baseline. " + SHORT_RUN_MEASURED
    )


# The accuracy benchmark's numbers behind the advice (docs/finetuning-and-short-runs.md).
SCRATCH_MEASURED = (
    "Accuracy benchmark, from scratch at 1,920 baseline steps: the paper's schedule lost "
    "(fine-detail task top-1 0.93 -> 0.12)."
)
FINETUNE_MEASURED = (
    "Accuracy benchmark, fine-tuning at 1,920 baseline steps (test top-1, 800 videos): the defaults reached "
    "0.937 against the baseline's 0.990 on the fine-detail task and 0.998 against 0.998 on the direction x texture "
    "task, in 2.3-2.4x less CPU time; spatial-only or short-cycle-only stayed within 1 point on both at 1.3-1.4x "
    "(docs/finetuning-and-short-runs.md). Check on your data with `lightning-multigrid compare`."
)
SHORT_RUN_MEASURED = (
    "The short-run mode (`short_run=True`, `--short-run`) keeps the baseline's steps, but from scratch it did "
    "not keep top-1 either (fine-detail task 0.15 against 0.93; docs/finetuning-and-short-runs.md)."
)


def format_regime(regime: Regime, run: str = "this run") -> str:
    """The regime as text: the step counts on one line, then the advice.

    Args:
        regime: the regime of :func:`describe_regime` (full epochs).
        run: what the multigrid step count is of, in the text: "this run" for a preview; "multigrid (full epochs)" where
            the run trains part of each epoch (``limit_train_batches``), so its own count is another one.
    """
    saving = regime.baseline_steps / regime.multigrid_steps
    return (
        f"regime: {regime.baseline_steps} baseline optimizer steps per device; {run} {regime.multigrid_steps} "
        f"({saving:.2f}x fewer), {regime.full_grid_steps} of them at the full grid; compute (clips x frames x "
        f"pixels) {regime.relative_compute:.2f}x the baseline's.\n{regime.advice}"
    )


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


@dataclass(frozen=True)
class GridSizing:
    """One grid's batch by Equation 1 and by measured cost (``batch_sizing``), side by side.

    Attributes:
        num_frames, crop_size: the grid (crop in pixels).
        relative_cost: measured cost of one clip relative to one base-grid clip.
        equation1_batch: clips per device by Equation 1 (the paper's).
        equation1_iteration_cost: what an iteration of that batch costs, relative to a base iteration.
        sized_batch: clips per device sized by the measured cost (what training uses).
        sized_iteration_cost: what an iteration of that batch costs, relative to a base iteration.
        shapes: the long-cycle shapes ``(num_frames, crop_size)`` whose stages train the grid at these
            batches (the base shape's for fine-tuning too). A short-cycle grid of two shapes can have
            two cost-sized batches: each stage rounds its batches to a multiple of its BatchNorm groups.
    """

    num_frames: int
    crop_size: int
    relative_cost: float
    equation1_batch: int
    equation1_iteration_cost: float
    sized_batch: int
    sized_iteration_cost: float
    shapes: tuple[tuple[int, int], ...] = ()


def grid_sizings(config: MultigridConfig) -> tuple[GridSizing, ...]:
    """Each grid's Equation 1 batch beside its cost-sized one, for a config whose batches are sized by cost.

    Grids in order of the long-cycle shapes (then the base shape's, for fine-tuning), each
    shape's short cycle in its order; a grid with the same batches in several cycles is listed once,
    with each of those shapes (``shapes``). With cost-sized batches a grid can be listed twice: each
    stage rounds its batches to a multiple of its own BatchNorm groups (e.g. 57 clips of 4 x 16 in the
    4 x 23 shape's short cycle, 3 groups, and 58 in the 4 x 32 shape's, 2 groups).

    Raises:
        ValueError: when ``config`` does not size batches by cost, or lacks a grid's cost.
    """
    if config.sizer.measure is None:
        raise ValueError("`config` sizes batches by Equation 1 (`batch_sizing`='equation1'): there is no cost to show.")
    paper = config.with_equation1_batches()
    options = config.options
    factors = dict.fromkeys([*(options.long_cycle_factors if options.long_cycle else ()), (1.0, 1.0)])
    rows: dict[GridSizing, list[tuple[int, int]]] = {}
    for pair in factors:
        paper_stage = build_stage(paper, pair, 0, 1, 0)
        sized_stage = build_stage(config, pair, 0, 1, 0)
        shape = (sized_stage.shape.num_frames, sized_stage.shape.crop_size)
        for equation1, sized in zip(paper_stage.short_cycle or (paper_stage.shape,), sized_stage.short_cycle or (sized_stage.shape,)):
            cost = config.relative_cost(sized.num_frames, sized.crop_size)
            row = GridSizing(
                sized.num_frames, sized.crop_size, cost,
                equation1.batch_size, equation1.batch_size * cost / config.batch_size,
                sized.batch_size, sized.batch_size * cost / config.batch_size,
            )
            shapes = rows.setdefault(row, [])
            if shape not in shapes:
                shapes.append(shape)
    return tuple(dataclasses.replace(row, shapes=tuple(shapes)) for row, shapes in rows.items())


def format_sizing(config: MultigridConfig) -> str:
    """:func:`grid_sizings` as a table, under a line that names the measure, with the long-cycle shapes that
    train each grid; a note says why when a grid is listed twice."""
    rows = [("grid (frames x crop)", "in shape", "cost per clip", "Eq. 1 batch", "iteration cost", "cost-sized batch",
             "iteration cost")]
    sizings = grid_sizings(config)
    for g in sizings:
        rows.append((
            f"{g.num_frames} x {g.crop_size}", ", ".join(f"{t} x {c}" for t, c in g.shapes), f"{g.relative_cost:.3f}",
            str(g.equation1_batch), f"{g.equation1_iteration_cost:.2f}",
            str(g.sized_batch), f"{g.sized_iteration_cost:.2f}",
        ))
    grids = [(g.num_frames, g.crop_size) for g in sizings]
    twice = len(set(grids)) < len(grids)
    return "\n".join([
        f"Batches sized by measured {config.sizer.measure} (cost per clip and per iteration relative to the base "
        f"grid's, {config.num_frames} x {config.crop_size} at {config.batch_size} clips; training uses the cost-sized batch):",
        *table_lines(rows),
        *(["A grid listed twice trains in two long-cycle shapes' short cycles at two batches: each shape rounds its "
           "batches to a multiple of its BatchNorm groups."] if twice else []),
    ])


def schedule_to_dict(
    schedule: MultigridSchedule, dataset_size: int | None = None, pretrained: bool | None = None
) -> dict[str, Any]:
    """The schedule as plain data, one entry per epoch (the ``--format json`` contract).

    ``max_epochs`` is the multigrid run's epochs (the length of ``epochs``), ``baseline_max_epochs`` the
    baseline's that the schedule was built for.

    With ``dataset_size``: also the iterations, the per-grid counts, the warnings and the
    ``regime`` (:func:`describe_regime`, given ``pretrained``).
    """
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
                "bn": stage.bn.to_dict() if schedule.config.options.long_cycle else {"mode": "model"},
                "sampling_rate": list(stage.sampling_rate),
                "short_cycle": [{"batch_size": g.batch_size, "crop_size": g.crop_size} for g in stage.short_cycle],
            }
        )
    result: dict[str, Any] = {
        "max_epochs": schedule.max_epochs, "baseline_max_epochs": schedule.config.max_epochs, "epochs": epochs,
    }
    if (measure := schedule.config.sizer.measure) is not None:
        result["batch_sizing"] = {
            "method": measure,
            "grids": [asdict(g) for g in grid_sizings(schedule.config)],
        }
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
        result["regime"] = asdict(describe_regime(schedule, dataset_size, pretrained))
    return result


def format_table(
    schedule: MultigridSchedule,
    dataset_size: int | None = None,
    convert_batchnorm: bool = True,
    pretrained: bool | None = None,
    size_hint: str = "give the dataset size (`dataset_size`)",
    has_batchnorm: bool = True,
    limit_train_batches: float = 1.0,
) -> str:
    """A readable table, one row per stage, and a summary line.

    With ``dataset_size``, also a table of the iterations and clips per device of each distinct
    grid, the full-grid warning of :func:`full_grid_warning` when it applies, and the regime
    (:func:`describe_regime`, given ``pretrained``). With batches sized by cost, also each grid's
    Equation 1 batch beside its cost-sized one (:func:`format_sizing`). The BN column says what training does: the
    schedule's grouping, or "model's own" where the model's BatchNorm is left as it is (no long
    cycle, or the callback's ``convert_batchnorm=False``), or "none" with a note when the model has
    no BatchNorm (``has_batchnorm=False``: a transformer's LayerNorm needs no conversion). Without
    ``dataset_size``, the last line says how to get those: ``size_hint``, as the caller's user gives the size.
    With ``dataset_size`` and a Trainer's ``limit_train_batches`` other than 1.0 (a fraction, or a number of
    batches), the counts above stay those of full epochs, said so, and a last line gives the iterations of
    the run that trains part of each epoch (:func:`~lightning_multigrid.schedule.limits.limited_iterations`).
    """
    header = ("epochs", "LR stage", "rel. LR", "batch x frames x crop", "short cycle (batch@crop)", "BN", "stride")
    rows = [header]
    for stage in schedule.stages:
        shape = stage.shape
        short = " ".join(f"{g.batch_size}@{g.crop_size}" for g in stage.short_cycle) or "-"
        bn = {"plain": "plain", "split": f"split {stage.bn.num_splits}", "sync": f"sync {stage.bn.group_size}"}
        if not has_batchnorm:
            bn = dict.fromkeys(bn, "none")
        elif not schedule.config.options.manages_batchnorm(convert_batchnorm):
            bn = dict.fromkeys(bn, "model's own")  # training leaves the model's BatchNorm as it is
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
    lines = table_lines(rows)
    if not has_batchnorm:
        lines.append("BN: the model has no BatchNorm, nothing to group (LayerNorm needs no conversion).")
    config = schedule.config
    summary = f"{schedule.max_epochs} multigrid epochs for a {config.max_epochs}-epoch baseline"
    if config.options.short_run is not None:
        summary += " (short-run mode)"
    sizing = ["", format_sizing(config)] if config.sizer.measure is not None else []
    if dataset_size is not None:
        baseline = schedule.baseline_iterations(dataset_size)
        multigrid = schedule.total_iterations(dataset_size)
        summary += f"; {multigrid} iterations per device vs {baseline} ({baseline / multigrid:.2f}x fewer)"
        warning = full_grid_warning(schedule, dataset_size)
        limited = limit_train_batches != 1.0 or isinstance(limit_train_batches, int)
        run = "multigrid (full epochs)" if limited else "this run"
        regime = format_regime(describe_regime(schedule, dataset_size, pretrained), run)
        return "\n".join(
            [*lines, "", summary, *sizing, "", _format_grid_counts(schedule, dataset_size),
             *([f"warning: {warning}"] if warning else []),
             "", regime, *([_format_limited(schedule, dataset_size, limit_train_batches)] if limited else [])]
        )
    return "\n".join([*lines, "", summary, *sizing, "", f"regime: {size_hint} to see the optimizer steps and the advice."])


def _format_limited(schedule: MultigridSchedule, dataset_size: int, limit_train_batches: float) -> str:
    multigrid, baseline = limited_iterations(schedule, dataset_size, limit_train_batches)
    return (
        f"this run, with `limit_train_batches={limit_train_batches}`: {multigrid} iterations per device vs {baseline} "
        "for its baseline (the counts above are of full epochs)"
    )


def _format_grid_counts(schedule: MultigridSchedule, dataset_size: int) -> str:
    """The per-grid table: the grids that train, and a line naming those that get no iteration."""
    counts = grid_counts(schedule, dataset_size)
    base = schedule.base_shape

    def name(count: GridCount) -> str:
        full = " (full grid)" if (count.grid.num_frames, count.grid.crop_size) == (base.num_frames, base.crop_size) else ""
        return f"{count.grid.batch_size} x {count.grid.num_frames} x {count.grid.crop_size}{full}"

    header = ("grid (batch x frames x crop)", "iterations", "clips", "share of iterations")
    total = sum(c.iterations for c in counts)
    rows = [header]
    for c in counts:
        if c.iterations:
            rows.append((name(c), str(c.iterations), str(c.clips), f"{100 * c.iterations / total:.1f}%"))
    # An epoch of fewer iterations than the short cycle's three never reaches its later grids.
    untrained = [name(c) for c in counts if not c.iterations]
    note = [f"no iteration (epochs too short to reach them): {', '.join(untrained)}"] if untrained else []
    return "\n".join(["Per grid, per device:", *table_lines(rows), *note])


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
        schedule.grid_at(epoch, i).batch_size
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
