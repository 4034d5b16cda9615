"""Frame folders as the field lays them out: filename templates, gaps, shared folders, unreadable files.

Every bad input is built from real files (JPEGs through Pillow) and checked in each mode: the
worker decode, the device decode (on ``device="cpu"``) and ``check-data`` must agree.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from lightning_multigrid.data.clip_params import ClipRequest
from lightning_multigrid.data.dataset import TrainVideoDataset, collate_clips
from lightning_multigrid.data.decoding.device import decode_batch, decode_clips
from lightning_multigrid.data.decoding.errors import VideoDecodeError
from lightning_multigrid.data.decoding.frame_names import FrameLayout, FrameNameError, select_frames
from lightning_multigrid.data.decoding.frames import open_frame_folder
from lightning_multigrid.data.manifests.entries import VideoEntry
from lightning_multigrid.data.reader_settings import ReaderSettings
from lightning_multigrid.data.sources import load_manifest
from lightning_multigrid.data.tools.check import check_videos

from conftest import FrameFactory, VideoFactory


def every_frame(index: int, num_frames: int, seed: int = 0) -> ClipRequest:
    """A request for ``num_frames`` consecutive frames (stride 1) at a small grid."""
    return ClipRequest(index, num_frames, 32, (1.0, 1.0), (40, 48), seed)


def grey(height: int = 48, width: int = 64) -> np.ndarray:
    return np.full((height, width, 3), 128, np.uint8)


def indices(video: object) -> list[int]:
    clip = video.numpy()  # type: ignore[attr-defined]
    return [VideoFactory.frame_index(clip[:, t]) for t in range(clip.shape[1])]


# ---------------------------------------------------------------------------- templates


def test_mmaction2_rawframes_with_flow_and_a_thumbnail_read_only_the_img_frames(
    tmp_path: Path, frames: FrameFactory
) -> None:
    """Failure 1: flow_x_/flow_y_ frames and a numbered thumbnail were read as frames."""
    folder = frames.coded("v", num_frames=16)
    for kind in ("flow_x", "flow_y"):
        frames.write("v", [grey()] * 16, pattern=kind + "_{:05d}.jpg")
    Image.fromarray(grey(24, 32)).save(folder / "thumb_00001.jpg")
    (tmp_path / "m.txt").write_text("v 0\n")
    assert open_frame_folder(VideoEntry(str(folder), (0,))).num_frames == 16
    for encoded in (False, True):
        dataset = TrainVideoDataset(tmp_path / "m.txt", ReaderSettings(frame_decode="device" if encoded else "workers"), flip=False)
        sample = dataset[every_frame(0, 16)]
        video = decode_clips([sample["video"]], "cpu")[0] if encoded else sample["video"]
        assert indices(video) == list(range(16)) and sample["skipped"] == ()
    report = check_videos(load_manifest(tmp_path / "m.txt"), workers=1, progress=False)
    assert report.ok and report.results[0].folder is not None and report.results[0].folder.num_frames == 16


@pytest.mark.parametrize("template", ["{video}_{:06d}.jpg", "{video}-{:06d}.jpg", "img_{:05d}.jpg", "{:d}.jpg"])
def test_field_layouts_are_detected(frames: FrameFactory, template: str) -> None:
    folder = frames.coded("46GP8", num_frames=12, pattern=template.replace("{video}", "46GP8"))
    Image.fromarray(grey()).save(folder / "cover.jpg")  # not numbered: never a frame
    listed = open_frame_folder(VideoEntry(str(folder), (0,)))
    assert listed.num_frames == 12 and listed.pattern is not None
    assert Path(listed.frame_path(11)).name == template.format(12, video="46GP8")


def test_a_given_template_picks_the_frames_and_ignores_the_rest(frames: FrameFactory) -> None:
    folder = frames.coded("v", num_frames=5, pattern="frame{:04d}.jpg")
    frames.write("v", [grey()] * 9, pattern="flow{:04d}.jpg")
    with pytest.raises(VideoDecodeError, match=r"mixes file name patterns 'flow<number>.jpg' \(9 files\), "
                       r"'frame<number>.jpg' \(5 files\): pass `filename_tmpl`"):
        open_frame_folder(VideoEntry(str(folder), (0,)))
    listed = open_frame_folder(VideoEntry(str(folder), (0,)), FrameLayout("frame{:04d}.jpg"))
    assert listed.num_frames == 5 and listed.pattern == ("frame", 4, 1, ".jpg")
    with pytest.raises(VideoDecodeError, match=r"no frame named like 'img_\{:05d\}.jpg' \(14 files: .*pass `filename_tmpl`"):
        open_frame_folder(VideoEntry(str(folder), (0,)), FrameLayout("img_{:05d}.jpg"))


@pytest.mark.parametrize(
    ("template", "match"),
    [
        ("img.jpg", "no frame-number field"),
        ("img_{:05d}_{:05d}.jpg", "one frame-number field"),
        ("{name}_{:05d}.jpg", "one frame-number field"),
        ("img_{:5d}.jpg", "zero-padded"),
        ("img_{:05d}.png", "must name JPEG files"),
        ("img_{:05d.jpg", "not a format string"),
    ],
)
def test_bad_templates_are_refused_naming_the_option(tmp_path: Path, frames: FrameFactory, template: str, match: str) -> None:
    frames.coded("v", num_frames=4)
    (tmp_path / "m.txt").write_text("v 0\n")
    with pytest.raises(ValueError, match=match):
        TrainVideoDataset(tmp_path / "m.txt", ReaderSettings(filename_tmpl=template))


def test_template_options_are_refused_for_a_video_manifest(tmp_path: Path, videos: VideoFactory) -> None:
    videos.coded("a.mp4")
    (tmp_path / "m.txt").write_text("a.mp4 0\n")
    with pytest.raises(ValueError, match="`filename_tmpl` and `allow_frame_gaps` describe frame folders"):
        TrainVideoDataset(tmp_path / "m.txt", ReaderSettings(filename_tmpl="img_{:05d}.jpg"))


def test_gap_report_names_the_missing_runs() -> None:
    names = [f"img_{n:05d}.jpg" for n in [*range(1, 20), *range(41, 61)]]
    with pytest.raises(FrameNameError, match=r"frames 20-40 are missing between frames 1 and 60 .*`allow_frame_gaps=True`"):
        select_frames("v", names, FrameLayout())
    listed = select_frames("v", names, FrameLayout(allow_gaps=True))
    assert len(listed.names) == 39 and listed.pattern is None


# ---------------------------------------------------------------------------- frame-list CSV


def test_csv_videos_sharing_a_folder_read_their_own_frames(tmp_path: Path) -> None:
    """Failure 2: the per-process cache was keyed by folder, so B was served A's frames."""
    shared = tmp_path / "shared"
    shared.mkdir()
    lines = ["original_vido_id video_id frame_id path labels"]
    for video, offset, label in (("A", 0, 0), ("B", 40, 1)):
        for i in range(8):
            name = f"{video}-{i + 1:06d}.jpg"
            Image.fromarray(np.full((48, 64, 3), VideoFactory.frame_colour(offset + i), np.uint8)).save(shared / name, quality=95)
            lines.append(f'{video} {label} {i} shared/{name} "{label}"')
    (tmp_path / "train.csv").write_text("\n".join(lines) + "\n")
    for encoded in (False, True):
        settings = ReaderSettings(frame_decode="device" if encoded else "workers")
        dataset = TrainVideoDataset(tmp_path / "train.csv", settings, flip=False)
        a, b = dataset[every_frame(0, 8)], dataset[every_frame(1, 8)]
        videos = decode_clips([a["video"], b["video"]], "cpu") if encoded else [a["video"], b["video"]]
        assert indices(videos[0]) == list(range(8)) and indices(videos[1]) == list(range(40, 48))
        assert (a["label"], b["label"]) == (0, 1)


