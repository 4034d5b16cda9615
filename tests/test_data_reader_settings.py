"""ReaderSettings: the decoder settings, one value checked once, building the reader a manifest's format asks for.

Real manifests: H.264 videos and JPEG frame folders written by the conftest factories, a packed
store made with ``pack-frames``; the DataModule is the real one, set up on the synthetic dataset.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_multigrid.data.clip_params import ClipRequest, eval_clip_params
from lightning_multigrid.data.datamodule import MultigridVideoDataModule
from lightning_multigrid.data.dataset import EvalVideoDataset, TrainVideoDataset
from lightning_multigrid.data.decoding.frame_names import FrameLayout
from lightning_multigrid.data.decoding.frames import EncodedClip
from lightning_multigrid.data.decoding.readers import FrameFolderReader, VideoFileReader
from lightning_multigrid.data.reader_settings import ReaderSettings
from lightning_multigrid.data.sources import load_manifest
from lightning_multigrid.data.store.reader import PackedFrameReader
from lightning_multigrid.data.synthetic import SyntheticDataset
from lightning_multigrid.data.tools.pack import pack_frames
from lightning_multigrid.grid import ClipSampling, EvalViews, GridShape

from conftest import FrameFactory, VideoFactory


@pytest.mark.parametrize(("settings", "match"), [
    ({"frame_decode": "gpu"}, "`frame_decode` must be 'workers' or 'device', got 'gpu'"),
    ({"interpolation": "CUBIC"}, "`interpolation` must be one of 'FAST_BILINEAR', .*got 'CUBIC'"),
    ({"filename_tmpl": "img.jpg"}, "`filename_tmpl` 'img.jpg' has no frame-number field"),
    ({"filename_tmpl": "img_{:05d}.png"}, "`filename_tmpl` .* must name JPEG files"),
    ({"allow_frame_gaps": "yes"}, "`allow_frame_gaps` must be True or False, got 'yes'"),
])
def test_invalid_settings_are_refused_naming_the_argument(settings: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ReaderSettings(**settings)  # type: ignore[arg-type]


def test_the_reader_follows_the_manifest_format(videos: VideoFactory, frames: FrameFactory, tmp_path: Path) -> None:
    videos.coded("v.mp4", num_frames=12)
    (tmp_path / "videos.txt").write_text("v.mp4 0\n")
    frames.coded("f", num_frames=12)
    (tmp_path / "frames.txt").write_text("f 0 12\n")
    store = pack_frames(load_manifest(tmp_path / "frames.txt"), tmp_path / "f.store", crop_size=32, workers=1,
                        progress=False).store
    settings = ReaderSettings(interpolation="AREA", frame_decode="device", filename_tmpl="img_{:05d}.jpg")

    folder_reader = settings.reader_for(load_manifest(tmp_path / "frames.txt"))
    assert isinstance(folder_reader, FrameFolderReader) and folder_reader.frame_decode == "device"
    assert folder_reader.layout is settings.layout == FrameLayout("img_{:05d}.jpg")  # built once, shared
    store_reader = ReaderSettings(frame_decode="device").reader_for(load_manifest(store))
    assert isinstance(store_reader, PackedFrameReader) and store_reader.frame_decode == "device"
    video_reader = ReaderSettings(interpolation="AREA").reader_for(load_manifest(tmp_path / "videos.txt"))
    assert isinstance(video_reader, VideoFileReader) and video_reader.interpolation == "AREA"

    # Settings for frames on a manifest of video files: refused where the reader is chosen, naming them.
    with pytest.raises(ValueError, match="`frame_decode='device'` needs a frame dataset, but .*videos.txt lists video"):
        ReaderSettings(frame_decode="device").reader_for(load_manifest(tmp_path / "videos.txt"))
    with pytest.raises(ValueError, match="`filename_tmpl` and `allow_frame_gaps` describe frame folders"):
        ReaderSettings(allow_frame_gaps=True).reader_for(load_manifest(tmp_path / "videos.txt"))


def test_a_dataset_builds_its_reader_from_settings_or_uses_the_one_given(frames: FrameFactory, tmp_path: Path) -> None:
    frames.coded("f", num_frames=12)
    (tmp_path / "m.txt").write_text("f 0 12\n")
    request = ClipRequest(0, 4, 32, (1.0, 2.0), (40, 48), seed=5)
    default = TrainVideoDataset(tmp_path / "m.txt", flip=False)
    assert isinstance(default.reader, FrameFolderReader) and default.reader.frame_decode == "workers"
    encoded = TrainVideoDataset(tmp_path / "m.txt", ReaderSettings(frame_decode="device"), flip=False)
    assert isinstance(encoded.reader, FrameFolderReader) and encoded.reader.frame_decode == "device"
    given = FrameFolderReader()
    dataset = TrainVideoDataset(tmp_path / "m.txt", given, flip=False)
    assert dataset.reader is given
    assert torch.equal(dataset[request]["video"], default[request]["video"])
    assert isinstance(encoded[request]["video"], EncodedClip)  # JPEG bytes for the device


def test_the_datamodule_checks_its_settings_once_and_builds_each_reader_once(
    synthetic_dataset: SyntheticDataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[FrameLayout] = []
    check = FrameLayout.__post_init__

    def counting(layout: FrameLayout) -> None:
        built.append(layout)
        check(layout)

    monkeypatch.setattr(FrameLayout, "__post_init__", counting)
    readers: list[object] = []
    reader_for = ReaderSettings.reader_for
    monkeypatch.setattr(ReaderSettings, "reader_for", lambda self, manifest: readers.append(reader_for(self, manifest))
                        or readers[-1])
    datamodule = MultigridVideoDataModule(
        train_manifest=str(synthetic_dataset.train_manifest), val_manifest=str(synthetic_dataset.val_manifest),
        class_names=str(synthetic_dataset.class_names_file), num_workers=0, batch_size=2,
        num_frames=4, crop_size=32, sampling_rate=2, jitter_scales=(32, 40),
    )
    datamodule.setup("fit")
    datamodule.setup("validate")  # keeps what fit read
    train, val = datamodule._datasets.train, datamodule._datasets.val
    assert train is not None and val is not None
    assert len(built) == 1 and built[0] is datamodule.reader_settings.layout  # one check, in __init__
    assert readers == [train.reader, val.reader]  # one reader per split, built in setup
    assert isinstance(train.reader, VideoFileReader) and isinstance(val.reader, VideoFileReader)


def test_eval_dataset_takes_the_grid_values_whole(videos: VideoFactory, tmp_path: Path) -> None:
    videos.coded("v.mp4", num_frames=30, width=64, height=48)
    (tmp_path / "m.txt").write_text("v.mp4 0\n")
    base, sampling, views = GridShape(8, 4, 32), ClipSampling(2, (36, 48)), EvalViews(3, 3)
    dataset = EvalVideoDataset(tmp_path / "m.txt", base_shape=base, clip_sampling=sampling, views=views)
    assert len(dataset) == 9 and dataset.short_side == 36  # the minimum training short side, one owner
    source = dataset.reader.source(dataset.manifest.entries[0])
    for item in range(9):  # view v: temporal clip v // 3, spatial crop v % 3
        params = eval_clip_params(source, base, sampling, views, item // 3, item % 3)
        expected = dataset.reader.read(dataset.manifest.entries[0], params)
        assert dataset[item]["view"] == item and torch.equal(dataset[item]["video"], expected)
    with pytest.raises(TypeError, match="`base_shape` must be a GridShape, got 4"):
        EvalVideoDataset(tmp_path / "m.txt", base_shape=4)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`jitter_scales` min 28 is smaller than `crop_size`=32"):
        EvalVideoDataset(tmp_path / "m.txt", base_shape=base, clip_sampling=ClipSampling(2, (28, 48)))
