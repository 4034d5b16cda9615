"""ChunkedDataLoader: big batches cut into worker chunks and joined back, on real H.264 files."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

from lightning_multigrid.data.dataset import TrainVideoDataset, collate_clips
from lightning_multigrid.data.loaders import ChunkedDataLoader, SmallByValue, TaskStream, chunk, join_batches
from lightning_multigrid.data.prefetch import DecodeAhead
from lightning_multigrid.data.reader_settings import ReaderSettings
from lightning_multigrid.data.sampler import EpochShardSampler, ShortCycleBatchSampler
from lightning_multigrid.data.synthetic import SyntheticDataset
from lightning_multigrid.data.transfer import BatchTransfer
from lightning_multigrid.schedule import GridShape, MultigridConfig, MultigridSchedule, build_schedule


def schedule() -> MultigridSchedule:
    config = MultigridConfig(base=GridShape(1, 8, 32), sampling_rate=2, max_epochs=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_schedule(config)


@pytest.mark.parametrize(
    ("size", "num_chunks", "min_size", "expected"),
    [
        (10, 3, 2, [4, 3, 3]),  # 10 = 4 + 3 + 3: near-equal, the first ones one larger
        (10, 3, 4, [5, 5]),  # 10 // 4 = 2 chunks of at least 4
        (3, 8, 1, [1, 1, 1]),  # never more chunks than clips
        (5, 8, 8, [5]),  # below the minimum: one chunk
        (128, 14, 8, [10] * 2 + [9] * 12),
    ],
)
def test_chunk_sizes(size: int, num_chunks: int, min_size: int, expected: list[int]) -> None:
    chunks = chunk(list(range(size)), num_chunks, min_size)
    assert [len(c) for c in chunks] == expected
    assert [x for c in chunks for x in c] == list(range(size))  # consecutive, nothing lost


def test_the_task_stream_cuts_batches_and_queues_them() -> None:
    stream = TaskStream(num_chunks=2, min_chunk_size=1)
    assert stream.dry and list(stream) == []
    stream.start([(0, [0, 1, 2, 3]), (0, [4]), (1, [5, 6])])
    tasks = list(stream)
    assert tasks == [[0, 1], [2, 3], [4], [5], [6]] and stream.dry
    assert [(t.start, t.batch_size, t.slot) for t in tasks] == [(0, 4, None), (2, 4, None), (0, 1, None), (0, 2, None), (1, 2, None)]
    assert [(c.requests, c.parts, c.tag) for c in stream.pending] == [([0, 1, 2, 3], 2, 0), ([4], 1, 0), ([5, 6], 2, 1)]
    with pytest.raises(ValueError, match="`num_chunks` and `min_chunk_size` must be >= 1"):
        TaskStream(num_chunks=0, min_chunk_size=1)


def make_batch_sampler(dataset: TrainVideoDataset, epoch: int = 0, sampler: Any = None) -> ShortCycleBatchSampler:
    sampler = sampler or EpochShardSampler(len(dataset), seed=5)
    batch_sampler = ShortCycleBatchSampler(sampler, schedule(), seed=5)
    batch_sampler.set_epoch(epoch)
    return batch_sampler


def test_same_batches_as_a_plain_loader_across_epochs(synthetic_dataset: SyntheticDataset) -> None:
    dataset = TrainVideoDataset(synthetic_dataset.train_manifest, flip=False)
    batch_sampler = make_batch_sampler(dataset)
    chunked = ChunkedDataLoader(
        dataset, batch_sampler=batch_sampler, min_chunk_size=2, num_workers=2, collate_fn=collate_clips,
        persistent_workers=True,
    )
    assert isinstance(chunked.batch_sampler, ShortCycleBatchSampler)  # what Lightning reads
    plain = DataLoader(dataset, batch_sampler=make_batch_sampler(dataset), collate_fn=collate_clips)
    for epoch in (0, 1):
        batch_sampler.set_epoch(epoch)
        plain.batch_sampler.set_epoch(epoch)  # type: ignore[union-attr]
        expected = list(plain)
        got = list(chunked)
        assert len(chunked) == len(plain) == len(got) == len(expected)
        assert max(b["video"].shape[0] for b in got) >= 4  # some batches were cut in two
        for ours, theirs in zip(got, expected):
            assert torch.equal(ours["video"], theirs["video"]) and torch.equal(ours["index"], theirs["index"])
            assert torch.equal(ours["label"], theirs["label"]) and ours["skipped"] == theirs["skipped"]


def test_an_abandoned_epoch_does_not_mix_the_next(synthetic_dataset: SyntheticDataset) -> None:
    dataset = TrainVideoDataset(synthetic_dataset.train_manifest, flip=False)
    loader = ChunkedDataLoader(
        dataset, batch_sampler=make_batch_sampler(dataset), min_chunk_size=1, num_workers=2,
        collate_fn=collate_clips, persistent_workers=True,
    )
    for _batch in loader:
        break  # as limit_train_batches does
    full = [b["index"].tolist() for b in loader]
    reference = DataLoader(dataset, batch_sampler=make_batch_sampler(dataset), collate_fn=collate_clips)
    assert full == [b["index"].tolist() for b in reference]


class IndexClips(torch.utils.data.Dataset[dict[str, Any]]):
    """Clips of zeros that carry their index: what the loader does with batches, whatever the clips."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"video": torch.zeros(3, 2, 4, 4, dtype=torch.uint8), "label": 0, "index": index, "skipped": ()}


