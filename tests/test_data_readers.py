"""The ClipReader door: the datasets reach pixels only through a reader; the in-memory reader is one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_multigrid.data import ClipRequest, EvalVideoDataset, TrainVideoDataset
from lightning_multigrid.data.clip_params import ClipParams
from lightning_multigrid.data.decoding.errors import VideoDecodeError
from lightning_multigrid.data.decoding.metadata import VideoMetadata
from lightning_multigrid.data.decoding.readers import (
    ClipReader,
    FrameFolderReader,
    InMemoryReader,
    VideoFileReader,
    returns_encoded,
)
from lightning_multigrid.data.manifests.entries import VideoEntry
from lightning_multigrid.data.sources import load_manifest
from lightning_multigrid.data.synthetic import SyntheticDataset
from lightning_multigrid.grid import EvalViews, GridShape

from conftest import VideoFactory


def request(index: int, seed: int) -> ClipRequest:
    return ClipRequest(index, num_frames=4, crop_size=32, sampling_rate_range=(1.0, 3.0), scale_range=(40, 48), seed=seed)


class RecordingReader:
    """Passes through to a real reader and records what the dataset asked of it."""

    def __init__(self, inner: ClipReader) -> None:
        self.inner = inner
        self.reads: list[tuple[str, ClipParams]] = []

    def source(self, entry: VideoEntry) -> VideoMetadata:
        return self.inner.source(entry)  # type: ignore[return-value]

    def read(self, entry: VideoEntry, params: ClipParams) -> torch.Tensor:
        self.reads.append((entry.path, params))
        return self.inner.read(entry, params)  # type: ignore[return-value]


def test_a_reader_gets_the_entry_and_the_drawn_params_of_each_clip(synthetic_dataset: SyntheticDataset) -> None:
    manifest = load_manifest(synthetic_dataset.train_manifest)
    reader = RecordingReader(VideoFileReader())
    dataset = TrainVideoDataset(manifest, reader, flip=False)
    default = TrainVideoDataset(manifest, flip=False)
    sample = dataset[request(3, seed=7)]
    assert torch.equal(sample["video"], default[request(3, seed=7)]["video"])
    [(path, params)] = reader.reads
    assert path == manifest.entries[3].path and len(params.frame_indices) == 4 and params.crop_size == 32


def test_in_memory_clips_match_decoded_clips(synthetic_dataset: SyntheticDataset) -> None:
    manifest = load_manifest(synthetic_dataset.val_manifest)
    memory = InMemoryReader(manifest.entries)
    train = TrainVideoDataset(manifest, memory, flip=False)
    decoded = TrainVideoDataset(manifest, flip=False)
    for seed in range(3):
        clip, reference = train[request(seed, seed)]["video"], decoded[request(seed, seed)]["video"]
        assert clip.shape == reference.shape == (3, 4, 32, 32) and clip.dtype == torch.uint8
        # Same draw, another resampler: pixels agree up to resampling error.
        assert (clip.float() - reference.float()).abs().mean() < 8
    evaluation = EvalVideoDataset(manifest, memory, base_shape=GridShape(1, 4, 32), views=EvalViews(1, 3))
    assert len(evaluation) == 3 * len(manifest) and evaluation[4]["video"].shape == (3, 4, 32, 32)


def test_in_memory_reader_reports_a_bad_video_as_the_dataset_skips_it(tmp_path: Path, videos: VideoFactory) -> None:
    videos.coded("good.mp4")
    videos.broken("random_bytes")
    (tmp_path / "m.csv").write_text("good.mp4 0\nrandom_bytes.mp4 1\n")
    manifest = load_manifest(tmp_path / "m.csv")
    with pytest.raises(VideoDecodeError, match="random_bytes"):
        InMemoryReader(manifest.entries)
    dataset = TrainVideoDataset(manifest, InMemoryReader(manifest.entries[:1]))
    sample = dataset[request(1, seed=0)]
    assert sample["index"] == 0 and sample["skipped"] == (manifest.entries[1].path,)


def test_a_video_file_is_opened_once_per_clip_and_the_reader_still_pickles(
    synthetic_dataset: SyntheticDataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pickle

    from lightning_multigrid.data.decoding import readers

    opened: list[str] = []
    real_reader = readers.VideoReader

    def counting(path, *args):  # the real PyAV reader, counted
        opened.append(str(path))
        return real_reader(path, *args)

    monkeypatch.setattr(readers, "VideoReader", counting)
    manifest = load_manifest(synthetic_dataset.train_manifest)
    dataset = TrainVideoDataset(manifest, VideoFileReader(), flip=False)
    dataset[request(2, seed=1)]  # first visit: probed and decoded through one open
    dataset[request(2, seed=2)]  # metadata cached: one more open
    assert opened == [manifest.entries[2].path] * 2
    # A probe whose read never came (the draw failed) leaves an open video: it does not travel to workers.
    dataset.reader.source(manifest.entries[5])
    copy = pickle.loads(pickle.dumps(dataset.reader))
    assert copy._probed is None and manifest.entries[5].path in copy.metadata


def test_in_memory_frames_are_placed_by_timestamp_as_the_file_reader_picks_them(videos: VideoFactory) -> None:
    path = str(videos.coded("vfr.mp4", num_frames=6, timestamps=[0, 0.1, 0.5, 0.6, 1.5, 1.6]))
    entry = VideoEntry(path=path, labels=(0,))
    memory, files = InMemoryReader([entry]), VideoFileReader()
    for index in range(6):
        params = ClipParams((index,), 64, 48, 0, 0, 32)
        assert VideoFactory.frame_index(memory.read(entry, params)[:, 0].numpy()) == index
        assert VideoFactory.frame_index(files.read(entry, params)[:, 0].numpy()) == index


def test_in_memory_clips_are_the_resized_crop_box_of_each_frame(synthetic_dataset: SyntheticDataset) -> None:
    import torch.nn.functional as F

    entry = load_manifest(synthetic_dataset.val_manifest).entries[0]
    memory = InMemoryReader([entry])
    source = memory._load(entry.path)[1]  # uint8 (T, 3, H, W)
    height, width = source.shape[-2:]
    for params in (ClipParams((0, 3, 3, 9), 43, 32, 5, 0, 32, flip=True), ClipParams((1, 2), 85, 64, 20, 7, 45)):
        # The box mapped back onto the source frame, gathered by advanced indexing, then resized.
        sy, sx = height / params.resize_height, width / params.resize_width
        box = (slice(round(params.crop_y * sy), round((params.crop_y + params.crop_size) * sy)),
               slice(round(params.crop_x * sx), round((params.crop_x + params.crop_size) * sx)))
        size = (params.crop_size, params.crop_size)
        expected = F.interpolate(source[list(params.frame_indices), :, box[0], box[1]], size=size, mode="bilinear",
                                 antialias=True)
        expected = (expected.flip(-1) if params.flip else expected).permute(1, 0, 2, 3)
        assert torch.equal(memory.read(entry, params), expected)


def test_a_reader_without_encoded_returns_pixels_and_gets_advice(synthetic_dataset: SyntheticDataset) -> None:
    # A user's reader written before `encoded` joined the protocol: pixels, never decoded on the device.
    from lightning_multigrid.data.datamodule import MultigridVideoDataModule

    reader = RecordingReader(VideoFileReader())
    assert not hasattr(reader, "encoded") and not returns_encoded(reader)
    assert returns_encoded(FrameFolderReader(frame_decode="device")) and not returns_encoded(FrameFolderReader())
    datamodule = MultigridVideoDataModule(batch_size=2, num_frames=4, crop_size=32, num_workers=0)
    datamodule.use_datasets(train=TrainVideoDataset(load_manifest(synthetic_dataset.train_manifest), reader, flip=False))
    advice = datamodule.loading_advice()
    assert "decoding in the workers" not in advice and "decode_ahead" not in advice
