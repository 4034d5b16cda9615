"""Videos and JPEG frames as phones, cameras and TV recorders write them, read alike in every mode.

Every input is a real file: videos written with PyAV (a display matrix through
``VideoStream.set_display_rotation``, the pixel aspect on the codec context, MPEG-2 in an MPEG
program stream, H.264 with B-frames in an MPEG transport stream, VP9 in WebM/Matroska cut short)
and JPEGs written with Pillow (EXIF orientation, bytes after the end marker). Training (train and
eval datasets; the device decode on ``device="cpu"`` for frames), ``check-data`` and
``extract-frames`` must read the good ones the same way and name and skip the same bad ones.
"""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

from lightning_multigrid.data.clip_params import ClipParams, ClipRequest
from lightning_multigrid.data.dataset import EvalVideoDataset, TrainVideoDataset, collate_clips, replacement_seed
from lightning_multigrid.data.decoding.device import decode_batch
from lightning_multigrid.data.decoding.errors import VideoDecodeError
from lightning_multigrid.data.decoding.frames import jpeg_end
from lightning_multigrid.data.decoding.metadata import MetadataCache
from lightning_multigrid.data.decoding.readers import InMemoryReader, VideoFileReader
from lightning_multigrid.data.decoding.video import VideoReader, probe_video
from lightning_multigrid.data.reader_settings import ReaderSettings
from lightning_multigrid.data.sources import load_manifest
from lightning_multigrid.data.tools.check import check_videos, format_report
from lightning_multigrid.data.tools.extract import extract_frames
from lightning_multigrid.data.tools.pack import pack_frames
from lightning_multigrid.grid import ClipSampling, EvalViews, GridShape

from conftest import FrameFactory, VideoFactory

# ---------------------------------------------------------------------------- writing the inputs


