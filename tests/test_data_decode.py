"""PyAV clip decoding on real H.264 files: exact frames, resize/crop/flip, VFR, seeking, bad files."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import av
import numpy as np
import pytest
import torch

from lightning_multigrid.data.clip_params import ClipParams
from lightning_multigrid.data.decoding.errors import VideoDecodeError
from lightning_multigrid.data.decoding.metadata import MetadataCache, VideoMetadata
from lightning_multigrid.data.decoding.video import VideoReader, probe_video
from lightning_multigrid.data.synthetic import SyntheticDataset, write_video

from conftest import BROKEN_KINDS, BrokenKind, VideoFactory


def coded_indices(clip: torch.Tensor) -> list[int]:
    """Frame indices coded in a ``(C, T, H, W)`` clip of a ``VideoFactory.coded`` video."""
    return [VideoFactory.frame_index(clip[:, t].numpy()) for t in range(clip.shape[1])]


def test_metadata_of_a_constant_rate_video(videos: VideoFactory) -> None:
    meta = probe_video(videos.coded(num_frames=24, width=64, height=48, fps=12))
    assert (meta.width, meta.height, meta.num_frames) == (64, 48, 24)
    assert meta.fps == pytest.approx(12.0)
    assert meta.duration == pytest.approx(2.0)
    assert meta.timestamps.step > 0 and not meta.timestamps.explicit  # stored as start + i * step


def test_reads_exactly_the_requested_frames(videos: VideoFactory) -> None:
    path = videos.coded(num_frames=24)
    with VideoReader(str(path)) as video:
        for indices in [(0, 1, 2, 3), (5, 9, 13, 17), (20, 22, 23, 23), (23,), (7, 3, 3, 0)]:
            clip = video.read(ClipParams(indices, 64, 48, 0, 0, 48))
            assert clip.dtype == torch.uint8 and clip.shape == (3, len(indices), 48, 48)
            assert coded_indices(clip) == list(indices)


def test_resize_crop_flip_match_a_full_decode(synthetic_dataset: SyntheticDataset) -> None:
    path = str(synthetic_dataset.root / "train/checker_left/00000.mp4")
    with av.open(path) as container:
        frames = list(container.decode(video=0))
    params = ClipParams((2, 9, 16), resize_width=53, resize_height=40, crop_x=7, crop_y=5, crop_size=32, flip=True)
    expected = np.stack(
        [
            frames[i].to_ndarray(width=53, height=40, format="rgb24", interpolation="BILINEAR")[5:37, 7:39][:, ::-1]
            for i in params.frame_indices
        ]
    )
    with VideoReader(path) as video:
        clip = video.read(params)
    assert torch.equal(clip, torch.from_numpy(expected).permute(3, 0, 1, 2))
    assert clip.is_contiguous()


def test_variable_frame_rate_maps_indices_through_timestamps(videos: VideoFactory) -> None:
    # Gaps of 50 ms to 500 ms: index i is the i-th frame shown, whatever its time.
    times = [0.0, 0.05, 0.1, 0.6, 0.65, 1.15, 1.2, 1.25, 1.3, 1.8]
    path = videos.coded("vfr.mp4", num_frames=len(times), timestamps=times)
    meta = probe_video(path)
    assert meta.num_frames == 10
    assert meta.timestamps.explicit  # uneven spacing kept per frame
    assert meta.duration == pytest.approx(1.8 + 0.5)  # last frame lasts as long as the gap before it
    with VideoReader(str(path)) as video:
        clip = video.read(ClipParams((0, 3, 5, 9), 64, 48, 0, 0, 48))
    assert coded_indices(clip) == [0, 3, 5, 9]


class CountingReader(VideoReader):
    """Records the timestamps of the frames the decoder returns."""

    decoded: list[int] = []

    def _frames(self, wanted_pts: set[int]) -> Iterator[av.VideoFrame]:
        for frame in super()._frames(wanted_pts):
            CountingReader.decoded.append(frame.pts)
            yield frame


def test_seeks_to_the_keyframe_before_and_stops_after_the_clip(tmp_path: Path) -> None:
    path = tmp_path / "gop.mp4"
    frames = (np.full((48, 64, 3), VideoFactory.frame_colour(i), np.uint8) for i in range(120))
    write_video(path, frames, fps=12, gop_size=10)
    with CountingReader(str(path)) as video:
        timestamps = video.metadata.timestamps.to_list()
        keyframes = [timestamps.index(pts) for pts in video.metadata.keyframe_pts]
        assert len(keyframes) >= 10 and keyframes[0] == 0  # at most 10 frames apart (x264 adds scene cuts)
        CountingReader.decoded = []
        clip = video.read(ClipParams((93, 97, 101, 105), 64, 48, 0, 0, 48))
    assert coded_indices(clip) == [93, 97, 101, 105]
    decoded = [timestamps.index(pts) for pts in CountingReader.decoded]
    keyframe = max(k for k in keyframes if k <= 93)
    # From that keyframe to frame 105, nothing after; unsampled non-reference frames are skipped.
    assert decoded[0] == keyframe and decoded[-1] == 105
    assert {93, 97, 101, 105} <= set(decoded) and len(decoded) <= 105 - keyframe + 1


def test_metadata_cache_round_trip(videos: VideoFactory, tmp_path: Path) -> None:
    path = str(videos.coded(num_frames=12))
    vfr = str(videos.coded("vfr.mp4", num_frames=4, timestamps=[0, 0.1, 0.5, 0.6]))
    cache = MetadataCache()
    for p in (path, vfr):
        cache.put(p, probe_video(p))
    cache.save(tmp_path / "meta.json")
    loaded = MetadataCache(tmp_path / "meta.json")
    assert len(loaded) == 2
    for p in (path, vfr):
        restored = loaded.get(os.path.relpath(p))  # keys are absolute paths
        assert restored == cache.get(p)
        assert isinstance(restored, VideoMetadata)
        assert restored.timestamps.to_list() == probe_video(p).timestamps.to_list()
    with VideoReader(vfr, loaded.get(vfr)) as video:
        assert coded_indices(video.read(ClipParams((1, 3), 64, 48, 0, 0, 48))) == [1, 3]


def test_metadata_file_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="metadata_file"):
        MetadataCache(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="check-data MANIFEST --write-metadata"):
        MetadataCache(tmp_path / "bad.json")


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("missing", "the file does not exist"),
        ("empty", r"the file is empty \(0 bytes\)"),
        ("truncated", "the file is truncated: its index lists 24 frames, only"),
        ("random_bytes", "not a readable video container"),
        ("audio_only", r"no video stream \(streams: audio\)"),
        ("zero_frames", "the video stream has no frames"),
        ("no_video_track", r"no video stream \(streams: none\)"),
        ("unknown_codec", "the video stream has no decoder"),
    ],
)
def test_bad_files_raise_with_path_and_reason(videos: VideoFactory, kind: BrokenKind, reason: str) -> None:
    path = str(videos.broken(kind))
    with pytest.raises(VideoDecodeError, match=reason) as caught:
        with VideoReader(path) as video:
            video.read(ClipParams((0,), 64, 48, 0, 0, 32))
    assert caught.value.path == path
    assert path in str(caught.value)


def test_every_broken_kind_is_covered() -> None:
    assert set(BROKEN_KINDS) == {
        "missing", "empty", "truncated", "random_bytes", "audio_only", "zero_frames", "no_video_track", "unknown_codec"
    }


def test_params_that_do_not_fit_the_video(videos: VideoFactory) -> None:
    with VideoReader(str(videos.coded(num_frames=6))) as video:
        with pytest.raises(ValueError, match="fall outside the 6 frames"):
            video.read(ClipParams((0, 6), 64, 48, 0, 0, 32))
        with pytest.raises(ValueError, match="does not fit the resized frame 64x48"):
            video.read(ClipParams((0,), 64, 48, 40, 0, 32))


def test_metadata_and_errors_survive_pickling(videos: VideoFactory) -> None:
    # DataLoader workers started with "spawn" receive the dataset (and its cache) pickled, and
    # errors come back pickled.
    import pickle

    path = str(videos.coded("vfr.mp4", num_frames=4, timestamps=[0, 0.1, 0.5, 0.6]))
    cache = MetadataCache()
    cache.put(path, probe_video(path))
    restored = pickle.loads(pickle.dumps(cache))
    assert restored.get(path) == cache.get(path)
    error = pickle.loads(pickle.dumps(VideoDecodeError(path, "the file is empty (0 bytes)")))
    assert (error.path, error.reason) == (path, "the file is empty (0 bytes)")
    assert str(error) == f"Cannot decode video {path}: the file is empty (0 bytes)"
