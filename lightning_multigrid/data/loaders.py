"""Every DataLoader the DataModule serves: training clips at a plan's grids, evaluation views.

No Lightning here: the builders take the rank and world size, the plan and the epoch, so they
work in a plain PyTorch loop too. :class:`CachedLoader` keeps one loader while what it was built
for (a :class:`LoaderKey`) holds, so persistent workers live on across epochs.

A DataLoader gives each batch to one worker. Multigrid's coarse batches are 8-16x larger than the
baseline's (e.g. 128 clips of 4 x 56 against 8 of 16 x 112): one worker then decodes 128 clips
while the batch is awaited, epochs hold 8-16x fewer batches than workers can overlap at their
start and end, and the first batch of every epoch takes a whole big batch of one worker's time.
:class:`ChunkedDataLoader` hands the workers chunks of each batch instead (no smaller than
``min_chunk_size`` clips, at most one per worker) and concatenates them in the main process, so
the training loop, Lightning included, still sees whole batches: ``len()`` counts them, and
``batch_sampler`` is the real batch sampler (Lightning can still swap in its
``DistributedSampler`` and re-create the loader from its arguments).

Two more things it does with persistent workers, so nothing waits between steps:

- **Batch slots** (:mod:`~lightning_multigrid.data.batch_slots`): the workers stack each batch's
  clips into shared memory mapped once, and the main process copies the batch out in one
  ``torch.cat``; no shared-memory file and no descriptor crosses per chunk (the main thread waited
  for each busy worker's GIL to receive one: a ceiling of a few hundred chunks a second).
- **Look-ahead across the epoch boundary** (:class:`TaskStream`): one DataLoader pass spans the
  epochs. While an epoch's last batches train, the workers already decode the next epoch's first
  ones, drawn from a copy of the batch sampler set to that epoch; the next pass serves them when
  its batch sampler draws exactly those batches (the same clip requests, hence the same pixels),
  and otherwise starts over from its first batch, as a DataLoader does at every epoch.

Example::

    loader = ChunkedDataLoader(dataset, batch_sampler=ShortCycleBatchSampler(sampler, schedule),
                               min_chunk_size=8, num_workers=8, collate_fn=collate_clips)
    for batch in loader:      # whole batches, e.g. 128 clips decoded by 8 workers in parallel
        ...
"""

from __future__ import annotations

import copy
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, SequentialSampler, get_worker_info

from lightning_multigrid._checks import check_bool, check_int
from lightning_multigrid._internals import shutdown_loader_workers
from lightning_multigrid.data.batch_slots import BatchSlots, ChunkTask, FetchedChunk, InSlot, slot_bytes_for
from lightning_multigrid.data.dataset import TrainVideoDataset, collate_clips
from lightning_multigrid.data.decoding.device import EncodedBatch
from lightning_multigrid.data.decoding.readers import returns_encoded
from lightning_multigrid.data.prefetch import DecodeAhead, Decoding
from lightning_multigrid.data.sampler import EpochShardSampler, ShortCycleBatchSampler
from lightning_multigrid.grid import GridPlan, GridShape

__all__ = [
    "CachedLoader",
    "ChunkedDataLoader",
    "CutBatch",
    "LoaderKey",
    "LoaderSettings",
    "SmallByValue",
    "TaskStream",
    "build_eval_loader",
    "build_train_loader",
    "chunk",
    "join_batches",
    "plan_slot_bytes",
]


@dataclass(frozen=True, slots=True)
class LoaderSettings:
    """How loaders run: worker processes, pinned memory, the training tail and chunking.

    No batch size: the base shape owns it. The plan's base batch is the smallest chunk of a chunked
    training batch; the evaluation loader is given its ``batch_size``.

    Raises:
        ValueError: naming a setting out of range.

    Attributes:
        num_workers: DataLoader worker processes per loader.
        pin_memory: pin host memory of batches.
        persistent_workers: keep workers alive between epochs (ignored with ``num_workers=0``).
        drop_last: drop the last, partial training batch of an epoch.
        chunk_batches: with several workers, cut each training batch into chunks decoded in
            parallel (:class:`ChunkedDataLoader`).
    """

    num_workers: int
    pin_memory: bool = False
    persistent_workers: bool = True
    drop_last: bool = False
    chunk_batches: bool = True

    def __post_init__(self) -> None:
        check_int("num_workers", self.num_workers, 0)
        for name in ("pin_memory", "persistent_workers", "drop_last", "chunk_batches"):
            check_bool(name, getattr(self, name))