def marked_frame(index: int, width: int, height: int) -> np.ndarray:
    """A frame whose top-left quarter is white (to tell up from down) and the rest flat, coded by index."""
    image = np.full((height, width, 3), VideoFactory.frame_colour(index), np.uint8)
    image[: height // 2, : width // 2] = 255
    return image


def moving_frame(index: int, width: int, height: int) -> np.ndarray:
    """Smooth gradients that move with ``index``: every frame differs, codecs keep them well."""
    image = np.zeros((height, width, 3), np.uint8)
    image[..., 0] = (np.arange(width)[None, :] * 3 + index * 7) % 256
    image[..., 1] = (np.arange(height)[:, None] * 5 + index * 11) % 256
    image[..., 2] = (index * 2) % 256
    return image


def write_video(
    path: Path,
    frames: list[np.ndarray],
    codec: str = "libx264",
    container_format: str | None = None,
    rotation: int | None = None,
    hflip: bool = False,
    pixel_aspect: Fraction | None = None,
    gop: int | None = None,
    max_b_frames: int | None = None,
    options: dict[str, str] | None = None,
) -> Path:
    """Encode ``frames`` (uint8 RGB) with PyAV; ``rotation`` is counter-clockwise, as FFmpeg's display matrix."""
    height, width = frames[0].shape[:2]
    with av.open(str(path), "w", format=container_format) as container:
        stream = container.add_stream(codec, rate=25, options=options or {})
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        if pixel_aspect is not None:
            stream.codec_context.sample_aspect_ratio = pixel_aspect
        if gop is not None:
            stream.codec_context.gop_size = gop
        if max_b_frames is not None:
            stream.codec_context.max_b_frames = max_b_frames
        if rotation is not None or hflip:
            stream.set_display_rotation(rotation or 0, hflip=hflip)
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def full_frame(path: Path | str, index: int) -> np.ndarray:
    """Frame ``index`` as the reader gives it at its displayed size: ``(H, W, 3)`` (a square crop of
    the short side, then the rest of the long side, so the whole frame is seen)."""
    meta = probe_video(path)
    crop = min(meta.width, meta.height)
    parts = []
    offsets = sorted({0, max(meta.width, meta.height) - crop})
    with VideoReader(str(path), meta) as video:
        for offset in offsets:
            x, y = (offset, 0) if meta.width >= meta.height else (0, offset)
            clip = video.read(ClipParams((index,), meta.width, meta.height, x, y, crop)).numpy()
            parts.append(clip[:, 0].transpose(1, 2, 0))
    if len(parts) == 1:
        return parts[0]
    axis = 1 if meta.width >= meta.height else 0
    keep = max(meta.width, meta.height) - crop
    return np.concatenate([parts[0], np.take(parts[1], range(crop - keep, crop), axis=axis)], axis=axis)


def close(a: np.ndarray, b: np.ndarray, tolerance: float = 12) -> bool:
    return a.shape == b.shape and float(np.abs(a.astype(int) - b.astype(int)).mean()) < tolerance


# ---------------------------------------------------------------------------- geometry


@pytest.mark.parametrize("clockwise", [90, 180, 270])
def test_a_phone_video_is_read_upright_in_training_extract_and_check_data(tmp_path: Path, clockwise: int) -> None:
    """Failure 5: a rotation tag was ignored, so phone videos trained sideways."""
    stored = [marked_frame(i, 64, 48) for i in range(12)]
    video = write_video(tmp_path / "phone.mp4", stored, rotation=-clockwise)  # PyAV's angle is counter-clockwise
    shown = np.rot90(stored[5], k=-clockwise // 90)  # what a player shows
    meta = probe_video(video)
    assert (meta.width, meta.height, meta.rotation) == (shown.shape[1], shown.shape[0], clockwise)
    assert close(full_frame(video, 5), shown)
    with VideoReader(str(video)) as reader:  # the in-memory reader's full decode
        assert close(reader.decode_rgb()[5], shown)
    (tmp_path / "m.txt").write_text("phone.mp4 0\n")
    report = extract_frames(load_manifest(tmp_path / "m.txt"), tmp_path / "frames", workers=1, progress=False)
    assert report.failures == ()
    with Image.open(tmp_path / "frames" / "phone" / "img_00006.jpg") as frame:
        assert close(np.asarray(frame.convert("RGB")), shown)
    # pack-frames straight from the video stores it upright too (level 0 of a 32 crop: 46 px short side).
    packed = pack_frames(load_manifest(tmp_path / "m.txt"), tmp_path / "phone.store", crop_size=32, workers=1, progress=False)
    assert packed.failures == ()
    stored = TrainVideoDataset(tmp_path / "phone.store", ReaderSettings(frame_decode="device"))
    stored_frame = stored[ClipRequest(0, 1, 32, (1.0, 1.0), (46, 46), 0)]
    with Image.open(io.BytesIO(bytes(stored_frame["video"].jpegs[0]))) as frame:
        assert (frame.width > frame.height) == (shown.shape[1] > shown.shape[0])
    check = check_videos(load_manifest(tmp_path / "m.txt"), workers=1, progress=False)
    text = format_report(check)
    assert check.ok and "1 rotated, 0 anamorphic" in text
    assert f"turned {clockwise} degrees clockwise" in text and f"read as {shown.shape[1]}x{shown.shape[0]}" in text


def test_an_anamorphic_video_is_stretched_to_square_pixels(tmp_path: Path) -> None:
    """Failure 5: non-square pixels were read as stored, so a 4:3-pixel video came out squeezed."""
    stored = [marked_frame(i, 48, 48) for i in range(12)]
    video = write_video(tmp_path / "dvd.mp4", stored, pixel_aspect=Fraction(4, 3))
    meta = probe_video(video)
    assert (meta.width, meta.height, meta.pixel_aspect) == (64, 48, Fraction(4, 3))
    shown = np.asarray(Image.fromarray(stored[3]).resize((64, 48), Image.Resampling.BILINEAR))
    assert close(full_frame(video, 3), shown)
    (tmp_path / "m.txt").write_text("dvd.mp4 0\n")
    extract_frames(load_manifest(tmp_path / "m.txt"), tmp_path / "frames", workers=1, progress=False, short_side=24)
    with Image.open(tmp_path / "frames" / "dvd" / "img_00004.jpg") as frame:
        assert frame.size == (32, 24)  # the displayed 4:3 shape, short side 24
    text = format_report(check_videos(load_manifest(tmp_path / "m.txt"), workers=1, progress=False))
    assert "0 rotated, 1 anamorphic" in text and "pixel aspect 4:3" in text and "read as 64x48" in text


def test_a_rotated_anamorphic_video_is_stretched_then_turned(tmp_path: Path) -> None:
    stored = [marked_frame(i, 48, 48) for i in range(6)]
    video = write_video(tmp_path / "both.mp4", stored, rotation=90, pixel_aspect=Fraction(4, 3))
    meta = probe_video(video)
    assert (meta.width, meta.height, meta.rotation) == (48, 64, 270)
    stretched = np.asarray(Image.fromarray(stored[2]).resize((64, 48), Image.Resampling.BILINEAR))
    assert close(full_frame(video, 2), np.rot90(stretched, k=1))


def test_training_clips_of_a_rotated_video_follow_the_displayed_frame(tmp_path: Path) -> None:
    """The datasets draw crops in the displayed frame (portrait here), as the probe reports it."""
    write_video(tmp_path / "phone.mp4", [marked_frame(i, 64, 48) for i in range(12)], rotation=90)
    (tmp_path / "m.txt").write_text("phone.mp4 0\n")
    train = TrainVideoDataset(tmp_path / "m.txt", flip=False)
    sample = train[ClipRequest(0, 4, 32, (1.0, 1.0), (32, 32), seed=0)]
    assert sample["skipped"] == () and sample["video"].shape == (3, 4, 32, 32)
    evaluation = EvalVideoDataset(tmp_path / "m.txt", base_shape=GridShape(1, 4, 32), clip_sampling=ClipSampling(1, (32, 32)),
                                  views=EvalViews(1, 3))
    tops = [evaluation[v]["video"][:, 0].float().mean().item() for v in range(3)]
    # Portrait: the three crops run top to bottom; turned 90 degrees counter-clockwise, the white
    # quarter sits at the bottom left, so the bottom crop is the brightest.
    assert tops[1] > tops[0]
    memory = TrainVideoDataset(tmp_path / "m.txt", InMemoryReader(), flip=False)
    request = ClipRequest(0, 4, 32, (1.0, 1.0), (40, 48), seed=3)
    assert close(memory[request]["video"].numpy(), train[request]["video"].numpy(), 16)


# ---------------------------------------------------------------------------- MPEG-2 and MPEG-TS


def _mpeg2_program_stream(path: Path) -> Path:
    return write_video(path.with_suffix(".mpg"), [moving_frame(i, 64, 48) for i in range(90)], "mpeg2video", "mpeg",
                       gop=15, max_b_frames=2)


def _h264_transport_stream(path: Path) -> Path:
    frames = [moving_frame(i, 64, 48) for i in range(90)]
    return write_video(path.with_suffix(".m2ts"), frames, "libx264", "mpegts",
                       options={"x264-params": "keyint=45:open-gop=1:bframes=3"})


def sequential_frames(path: Path) -> dict[int, np.ndarray]:
    """Every frame by timestamp, from a fresh container decoded from the start (no seek)."""
    with av.open(str(path)) as container:
        return {frame.pts: frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)}


@pytest.mark.parametrize("build", [_mpeg2_program_stream, _h264_transport_stream], ids=["mpg", "m2ts"])
def test_every_clip_of_an_mpeg_stream_is_the_frames_a_sequential_decode_gives(
    tmp_path: Path, build: Callable[[Path], Path]
) -> None:
    """Failure 6: after a seek, MPEG-PS labelled frames with shifted timestamps (wrong frames, silently)
    and MPEG-TS landed past the last keyframe (nothing decoded: training died, check-data said fine)."""
    video = build(tmp_path / "recording")
    meta = probe_video(video)
    reference = sequential_frames(video)
    for start in range(meta.num_frames - 4):
        indices = tuple(range(start, start + 4))
        with VideoReader(str(video), meta) as reader:  # a fresh reader per clip, as training opens them
            clip = reader.read(ClipParams(indices, 64, 48, 0, 0, 48)).numpy()
        for t, i in enumerate(indices):
            expected = reference[meta.timestamps[i]][:48, :48]
            assert close(clip[:, t].transpose(1, 2, 0), expected, 2), f"frame {i} of a clip from {start}"


@pytest.mark.parametrize("build", [_mpeg2_program_stream, _h264_transport_stream], ids=["mpg", "m2ts"])
def test_mpeg_streams_train_and_pass_check_data_alike(tmp_path: Path, build: Callable[[Path], Path]) -> None:
    videos = [build(tmp_path / f"v{i}") for i in range(2)]
    (tmp_path / "m.txt").write_text("".join(f"{v.name} {i}\n" for i, v in enumerate(videos)))
    dataset = TrainVideoDataset(tmp_path / "m.txt", strict=True)
    for seed in range(12):  # clips all over the videos, the last frames included
        assert dataset[ClipRequest(seed % 2, 8, 32, (1.0, 10.0), (40, 48), seed)]["skipped"] == ()
    evaluation = EvalVideoDataset(tmp_path / "m.txt", base_shape=GridShape(1, 8, 32), clip_sampling=ClipSampling(10),
                                  views=EvalViews(3, 1), strict=True)
    assert all(evaluation[i]["skipped"] == () for i in range(len(evaluation)))
    # check-data reads clips the way training does (seeks included, the last frames too) and agrees.
    assert check_videos(load_manifest(tmp_path / "m.txt"), workers=1, progress=False).ok


# ---------------------------------------------------------------------------- bad videos, in every mode


def _cut(path: Path, fraction: float = 0.6) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])


