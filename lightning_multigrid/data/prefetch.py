"""Decode the next training batches on the device while the current step runs.

With ``frame_decode="device"`` a batch leaves the workers as JPEG bytes and is decoded on the
training device. Decoded between two steps (``decode_ahead=0``), its time adds to the step's; a
coarse grid's batch holds 4x the frames of a base batch, so there the decode, not the model, sets
the pace. :class:`DecodeAhead` moves it off the critical path: one background thread decodes the
batches after the one being trained on, on its own CUDA stream, so the JPEG engine and the
crop-resize run while the training thread queues the step's kernels. torchcodec's
``decode_jpeg`` is a ``torch.ops`` call, which releases the GIL; it decodes on the calling thread's
current stream (the side stream here) and synchronises only that stream, so the training thread is
not held up. The thread's host work per batch is a fixed number of tensor operations (the batched
crop-resize builds the whole batch's resize weights at once), not a dozen per frame, which held the
GIL the training thread needs to launch its kernels.

Only the decode runs in the thread. The training thread still pulls the host batches from the
DataLoader (so its iterator, its workers and Lightning's shutdown of them stay in one thread), hands
each to the thread and takes back a decoded one, its training stream waiting on the batch's CUDA
event (recorded on the side stream after the last kernel that writes it) and its tensors marked as
used by the training stream (``record_stream``) so the allocator does not recycle them while the
step still reads them. Labels and indices stay host tensors until Lightning's transfer, and follow a
replaced clip before it (``BatchTransfer.decode``). A failure in the thread (a strict run's bad frame) is raised in the
training thread at the batch it belongs to; a bad frame otherwise is replaced and counted exactly as
in the serial path (the same ``decode`` runs). Without CUDA the same code runs on the CPU, without
streams, which is how it is tested.

The thread lives as long as one pass over the loader: it ends when the epoch's batches are used up,
when the pass is abandoned (:meth:`DecodeAhead.iterate`'s iterator closed, or the loader iterated
again), and at the DataModule's ``teardown`` and ``on_exception`` (a fit that raised or was
interrupted); none of these waits longer than the decode in flight.

Example::

    ahead = DecodeAhead(BatchTransfer().decode, torch.device("cuda"), depth=1)
    for batch in ahead.iterate(loader):   # batch["video"]: uint8 (N, 3, T, S, S) on the GPU
        ...
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from lightning_multigrid._checks import check_positive_int
from lightning_multigrid.data.transfer import is_encoded

__all__ = ["THREAD_NAME", "DecodeAhead", "Decoding"]

THREAD_NAME = "multigrid-decode-ahead"

Decode = Callable[[dict[str, Any], torch.device], None]
# A batch being decoded: the batch and the CUDA event after its last kernel (``None`` off CUDA).
Decoding = Future[tuple[dict[str, Any], torch.cuda.Event | None]]


@dataclass(frozen=True, slots=True)
class DecodeAhead:
    """Decode training batches ``depth`` batches ahead of the one handed out, in a background thread.

    Args:
        decode: decodes ``batch`` on ``device`` in place (``BatchTransfer.decode``: a bad clip is
            replaced and its video added to ``batch["skipped"]``, or it raises with ``strict``).
        device: the training device.
        depth: batches decoded ahead, 1 or 2. Lightning itself holds one batch ahead, so with 1 the
            batch after next is decoded while a step runs.

    Raises:
        ValueError: on a ``depth`` that is not 1 or 2.
    """

    decode: Decode
    device: torch.device
    depth: int = 1

    def __post_init__(self) -> None:
        check_positive_int("depth", self.depth)
        if self.depth > 2:
            raise ValueError(f"`depth` (batches decoded ahead) must be 1 or 2, got {self.depth!r}: more only holds memory.")
        object.__setattr__(self, "device", torch.device(self.device))

    def iterate(self, batches: Iterable[dict[str, Any]], started: Sequence[Decoding] = ()) -> Iterator[dict[str, Any]]:
        """``batches`` decoded on :attr:`device`, in order; the thread stops when this iterator ends or is closed.

        Only JPEG batches (:func:`~lightning_multigrid.data.transfer.is_encoded`) are decoded, and the
        thread starts at the first one; a batch the reader returned decoded passes through as it is.
        ``started``: batches :meth:`start` is already decoding, handed out first (the pass's first
        batches, decoded while the pass before it ended).
        """
        executor: ThreadPoolExecutor | None = None  # started at the first encoded batch
        side = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        pending: deque[Decoding] = deque(started)
        try:
            for batch in batches:  # the host batches are pulled here, in the consuming thread
                if is_encoded(batch):
                    executor = executor or ThreadPoolExecutor(1, thread_name_prefix=THREAD_NAME)
                    pending.append(executor.submit(self._decode, batch, side))
                else:  # decoded by the reader already: handed out as it is, in its turn
                    pending.append(_done((batch, None)))
                while len(pending) > self.depth:  # more than `depth` after a start with batches decoded ahead
                    yield self._ready(pending.popleft())
            while pending:
                yield self._ready(pending.popleft())
        finally:
            # Abandoned, failed or done: drop what is queued, let the decode in flight finish, end the thread.
            if executor is not None:
                executor.shutdown(wait=True, cancel_futures=True)

    def start(self, batches: Sequence[dict[str, Any]]) -> list[Decoding]:
        """Start decoding ``batches`` now, in order, in a thread of their own that ends with them; for
        :meth:`iterate`'s ``started``."""
        executor = ThreadPoolExecutor(1, thread_name_prefix=THREAD_NAME)
        side = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        try:
            return [executor.submit(self._decode, b, side) if is_encoded(b) else _done((b, None)) for b in batches]
        finally:
            executor.shutdown(wait=False)  # the thread ends after these decodes

    def _decode(self, batch: dict[str, Any], side: torch.cuda.Stream | None) -> tuple[dict[str, Any], torch.cuda.Event | None]:
        """In the background thread: decode on the side stream and mark where the work ends."""
        if side is None:
            self.decode(batch, self.device)
            return batch, None
        with torch.cuda.device(self.device), torch.cuda.stream(side):
            self.decode(batch, self.device)
            done = torch.cuda.Event()
            done.record(side)
        return batch, done

    def _ready(self, future: Decoding) -> dict[str, Any]:
        """In the training thread: the decoded batch, safe to use on the current stream (raises the thread's error)."""
        batch, done = future.result()
        if done is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(done)
            for tensor in _device_tensors(batch):
                tensor.record_stream(stream)  # allocated on the side stream, read on this one
        return batch


def _done(result: tuple[dict[str, Any], None]) -> Decoding:
    future: Decoding = Future()
    future.set_result(result)
    return future


def _device_tensors(batch: dict[str, Any]) -> Iterator[torch.Tensor]:
    for value in batch.values():
        for tensor in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(tensor, torch.Tensor) and tensor.device.type == "cuda":
                yield tensor
