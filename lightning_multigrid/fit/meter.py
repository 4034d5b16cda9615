"""The data-wait meter: per grid, the share of each training iteration spent waiting for data.

An iteration runs from the end of one step's ``on_train_batch_end`` to the end of the next; its
wait runs from the moment the fit loop asks the train loader for the next batch
(:meth:`DataWaitMeter.fetch_start`, through :func:`~lightning_multigrid._internals.watch_train_fetches`)
to the next ``on_train_batch_start``: fetching the batch (the loader, its workers, collate), the
host-to-device copy and ``on_after_batch_transfer`` (device decode, normalisation). What runs
before the fetch (other callbacks' ``on_train_batch_end``, logger writes, checkpoint saves) is
part of the iteration, not of its wait. ``time.perf_counter`` only: no device synchronisation, so
on a GPU the step's time is the host's (kernels still queued at ``on_train_batch_end`` are counted
in the next iteration, and a fetch that overlaps them shows as wait although the device was busy).
Validation and epoch boundaries are not iterations (:meth:`DataWaitMeter.pause`). A grid timed over
fewer than :data:`MIN_ITERATIONS` iterations is not judged. Pure Python.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from lightning_multigrid.grid import GridShape

__all__ = ["DATA_WAIT_LIMIT", "MIN_ITERATIONS", "DataWaitMeter", "GridWait", "format_grid"]

# A grid whose iterations wait this share of their time or more is paced by loading.
DATA_WAIT_LIMIT = 0.2
# Fewer iterations of a grid than this are too few to judge it (loader start-up, worker warm-up).
MIN_ITERATIONS = 20

# What to do about loading in any DataModule; a DataModule that knows its source says more.
GENERIC_ADVICE = (
    "more DataLoader workers, a cheaper source (frame folders or a packed frame store instead of "
    "video files: `lightning-multigrid pack-frames`, docs/data.md)"
)


def format_grid(grid: GridShape) -> str:
    """``"batch x frames x crop"``, as the schedule table writes a grid."""
    return f"{grid.batch_size} x {grid.num_frames} x {grid.crop_size}"


@dataclass(slots=True)
class GridWait:
    """Seconds waited and spent in total over ``iterations`` iterations of one grid."""

    wait_s: float = 0.0
    total_s: float = 0.0
    iterations: int = 0

    @property
    def share(self) -> float:
        """Waiting time over iteration time (0 before any iteration)."""
        return self.wait_s / self.total_s if self.total_s > 0 else 0.0


class DataWaitMeter:
    """Times training iterations per grid with ``time.perf_counter``: a few floats per step.

    Call :meth:`fetch_start` when the loop asks the loader for the next batch, :meth:`batch_start`
    first thing in ``on_train_batch_start``, :meth:`batch_end` in ``on_train_batch_end``, and
    :meth:`pause` where the time until the next batch is not an iteration's (an epoch's start, a
    validation). An iteration whose fetch was not seen is not timed.
    """

    def __init__(
        self, limit: float = DATA_WAIT_LIMIT, clock: Callable[[], float] = time.perf_counter,
        min_iterations: int = MIN_ITERATIONS,
    ) -> None:
        self.limit = limit
        self.min_iterations = min_iterations
        self._clock = clock
        self._last_end: float | None = None  # end of the previous iteration, None after a pause
        self._fetch_start: float | None = None  # first fetch since the previous iteration ended
        self._wait: float | None = None  # of the iteration in progress
        self.grids: dict[GridShape, GridWait] = {}
        self._window = GridWait()  # since the last `take_window_share`

    def pause(self) -> None:
        """The time until the next batch is not an iteration's (epoch start, validation, checkpoint)."""
        self._last_end = None
        self._fetch_start = None
        self._wait = None

    def fetch_start(self) -> None:
        """The loop asks the loader for the next batch: the wait starts (at the first ask)."""
        if self._fetch_start is None:
            self._fetch_start = self._clock()

    def batch_start(self) -> None:
        now = self._clock()
        start = self._fetch_start if self._last_end is not None else None
        self._wait = None if start is None else now - start

    def batch_end(self, grid: GridShape) -> None:
        now = self._clock()
        if self._wait is not None and self._last_end is not None:
            total = now - self._last_end
            for record in (self.grids.setdefault(grid, GridWait()), self._window):
                record.wait_s += self._wait
                record.total_s += total
                record.iterations += 1
        self._last_end = now
        self._fetch_start = None
        self._wait = None

    def take_window_share(self) -> float | None:
        """The wait share of the iterations since the last call (``None``: none timed), and start anew."""
        window, self._window = self._window, GridWait()
        return window.share if window.iterations else None

    def paced_by_loading(self) -> list[tuple[GridShape, GridWait]]:
        """Grids timed often enough to judge whose iterations waited at least :attr:`limit` of their
        time, most waiting first."""
        slow = [(g, w) for g, w in self._judged() if w.share >= self.limit]
        return sorted(slow, key=lambda item: -item[1].share)

    def _judged(self) -> list[tuple[GridShape, GridWait]]:
        return [(g, w) for g, w in self.grids.items() if w.iterations >= self.min_iterations]

    def summary(self, advice: str | None = None) -> str:
        """One line per grid paced by loading, with what to do; a line saying none was, otherwise.

        Args:
            advice: what to do about loading in this run's DataModule (how it reads its clips and
                what it can change), after which the meter adds the schedule's part; default
                advice that fits any DataModule.
        """
        timed = sum(w.iterations for w in self.grids.values())
        if not timed:
            return (
                "multigrid data wait: no iteration timed (the first batch of each epoch and the first "
                "after each validation are not timed: loader start-up, not a step's wait; this run had no other)."
            )
        judged = self._judged()
        unjudged = [(g, w) for g, w in self.grids.items() if w.iterations < self.min_iterations]
        too_few = (
            f"too few iterations to judge (under {self.min_iterations} timed) at "
            + ", ".join(f"{format_grid(g)} ({w.iterations})" for g, w in unjudged)
        ) if unjudged else ""
        if not judged:
            return f"multigrid data wait: {too_few}; train longer to see whether loading sets the pace."
        slow = self.paced_by_loading()
        if not slow:
            where = "at every grid" if not unjudged else f"at the {len(judged)} grids judged"
            line = (
                f"multigrid data wait: under {self.limit:.0%} of each iteration {where} "
                f"({sum(w.iterations for _, w in judged)} iterations timed): the model, not loading, set the pace."
            )
            return line + (f" {too_few[0].upper()}{too_few[1:]}." if too_few else "")
        lines = [
            f"multigrid data wait: loading set the pace at {len(slow)} of {len(judged)} grids judged "
            f"(share of each iteration spent waiting for the batch, limit {self.limit:.0%}):"
        ]
        lines += [f"  {format_grid(g)}: {w.share:.0%} of {w.iterations} iterations" for g, w in slow]
        if too_few:
            lines.append(f"  Not judged: {too_few}.")
        lines.append(
            f"  The coarse grids' saving did not reach the wall clock there. Try {advice or GENERIC_ADVICE}, "
            "or fewer or larger long-cycle shapes (`long_cycle_factors`)."
        )
        return "\n".join(lines)