class LoaderKey(NamedTuple):
    """What a cached loader was built for; a different key means a new loader."""

    cycle: tuple[GridShape, ...] | None  # None: serves every grid of the plan
    rank: int
    world_size: int
    resume: tuple[int, int] | None = None  # (epoch, iteration) a mid-epoch resume starts at


def build_train_loader(
    dataset: Dataset[Any],
    plan: GridPlan,
    settings: LoaderSettings,
    *,
    epoch: int,
    rank: int,
    world_size: int,
    seed: int,
    start_iteration: int = 0,
    decode_ahead: DecodeAhead | None = None,
) -> DataLoader[Any]:
    """Shuffled training clips of ``dataset`` at ``plan``'s grid of every iteration, from ``epoch`` on.

    Args:
        dataset: a dataset of clip requests (``TrainVideoDataset``) with a length.
        plan: the grids of every epoch.
        settings: worker and batch settings.
        epoch: the 0-based epoch the loader serves first.
        rank: 0-based rank of this process.
        world_size: number of ranks.
        seed: seed of the shuffle and of every clip's draws.
        start_iteration: iterations of ``epoch`` already trained (mid-epoch resume), skipped.
        decode_ahead: decode JPEG batches on the device in a background thread, ahead of the
            step (:mod:`~lightning_multigrid.data.prefetch`); ``None``: batches leave as the
            workers return them.
    """
    # Under Lightning this is built inside a *_dataloader hook, so Lightning can swap the inner
    # sampler for its DistributedSampler and keep the batch sampler's settings.
    sampler = EpochShardSampler(len(dataset), num_replicas=world_size, rank=rank, shuffle=True, seed=seed)  # type: ignore[arg-type]
    batch_sampler = ShortCycleBatchSampler(
        sampler, plan, drop_last=settings.drop_last, seed=seed, start_epoch=epoch, start_iteration=start_iteration
    )
    # Any worker: the batch slots spare the main process a descriptor hand-over per batch.
    if settings.num_workers > 0 or decode_ahead is not None:
        return ChunkedDataLoader(
            dataset,
            batch_sampler=batch_sampler,
            min_chunk_size=plan.base_shape.batch_size,
            num_workers=settings.num_workers,
            collate_fn=collate_clips,
            pin_memory=settings.pin_memory,
            persistent_workers=settings.persistent_workers and settings.num_workers > 0,
            chunk_batches=settings.chunk_batches,
            decode_ahead=decode_ahead,
            slot_bytes=0 if isinstance(dataset, TrainVideoDataset) and returns_encoded(dataset.reader) else None,  # JPEG bytes
        )
    return DataLoader(
        dataset,
        batch_sampler=batch_sampler,
        num_workers=settings.num_workers,
        collate_fn=collate_clips,
        pin_memory=settings.pin_memory,
        persistent_workers=settings.persistent_workers and settings.num_workers > 0,
    )


def build_eval_loader(
    dataset: Dataset[Any], settings: LoaderSettings, *, batch_size: int, rank: int, world_size: int
) -> DataLoader[Any]:
    """Evaluation views of ``dataset`` in order, ``batch_size`` per batch, split over ranks."""
    sampler: Sampler[int]
    if world_size > 1:
        # Pads by repeating a few views so every rank runs the same number of steps.
        sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=False)
    else:
        sampler = SequentialSampler(dataset)  # type: ignore[arg-type]
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=settings.num_workers,
        collate_fn=collate_clips,
        pin_memory=settings.pin_memory,
        persistent_workers=settings.persistent_workers and settings.num_workers > 0,
    )


