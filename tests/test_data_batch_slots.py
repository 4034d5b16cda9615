"""Batch slots: workers stack clips into shared memory mapped once; batches identical to the usual hand-over.

On a real packed frame store (JPEG frames of H.264 videos), real worker processes.
"""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_multigrid.data.batch_slots import BatchSlots, ChunkTask, InSlot, slot_bytes_for
from lightning_multigrid.data.dataset import TrainVideoDataset, collate_clips
from lightning_multigrid.data.loaders import ChunkedDataLoader, plan_slot_bytes
from lightning_multigrid.data.sampler import EpochShardSampler, ShortCycleBatchSampler
from lightning_multigrid.data.sources import load_manifest
from lightning_multigrid.data.tools.pack import pack_frames
from lightning_multigrid.grid import FixedGrid
from lightning_multigrid.schedule import GridShape, MultigridConfig, MultigridSchedule, build_schedule


@pytest.fixture(scope="module")
def store(synthetic_frames: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("slots") / "train.store"
    return pack_frames(load_manifest(synthetic_frames[0]), folder, crop_size=32, workers=1, progress=False).store


def schedule() -> MultigridSchedule:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_schedule(MultigridConfig(base=GridShape(2, 8, 32), sampling_rate=2, max_epochs=4))


def batch_sampler(dataset: TrainVideoDataset, plan: Any, epoch: int = 0) -> ShortCycleBatchSampler:
    return ShortCycleBatchSampler(EpochShardSampler(len(dataset), seed=3), plan, seed=3, start_epoch=epoch)


def reference(dataset: TrainVideoDataset, plan: Any, epoch: int = 0) -> list[dict[str, Any]]:
    """The batches as one process collates them: each clip decoded here, ``collate_clips``."""
    return [collate_clips([dataset[r] for r in batch]) for batch in batch_sampler(dataset, plan, epoch)]


def assert_same_batches(got: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    assert len(got) == len(expected)
    for ours, theirs in zip(got, expected):
        assert list(ours) == list(theirs)  # the same keys in the same order
        videos = ours["video"] if isinstance(ours["video"], list) else [ours["video"]]
        references = theirs["video"] if isinstance(theirs["video"], list) else [theirs["video"]]
        for video, ref in zip(videos, references, strict=True):
            assert video.dtype == ref.dtype == torch.uint8 and video.shape == ref.shape and torch.equal(video, ref)
        for key in ("label", "index"):
            assert ours[key].dtype == theirs[key].dtype and torch.equal(ours[key], theirs[key])
        assert ours["skipped"] == theirs["skipped"]


def count_slot_batches(loader: ChunkedDataLoader) -> list[int]:
    """The slots of the batches the loader copies out of one, in order (a batch whose clips the workers stacked there)."""
    assert loader._slots is not None
    through: list[int] = []
    join = loader._join

    def recording(pieces: list[Any], slot: int | None) -> Any:
        if any(isinstance(piece, dict) and isinstance(piece.get("video"), InSlot) for piece in pieces):
            through.append(slot)  # type: ignore[arg-type]
        return join(pieces, slot)

    loader._join = recording  # type: ignore[method-assign]
    return through


def test_store_batches_through_slots_are_bit_identical_at_every_grid(store: Path) -> None:
    dataset = TrainVideoDataset(store)
    plan = schedule()
    loader = ChunkedDataLoader(dataset, batch_sampler=batch_sampler(dataset, plan), min_chunk_size=1, num_workers=2,
                               collate_fn=collate_clips, persistent_workers=True)
    assert loader._slots is not None and loader._slots.slot_bytes == plan_slot_bytes(plan)
    through = count_slot_batches(loader)
    for epoch in (0, 1, 3):  # several grids; big batches cut in chunks, small ones one chunk a batch
        loader.batch_sampler.set_epoch(epoch)  # type: ignore[union-attr]
        got = list(loader)
        assert_same_batches(got, reference(dataset, plan, epoch))
        assert all(b["video"].is_contiguous() for b in got)
        assert len(through) == len(got)  # every batch came through a slot: the workers handed over no clip tensor
        through.clear()


def test_slowfast_pathways_through_slots(store: Path) -> None:
    dataset = TrainVideoDataset(store, slowfast_alpha=4)
    plan = FixedGrid(GridShape(4, 8, 32))
    loader = ChunkedDataLoader(dataset, batch_sampler=batch_sampler(dataset, plan), min_chunk_size=2, num_workers=2,
                               collate_fn=collate_clips, persistent_workers=True)
    through = count_slot_batches(loader)
    got = list(loader)
    assert [v.shape[2] for v in got[0]["video"]] == [2, 8] and len(through) == len(got)
    assert_same_batches(got, reference(dataset, plan))


@pytest.mark.parametrize(("slot_bytes", "persistent"), [(0, True), (None, False), (1000, True)])
def test_without_room_in_a_slot_batches_go_the_usual_way(store: Path, slot_bytes: int | None, persistent: bool) -> None:
    # No slots asked for; workers that do not persist (no slots: a dropped pass's workers may still write);
    # slots too small for a batch.
    dataset = TrainVideoDataset(store)
    plan = FixedGrid(GridShape(4, 8, 32))
    loader = ChunkedDataLoader(dataset, batch_sampler=batch_sampler(dataset, plan), min_chunk_size=2, num_workers=2,
                               collate_fn=collate_clips, slot_bytes=slot_bytes, persistent_workers=persistent)
    assert (loader._slots is None) == (slot_bytes != 1000)
    through = count_slot_batches(loader) if loader._slots is not None else []
    assert_same_batches(list(loader), reference(dataset, plan))
    assert not through


def test_more_batches_in_flight_than_slots(store: Path) -> None:
    dataset = TrainVideoDataset(store)
    plan = FixedGrid(GridShape(2, 8, 32))
    loader = ChunkedDataLoader(dataset, batch_sampler=batch_sampler(dataset, plan), num_workers=2, collate_fn=collate_clips,
                               persistent_workers=True)
    assert loader._slots is not None
    loader._slots.num_slots = 1  # batches beyond the one slot go the usual way, mixed in order
    through = count_slot_batches(loader)
    got = list(loader)
    assert_same_batches(got, reference(dataset, plan))
    assert 0 < len(through) < len(got)


def test_batch_slots_layout_and_bookkeeping() -> None:
    slots = BatchSlots(2, slot_bytes_for([(3, 2, 4)]))
    assert slots.acquire() is None  # nothing before the memory exists
    slots.create()
    first, second = slots.acquire(), slots.acquire()
    assert {first, second} == {0, 1} and slots.acquire() is None
    slots.release(first)  # type: ignore[arg-type]
    assert slots.acquire() == first
    clips = [torch.full((3, 2, 4, 4), k, dtype=torch.uint8) for k in range(3)]
    placed = slots.write(clips[1:], ChunkTask(["b", "c"], second, start=1, batch_size=3))
    assert placed is not None and placed.start == 1 and placed.num_clips == 2 and not placed.pathways
    (view,) = slots.views(placed)
    assert view.shape == (2, 3, 2, 4, 4) and torch.equal(view, torch.stack(clips[1:]))
    assert slots.write(clips, ChunkTask("abc", None, 0, 3)) is None  # the task has no slot
    assert slots.write([b"jpeg bytes"], ChunkTask("a", first, 0, 3)) is None  # not pixels (encoded clips)
    assert slots.write([torch.zeros(3, 9, 9, 9, dtype=torch.uint8)], ChunkTask("a", first, 0, 3)) is None  # too big
    odd = [torch.zeros(3, 2, 4, 4, dtype=torch.uint8), torch.zeros(3, 2, 5, 4, dtype=torch.uint8)]
    assert slots.write(odd, ChunkTask("ab", first, 0, 3)) is None  # shapes differ: collating says so
    with pytest.raises(ValueError, match="Clips of one batch must share a shape"):
        collate_clips([{"video": v, "label": 0, "index": 0, "skipped": ()} for v in odd])
    copy = pickle.loads(pickle.dumps(slots))  # what a spawned worker gets: the memory, no slot to hand out
    assert copy.acquire() is None and len(copy.buffers) == 2
    with pytest.raises(ValueError, match="`num_slots` and `slot_bytes` must be >= 1"):
        BatchSlots(0, 10)


def test_slot_bytes_cover_every_grid_of_the_plan() -> None:
    plan = schedule()
    grids = {g for start, _ in plan.epoch_spans() for g in plan.cycle_at(start)}
    largest = max(3 * g.batch_size * g.num_frames * g.crop_size**2 for g in grids)
    assert largest <= plan_slot_bytes(plan) < largest + 64
    # [slow, fast]: the slow pathway's ceil(T / alpha) frames besides.
    assert slot_bytes_for([(2, 8, 32)], slowfast_alpha=4) == 3 * 2 * (2 + 8) * 32**2


def test_a_slot_is_freed_when_its_batch_was_not_written_into_it(store: Path) -> None:
    # JPEG bytes for the device decode cannot be stacked into a slot: each batch still took one when it was cut.
    from lightning_multigrid.data.reader_settings import ReaderSettings

    dataset = TrainVideoDataset(store, ReaderSettings(frame_decode="device"))
    plan = schedule()
    loader = ChunkedDataLoader(dataset, batch_sampler=batch_sampler(dataset, plan), min_chunk_size=1, num_workers=2,
                               collate_fn=collate_clips, persistent_workers=True)
    assert loader._slots is not None and loader._stream is None
    for epoch in (0, 1, 3):
        loader.batch_sampler.set_epoch(epoch)  # type: ignore[union-attr]
        assert len(list(loader)) == len(reference(dataset, plan, epoch))
        # Every slot is free, or named by a batch cut ahead for the next epoch (its tasks are in flight).
        held = [cut.slot for cut in loader._stream.pending if cut.slot is not None]  # type: ignore[union-attr]
        assert sorted(loader._slots._free + held) == list(range(loader._slots.num_slots))


def test_no_slots_where_no_clip_is_stacked_into_one(store: Path) -> None:
    from lightning_multigrid.data.loaders import LoaderSettings, build_train_loader
    from lightning_multigrid.data.reader_settings import ReaderSettings

    plan, settings = schedule(), LoaderSettings(num_workers=2, persistent_workers=True)
    pixels, encoded = TrainVideoDataset(store), TrainVideoDataset(store, ReaderSettings(frame_decode="device"))
    built = {
        name: build_train_loader(dataset, plan, settings, epoch=0, rank=0, world_size=1, seed=0)
        for name, dataset in (("pixels", pixels), ("encoded", encoded))
    }
    assert built["pixels"]._slots is not None and built["encoded"]._slots is None  # type: ignore[attr-defined]
    # A collate function of the user's: the workers hand its batches over as it returns them.
    other = ChunkedDataLoader(pixels, batch_sampler=batch_sampler(pixels, plan), num_workers=2, persistent_workers=True,
                              collate_fn=lambda samples: collate_clips(samples))
    assert other._slots is None