def test_a_pass_abandoned_before_its_first_batch_leaves_the_next_whole() -> None:
    # A batch sampler without epochs, decoding ahead: the pass opens at `iter()` and cuts its first batches.
    # The next pass draws the same clips first, so it takes them, and every batch after (it once yielded none).
    batches = [[start, start + 1] for start in range(0, 16, 2)]
    loader = ChunkedDataLoader(
        IndexClips(), batch_sampler=batches, min_chunk_size=2, num_workers=1, collate_fn=collate_clips,
        persistent_workers=True, decode_ahead=DecodeAhead(BatchTransfer().decode, torch.device("cpu")),
    )
    iter(loader)  # abandoned before its first batch
    for _ in range(2):
        assert [b["index"].tolist() for b in loader] == batches
    loader.close()


def test_lightning_re_creates_it_with_its_sampler(synthetic_dataset: SyntheticDataset) -> None:
    from lightning_fabric.utilities.data import _replace_dunder_methods

    from lightning_multigrid._lightning import submodule

    _update_dataloader = submodule("utilities.data")._update_dataloader

    dataset = TrainVideoDataset(synthetic_dataset.train_manifest, flip=False)
    with _replace_dunder_methods(DataLoader, "dataset"), _replace_dunder_methods(BatchSampler):
        loader = ChunkedDataLoader(dataset, batch_sampler=make_batch_sampler(dataset), min_chunk_size=2,
                                   num_workers=2, collate_fn=collate_clips)
    injected: DistributedSampler[int] = DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=True, seed=0)
    updated = _update_dataloader(loader, injected)
    assert isinstance(updated, ChunkedDataLoader) and updated.min_chunk_size == 2 and updated.num_workers == 2
    assert updated.batch_sampler.sampler is injected  # type: ignore[union-attr]
    assert len(list(updated)) == len(updated)


def test_join_batches_pathways_views_and_refusals() -> None:
    parts = [
        {"video": [torch.zeros(2, 3, 1), torch.zeros(2, 3, 4)], "label": torch.tensor([0, 1]), "skipped": ["a"],
         "view": torch.tensor([0, 1])},
        {"video": [torch.ones(1, 3, 1), torch.ones(1, 3, 4)], "label": torch.tensor([2]), "skipped": [],
         "view": torch.tensor([2])},
    ]
    joined = join_batches(parts)
    assert [p.shape for p in joined["video"]] == [(3, 3, 1), (3, 3, 4)]
    assert joined["label"].tolist() == [0, 1, 2] and joined["view"].tolist() == [0, 1, 2]
    assert joined["skipped"] == ["a"]
    with pytest.raises(TypeError, match="cannot join batch key 'x'"):
        join_batches([{"x": 1.0}, {"x": 2.0}])


def test_small_tensors_come_back_by_value_as_the_same_tensors(synthetic_dataset: SyntheticDataset) -> None:
    # In the main process the wrapper changes nothing (num_workers=0 hands the batch over as it is).
    samples = [{"video": torch.zeros(3, 2, 4, 4, dtype=torch.uint8), "label": i, "index": i, "skipped": ()} for i in (3, 5)]
    assert SmallByValue(collate_clips)(samples).keys() == collate_clips(samples).keys()
    assert isinstance(SmallByValue(collate_clips)(samples)["label"], torch.Tensor)
    # Through a real worker: plain tensors of the same dtype, shape and values as the plain loader's,
    # the video (above the by-value limit) still through shared memory.
    dataset = TrainVideoDataset(synthetic_dataset.train_manifest, flip=False)
    chunked = ChunkedDataLoader(dataset, batch_sampler=make_batch_sampler(dataset), min_chunk_size=1, num_workers=2,
                                collate_fn=collate_clips)
    assert isinstance(chunked.collate_fn, SmallByValue)
    re_created = ChunkedDataLoader(dataset, batch_sampler=make_batch_sampler(dataset), num_workers=2, collate_fn=chunked.collate_fn)
    assert re_created.collate_fn.collate_fn is collate_clips  # type: ignore[union-attr]  # not wrapped twice
    assert re_created.collate_fn is not chunked.collate_fn  # its own wrapper, for its own slots
    plain = DataLoader(dataset, batch_sampler=make_batch_sampler(dataset), collate_fn=collate_clips)
    for ours, theirs in zip(chunked, plain, strict=True):
        for key in ("label", "index"):
            assert type(ours[key]) is torch.Tensor and ours[key].dtype == theirs[key].dtype == torch.int64
            assert torch.equal(ours[key], theirs[key])
        assert torch.equal(ours["video"], theirs["video"])