class CachedLoader:
    """One training loader, kept while its :class:`LoaderKey` holds."""

    def __init__(self) -> None:
        self._key: LoaderKey | None = None
        self._loader: DataLoader[Any] | None = None

    def get(self, key: LoaderKey, epoch: int, build: Callable[[], DataLoader[Any]]) -> DataLoader[Any]:
        """The loader for ``key``, set to ``epoch``: the kept one if built for ``key``, else ``build()``."""
        if self._loader is not None and self._key == key:
            # Lightning sizes the epoch (len) before it calls set_epoch: set it now.
            batch_sampler = self._loader.batch_sampler
            assert isinstance(batch_sampler, ShortCycleBatchSampler)
            batch_sampler.set_epoch(epoch)
            return self._loader
        self.clear()  # let the old loader's workers go before new ones start
        self._loader = build()
        self._key = key
        return self._loader

    def clear(self) -> None:
        """Forget the kept loader (its workers stop when nothing else holds it)."""
        self._key = None
        self._loader = None

    def close(self) -> None:
        """Stop the kept loader's decode-ahead thread and its workers now, and forget it.

        At the end of a fit: the workers of a loader dropped without this linger until garbage
        collection, which may run in a worker the next fit forks, where shutting them down fails.
        """
        if isinstance(self._loader, ChunkedDataLoader):
            self._loader.close()
        if self._loader is not None:
            shutdown_loader_workers(self._loader)
        self.clear()


class CutBatch(NamedTuple):
    """A batch cut into worker tasks whose results the loader has not taken yet."""

    requests: list[Any]
    parts: int  # its chunks (tasks), whose results come back in order
    tag: int  # the pass it belongs to: the epoch (0 for another batch sampler)
    slot: int | None  # the batch slot its tasks name (None: none was free, or the loader has none)


class TaskStream:
    """The worker tasks of a loader's passes: batches cut into up to ``num_chunks`` chunks of at least
    ``min_chunk_size``, each a :class:`~lightning_multigrid.data.batch_slots.ChunkTask` naming the
    batch's slot in ``slots`` (when one is free) and the chunk's place in the batch.

    The DataLoader's iterator draws from it (in the main process, ahead of the results coming back
    in order) whenever it has room for a task. Each batch cut is queued in :attr:`pending` with its
    chunk count and its pass, so the loader knows how many results make the next batch and where a
    pass ends. The batches come from :meth:`start`'s iterable, which may run past the current pass
    into the next ones (the loader's look-ahead across the epoch boundary): the stream never runs
    dry while a later pass is known, so the workers keep busy through the boundary.
    """

    def __init__(self, num_chunks: int, min_chunk_size: int, slots: BatchSlots | None = None) -> None:
        if num_chunks < 1 or min_chunk_size < 1:
            raise ValueError(f"`num_chunks` and `min_chunk_size` must be >= 1, got {num_chunks} and {min_chunk_size}.")
        self.num_chunks = num_chunks
        self.min_chunk_size = min_chunk_size
        self.slots = slots
        self.pending: deque[CutBatch] = deque()
        self.dry = True  # no batch left to cut: the DataLoader's iterator stops asking until it is reset
        self._batches: Iterator[tuple[int, list[Any]]] = iter(())
        self._tasks: Iterator[ChunkTask] = iter(())  # the rest of the batch being cut

    def start(self, batches: Iterable[tuple[int, list[Any]]]) -> None:
        """Cut ``(tag, batch)`` pairs from now on, forgetting what was cut before (its tasks are dropped:
        call before the DataLoader's iterator is reset, which takes their results back first)."""
        self.pending.clear()
        self._batches = iter(batches)
        self._tasks = iter(())
        self.dry = False
        if self.slots is not None:
            self.slots.release_all()

    def follow(self, batches: Iterator[tuple[int, list[Any]]]) -> None:
        """Cut ``batches`` next, keeping what is pending (it was checked to be their predecessors)."""
        self._batches = batches

    def __iter__(self) -> TaskStream:
        return self

    def __next__(self) -> ChunkTask:
        task = next(self._tasks, None)
        if task is not None:
            return task
        try:
            tag, batch = next(self._batches)
        except StopIteration:
            self.dry = True
            raise
        chunks = chunk(batch, self.num_chunks, self.min_chunk_size)
        slot = self.slots.acquire() if self.slots is not None else None
        starts = itertools.accumulate((len(c) for c in chunks[:-1]), initial=0)
        self._tasks = iter([ChunkTask(part, slot, start, len(batch)) for part, start in zip(chunks, starts)])
        self.pending.append(CutBatch(batch, len(chunks), tag, slot))
        return next(self._tasks)


