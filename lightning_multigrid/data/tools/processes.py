"""Worker processes that never outlive an interrupted command (``extract-frames``, ``check-data``,
``make-synthetic``): the one process pool of the package.

``concurrent.futures.ProcessPoolExecutor`` leaves its workers running when the main process is
killed by ``SIGTERM`` (the default handler exits without any clean-up): they go on writing, then
hang on a queue no one reads. Here the main process turns ``SIGTERM`` into ``SystemExit`` for the
duration of the run and the pool is terminated on any way out; workers ignore ``SIGINT`` (a
Ctrl-C reaches the whole process group) and leave the stopping to the main process.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import FrameType
from typing import TypeVar

__all__ = ["imap_in_processes", "map_in_processes"]

Item = TypeVar("Item")
Result = TypeVar("Result")


def imap_in_processes(
    function: Callable[[Item], Result], items: Iterable[Item], processes: int, chunksize: int = 1
) -> Iterator[Result]:
    """``function(item)`` for each item, in order, computed by ``processes`` worker processes.

    The workers are terminated when the iteration ends, fails, is abandoned, or the main process
    receives ``SIGINT`` or ``SIGTERM`` (which then raise ``KeyboardInterrupt`` / ``SystemExit``).
    """
    with multiprocessing.get_context().Pool(processes, initializer=_ignore_sigint) as pool:
        # Pool.__exit__ calls terminate(): no worker survives the block, however it is left. The
        # workers are forked before the SIGTERM handler is installed: terminate() kills them with
        # SIGTERM, which a Python handler inherited by a worker stuck in C code would never run.
        restore = _exit_on_sigterm()
        try:
            yield from pool.imap(function, items, chunksize)
        finally:
            restore()


def map_in_processes(
    function: Callable[[Item], Result], items: Sequence[Item], workers: int | None, chunksize: int | None = 1
) -> Iterator[Result]:
    """``function(item)`` for each item, in order: in this process when ``workers`` is 0 or 1 (or
    there is one item), else in ``min(workers, len(items))`` processes (``None``: one per core)
    by :func:`imap_in_processes`.

    Args:
        chunksize: items per task sent to a worker; ``None`` sizes chunks for about 8 per process
            (at most 16 items each), for many cheap items.
    """
    processes = min((os.cpu_count() or 1) if workers is None else workers, len(items))
    if processes <= 1:
        return map(function, items)
    if chunksize is None:
        chunksize = max(1, min(16, len(items) // (8 * processes)))
    return imap_in_processes(function, items, processes, chunksize)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _exit_on_sigterm() -> Callable[[], None]:
    """Make ``SIGTERM`` raise ``SystemExit`` in the main thread; returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)

    def restore() -> None:
        signal.signal(signal.SIGTERM, previous)

    return restore