def test_by_value_pickling_keeps_dtype_shape_and_values() -> None:
    import io
    import pickle
    from multiprocessing.reduction import ForkingPickler

    from lightning_multigrid.data.loaders import _ByValue, _small

    tensors = [torch.tensor([[0.0, 1.0], [1.0, 0.0]]), torch.arange(5, dtype=torch.int64)[::2], torch.tensor([True])]
    buffer = io.BytesIO()
    ForkingPickler(buffer, pickle.HIGHEST_PROTOCOL).dump([_ByValue(t) for t in tensors])
    for before, after in zip(tensors, pickle.loads(buffer.getvalue()), strict=True):
        assert type(after) is torch.Tensor and after.dtype == before.dtype and torch.equal(after, before)
    assert _small(torch.zeros(1 << 14)) and not _small(torch.zeros((1 << 14) + 1))  # up to 64 KiB by value
    assert not _small(torch.zeros(2, dtype=torch.bfloat16))  # no numpy dtype


def test_the_next_epoch_is_decoded_ahead_and_served_unchanged(synthetic_dataset: SyntheticDataset) -> None:
    dataset = TrainVideoDataset(synthetic_dataset.train_manifest, flip=False)
    batch_sampler = make_batch_sampler(dataset)
    loader = ChunkedDataLoader(dataset, batch_sampler=batch_sampler, min_chunk_size=1, num_workers=2,
                               collate_fn=collate_clips, persistent_workers=True)
    stream = loader._index_sampler
    starts: list[int] = []
    start = stream.start
    stream.start = lambda batches: (starts.append(batch_sampler.epoch), start(batches))[1]  # type: ignore[method-assign]
    plain = DataLoader(dataset, batch_sampler=make_batch_sampler(dataset), collate_fn=collate_clips)
    for epoch in (0, 1, 2, 5, 6):  # 5: not the epoch looked ahead to
        batch_sampler.set_epoch(epoch)
        plain.batch_sampler.set_epoch(epoch)  # type: ignore[union-attr]
        expected = list(plain)
        got = list(loader)
        assert [b["index"].tolist() for b in got] == [b["index"].tolist() for b in expected]
        for ours, theirs in zip(got, expected, strict=True):
            assert torch.equal(ours["video"], theirs["video"]) and torch.equal(ours["label"], theirs["label"])
        # Before the next epoch starts, its first batches are already with the workers.
        assert stream.pending and stream.pending[0].tag == epoch + 1
    assert starts == [0, 5]  # the pass started over only where the epoch was not the one looked ahead to
    # A pass abandoned after one batch: the next pass starts over, at its first batch.
    next(iter(loader))
    assert [b["index"].tolist() for b in loader] == [b["index"].tolist() for b in list(plain)]
    assert starts == [0, 5, 6, 6]


def test_the_next_epochs_first_batch_is_decoded_on_the_device_while_an_epoch_ends(
    synthetic_frames: tuple[Path, Path],
) -> None:
    dataset = TrainVideoDataset(synthetic_frames[0], ReaderSettings(frame_decode="device"), flip=False)
    transfer, cpu = BatchTransfer(), torch.device("cpu")
    batch_sampler = make_batch_sampler(dataset)
    loader = ChunkedDataLoader(dataset, batch_sampler=batch_sampler, num_workers=2, collate_fn=collate_clips,
                               persistent_workers=True, decode_ahead=DecodeAhead(transfer.decode, cpu))
    plain = DataLoader(dataset, batch_sampler=make_batch_sampler(dataset), collate_fn=collate_clips)
    carried = None
    for epoch in (0, 1, 2, 5):  # 5: not the epoch decoded ahead to (its batch is dropped, the pass starts over)
        batch_sampler.set_epoch(epoch)
        plain.batch_sampler.set_epoch(epoch)  # type: ignore[union-attr]
        expected = list(plain)
        for batch in expected:
            transfer.decode(batch, cpu)
        got = list(loader)
        if carried is not None and carried.tag == epoch:  # the pass began with the batches decoded ahead
            assert 1 <= len(carried.decodings) <= 2  # up to the decode depth plus the batch Lightning fetches ahead
            assert all(got[k] is decoding.result()[0] for k, decoding in enumerate(carried.decodings))
        assert [b["index"].tolist() for b in got] == [b["index"].tolist() for b in expected]
        for ours, theirs in zip(got, expected, strict=True):
            assert torch.equal(ours["video"], theirs["video"]) and torch.equal(ours["label"], theirs["label"])
        carried = loader._carried
        assert carried is not None and carried.tag == epoch + 1  # started while this epoch's last batches trained
    loader.close()
    assert loader._carried is None
