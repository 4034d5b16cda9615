"""A packed frame store beside other datasets: inside a folder-per-class root, as the training split of a
DataModule whose other splits are a folder per class or frame folders that need their own settings; and
the one rule for a still picture, in video files, frame folders and stores."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lightning_multigrid.data.datamodule import MultigridVideoDataModule
from lightning_multigrid.data.decoding import frames as frames_module
from lightning_multigrid.data.decoding.errors import VideoDecodeError
from lightning_multigrid.data.decoding.readers import FrameFolderReader
from lightning_multigrid.data.manifests.entries import ManifestError
from lightning_multigrid.data.reader_settings import ReaderSettings
from lightning_multigrid.data.sources import load_manifest
from lightning_multigrid.data.store.reader import PackedFrameReader
from lightning_multigrid.data.tools.check import check_video, check_videos
from lightning_multigrid.data.tools.pack import pack_frames

from conftest import FrameFactory, VideoFactory

CLASSES = ("a", "b", "c", "d")


def train_frames(tmp_path: Path, frames: FrameFactory) -> Path:
    """Four frame folders, one per class, and their manifest (labels as indices)."""
    for label in range(len(CLASSES)):
        frames.coded(f"frames/v{label}", num_frames=12)
    manifest = tmp_path / "frames" / "train.txt"
    manifest.write_text("".join(f"v{label} {label}\n" for label in range(len(CLASSES))))
    (tmp_path / "names.txt").write_text("\n".join(CLASSES) + "\n")
    return manifest


def folder_per_class(tmp_path: Path) -> Path:
    """``val/<class>/x.mp4`` for the four classes."""
    root = tmp_path / "val"
    videos = VideoFactory(root)
    for name in CLASSES:
        (root / name).mkdir(parents=True)
        videos.coded(f"{name}/x.mp4", num_frames=12)
    return root


def test_a_store_inside_a_folder_per_class_root_is_not_a_class(tmp_path: Path, frames: FrameFactory) -> None:
    root = folder_per_class(tmp_path)
    before = load_manifest(root)
    pack_frames(load_manifest(train_frames(tmp_path, frames)), root / "train.store", crop_size=32, workers=1,
                progress=False)
    after = load_manifest(root)
    assert after.num_classes == 4 and after.class_names == CLASSES
    assert after.entries == before.entries  # every label as before the store was packed there
    assert [r.path for r in check_videos(after, workers=1, progress=False).results] == [e.path for e in before.entries]


def test_a_store_packed_without_class_names_and_a_folder_per_class_val_split_name_the_fix_that_works(
    tmp_path: Path, frames: FrameFactory
) -> None:
    manifest, root = train_frames(tmp_path, frames), folder_per_class(tmp_path)
    store = pack_frames(load_manifest(manifest), tmp_path / "train.store", crop_size=32, workers=1, progress=False).store

    def setup() -> MultigridVideoDataModule:
        datamodule = MultigridVideoDataModule(
            train_manifest=str(store), val_manifest=str(root), batch_size=2, num_frames=4, crop_size=32, num_workers=0
        )
        datamodule.setup("fit")
        return datamodule

    with pytest.raises(ManifestError, match=rf"pack the training store again.*pack-frames <manifest> {store} --class-names"):
        setup()
    # The fix it names, followed: the store records the names, and the val split is read on them.
    pack_frames(load_manifest(manifest, class_names=tmp_path / "names.txt"), store, crop_size=32, workers=1,
                progress=False)
    assert setup().num_classes == 4


def test_a_store_beside_frame_folders_that_need_root_dir_and_layout_settings(tmp_path: Path, frames: FrameFactory) -> None:
    store = pack_frames(load_manifest(train_frames(tmp_path, frames)), tmp_path / "train.store", crop_size=32,
                        workers=1, progress=False).store
    # Val frames named `clip-1.jpg, clip-2.jpg, clip-4.jpg` (a gap), listed relative to `frames/`, not to the manifest.
    for label in range(len(CLASSES)):
        folder = frames.coded(f"frames/w{label}", num_frames=3, pattern="clip-{}.jpg")
        (folder / "clip-3.jpg").rename(folder / "clip-4.jpg")
    (tmp_path / "lists").mkdir()
    (tmp_path / "lists" / "val.txt").write_text("".join(f"w{label} {label}\n" for label in range(len(CLASSES))))
    datamodule = MultigridVideoDataModule(
        train_manifest=str(store), val_manifest=str(tmp_path / "lists" / "val.txt"), root_dir=str(tmp_path / "frames"),
        batch_size=2, num_frames=4, crop_size=32, num_workers=0, manifest_kind="frames",
        reader_settings=ReaderSettings(filename_tmpl="clip-{}.jpg", allow_frame_gaps=True),
    )
    datamodule.setup("fit")
    assert isinstance(datamodule._datasets.require_train().reader, PackedFrameReader)
    val = datamodule.val_dataloader()
    batch = next(iter(val))
    assert batch["video"].shape[-1] == 32 and datamodule.skipped_videos == 0


def test_a_single_frame_is_a_still_picture_for_videos_frame_folders_and_stores(
    tmp_path: Path, frames: FrameFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    still = "holds a single frame (a still picture; every clip would repeat it)"
    frames.coded("one", num_frames=1)
    frames.coded("good", num_frames=12)
    (tmp_path / "m.txt").write_text("one 0\ngood 1\n")
    manifest = load_manifest(tmp_path / "m.txt")
    folder_reason = f"not a video: the frame folder {still}"
    with pytest.raises(VideoDecodeError, match=re.escape(folder_reason)):
        FrameFolderReader().source(manifest.entries[0])  # training skips it (strict raises)
    assert [(f.path, f.error) for f in check_videos(manifest, workers=1, progress=False).failures] == [
        (str(tmp_path / "one"), folder_reason)
    ]
    report = pack_frames(manifest, tmp_path / "s.store", crop_size=32, workers=1, progress=False)
    assert [(f.path, f.error) for f in report.failures] == [(str(tmp_path / "one"), folder_reason)]
    video = VideoFactory(tmp_path).coded("still.mp4", num_frames=1)
    assert check_video(str(video)).error == f"not a video: its video stream {still}"
    # A store packed by a version without the rule: its still picture is refused when read.
    monkeypatch.setattr(frames_module, "refuse_still_picture", lambda *args: None)
    old = pack_frames(manifest, tmp_path / "old.store", crop_size=32, workers=1, progress=False).store
    monkeypatch.undo()
    entry = load_manifest(old).entries[0]
    with pytest.raises(VideoDecodeError, match=re.escape(f"not a video: the store {old} {still}")):
        PackedFrameReader(old).source(entry)
