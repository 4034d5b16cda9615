"""The data-wait meter: per grid, the share of each training iteration spent waiting for data.

An iteration runs from the end of one step's ``on_train_batch_end`` to the end of the next; its
wait is the part before the next ``on_train_batch_start``: fetching the batch (the loader, its
workers, collate), the host-to-device copy and ``on_after_batch_transfer`` (device decode,
normalisation). ``time.perf_counter`` only: no device synchronisation, so on a GPU the step's
time is the host's (kernels still queued at ``on_train_batch_end`` are counted in the next
iteration, and a fetch that overlaps them shows as wait although the device was busy).
Validation and epoch boundaries are not iterations (:meth:`DataWaitMeter.pause`). Pure Python.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from lightning_multigrid.grid import GridShape

__all__ = ["DATA_WAIT_LIMIT", "DataWaitMeter", "GridWait", "format_grid"]

# A grid whose iterations wait this share of their time or more is paced by loading.
DATA_WAIT_LIMIT = 0.2


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

    Call :meth:`batch_start` first thing in ``on_train_batch_start``, :meth:`batch_end` in
    ``on_train_batch_end``, and :meth:`pause` where the time until the next batch is not the
    loader's (an epoch's start, a validation).
    """

    def __init__(self, limit: float = DATA_WAIT_LIMIT, clock: Callable[[], float] = time.perf_counter) -> None:
        self.limit = limit
        self._clock = clock
        self._last_end: float | None = None  # end of the previous iteration, None after a pause
        self._wait: float | None = None  # of the iteration in progress
        self.grids: dict[GridShape, GridWait] = {}
        self._window = GridWait()  # since the last `take_window_share`

    def pause(self) -> None:
        """The time until the next batch is not an iteration's (epoch start, validation, checkpoint)."""
        self._last_end = None
        self._wait = None

    def batch_start(self) -> None:
        now = self._clock()
        self._wait = None if self._last_end is None else now - self._last_end

    def batch_end(self, grid: GridShape) -> None:
        now = self._clock()
        if self._wait is not None and self._last_end is not None:
            total = now - self._last_end
            for record in (self.grids.setdefault(grid, GridWait()), self._window):
                record.wait_s += self._wait
                record.total_s += total
                record.iterations += 1
        self._last_end = now
        self._wait = None

    def take_window_share(self) -> float | None:
        """The wait share of the iterations since the last call (``None``: none timed), and start anew."""
        window, self._window = self._window, GridWait()
        return window.share if window.iterations else None

    def paced_by_loading(self) -> list[tuple[GridShape, GridWait]]:
        """Grids whose iterations waited at least :attr:`limit` of their time, most waiting first."""
        slow = [(g, w) for g, w in self.grids.items() if w.iterations and w.share >= self.limit]
        return sorted(slow, key=lambda item: -item[1].share)

    def summary(self) -> str:
        """One line per grid paced by loading, with what to do; a line saying none was, otherwise."""
        timed = sum(w.iterations for w in self.grids.values())
        if not timed:
            return "multigrid data wait: no iteration timed."
        slow = self.paced_by_loading()
        if not slow:
            return (
                f"multigrid data wait: under {self.limit:.0%} of each iteration at every grid "
                f"({timed} iterations timed): the model, not loading, set the pace."
            )
        lines = [
            f"multigrid data wait: loading set the pace at {len(slow)} of {len(self.grids)} grids "
            f"(share of each iteration spent waiting for the batch, limit {self.limit:.0%}):"
        ]
        lines += [f"  {format_grid(g)}: {w.share:.0%} of {w.iterations} iterations" for g, w in slow]
        lines.append(
            "  The coarse grids' saving did not reach the wall clock there. Read frames from a packed store "
            "(or frame folders instead of mp4), use fewer or larger long-cycle shapes, more loader "
            "workers (`num_workers`), or decode on the device (`reader_settings: {frame_decode: device}`)."
        )
        return "\n".join(lines)
