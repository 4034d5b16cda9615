"""The short-run mode (:class:`~lightning_multigrid.schedule.config.ShortRun`): coarse grids first, then the full grid.

For runs of a few thousand iterations, below multigrid's published regime: the coarse grids of
``long_cycle_factors`` at (about) the base batch for at most ``coarse_share`` of the baseline's
epochs, then the full grid, over the baseline's epochs and LR stages. Pure Python, no torch.
"""

from __future__ import annotations

import bisect
import math

from lightning_multigrid.schedule.config import MultigridConfig, ShortRun
from lightning_multigrid.schedule.stages import Stage, build_stage

__all__ = ["short_run_stages"]


def short_run_stages(config: MultigridConfig, short_run: ShortRun) -> tuple[tuple[Stage, ...], tuple[int, ...]]:
    """The short-run mode's stages, and the epoch where each baseline LR stage starts (plus the end).

    Stages break where the grid changes and at the baseline's milestones, so multigrid epoch ``e``
    is baseline epoch ``e`` and every stage has one LR stage.
    """
    grid_of_epoch = [(1.0, 1.0)] * config.max_epochs
    grids = _coarse_grids(config)
    start = 0
    for factors, epochs in zip(grids, _coarse_epochs(config, short_run, grids)):
        grid_of_epoch[start : start + epochs] = [factors] * epochs
        start += epochs
    edges = config.lr_stage_edges
    breaks = sorted({*edges, *(e for e in range(1, config.max_epochs) if grid_of_epoch[e] != grid_of_epoch[e - 1])})
    stages = []
    for begin, end in zip(breaks, breaks[1:]):
        lr_stage = bisect.bisect_right(config.milestones, begin)
        stages.append(build_stage(config, grid_of_epoch[begin], begin, end, lr_stage))
    return tuple(stages), edges


def _coarse_grids(config: MultigridConfig) -> list[tuple[float, float]]:
    """The coarse grids of the short-run mode, coarsest first: ``long_cycle_factors`` below the base shape."""
    coarse = {(t, s) for t, s in config.options.long_cycle_factors if _cost_ratio(config, t, s) > 1}
    return sorted(coarse, key=lambda f: -_cost_ratio(config, *f))


def _coarse_epochs(config: MultigridConfig, short_run: ShortRun, grids: list[tuple[float, float]]) -> list[int]:
    """Whole epochs of each of the coarse ``grids`` (coarsest first), each share proportional to ``1 / r``.

    ``floor(coarse_share * max_epochs)`` epochs in all, split in proportion to ``1 / r`` by
    rounding the cumulative ends, so a grid whose share rounds to nothing gets 0 epochs.
    """
    total = math.floor(short_run.coarse_share * config.max_epochs + 1e-9)
    weights = [1 / _cost_ratio(config, t, s) for t, s in grids]
    ends = [round(total * sum(weights[: i + 1]) / sum(weights)) for i in range(len(weights))]
    return [end - start for start, end in zip([0, *ends], ends)]


def _cost_ratio(config: MultigridConfig, t_factor: float, s_factor: float) -> float:
    """A ``(t_factor, s_factor)`` grid's cost saving per clip, the sizer's (Equation 1's relative batch ``r``)."""
    return config.sizer.cost_ratio(*config.grid_size(t_factor, s_factor))