def test_csv_skips_are_per_video_not_per_folder(tmp_path: Path, frames: FrameFactory) -> None:
    frames.coded("shared", num_frames=4)
    lines = ["original_vido_id video_id frame_id path labels"]
    lines += [f'A 0 {i} shared/img_{i + 1:05d}.jpg "0"' for i in range(4)]
    lines += [f'B 1 {i} shared/missing_{i}.jpg "1"' for i in range(4)]  # B's frames are gone
    (tmp_path / "train.csv").write_text("\n".join(lines) + "\n")
    dataset = TrainVideoDataset(tmp_path / "train.csv")
    bad = dataset[every_frame(1, 4)]
    good = dataset[every_frame(0, 4)]
    assert bad["skipped"] == (f"{tmp_path / 'shared'} [video B]",) and bad["index"] == 0
    assert good["skipped"] == () and good["index"] == 0
    report = check_videos(load_manifest(tmp_path / "train.csv"), workers=1, progress=False)
    assert [r.path for r in report.failures] == [f"{tmp_path / 'shared'} [video B]"]


# ---------------------------------------------------------------------------- bad videos, in every mode


def _gap(frames: FrameFactory) -> Path:
    folder = frames.coded("bad", num_frames=60)
    for n in range(20, 41):
        (folder / f"img_{n:05d}.jpg").unlink()
    return folder


