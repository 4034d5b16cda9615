"""The grids the benchmarks measure and the batches they draw at each.

A sibling module of the benchmark scripts (``import grids``): a script run as ``python benchmarks/x.py``
has ``benchmarks/`` first on ``sys.path``.
"""

from __future__ import annotations

import argparse
import itertools
import random
from collections.abc import Collection, Iterator
from dataclasses import dataclass

from lightning_multigrid.data.clip_params import ClipRequest
from lightning_multigrid.schedule import BNPlan, GridShape, MultigridConfig, MultigridSchedule, build_schedule


def parse_shape(text: str) -> GridShape:
    """A grid written ``BxTxS`` (``8x8x224``): an argparse ``type``."""
    try:
        batch, frames, crop = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not BxTxS (e.g. 8x8x224)") from None
    return GridShape(batch, frames, crop)


def bn_plans(schedule: MultigridSchedule) -> dict[GridShape, BNPlan]:
    """The BatchNorm plan each grid of ``schedule`` first trains with."""
    plans: dict[GridShape, BNPlan] = {}
    for stage in schedule.stages:
        for grid in schedule.cycle_at(stage.start_epoch):
            plans.setdefault(grid, stage.bn)
    return plans


@dataclass(frozen=True)
class Grid:
    name: str
    shape: GridShape
    sampling_rate_range: tuple[float, float]
    scale_range: tuple[int, int]


def benchmark_schedule(base: GridShape, sampling_rate: int) -> MultigridSchedule:
    """The schedule whose grids the benchmarks measure: 100 epochs, milestones 50 and 80."""
    return build_schedule(MultigridConfig(base=base, sampling_rate=sampling_rate, max_epochs=100, milestones=(50, 80)))


def schedule_grids(schedule: MultigridSchedule) -> list[Grid]:
    """The base grid, each other long-cycle shape (coarse to fine), and the coarsest short-cycle grid."""
    base = schedule.base_shape
    grids = {base: Grid("base", base, (0.0, 0.0), schedule.jitter_scales_for(base.crop_size))}
    coarsest: Grid | None = None
    for stage in schedule.stages:
        rate = (float(stage.sampling_rate[0]), float(stage.sampling_rate[1]))
        shape = stage.shape
        if shape == base:
            grids[base] = Grid("base", base, rate, grids[base].scale_range)
        elif shape not in grids:
            name = f"long {shape.batch_size}x{shape.num_frames}x{shape.crop_size}"
            grids[shape] = Grid(name, shape, rate, schedule.jitter_scales_for(shape.crop_size))
        for short in stage.short_cycle:
            if coarsest is None or short.num_frames * short.crop_size**2 < coarsest.shape.num_frames * coarsest.shape.crop_size**2:
                coarsest = Grid("coarsest", short, rate, schedule.jitter_scales_for(short.crop_size))
    ordered = [g for g in grids.values() if g.name != "base"] + [grids[base]]
    return ([coarsest] if coarsest is not None else []) + ordered


def selected_grids(schedule: MultigridSchedule, names: Collection[str] | None) -> list[Grid]:
    """:func:`schedule_grids`, only those whose name's first word is in ``names`` (``base``, ``coarsest``,
    ``long``; None: every one)."""
    return [g for g in schedule_grids(schedule) if names is None or g.name.split()[0] in names]


def drawn_grids(schedule: MultigridSchedule) -> list[Grid]:
    """Every grid the schedule draws (long- and short-cycle shapes; 8 at the default base), cheapest first:
    :func:`schedule_grids`' names, ``short BxTxS`` for the short-cycle grids they do not name."""
    grids = {g.shape: g for g in schedule_grids(schedule)}
    for stage in schedule.stages:
        rate = (float(stage.sampling_rate[0]), float(stage.sampling_rate[1]))
        for shape in stage.short_cycle:
            if shape not in grids:
                name = f"short {shape.batch_size}x{shape.num_frames}x{shape.crop_size}"
                grids[shape] = Grid(name, shape, rate, schedule.jitter_scales_for(shape.crop_size))
    return sorted(grids.values(), key=lambda g: (g.shape.num_frames * g.shape.crop_size**2, -g.shape.batch_size))


def requests_for(grid: Grid, num_videos: int, seed: int) -> Iterator[list[ClipRequest]]:
    """Endless batches at one grid, as the batch sampler makes them (random videos, one seed per clip)."""
    rng = random.Random(seed)
    for batch in itertools.count():
        yield [
            ClipRequest(rng.randrange(num_videos), grid.shape.num_frames, grid.shape.crop_size, grid.sampling_rate_range,
                        grid.scale_range, seed=batch * 100_000 + k)
            for k in range(grid.shape.batch_size)
        ]
