"""Frame datasets: manifests, reading only the sampled frames, reduced-size decode, device decode, bad input."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from lightning_multigrid.data.clip_params import ClipRequest, eval_clip_params, sample_clip_params
from lightning_multigrid.data.dataset import EvalVideoDataset, TrainVideoDataset, collate_clips
from lightning_multigrid.data.decoding.device import EncodedBatch, decode_clips
from lightning_multigrid.data.decoding.errors import VideoDecodeError
from lightning_multigrid.data.decoding.frame_names import FrameLayout
from lightning_multigrid.data.decoding.frames import EncodedClip, open_frame_folder, read_clip, read_encoded_clip
from lightning_multigrid.data.manifests.entries import ManifestError, VideoEntry
from lightning_multigrid.data.manifests.frames import read_frame_manifest, write_frame_manifest
from lightning_multigrid.data.manifests.load import is_frame_manifest
from lightning_multigrid.data.reader_settings import ReaderSettings
from lightning_multigrid.data.sources import load_manifest
from lightning_multigrid.data.tools.check import check_videos, format_report
from lightning_multigrid.grid import ClipSampling, EvalViews, GridShape

from conftest import FRAME_BROKEN_KINDS, FrameBrokenKind, FrameFactory, VideoFactory


def request(index: int = 0, num_frames: int = 8, crop: int = 32, scales: tuple[int, int] = (40, 48), seed: int = 0,
            stride: tuple[float, float] = (1.0, 2.0)) -> ClipRequest:
    return ClipRequest(index, num_frames, crop, stride, scales, seed)


# ---------------------------------------------------------------------------- manifests


def test_frame_manifest_lines_counts_names_and_multi_label(tmp_path: Path, frames: FrameFactory) -> None:
    frames.coded("a/x", num_frames=4)
    frames.coded("b/y", num_frames=5)
    (tmp_path / "names.txt").write_text("jump\nrun\nswim\n")
    (tmp_path / "list.txt").write_text("# comment\na/x run 4\n\nb/y jump,swim\n")
    manifest = load_manifest(tmp_path / "list.txt", class_names=tmp_path / "names.txt")
    assert manifest.format == "frames"
    assert manifest.entries == (
        VideoEntry(str(tmp_path / "a/x"), (1,), 4),
        VideoEntry(str(tmp_path / "b/y"), (0, 2), None),
    )
    assert manifest.multi_label and manifest.num_classes == 3


def test_write_frame_manifest_round_trips(tmp_path: Path, frames: FrameFactory) -> None:
    entries = [VideoEntry(str(frames.coded("v1", num_frames=3)), (2,), 3), VideoEntry(str(frames.coded("v2", 2)), (0,), 2)]
    write_frame_manifest(tmp_path / "out.txt", entries)
    assert (tmp_path / "out.txt").read_text() == "v1 2 3\nv2 0 2\n"
    assert read_frame_manifest(tmp_path / "out.txt").entries == tuple(entries)


def test_pyslowfast_frame_csv_groups_sorts_and_unions_labels(tmp_path: Path) -> None:
    (tmp_path / "train.csv").write_text(
        "original_vido_id video_id frame_id path labels\n"
        'V1 0 2 V1/f3.jpg "2"\n'
        'V1 0 0 V1/f1.jpg "0,2"\n'
        'V1 0 1 V1/f2.jpg ""\n'
        'V2 1 0 V2/f1.jpg ""\n'
    )
    assert is_frame_manifest(tmp_path / "train.csv")
    manifest = load_manifest(tmp_path / "train.csv")
    first, second = manifest.entries
    assert first.frame_paths == tuple(str(tmp_path / f"V1/f{i}.jpg") for i in (1, 2, 3))
    assert first.labels == (0, 2) and first.num_frames == 3 and first.path == str(tmp_path / "V1")
    assert second.labels == () and manifest.multi_label and manifest.num_classes == 3


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("a 0 1 2\n", "expected `folder label"),
        ("a 0 zero\n", "`num_frames` 'zero' is not a positive integer"),
        ("a dog\n", "label 'dog' is not a class index"),
        ("original_vido_id video_id frame_id path labels\nV1 0 x V1/a.jpg 0\n", "integer frame_id"),
        ("original_vido_id video_id frame_id path labels\n", "lists no videos"),
    ],
)
def test_malformed_frame_manifests_name_file_and_line(tmp_path: Path, text: str, match: str) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "m.txt").write_text(text)
    with pytest.raises(ManifestError, match=match):
        read_frame_manifest(tmp_path / "m.txt")


def test_single_label_csv_video_without_label_is_refused(tmp_path: Path) -> None:
    (tmp_path / "m.csv").write_text('original_vido_id video_id frame_id path labels\nV 0 0 V/a.jpg ""\n')
    with pytest.raises(ManifestError, match="V has no label"):
        read_frame_manifest(tmp_path / "m.csv", multi_label=False)


def test_video_manifests_are_not_frame_manifests(tmp_path: Path, videos: VideoFactory) -> None:
    videos.coded("v.mp4")
    (tmp_path / "m.csv").write_text("v.mp4 0\n")
    assert not is_frame_manifest(tmp_path / "m.csv")
    assert load_manifest(tmp_path / "m.csv").format == "video"


# ---------------------------------------------------------------------------- folders and clips


def test_folder_listing_sorts_by_number_and_keeps_a_pattern(frames: FrameFactory) -> None:
    folder = open_frame_folder(VideoEntry(str(frames.coded("v", num_frames=12, pattern="{}.jpg")), (0,)))
    assert folder.pattern == ("", 1, 1, ".jpg")  # 1.jpg .. 12.jpg: 10 sorts after 9, not after 1
    assert [Path(folder.frame_path(i)).name for i in (0, 8, 9, 11)] == ["1.jpg", "9.jpg", "10.jpg", "12.jpg"]
    assert (folder.width, folder.height, folder.num_frames) == (64, 48, 12)


def test_irregular_names_are_kept_as_a_list(frames: FrameFactory) -> None:
    path = frames.coded("v", num_frames=3)
    (path / "img_00002.jpg").rename(path / "img_00007.jpg")
    folder = open_frame_folder(VideoEntry(str(path), (0,)), FrameLayout(allow_gaps=True))
    assert folder.pattern is None
    assert [Path(folder.frame_path(i)).name for i in range(3)] == ["img_00001.jpg", "img_00003.jpg", "img_00007.jpg"]


def test_clip_holds_exactly_the_sampled_frames(frames: FrameFactory) -> None:
    folder = open_frame_folder(VideoEntry(str(frames.coded(num_frames=40)), (0,)))
    for seed in range(5):
        params = sample_clip_params(request(num_frames=8, crop=32, stride=(2.0, 4.0), seed=seed), folder, flip=False)
        clip = read_clip(folder, params)
        assert clip.shape == (3, 8, 32, 32) and clip.dtype == torch.uint8
        read = [VideoFactory.frame_index(clip[:, t].numpy()) for t in range(8)]
        assert read == list(params.frame_indices)


@pytest.mark.parametrize(("crop", "short_side"), [(112, 128), (56, 64), (28, 32)])
def test_reduced_size_decode_matches_full_decode_then_resize(frames: FrameFactory, crop: int, short_side: int) -> None:
    """The DCT-scaled decode and box resize give the pixels of a full decode, resize, crop."""
    path = frames.smooth(num_frames=4, width=320, height=240)
    folder = open_frame_folder(VideoEntry(str(path), (0,)))
    params = eval_clip_params(folder, GridShape(1, 4, crop), ClipSampling(1, (short_side, short_side)), EvalViews(1, 1))
    clip = read_clip(folder, params).numpy()
    for t, index in enumerate(params.frame_indices):
        with Image.open(folder.frame_path(index)) as image:
            full = image.convert("RGB").resize((params.resize_width, params.resize_height), Image.Resampling.BILINEAR)
        x, y = params.crop_x, params.crop_y
        reference = np.asarray(full)[y : y + crop, x : x + crop].transpose(2, 0, 1).astype(np.float32)
        assert np.abs(clip[:, t].astype(np.float32) - reference).mean() < 2.0


def test_flip_mirrors_the_crop(frames: FrameFactory) -> None:
    folder = open_frame_folder(VideoEntry(str(frames.smooth(num_frames=2)), (0,)))
    params = eval_clip_params(folder, GridShape(1, 2, 48), ClipSampling(1, (64, 64)), EvalViews(1, 1))
    flipped = read_clip(folder, dataclasses.replace(params, flip=True))
    assert torch.equal(flipped, read_clip(folder, params).flip(-1))


def test_eval_views_of_a_frame_dataset(tmp_path: Path, frames: FrameFactory) -> None:
    frames.coded("v", num_frames=30)
    (tmp_path / "m.txt").write_text("v 0 30\n")
    dataset = EvalVideoDataset(tmp_path / "m.txt", base_shape=GridShape(1, 4, 32), clip_sampling=ClipSampling(2),
                               views=EvalViews(3, 3))
    assert len(dataset) == 9
    starts = [VideoFactory.frame_index(dataset[v]["video"][:, 0].numpy()) for v in (0, 3, 6)]
    assert starts == [0, 12, 23]  # room = 30 - 7 = 23, spread over 3 clips


def test_train_dataset_same_request_same_clip_as_mp4_parameters(tmp_path: Path, frames: FrameFactory) -> None:
    frames.coded("v", num_frames=40)
    (tmp_path / "m.txt").write_text("v 0\n")
    dataset = TrainVideoDataset(tmp_path / "m.txt", flip=False)
    folder = open_frame_folder(dataset.manifest.entries[0])
    req = request(num_frames=6, crop=24, scales=(32, 40), stride=(2.0, 3.0), seed=7)
    params = sample_clip_params(req, folder, flip=False)
    sample = dataset[req]
    assert sample["label"] == 0 and sample["skipped"] == ()
    assert [VideoFactory.frame_index(sample["video"][:, t].numpy()) for t in range(6)] == list(params.frame_indices)


# ---------------------------------------------------------------------------- device-side decode


def test_device_path_matches_worker_path_on_cpu(tmp_path: Path, frames: FrameFactory) -> None:
    """Same seeds, same clip parameters; decode/resize/crop/flip on the device within JPEG/resize error."""
    for i in range(3):
        frames.smooth(f"v{i}", num_frames=12, width=160, height=120, seed=i)
    (tmp_path / "m.txt").write_text("".join(f"v{i} {i}\n" for i in range(3)))
    workers = TrainVideoDataset(tmp_path / "m.txt")
    encoded = TrainVideoDataset(tmp_path / "m.txt", ReaderSettings(frame_decode="device"))
    for crop, scales in ((112, (120, 150)), (56, (60, 75)), (28, (30, 38))):
        requests = [request(i % 3, num_frames=8, crop=crop, scales=scales, seed=10 + i) for i in range(6)]
        expected = collate_clips([workers[r] for r in requests])
        batch = collate_clips([encoded[r] for r in requests])
        assert isinstance(batch["video"], EncodedBatch) and len(batch["video"]) == 6
        assert any(c.params.flip for c in batch["video"].clips)  # flips were drawn and applied
        video = decode_clips(batch["video"], "cpu")
        assert video.shape == expected["video"].shape == (6, 3, 8, crop, crop) and video.dtype == torch.uint8
        difference = (video.float() - expected["video"].float()).abs()
        assert difference.mean() < 1.5 and difference.max() <= 24
        assert torch.equal(batch["label"], expected["label"])


def test_encoded_clips_keep_repeated_frames_once(frames: FrameFactory) -> None:
    folder = open_frame_folder(VideoEntry(str(frames.coded(num_frames=3)), (0,)))
    params = sample_clip_params(request(num_frames=6, crop=32, stride=(1.0, 1.0)), folder)
    clip = read_encoded_clip(folder, params)
    assert len(clip.jpegs) == 3 and clip.order == (0, 1, 2, 2, 2, 2)
    decoded = decode_clips([clip], "cpu")[0]
    assert [VideoFactory.frame_index(decoded[:, t].numpy()) for t in range(6)] == [0, 1, 2, 2, 2, 2]


def test_decode_clips_refuses_mixed_grids(frames: FrameFactory) -> None:
    folder = open_frame_folder(VideoEntry(str(frames.coded(num_frames=8)), (0,)))
    clips = [read_encoded_clip(folder, sample_clip_params(request(crop=c, scales=(48, 48)), folder)) for c in (32, 40)]
    with pytest.raises(ValueError, match="share a grid"):
        decode_clips(clips, "cpu")


def test_device_frame_decode_needs_a_frame_dataset(tmp_path: Path, videos: VideoFactory) -> None:
    videos.coded("v.mp4")
    (tmp_path / "m.csv").write_text("v.mp4 0\n")
    with pytest.raises(ValueError, match="needs a frame dataset.*extract-frames"):
        TrainVideoDataset(tmp_path / "m.csv", ReaderSettings(frame_decode="device"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_decode_matches_cpu_decode(tmp_path: Path, frames: FrameFactory) -> None:
    frames.smooth("v", num_frames=12, width=320, height=240)
    (tmp_path / "m.txt").write_text("v 0\n")
    encoded = TrainVideoDataset(tmp_path / "m.txt", ReaderSettings(frame_decode="device"))
    clips: list[EncodedClip] = [encoded[request(0, 8, 112, (128, 160), seed=s)]["video"] for s in range(4)]
    on_gpu = decode_clips(clips, "cuda")
    assert on_gpu.device.type == "cuda"
    difference = (on_gpu.cpu().float() - decode_clips(clips, "cpu").float()).abs()
    assert difference.mean() < 1.0


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("kind", FRAME_BROKEN_KINDS)
@pytest.mark.parametrize("encoded", [False, True], ids=["workers", "device"])
def test_bad_frame_folders_are_skipped_counted_and_named(
    tmp_path: Path, frames: FrameFactory, kind: FrameBrokenKind, encoded: bool
) -> None:
    good = frames.coded("good", num_frames=12)
    bad, count = frames.broken(kind)
    (tmp_path / "m.txt").write_text(f"{bad.name} 1{'' if count is None else f' {count}'}\ngood 0\n")
    req = request(0, num_frames=12, crop=32, stride=(1.0, 1.0))  # every frame, so the bad one too
    dataset = TrainVideoDataset(tmp_path / "m.txt", ReaderSettings(frame_decode="device" if encoded else "workers"))
    assert sample_clip_params(req, open_frame_folder(VideoEntry(str(good), (0,)))).frame_indices == tuple(range(12))
    sample = dataset[req]
    assert sample["index"] == 1 and sample["skipped"] == (str(bad),)
    strict = TrainVideoDataset(tmp_path / "m.txt", ReaderSettings(frame_decode="device" if encoded else "workers"), strict=True)
    with pytest.raises(VideoDecodeError, match=str(bad)) as error:
        strict[req]
    if kind in ("random_bytes", "not_jpeg", "truncated"):
        assert "img_00003.jpg" in error.value.reason


@pytest.mark.parametrize("kind", FRAME_BROKEN_KINDS)
def test_check_data_lists_bad_frame_folders(tmp_path: Path, frames: FrameFactory, kind: FrameBrokenKind) -> None:
    frames.coded("good", num_frames=12)
    bad, count = frames.broken(kind)
    (tmp_path / "m.txt").write_text(f"good 0 12\n{bad.name} 1{'' if count is None else f' {count}'}\n")
    report = check_videos(load_manifest(tmp_path / "m.txt"), workers=1, progress=False)
    assert [r.path for r in report.failures] == [str(bad)]
    text = format_report(report)
    assert f"FAILED {bad}" in text and "1 of 2 frame folders decode" in text
    assert "frames          12 in all" in text