def _png_named_png(frames: FrameFactory) -> Path:
    folder = frames.coded("bad", num_frames=12)
    (folder / "img_00005.jpg").unlink()
    Image.fromarray(grey()).save(folder / "img_00005.png")  # not a frame of the template: a gap
    return folder


def _png_named_jpg(frames: FrameFactory) -> Path:
    folder = frames.coded("bad", num_frames=12)
    Image.fromarray(grey()).save(folder / "img_00005.jpg", format="PNG")  # a frame, but not a JPEG
    return folder


def _mixed(frames: FrameFactory) -> Path:
    folder = frames.coded("bad", num_frames=12, pattern="a{:03d}.jpg")
    frames.write("bad", [grey()] * 3, pattern="b{:03d}.jpg")
    return folder


def _jpg_and_jpeg(frames: FrameFactory) -> Path:
    """12 frames, the even ones saved as .jpeg (two tools, or a rename, wrote the folder)."""
    folder = frames.coded("bad", num_frames=12)
    for n in range(2, 13, 2):
        (folder / f"img_{n:05d}.jpg").rename(folder / f"img_{n:05d}.jpeg")
    return folder


def damage_huffman_table(frame: Path) -> None:
    """Make a JPEG whose header reads but whose Huffman table is bogus: only a full decode fails."""
    data = bytearray(frame.read_bytes())
    table = data.find(b"\xff\xc4")  # DHT marker; its 16 code-length counts follow class/id
    data[table + 5 : table + 21] = b"\xff" * 16
    frame.write_bytes(bytes(data))


def _damaged(frames: FrameFactory) -> Path:
    folder = frames.coded("bad", num_frames=12)
    damage_huffman_table(folder / "img_00003.jpg")
    return folder


BAD_FOLDERS = {
    "damaged_huffman_table": (_damaged, "img_00003.jpg"),
    "gap": (_gap, "frames 20-40 are missing"),
    "png_named_png": (_png_named_png, "frame 5 is missing"),
    "png_named_jpg": (_png_named_jpg, "img_00005.jpg is not a JPEG (PNG)"),
    "mixed_patterns": (_mixed, "mixes file name patterns"),
    "jpg_and_jpeg": (_jpg_and_jpeg, "6 frames are named otherwise than the other 6 ('img_{:05d}.jpg')"),
}


@pytest.mark.parametrize("kind", sorted(BAD_FOLDERS))
def test_bad_folders_are_refused_alike_by_workers_device_and_check_data(
    tmp_path: Path, frames: FrameFactory, kind: str
) -> None:
    """Failure 4: a gap (and a PNG among JPEGs) was read across as if time were continuous."""
    build, reason = BAD_FOLDERS[kind]
    bad = build(frames)
    frames.coded("good", num_frames=60)
    (tmp_path / "m.txt").write_text("bad 1\ngood 0\n")
    sample = TrainVideoDataset(tmp_path / "m.txt")[every_frame(0, 12)]
    assert sample["skipped"] == (str(bad),) and sample["index"] == 1
    with pytest.raises(VideoDecodeError, match=re.escape(reason)):
        TrainVideoDataset(tmp_path / "m.txt", strict=True)[every_frame(0, 12)]
    assert device_mode(tmp_path / "m.txt", strict=False) == [str(bad)]
    with pytest.raises(VideoDecodeError, match=re.escape(reason)):
        device_mode(tmp_path / "m.txt", strict=True)
    report = check_videos(load_manifest(tmp_path / "m.txt"), workers=1, progress=False)
    assert [r.path for r in report.failures] == [str(bad)] and reason in str(report.failures[0].error)


def device_mode(manifest: Path, strict: bool) -> list[str]:
    """The videos skipped reading video 0 beside video 1 with ``frame_decode="device"``: by the
    workers (header checks) or by the decode on the device (``device="cpu"``)."""
    dataset = TrainVideoDataset(manifest, ReaderSettings(frame_decode="device"), strict=strict)
    batch = collate_clips([dataset[every_frame(0, 12)], dataset[every_frame(1, 12)]])
    decoded = decode_batch(batch["video"], "cpu", strict=strict)
    return [*batch["skipped"], *decoded.skipped]


