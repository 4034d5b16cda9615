"""The paper's allocation of epochs (DESIGN.md section 1): long cycle, fine-tuning, epoch factor.

One long cycle per baseline LR stage but the last, each shape's share of a stage proportional to
its average batch; then the fine-tuning phase at the base shape; every length scaled to
``epoch_factor`` times the baseline's epochs and rounded to whole epochs as the reference
implementation does, without its empty stages. Pure Python, no torch.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from functools import partial

from lightning_multigrid.fit.meter import format_grid
from lightning_multigrid.schedule.config import MultigridConfig
from lightning_multigrid.schedule.stages import Stage, batchnorm_groups, build_stage

__all__ = ["ShortScheduleWarning", "allocate_stages"]


class ShortScheduleWarning(UserWarning):
    """The schedule is too short for every long-cycle shape to get a whole epoch."""


@dataclass(frozen=True, slots=True)
class _Piece:
    """A stage before whole epochs are assigned: LR stage, long-cycle factors, exact length."""

    lr_stage: int
    t_factor: float
    s_factor: float
    fine_tuning: bool = False
    split_lr: bool = False  # fine-tuning that spans two LR stages
    full_grid: bool = False  # no short cycle: every iteration at the base shape


def allocate_stages(config: MultigridConfig) -> tuple[tuple[Stage, ...], tuple[int, ...]]:
    """The paper's stages for ``config``, and the multigrid epoch where each baseline LR stage starts (plus the end).

    Warns with :class:`ShortScheduleWarning` and drops the shortest long-cycle shapes when there
    are fewer epochs than shapes.

    Raises:
        ValueError: when a batch cannot be grouped for BatchNorm, or there are fewer multigrid
            epochs than baseline LR stages.
    """
    options = config.options
    if options.long_cycle:
        pieces, lengths = _long_cycle_pieces(config)
    else:
        pieces, lengths = _lr_stage_pieces(config)
    factor = 1.0 if not (options.long_cycle or options.short_cycle) else options.epoch_factor
    if options.full_grid_share > 0 and (options.long_cycle or options.short_cycle):
        pieces, ends = _allocate_with_full_grid(config, pieces, lengths, config.max_epochs * factor)
    else:
        # The reference truncates where the long cycle is off (`int(s * EPOCH_FACTOR)`: 45 x 1.5 -> 67)
        # and rounds the long cycle's cumulative ends.
        truncate = not options.long_cycle
        total_epochs = math.floor(config.max_epochs * factor + 1e-9) if truncate else round(config.max_epochs * factor)
        pieces, ends = _allocate_epochs(config, pieces, lengths, config.max_epochs * factor, total_epochs, truncate=truncate)

    stages: list[Stage] = []
    start = 0
    for piece, end in zip(pieces, ends):
        if piece.fine_tuning and piece.split_lr:
            # First half at the LR of stage L-2, second half at that of stage L-1.
            middle = (start + end) // 2
            stages.append(_stage(config, piece, start, middle, piece.lr_stage - 1))
            start = middle
        stages.append(_stage(config, piece, start, end, piece.lr_stage))
        start = end

    lr_starts = [next(s.start_epoch for s in stages if s.lr_stage == i) for i in range(config.num_lr_stages)]
    return tuple(stages), (*lr_starts, stages[-1].end_epoch)


def _stage(config: MultigridConfig, piece: _Piece, start: int, end: int, lr_stage: int) -> Stage:
    return build_stage(
        config, (piece.t_factor, piece.s_factor), start, end, lr_stage,
        full_grid=piece.full_grid, fine_tuning=piece.fine_tuning,
    )


def _long_cycle_pieces(config: MultigridConfig) -> tuple[list[_Piece], list[float]]:
    """One long cycle per LR stage but the last; the last is the fine-tuning phase.

    Each shape gets the same number of iterations within a stage, so its share of the stage's
    epochs is proportional to its average batch. Without milestones the whole run is one cycle.
    """
    factors = config.options.long_cycle_factors
    avg_batches = [_average_relative_batch(config, t, s) for t, s in factors]
    edges = config.lr_stage_edges
    cycled_stages = max(config.num_lr_stages - 1, 1)
    pieces: list[_Piece] = []
    lengths: list[float] = []
    relative_iterations = 0.0
    for lr_stage in range(cycled_stages):
        stage_epochs = edges[lr_stage + 1] - edges[lr_stage]
        for (t, s), avg in zip(factors, avg_batches):
            epochs = stage_epochs * avg / sum(avg_batches)
            pieces.append(_Piece(lr_stage, t, s))
            lengths.append(epochs)
            relative_iterations += epochs / avg
    if config.num_lr_stages > 1:
        # The fine-tuning phase keeps the iteration saving of the cycled stages.
        saving = edges[-2] / relative_iterations
        last = config.num_lr_stages - 1
        pieces.append(_Piece(last, 1.0, 1.0, fine_tuning=True, split_lr=True))
        lengths.append((edges[-1] - edges[-2]) / saving * _average_relative_batch(config, 1.0, 1.0))
    return pieces, lengths


def _lr_stage_pieces(config: MultigridConfig) -> tuple[list[_Piece], list[float]]:
    """Without the long cycle, stages are the baseline LR stages at the base shape."""
    edges = config.lr_stage_edges
    pieces = [_Piece(i, 1.0, 1.0) for i in range(config.num_lr_stages)]
    return pieces, [float(edges[i + 1] - edges[i]) for i in range(config.num_lr_stages)]


def _allocate_epochs(
    config: MultigridConfig, pieces: list[_Piece], lengths: list[float], target: float, total_epochs: int,
    truncate: bool = False,
) -> tuple[list[_Piece], list[int]]:
    """Scale exact lengths to ``target`` epochs and round (``truncate``: floor) the cumulative ends, as the reference.

    Then repair what rounding breaks on short schedules: every piece gets at least one epoch
    (fine-tuning two, one per LR half), taken from the longest pieces; when the epochs cannot
    cover every long-cycle shape, the shortest shapes are dropped (never an LR stage's last one).
    """
    pieces, lengths = list(pieces), list(lengths)
    dropped: list[_Piece] = []
    while sum(_minimum_epochs(p) for p in pieces) > total_epochs:
        droppable = [
            i for i, p in enumerate(pieces)
            if not p.fine_tuning and sum(q.lr_stage == p.lr_stage for q in pieces) > 1
        ]
        if not droppable:
            break
        index = min(droppable, key=lambda i: lengths[i])
        dropped.append(pieces.pop(index))
        lengths.pop(index)
    if pieces[-1].split_lr and sum(_minimum_epochs(p) for p in pieces) > total_epochs:
        pieces[-1] = _Piece(pieces[-1].lr_stage, 1.0, 1.0, fine_tuning=True, split_lr=False)
        warnings.warn(
            f"{total_epochs} multigrid epochs are too few to split fine-tuning over two LR stages; "
            "it runs at the last stage's LR only.",
            ShortScheduleWarning,
            stacklevel=4,
        )
    if len(pieces) > total_epochs:
        raise ValueError(
            f"The schedule has {total_epochs} multigrid epochs, fewer than its {len(pieces)} LR stages: "
            "raise `max_epochs` or `epoch_factor`, or use fewer `milestones`."
        )
    if dropped:
        shapes = ", ".join(f"{format_grid(_stage(config, p, 0, 1, p.lr_stage).shape)} in LR stage {p.lr_stage}" for p in dropped)
        warnings.warn(
            f"{total_epochs} multigrid epochs are too few for every long-cycle shape to get an epoch: "
            f"dropped {len(dropped)} of the shortest long-cycle stages (batch x frames x crop: {shapes}). "
            "Raise `max_epochs` or `epoch_factor` to train every shape.",
            ShortScheduleWarning,
            stacklevel=4,
        )

    scale = target / sum(lengths)
    ends, cumulative = [], 0.0
    for length in lengths:
        cumulative += length * scale
        ends.append(math.floor(cumulative + 1e-9) if truncate else round(cumulative))
    ends[-1] = total_epochs
    epochs = [end - start for start, end in zip([0, *ends], ends)]
    minimum = [_minimum_epochs(p) for p in pieces]
    for i in range(len(epochs)):
        while epochs[i] < minimum[i]:
            donor = max(range(len(epochs)), key=lambda j: epochs[j] - minimum[j])
            epochs[donor] -= 1
            epochs[i] += 1
    ends = [sum(epochs[: i + 1]) for i in range(len(epochs))]
    return pieces, ends


def _allocate_with_full_grid(
    config: MultigridConfig, pieces: list[_Piece], lengths: list[float], target: float
) -> tuple[list[_Piece], list[int]]:
    """Whole epochs when fine-tuning must give the full grid ``full_grid_share`` of the iterations.

    The stages before fine-tuning keep the paper's epochs (its share of ``target``); fine-tuning,
    without short cycle, gets ``ceil(full_grid_share * max_epochs)`` epochs of base-shape
    iterations (each as many as a baseline epoch), or the paper's length if that is longer.
    """
    scale = target / sum(lengths)
    last = config.num_lr_stages - 1
    if pieces[-1].fine_tuning:
        paper_epochs = round(lengths[-1] * scale)
        fine_tuning = _Piece(last, 1.0, 1.0, fine_tuning=True, split_lr=pieces[-1].split_lr, full_grid=True)
        pieces, lengths = pieces[:-1], lengths[:-1]
    else:  # one long cycle (no milestones) or no long cycle: fine-tuning is added at the end
        paper_epochs = 0
        fine_tuning = _Piece(last, 1.0, 1.0, fine_tuning=True, full_grid=True)
    # The 1e-9 keeps a share that is an exact fraction of max_epochs from rounding up once more.
    share = config.options.full_grid_share
    epochs = max(math.ceil(share * config.max_epochs - 1e-9), paper_epochs, _minimum_epochs(fine_tuning))
    rest = sum(lengths) * scale
    pieces, ends = _allocate_epochs(config, pieces, lengths, rest, round(rest))
    return [*pieces, fine_tuning], [*ends, ends[-1] + epochs]


def _minimum_epochs(piece: _Piece) -> int:
    return 2 if piece.split_lr else 1


def _average_relative_batch(config: MultigridConfig, t_factor: float, s_factor: float) -> float:
    """Average relative batch of a long-cycle shape over its short cycle (itself when off), the sizer's."""
    options = config.options
    short_cycle_factors = options.short_cycle_factors if options.short_cycle else ()
    return config.sizer.average_relative_batch(
        *config.grid_size(t_factor, s_factor), short_cycle_factors, partial(batchnorm_groups, config)
    )