def _cut_vp9(name: str, seed: int) -> Callable[[Path], Path]:
    """A VP9 video in a Matroska container (``name``: cut.webm, cut.mkv) cut at 60% of its bytes."""
    def build(directory: Path) -> Path:
        rng = np.random.default_rng(seed)
        frames = [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(48)]
        path = write_video(directory / name, frames, "libvpx-vp9")
        _cut(path)
        return path

    return build


def _jpeg_as_mp4(directory: Path) -> Path:
    path = directory / "photo.mp4"
    Image.fromarray(marked_frame(0, 64, 48)).save(path, format="JPEG")
    return path


def _png_as_mp4(directory: Path) -> Path:
    path = directory / "drawing.mp4"
    Image.fromarray(marked_frame(0, 64, 48)).save(path, format="PNG")
    return path


def _single_frame(directory: Path) -> Path:
    return write_video(directory / "still.mp4", [marked_frame(0, 64, 48)])


def _mirrored(directory: Path) -> Path:
    return write_video(directory / "selfie.mp4", [marked_frame(i, 64, 48) for i in range(12)], hflip=True)


BAD_VIDEOS = {
    "webm_cut_at_60_percent": (_cut_vp9("cut.webm", 0), "the file is truncated: its header declares 1.92 s of video"),
    "mkv_cut_at_60_percent": (_cut_vp9("cut.mkv", 1), "the file is truncated: its header declares 1.92 s of video"),
    "jpeg_saved_as_mp4": (_jpeg_as_mp4, "not a video: a still image (mjpeg, read by FFmpeg's jpeg_pipe demuxer)"),
    "png_saved_as_mp4": (_png_as_mp4, "not a video: a still image (png, read by FFmpeg's png_pipe demuxer)"),
    "single_frame": (_single_frame, "not a video: its video stream holds a single frame"),
    "mirrored_display_matrix": (_mirrored, "its display matrix mirrors the picture"),
}