def test_allowed_gaps_read_the_frames_there_are(tmp_path: Path, frames: FrameFactory) -> None:
    _gap(frames)
    (tmp_path / "m.txt").write_text("bad 0\n")
    dataset = TrainVideoDataset(tmp_path / "m.txt", ReaderSettings(allow_frame_gaps=True), flip=False)
    sample = dataset[ClipRequest(0, 20, 32, (1.0, 1.0), (40, 48), 0)]
    assert sample["skipped"] == ()
    seen = indices(sample["video"])
    assert all(n < 19 or n >= 40 for n in seen)  # frames 20-40 (indices 19-39) are not there
    report = check_videos(load_manifest(tmp_path / "m.txt"), workers=1, progress=False,
                          layout=FrameLayout(allow_gaps=True))
    assert report.ok and report.results[0].folder is not None and report.results[0].folder.num_frames == 39


def test_frames_with_another_ending_are_never_read_as_consecutive(tmp_path: Path, frames: FrameFactory) -> None:
    """Review leftover: .jpg and .jpeg frames were a gap whose hint, `allow_frame_gaps=True`, then
    read 6 of the 12 frames as consecutive."""
    bad = _jpg_and_jpeg(frames)
    (tmp_path / "m.txt").write_text("bad 0\n")
    reason = "mixes file endings (.jpg and .jpeg) or zero-padding: rename its frames to one pattern"
    with pytest.raises(VideoDecodeError, match=re.escape(reason)) as refused:
        TrainVideoDataset(tmp_path / "m.txt", ReaderSettings(allow_frame_gaps=True), strict=True)[every_frame(0, 6)]
    assert "img_00002.jpeg, img_00004.jpeg, img_00006.jpeg, ..." in str(refused.value)
    assert "allow_frame_gaps" not in str(refused.value)
    report = check_videos(load_manifest(tmp_path / "m.txt"), workers=1, progress=False, layout=FrameLayout(allow_gaps=True))
    assert [r.path for r in report.failures] == [str(bad)] and reason in str(report.failures[0].error)
    # Renamed to one ending, the folder reads all 12 frames in order.
    for n in range(2, 13, 2):
        (bad / f"img_{n:05d}.jpeg").rename(bad / f"img_{n:05d}.jpg")
    sample = TrainVideoDataset(tmp_path / "m.txt", strict=True, flip=False)[every_frame(0, 12)]
    assert indices(sample["video"]) == list(range(12))


# ---------------------------------------------------------------------------- unreadable files