def chunk(batch: list[Any], num_chunks: int, min_chunk_size: int) -> list[list[Any]]:
    """``batch`` cut into ``min(num_chunks, len // min_chunk_size)`` (at least 1) near-equal consecutive chunks.

    Example::

        chunk(list(range(10)), num_chunks=3, min_chunk_size=2)   # [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    """
    parts = max(1, min(num_chunks, len(batch) // min_chunk_size))
    size, extra = divmod(len(batch), parts)
    chunks, start = [], 0
    for k in range(parts):
        end = start + size + (k < extra)
        chunks.append(batch[start:end])
        start = end
    return chunks


class ChunkedDataLoader(DataLoader):
    """A DataLoader whose workers decode chunks of each batch; it yields whole, joined batches,
    JPEG batches decoded on the device ahead of the step when ``decode_ahead`` is given.

    Args:
        dataset: the dataset, indexed by the batch sampler's items.
        batch_sampler: yields whole batches (e.g. ``ShortCycleBatchSampler``).
        min_chunk_size: no chunk below this many clips (a few clips per worker round trip keep
            the inter-process overhead small; the base batch size is a good value).
        num_workers: worker processes; with 0 or 1 batches are not cut.
        collate_fn: collates a chunk; chunks are joined with :func:`join_batches`. Wrapped in
            :class:`SmallByValue`, so a chunk's labels and indices come back from the worker by value.
        pin_memory: pin batches (the joined batch is pinned again).
        persistent_workers: keep workers between epochs.
        batch_size: as ``DataLoader``; must stay 1 with a ``batch_sampler`` (here so Lightning
            can re-create the loader from its arguments).
        shuffle: as ``DataLoader``, must stay unset.
        sampler: as ``DataLoader``, must stay unset.
        drop_last: as ``DataLoader``, must stay ``False``.
        chunk_batches: cut batches into chunks (``False``: one worker per batch, as a DataLoader).
        decode_ahead: decode each batch on the device in a background thread while the previous
            ones are trained on (:class:`~lightning_multigrid.data.prefetch.DecodeAhead`).
        slot_bytes: bytes of each batch slot (:mod:`~lightning_multigrid.data.batch_slots`: shared
            memory the workers stack ``collate_clips`` batches into, copied out once per batch);
            ``None``: the largest batch of a ``ShortCycleBatchSampler``'s plan (RGB uint8 clips),
            no slots for another batch sampler; ``0``: no slots.

    Raises:
        ValueError: when ``min_chunk_size`` < 1.
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        batch_sampler: Iterable[list[Any]],
        min_chunk_size: int = 1,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        drop_last: bool = False,
        chunk_batches: bool = True,
        decode_ahead: DecodeAhead | None = None,
        slot_bytes: int | None = None,
    ) -> None:
        if min_chunk_size < 1:
            raise ValueError(f"`min_chunk_size` must be >= 1, got {min_chunk_size!r}.")
        if isinstance(collate_fn, SmallByValue):
            collate_fn = collate_fn.collate_fn  # Lightning re-creates the loader with the wrapper: not its slots
        if collate_fn is not None:
            collate_fn = SmallByValue(collate_fn)
        super().__init__(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            drop_last=drop_last,
            persistent_workers=persistent_workers,
        )
        self.min_chunk_size = min_chunk_size
        self.chunk_batches = chunk_batches
        self.decode_ahead = decode_ahead
        self.slot_bytes = slot_bytes
        self._slots = self._batch_slots(slot_bytes)
        if isinstance(self.collate_fn, SmallByValue):
            self.collate_fn.slots = self._slots
        self._stream: TaskStream | None = None
        self._running: Any = None  # the DataLoader's iterator the passes draw from
        self._pass: Iterator[Any] | None = None  # the running pass over the batches, when decoding ahead
        self._carried: CarriedBatches | None = None  # the next pass's first batches, decoding since this pass's end

    def _batch_slots(self, slot_bytes: int | None) -> BatchSlots | None:
        """The slots (memory allocated when the workers start): batches in flight at most, plus the one
        being cut and the one being joined."""
        if slot_bytes is None and isinstance(self.batch_sampler, ShortCycleBatchSampler):
            slot_bytes = plan_slot_bytes(self.batch_sampler.plan, getattr(self.dataset, "slowfast_alpha", None))
        # Persistent workers only: their iterator takes back every task of a pass before the next
        # pass cuts one, so no worker still writes into a slot handed out again. Only `collate_clips` fills slots.
        collate = self.collate_fn
        if not slot_bytes or self.num_workers < 1 or not self.persistent_workers or not (
            isinstance(collate, SmallByValue) and collate.collate_fn is collate_clips
        ):
            return None
        return BatchSlots(self.prefetch_factor * self.num_workers + 2, slot_bytes)  # type: ignore[operator]

    @property
    def _index_sampler(self) -> Any:
        # What the DataLoader's iterator draws worker tasks from (``batch_sampler`` by default);
        # one wrapper per loader, since a persistent workers' iterator keeps the one it first got.
        if self.num_workers < 1:
            return self.batch_sampler
        if self._stream is None:
            num_chunks = self.num_workers if self.chunk_batches else 1
            self._stream = TaskStream(num_chunks, self.min_chunk_size, self._slots)
        return self._stream

    def _get_iterator(self) -> Any:
        # The workers start here: the slots' memory must exist before, so they inherit it.
        if self._slots is not None:
            self._slots.create()
        return super()._get_iterator()

    def __len__(self) -> int:
        return len(self.batch_sampler)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        # A new pass (next epoch, or a reset) first ends the last one's decode thread: the
        # persistent workers' iterator is shared between passes.
        carried, self._carried = self._carried, None
        self.close()
        if self.decode_ahead is None:
            return self._whole_batches()
        if self.num_workers < 1:
            self._pass = self.decode_ahead.iterate(super().__iter__())
            return self._pass
        # Opened now, not at the first batch: whether the batch decoded since the last pass ended is
        # this pass's first decides what the decode thread starts with.
        stream, tag, iterator, started = self._open_pass(carried)
        self._pass = self.decode_ahead.iterate(self._host_batches(stream, tag, iterator, carry=True), started)
        return self._pass

    def close(self) -> None:
        """End the running pass's decode-ahead thread (no-op without one): at teardown, or when abandoned."""
        self._carried = None
        if self._pass is not None:
            self._pass.close()  # type: ignore[attr-defined]  # a generator
            self._pass = None

    def _whole_batches(self) -> Iterator[Any]:
        if self.num_workers < 1:
            yield from super().__iter__()
            return
        stream, tag, iterator, _ = self._open_pass(None)
        yield from self._host_batches(stream, tag, iterator, carry=False)

    def _open_pass(self, carried: CarriedBatches | None) -> tuple[TaskStream, int, Any, list[Decoding]]:
        """The pass's stream, tag and DataLoader iterator: the running one when what was cut ahead (and
        ``carried``, the batches decoded ahead) is this pass's start, else a restarted one."""
        stream = self._index_sampler
        tag = self._pass_tag()
        if self._carry_on(stream, tag, carried):
            return stream, tag, self._running, carried.decodings if carried is not None else []
        return stream, tag, self._restart(stream, tag), []

    def _host_batches(self, stream: TaskStream, tag: int, iterator: Any, carry: bool) -> Iterator[Any]:
        """The pass's batches from the workers; with ``carry``, then the next pass's first batches are
        started decoding (:class:`CarriedBatches`) while this pass's last ones train."""
        # Pending is empty only once nothing is left to cut: the iterator asks for a task after every result.
        while stream.pending and stream.pending[0].tag == tag:
            cut = stream.pending[0]
            pieces = [next(iterator) for _ in range(cut.parts)]
            stream.pending.popleft()
            yield self._join(pieces, cut.slot)
        if not stream.pending:
            next(iterator, None)  # the DataLoader ends its pass (workers that do not persist stop now)
        elif carry and self._running is iterator and stream.pending[0].tag == tag + 1:
            assert self.decode_ahead is not None
            # As many as the next pass needs before its first step: Lightning fetches one batch ahead of
            # the step, and the decode thread runs `depth` batches ahead of that.
            cuts: list[CutBatch] = []
            while stream.pending and stream.pending[0].tag == tag + 1 and len(cuts) < self.decode_ahead.depth + 1:
                cuts.append(stream.pending.popleft())
            batches = [self._join([next(iterator) for _ in range(cut.parts)], cut.slot) for cut in cuts]
            self._carried = CarriedBatches(tag + 1, [cut.requests for cut in cuts], self.decode_ahead.start(batches))

    def _restart(self, stream: TaskStream, tag: int) -> Any:
        """Start the pass from its first batch: the workers' tasks still in flight are taken back first."""
        stream.start(_batches_from(self.batch_sampler, tag, look_ahead=self.persistent_workers))  # type: ignore[arg-type]
        iterator = super().__iter__()
        # Kept for the next pass only when the workers persist (else the pass's iterator stops them when dropped).
        self._running = iterator if self.persistent_workers else None
        return iterator

    def _pass_tag(self) -> int:
        """The epoch of the pass about to start; 0 for a batch sampler without epochs, which never looks ahead:
        whether the batches cut before a pass starts are its own is told by their clips (:meth:`_carry_on`)."""
        return self.batch_sampler.epoch if isinstance(self.batch_sampler, ShortCycleBatchSampler) else 0

    def _carry_on(self, stream: TaskStream, tag: int, carried: CarriedBatches | None = None) -> bool:
        """Whether the tasks already cut ahead (the look-ahead; ``carried`` first, taken from them) are this
        pass's first batches: then the pass takes their results, and the stream cuts on from after them."""
        if stream.dry or self._running is None or self._running is not self._iterator:
            return False  # nothing ahead, or the workers were stopped (teardown)
        if carried is not None and carried.tag != tag:
            return False  # decoded ahead for another epoch than this one
        batches = _batches_from(self.batch_sampler, tag, look_ahead=True)  # type: ignore[arg-type]
        expected = (carried.requests if carried is not None else []) + [cut.requests for cut in stream.pending]
        ahead = list(itertools.islice(batches, len(expected)))
        if [batch for _, batch in ahead] != expected:
            return False  # an abandoned epoch's rest, or another epoch than looked ahead to
        stream.follow(batches)
        return True

    def _join(self, pieces: list[Any], slot: int | None) -> Any:
        """One batch from its chunks: clips in its ``slot`` are copied out (one ``torch.cat``); the slot is freed,
        also when no chunk was written into it (JPEG bytes, clips that did not fit): every task is back."""
        try:
            if not any(isinstance(p, dict) and isinstance(p.get("video"), InSlot) for p in pieces):
                return join_batches(pieces, pin_memory=self.pin_memory) if len(pieces) > 1 else pieces[0]
            assert self._slots is not None
            return join_batches([_out_of_slot(p, self._slots) for p in pieces], pin_memory=self.pin_memory)
        finally:
            if slot is not None:
                assert self._slots is not None
                self._slots.release(slot)


class CarriedBatches(NamedTuple):
    """The next pass's first batches, taken from the look-ahead and decoding on the device while the pass
    before it ends: the next pass starts with them when it draws exactly their clips (else they are dropped)."""

    tag: int
    requests: list[list[Any]]
    decodings: list[Decoding]


def _batches_from(batch_sampler: Iterable[list[Any]], tag: int, look_ahead: bool) -> Iterator[tuple[int, list[Any]]]:
    """A pass's batches tagged ``tag``, then with ``look_ahead`` (and a ``ShortCycleBatchSampler``) the next
    epochs', as far as the workers get ahead: what keeps them busy across the epoch boundary. (A function,
    not a method: the loader holds the stream that holds this generator.)"""
    yield from ((tag, batch) for batch in batch_sampler)
    if look_ahead and isinstance(batch_sampler, ShortCycleBatchSampler):
        yield from _later_epochs(batch_sampler, tag + 1)


def _later_epochs(batch_sampler: ShortCycleBatchSampler, first_epoch: int) -> Iterator[tuple[int, list[Any]]]:
    """The batches of epochs ``first_epoch, first_epoch + 1, ...`` as ``batch_sampler`` will draw them, from
    copies set to those epochs (the sampler itself is left as it is)."""
    for epoch in itertools.count(first_epoch):
        ahead = copy.copy(batch_sampler)
        ahead.sampler = copy.copy(batch_sampler.sampler)
        empty = True
        try:
            ahead.set_epoch(epoch)
            for batch in ahead:
                empty = False
                yield epoch, batch
        except Exception:  # noqa: BLE001 -- a plan that does not reach past its last epoch: no look-ahead there
            return
        if empty:
            return


def _out_of_slot(piece: dict[str, Any], slots: BatchSlots) -> dict[str, Any]:
    """A chunk whose clips lie in a slot, with views of them there instead (copied by the join)."""
    placed = piece["video"]
    if not isinstance(placed, InSlot):
        return piece
    views = slots.views(placed)
    return {**piece, "video": views if placed.pathways else views[0]}


def plan_slot_bytes(plan: GridPlan, slowfast_alpha: int | None = None) -> int:
    """Bytes of the largest batch of RGB uint8 clips over every grid ``plan`` serves (its epoch spans' cycles)."""
    grids = {grid for start, _ in plan.epoch_spans() for grid in plan.cycle_at(start)}
    return slot_bytes_for(((g.batch_size, g.num_frames, g.crop_size) for g in grids), slowfast_alpha=slowfast_alpha)


def join_batches(batches: list[dict[str, Any]], pin_memory: bool = False) -> dict[str, Any]:
    """Concatenate collated batches (``collate_clips`` dicts) along the batch dimension.

    Tensors are concatenated (video, its pathways, labels, indices, views), lists of paths
    chained, JPEG clips gathered into one :class:`EncodedBatch`. Always new tensors, also for one batch.
    """
    joined: dict[str, Any] = {}
    for key, first in batches[0].items():
        values = [b[key] for b in batches]
        if isinstance(first, torch.Tensor):
            joined[key] = _cat(values, pin_memory)
        elif isinstance(first, EncodedBatch):
            joined[key] = EncodedBatch([clip for value in values for clip in value.clips])
        elif isinstance(first, list) and first and isinstance(first[0], torch.Tensor):
            joined[key] = [_cat([v[p] for v in values], pin_memory) for p in range(len(first))]
        elif isinstance(first, list):
            joined[key] = [item for value in values for item in value]
        else:
            raise TypeError(f"`join_batches` cannot join batch key {key!r} of type {type(first).__name__}.")
    return joined


def _cat(tensors: list[torch.Tensor], pin_memory: bool) -> torch.Tensor:
    if not pin_memory or not torch.cuda.is_available():
        return torch.cat(tensors)
    shape = (sum(t.shape[0] for t in tensors), *tensors[0].shape[1:])
    out = torch.empty(shape, dtype=tensors[0].dtype, pin_memory=True)
    return torch.cat(tensors, out=out)


# Tensors a worker hands back by value, pickled with the batch, up to this size. torch sends every
# tensor of a batch through a shared-memory file whose descriptor goes over a socket: about 0.2-0.3 ms
# of the main process's CPU per tensor (and the worker's), so a chunk's labels and indices cost
# more than its video; multigrid's coarse batches arrive in several chunks each.
_BY_VALUE_BYTES = 1 << 16
_NUMPY_DTYPES = frozenset({
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.float32, torch.float64,
})


class SmallByValue:
    """A ``collate_fn`` whose small tensors leave a DataLoader worker by value.

    Wraps ``collate_fn``: in a worker process, the tensors of the batch (a dict) of at most 64 KiB
    (labels, indices, views) are pickled as bytes with the batch instead of each getting a
    shared-memory file; the main process receives the same plain tensors (dtype, shape, values).
    Outside a worker (``num_workers=0``) the batch is returned untouched.

    Args:
        collate_fn: the collate function wrapped.
    """

    def __init__(self, collate_fn: Callable[[list[Any]], Any]) -> None:
        self.collate_fn = collate_fn
        self.slots: BatchSlots | None = None  # set by the loader: where ``collate_clips`` batches go

    def __call__(self, samples: list[Any] | FetchedChunk) -> Any:
        batch = self._collate(samples)
        if not isinstance(batch, dict) or get_worker_info() is None:
            return batch
        return {key: _ByValue(value) if _small(value) else value for key, value in batch.items()}

    def _collate(self, samples: list[Any] | FetchedChunk) -> Any:
        if not isinstance(samples, FetchedChunk):
            return self.collate_fn(samples)
        if self.slots is not None and get_worker_info() is not None:  # slots come with `collate_clips` only
            placed = self.slots.write([s["video"] for s in samples.samples], samples.task)
            if placed is not None:
                return collate_clips(samples.samples, video=placed)
        return self.collate_fn(samples.samples)


def _small(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dtype in _NUMPY_DTYPES
        and not value.requires_grad and value.numel() * value.element_size() <= _BY_VALUE_BYTES
    )


class _ByValue:
    """A small CPU tensor that unpickles as a plain tensor with the same dtype, shape and values."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def __reduce__(self) -> tuple[Any, ...]:
        # numpy arrays pickle their bytes; from_numpy gives the tensor back without a copy.
        return (torch.from_numpy, (self.tensor.numpy(),))