@pytest.mark.parametrize("kind", sorted(BAD_VIDEOS))
def test_bad_videos_are_named_and_skipped_alike_by_training_check_data_and_extract(tmp_path: Path, kind: str) -> None:
    """Failure 11: a cut WebM/MKV and an image named .mp4 passed check-data and trained."""
    build, reason = BAD_VIDEOS[kind]
    bad = build(tmp_path)
    write_video(tmp_path / "good.mp4", [moving_frame(i, 64, 48) for i in range(24)])
    (tmp_path / "m.txt").write_text(f"{bad.name} 1\ngood.mp4 0\n")
    manifest = tmp_path / "m.txt"
    train = TrainVideoDataset(manifest)[ClipRequest(0, 4, 32, (1.0, 2.0), (40, 48), 0)]
    assert train["skipped"] == (str(bad),) and train["index"] == 1
    evaluation = EvalVideoDataset(manifest, base_shape=GridShape(1, 4, 32))[0]
    assert evaluation["skipped"] == (str(bad),) and evaluation["index"] == 1
    for strict in (TrainVideoDataset(manifest, strict=True), EvalVideoDataset(manifest, base_shape=GridShape(1, 4, 32), strict=True)):
        with pytest.raises(VideoDecodeError, match=re.escape(reason)):
            strict[ClipRequest(0, 4, 32, (1.0, 2.0), (40, 48), 0) if isinstance(strict, TrainVideoDataset) else 0]
    report = check_videos(load_manifest(manifest), workers=1, progress=False)
    assert [r.path for r in report.failures] == [str(bad)] and reason in str(report.failures[0].error)
    extracted = extract_frames(load_manifest(manifest), tmp_path / "frames", workers=1, progress=False)
    assert [r.path for r in extracted.failures] == [str(bad)] and reason in str(extracted.failures[0].error)
    assert extracted.extracted == 1
    packed = pack_frames(load_manifest(manifest), tmp_path / "m.store", crop_size=32, workers=1, progress=False)
    assert [r.path for r in packed.failures] == [str(bad)] and reason in str(packed.failures[0].error)
    assert packed.videos == 1