@contextmanager
def as_other_user() -> Iterator[None]:
    """Run the block without root's right to read anything (file permissions then apply)."""
    if os.geteuid() != 0:
        yield
        return
    os.setegid(65534)
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A temporary folder another user can reach (pytest's are private to their owner)."""
    with tempfile.TemporaryDirectory() as name:
        os.chmod(name, 0o755)
        yield Path(name)


@pytest.mark.parametrize("what", ["folder", "frame"])
def test_unreadable_files_are_skips_with_their_reason(open_dir: Path, what: str) -> None:
    """Failure 8: a PermissionError escaped the skip logic, and check-data crashed."""
    factory = FrameFactory(open_dir)
    bad = factory.coded("bad", num_frames=12)
    factory.coded("good", num_frames=12)
    (open_dir / "m.txt").write_text("bad 1\ngood 0\n")
    os.chmod(bad if what == "folder" else bad / "img_00001.jpg", 0)
    with as_other_user():
        for encoded in (False, True):
            settings = ReaderSettings(frame_decode="device" if encoded else "workers")
            sample = TrainVideoDataset(open_dir / "m.txt", settings)[every_frame(0, 12)]
            assert sample["skipped"] == (str(bad),)
            batch = collate_clips([sample])
            assert batch["skipped"] == [str(bad)]
        report = check_videos(load_manifest(open_dir / "m.txt"), workers=1, progress=False)
    assert [r.path for r in report.failures] == [str(bad)]
    assert "Permission denied" in str(report.failures[0].error) or "Errno 13" in str(report.failures[0].error)


@pytest.mark.parametrize("split", ["train", "val"])
def test_device_decode_failure_in_a_batch_is_replaced_counted_and_logged(
    tmp_path: Path, frames: FrameFactory, split: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Failure 7: with `frame_decode="device"` a JPEG damaged inside its data killed the run at that
    batch (`RuntimeError: ... Bogus Huffman table`), naming no frame or folder; validation too."""
    from types import SimpleNamespace

    from lightning_multigrid.data.datamodule import MultigridVideoDataModule

    bad = _damaged(frames)
    frames.coded("good", num_frames=12)
    (tmp_path / "m.txt").write_text("bad 1\ngood 0\n")
    options = dict(train_manifest=str(tmp_path / "m.txt"), val_manifest=str(tmp_path / "m.txt"), batch_size=2,
                   num_frames=12, crop_size=32, sampling_rate=1, num_workers=0,
                   reader_settings=ReaderSettings(frame_decode="device"))
    datamodule = MultigridVideoDataModule(**options)  # type: ignore[arg-type]
    datamodule.trainer = SimpleNamespace(current_epoch=0, global_rank=0, world_size=1)  # type: ignore[assignment]
    datamodule.setup("fit")
    loader = datamodule.train_dataloader() if split == "train" else datamodule.val_dataloader()
    with caplog.at_level("WARNING", logger="lightning_multigrid.data"):
        batch = datamodule.on_after_batch_transfer(next(iter(loader)), 0)
    assert batch["video"].shape == (2, 3, 12, 32, 32)
    assert batch["label"].tolist() == [0, 0] and batch["index"].tolist() == [1, 1]  # the good clip, twice
    assert batch["skipped"] == [str(bad)] and datamodule.skipped_video_paths == (str(bad),)
    assert f"Skipping video {bad}: frame {bad / 'img_00003.jpg'} cannot be decoded on cpu" in caplog.text
    strict = MultigridVideoDataModule(**options, strict=True)  # type: ignore[arg-type]
    strict.trainer = SimpleNamespace(current_epoch=0, global_rank=0, world_size=1)  # type: ignore[assignment]
    strict.setup("fit")
    loader = strict.train_dataloader() if split == "train" else strict.val_dataloader()
    with pytest.raises(VideoDecodeError, match=re.escape(f"{bad}: frame {bad / 'img_00003.jpg'} cannot be decoded")):
        strict.on_after_batch_transfer(next(iter(loader)), 0)


def test_check_data_cli_takes_the_template_gaps_and_kind_options(
    tmp_path: Path, frames: FrameFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    from lightning_multigrid.cli.commands import main

    frames.coded("a", num_frames=6, pattern="frame{:04d}.jpg")
    frames.write("a", [grey()] * 6, pattern="flow{:04d}.jpg")
    (tmp_path / "m.txt").write_text("a 0\n")
    with pytest.raises(SystemExit) as failed:
        main(["check-data", str(tmp_path / "m.txt"), "--workers", "1", "--no-progress"])
    assert failed.value.code == 1 and "mixes file name patterns" in capsys.readouterr().out
    main(["check-data", str(tmp_path / "m.txt"), "--workers", "1", "--no-progress", "--filename-tmpl", "frame{:04d}.jpg",
          "--manifest-kind", "frames"])
    assert "1 of 1 frame folders decode" in capsys.readouterr().out
    (tmp_path / "a" / "frame0003.jpg").unlink()
    main(["check-data", str(tmp_path / "m.txt"), "--workers", "1", "--no-progress", "--filename-tmpl", "frame{:04d}.jpg",
          "--allow-frame-gaps"])
    assert "frames          5 in all" in capsys.readouterr().out
    for options, message in (
        (["--filename-tmpl", "frame.jpg"], "no frame-number field"),
        (["--write-metadata", str(tmp_path / "missing" / "m.json")], "does not exist"),
        (["--workers", "-1"], "`--workers` must be >= 0"),
    ):
        with pytest.raises(SystemExit) as refused:
            main(["check-data", str(tmp_path / "m.txt"), "--no-progress", *options])
        assert refused.value.code == 2 and message in capsys.readouterr().err


def test_datamodule_refuses_bad_frame_options_at_construction() -> None:
    from lightning_multigrid.data.datamodule import MultigridVideoDataModule

    with pytest.raises(ValueError, match="`filename_tmpl` 'img.jpg' has no frame-number field"):
        MultigridVideoDataModule(train_manifest="any.txt", reader_settings=ReaderSettings(filename_tmpl="img.jpg"))
    with pytest.raises(ValueError, match="`allow_frame_gaps` must be True or False"):
        MultigridVideoDataModule(
            train_manifest="any.txt", reader_settings=ReaderSettings(allow_frame_gaps="yes")  # type: ignore[arg-type]
        )
    with pytest.raises(ValueError, match="`manifest_kind` must be 'auto', 'video' or 'frames'"):
        MultigridVideoDataModule(train_manifest="any.txt", manifest_kind="folders")  # type: ignore[arg-type]
