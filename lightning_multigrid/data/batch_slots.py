"""Batch slots: shared memory the workers write each batch's clips into, mapped once, reused every batch.

A DataLoader worker hands a tensor to the main process as a shared-memory file whose descriptor
crosses a socket: the main process connects to a thread of the worker, which must take the
worker's GIL to answer, while the worker's main thread decodes. The main thread waits for that
once per tensor, serially (measured here: 10-15 ms of wall time per chunk with busy workers, about
0.7 ms of CPU; on a 16-core machine about one interpreter switch interval, 5 ms: 14 chunks of a
coarse batch then cap the loader near 1500 clips/s, whatever the workers' speed). The segment is
created, mapped, faulted in and unmapped again for every chunk.

Here the main process creates a few slots of shared memory once, before the workers start (they
inherit them, or receive them once when started by spawn), and cuts every batch into
:class:`ChunkTask`\\ s naming a slot and where in the batch the chunk's clips go. A worker stacks
its chunk's clips straight into the slot (one copy) and returns only the small rest of the batch
by value (labels, indices: no descriptor, no segment); the main process copies the whole batch
out of the slot in one ``torch.cat`` and frees the slot. Anything that does not fit (another
collate function, encoded clips, a batch larger than a slot, no free slot) goes the usual way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import torch

__all__ = ["BatchSlots", "ChunkTask", "FetchedChunk", "InSlot", "slot_bytes_for"]

_ALIGN = 64  # bytes: every pathway's region starts aligned, so it can be viewed as any dtype


def _aligned(num_bytes: int) -> int:
    """``num_bytes`` rounded up to a multiple of :data:`_ALIGN`: a pathway's region in a slot."""
    return -(-num_bytes // _ALIGN) * _ALIGN


class ChunkTask(list):
    """The clip requests of one chunk: clips ``start .. start + len(self)`` of a batch of
    ``batch_size`` clips whose clips go to ``slot`` (``None``: no slot, the usual hand-over)."""

    def __init__(self, requests: Iterable[Any], slot: int | None, start: int, batch_size: int) -> None:
        super().__init__(requests)
        self.slot = slot
        self.start = start
        self.batch_size = batch_size


class FetchedChunk(NamedTuple):
    """A chunk's samples with the task they were fetched for (what a dataset's ``__getitems__`` returns
    for a :class:`ChunkTask`, so the collate function in the worker knows where the clips go)."""

    samples: list[Any]
    task: ChunkTask


class InSlot(NamedTuple):
    """Where a chunk's clips lie in a slot: for each pathway ``(byte offset, dtype, clip shape)``
    of the batch's region, the clips ``start .. start + num_clips`` of ``batch_size``. Pickled by
    value: a few numbers cross to the main process instead of the clips."""

    slot: int
    layout: tuple[tuple[int, torch.dtype, tuple[int, ...]], ...]
    start: int
    num_clips: int
    batch_size: int
    pathways: bool  # the video is a list of pathways (not one tensor)


class BatchSlots:
    """``num_slots`` slots of ``slot_bytes`` shared memory, owned by the main process.

    Created (:meth:`create`) before the DataLoader's workers start, so they share the memory
    without ever passing a descriptor. Only the main process acquires and releases slots; a
    worker only writes into the slot its task names.

    Args:
        num_slots: slots: batches that may be in flight at once.
        slot_bytes: bytes per slot: the largest batch's clips.
    """

    def __init__(self, num_slots: int, slot_bytes: int) -> None:
        if num_slots < 1 or slot_bytes < 1:
            raise ValueError(f"`num_slots` and `slot_bytes` must be >= 1, got {num_slots} and {slot_bytes}.")
        self.num_slots = num_slots
        self.slot_bytes = slot_bytes
        self.buffers: list[torch.Tensor] = []
        self._free: list[int] = []

    def create(self) -> None:
        """Allocate the shared memory (once; before the workers start)."""
        if not self.buffers:
            self.buffers = [torch.empty(self.slot_bytes, dtype=torch.uint8).share_memory_() for _ in range(self.num_slots)]
            self.release_all()

    def acquire(self) -> int | None:
        """A free slot for the next batch, ``None`` when every slot is in flight (that batch goes the usual way)."""
        return self._free.pop() if self._free else None

    def release(self, slot: int) -> None:
        """The batch in ``slot`` was copied out: the slot may take another."""
        self._free.append(slot)

    def release_all(self) -> None:
        """A new pass: nothing of the last one is in flight any more."""
        self._free = list(range(len(self.buffers)))[::-1]

    def write(self, videos: Sequence[Any], task: ChunkTask) -> InSlot | None:
        """In a worker: stack a chunk's clips (tensors, or lists of pathway tensors) into its task's slot.

        Returns:
            Where they went, or ``None`` when they do not fit a slot (the caller hands them over the usual way).
        """
        if task.slot is None or not self.buffers or not videos:
            return None
        pathways = isinstance(videos[0], (list, tuple))
        if not pathways and not isinstance(videos[0], torch.Tensor):
            return None  # e.g. encoded clips: bytes, not pixels
        parts = [[v[p] for v in videos] for p in range(len(videos[0]))] if pathways else [list(videos)]
        layout, offset = [], 0
        for clips in parts:
            first = clips[0]
            if not isinstance(first, torch.Tensor) or first.device.type != "cpu":
                return None
            layout.append((offset, first.dtype, tuple(first.shape)))
            offset += _aligned(task.batch_size * first.numel() * first.element_size())
        if offset > self.slot_bytes:
            return None
        placed = InSlot(task.slot, tuple(layout), task.start, len(videos), task.batch_size, pathways)
        try:
            for clips, view in zip(parts, self.views(placed)):
                torch.stack(clips, out=view)
        except RuntimeError:
            return None  # clips of different shapes: collating them the usual way says so
        return placed

    def views(self, placed: InSlot) -> list[torch.Tensor]:
        """The chunk's clips in the slot, one ``(num_clips, *clip shape)`` view per pathway (no copy)."""
        buffer = self.buffers[placed.slot]
        out = []
        for offset, dtype, shape in placed.layout:
            numel = placed.batch_size * math.prod(shape)
            region = buffer[offset : offset + numel * dtype.itemsize].view(dtype).view(placed.batch_size, *shape)
            out.append(region[placed.start : placed.start + placed.num_clips])
        return out

    def __getstate__(self) -> dict[str, Any]:
        # Workers started by spawn or forkserver receive the slots once, with the collate function;
        # they never acquire or release.
        return {"num_slots": self.num_slots, "slot_bytes": self.slot_bytes, "buffers": self.buffers, "_free": []}


def slot_bytes_for(shapes: Iterable[tuple[int, int, int]], channels: int = 3, slowfast_alpha: int | None = None) -> int:
    """Bytes of the largest batch of uint8 clips over ``(batch_size, num_frames, crop_size)`` grids,
    with the slow pathway's frames when ``slowfast_alpha`` is given (aligned as :class:`BatchSlots` lays them out)."""
    largest = 0
    for batch_size, num_frames, crop_size in shapes:
        frames = [num_frames] if slowfast_alpha is None else [-(-num_frames // slowfast_alpha), num_frames]
        size = sum(_aligned(batch_size * channels * t * crop_size**2) for t in frames)
        largest = max(largest, size)
    return largest