def test_an_uncut_webm_passes(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    path = write_video(tmp_path / "ok.webm", [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(24)],
                       "libvpx-vp9")
    assert probe_video(path).num_frames == 24
    assert check_videos([str(path)], workers=1, progress=False).ok


# ---------------------------------------------------------------------------- a stale metadata file


def test_a_video_replaced_after_write_metadata_is_probed_again(
    tmp_path: Path, videos: VideoFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Failure 11: the metadata file's size and frame count were trusted for a replaced video."""
    video = videos.coded("v.mp4", num_frames=12, width=64, height=48)
    (tmp_path / "m.txt").write_text("v.mp4 0\n")
    check_videos(load_manifest(tmp_path / "m.txt"), workers=1, progress=False).metadata_cache().save(tmp_path / "meta.json")
    videos.coded("v.mp4", num_frames=40, width=96, height=64)  # replaced: other size and length
    dataset = TrainVideoDataset(tmp_path / "m.txt", ReaderSettings(metadata_file=tmp_path / "meta.json"), flip=False)
    with caplog.at_level(logging.WARNING, logger="lightning_multigrid.data"):
        source = dataset.reader.source(dataset.manifest.entries[0])
    assert (source.width, source.height, source.num_frames) == (96, 64, 40)
    assert "is stale for video" in caplog.text and str(tmp_path / "meta.json") in caplog.text
    request = ClipRequest(0, 8, 32, (4.0, 4.0), (40, 48), seed=0)
    sample = dataset[request]
    assert sample["skipped"] == () and max(VideoFactory.frame_index(sample["video"][:, t].numpy()) for t in range(8)) > 11
    assert MetadataCache(tmp_path / "meta.json").get(str(video)) is None  # every process drops it


def test_a_metadata_file_of_an_earlier_version_is_refused(tmp_path: Path, videos: VideoFactory) -> None:
    video = videos.coded("v.mp4", num_frames=12)
    cache = MetadataCache()
    cache.put(str(video), probe_video(video))
    cache.save(tmp_path / "meta.json")
    data = json.loads((tmp_path / "meta.json").read_text())
    assert MetadataCache(tmp_path / "meta.json").get(str(video)) == probe_video(video)  # unchanged video: kept
    data["version"] = 1
    (tmp_path / "old.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"earlier version \(format 1.*write it again"):
        VideoFileReader(tmp_path / "old.json")


# ---------------------------------------------------------------------------- replacements


class RecordingReader(VideoFileReader):
    """The real video reader, recording the parameters of every clip asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.params: list[tuple[str, ClipParams]] = []

    def read(self, entry, params):  # type: ignore[no-untyped-def]
        self.params.append((Path(entry.path).name, params))
        return super().read(entry, params)


def test_a_replacement_draws_its_own_clip(tmp_path: Path, videos: VideoFactory) -> None:
    """Failure 6: the replacement retried the draw that had failed, on the next video."""
    videos.broken("truncated", name="bad.mp4")
    for name in ("a.mp4", "b.mp4"):
        videos.coded(name, num_frames=60)
    (tmp_path / "m.txt").write_text("bad.mp4 0\na.mp4 0\nb.mp4 0\n")
    reader = RecordingReader()
    dataset = TrainVideoDataset(tmp_path / "m.txt", reader)
    request = ClipRequest(0, 4, 32, (1.0, 12.0), (40, 48), seed=5)
    sample = dataset[request]
    assert sample["skipped"] == (str(tmp_path / "bad.mp4"),)
    [(name, params)] = reader.params  # the bad video fails at its probe, before any read
    from lightning_multigrid.data.clip_params import sample_clip_params

    source = reader.source(dataset.manifest.entries[sample["index"]])
    assert params == sample_clip_params(request._replace(seed=replacement_seed(5, 1)), source, flip=True)
    assert params != sample_clip_params(request, source, flip=True)


# ---------------------------------------------------------------------------- JPEG frames


def _jpeg(image: np.ndarray, orientation: int | None = None, trailer: bytes = b"") -> bytes:
    buffer = io.BytesIO()
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    Image.fromarray(image).save(buffer, "JPEG", quality=95, exif=exif.tobytes())
    return buffer.getvalue() + trailer


def _tagged_folder(frames: FrameFactory, tagged: range) -> Path:
    folder = frames.coded("bad", num_frames=12)
    for n in tagged:
        frame = folder / f"img_{n:05d}.jpg"
        with Image.open(frame) as image:
            pixels = np.asarray(image.convert("RGB"))
        frame.write_bytes(_jpeg(np.ascontiguousarray(np.rot90(pixels)), orientation=6))
    return folder


def read_all_modes(manifest: Path, strict: bool) -> dict[str, list[str]]:
    """The videos skipped by each mode reading video 0 (beside video 1): workers (train, eval), the
    device decode on CPU, and ``check-data``."""
    request = ClipRequest(0, 12, 32, (1.0, 1.0), (40, 48), 0)
    skipped = {
        "train": list(TrainVideoDataset(manifest, strict=strict)[request]["skipped"]),
        "eval": list(EvalVideoDataset(manifest, base_shape=GridShape(1, 12, 32), strict=strict)[0]["skipped"]),
    }
    device = TrainVideoDataset(manifest, ReaderSettings(frame_decode="device"), strict=strict)
    batch = collate_clips([device[request], device[request._replace(index=1)]])
    skipped["device"] = [*batch["skipped"], *decode_batch(batch["video"], "cpu", strict=strict).skipped]
    report = check_videos(load_manifest(manifest), workers=1, progress=False)
    skipped["check-data"] = [r.path for r in report.failures]
    store = manifest.with_suffix(".store")
    skipped["pack-frames"] = [r.path for r in pack_frames(load_manifest(manifest), store, 32, workers=1, progress=False).failures]
    return skipped


@pytest.mark.parametrize("tagged", [range(1, 13), range(5, 7)], ids=["all_frames", "some_frames"])
def test_exif_oriented_frames_are_refused_alike_in_every_mode(tmp_path: Path, frames: FrameFactory, tagged: range) -> None:
    """Failure 5: tagged frames were turned on the device (torchcodec applies the tag) but not by
    Pillow in the workers; a partly tagged folder was skipped only on the device."""
    bad = _tagged_folder(frames, tagged)
    frames.coded("good", num_frames=12)
    (tmp_path / "m.txt").write_text("bad 1\ngood 0\n")
    skipped = read_all_modes(tmp_path / "m.txt", strict=False)
    assert skipped == {mode: [str(bad)] for mode in ("train", "eval", "device", "check-data", "pack-frames")}
    report = check_videos(load_manifest(tmp_path / "m.txt"), workers=1, progress=False)
    assert f"img_{tagged[0]:05d}.jpg has EXIF orientation 6" in str(report.failures[0].error)
    for decode in ("workers", "device"):
        with pytest.raises(VideoDecodeError, match="EXIF orientation 6"):
            dataset = TrainVideoDataset(tmp_path / "m.txt", ReaderSettings(frame_decode=decode), strict=True)  # type: ignore[arg-type]
            dataset[ClipRequest(0, 12, 32, (1.0, 1.0), (40, 48), 0)]


def test_an_upright_exif_tag_is_fine(tmp_path: Path, frames: FrameFactory) -> None:
    folder = frames.coded("v", num_frames=12)
    for n in range(1, 13):
        frame = folder / f"img_{n:05d}.jpg"
        with Image.open(frame) as image:
            pixels = np.asarray(image.convert("RGB"))
        frame.write_bytes(_jpeg(pixels, orientation=1))
    frames.coded("good", num_frames=12)
    (tmp_path / "m.txt").write_text("v 1\ngood 0\n")
    assert read_all_modes(tmp_path / "m.txt", strict=True) == {m: [] for m in ("train", "eval", "device", "check-data", "pack-frames")}


def test_bytes_after_the_jpeg_end_marker_are_ignored_in_every_mode(tmp_path: Path, frames: FrameFactory) -> None:
    """Open from the earlier review: the device path refused JPEGs with a trailer that the workers and
    check-data read. One rule: bytes after the end marker are ignored everywhere, as libjpeg does."""
    folder = frames.coded("v", num_frames=12)
    frames.coded("plain", num_frames=12)
    trailer = b"\x00MOTION-PHOTO" + bytes(range(256)) * 4 + b"\xff\xd9trailing"
    for n in range(1, 13):
        frame = folder / f"img_{n:05d}.jpg"
        frame.write_bytes(frame.read_bytes() + trailer)
    (tmp_path / "m.txt").write_text("v 0\nplain 1\n")
    assert read_all_modes(tmp_path / "m.txt", strict=True) == {m: [] for m in ("train", "eval", "device", "check-data", "pack-frames")}
    request = ClipRequest(0, 12, 32, (1.0, 1.0), (40, 48), 0)
    device = TrainVideoDataset(tmp_path / "m.txt", ReaderSettings(frame_decode="device"), flip=False)
    encoded = device[request]["video"]
    assert all(bytes(jpeg).endswith(b"\xff\xd9") and b"MOTION" not in bytes(jpeg) for jpeg in encoded.jpegs)
    on_device = decode_batch([encoded], "cpu").video[0]
    workers = TrainVideoDataset(tmp_path / "m.txt", flip=False)[request]["video"]
    untouched = TrainVideoDataset(tmp_path / "m.txt", flip=False)[request._replace(index=1)]["video"]
    assert close(workers.numpy(), untouched.numpy(), 0.01)  # the trailer changes nothing
    assert close(on_device.numpy(), workers.numpy(), 3)
    # The store packed from them holds each frame cut at its end marker, read alike by both decoders.
    store = TrainVideoDataset(tmp_path / "m.store", ReaderSettings(frame_decode="device"), flip=False)[request]["video"]
    assert all(bytes(jpeg).endswith(b"\xff\xd9") and b"MOTION" not in bytes(jpeg) for jpeg in store.jpegs)


def test_jpeg_end_walks_the_markers() -> None:
    image = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    thumbnail = io.BytesIO()
    Image.fromarray(image[:8, :8]).save(thumbnail, "JPEG")
    for options in ({}, {"progressive": True}, {"restart_marker_blocks": 2}):
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, "JPEG", **options)
        data = buffer.getvalue()
        assert jpeg_end(data) == len(data) and jpeg_end(data + b"\xff\xd9junk") == len(data)
        assert jpeg_end(data[: len(data) // 2]) is None
    assert jpeg_end(b"not a jpeg") is None
