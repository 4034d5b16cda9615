"""Decode every video of a manifest before training: ``lightning-multigrid check-data``.

Training skips bad videos (and reports them) rather than dying; this finds them all up front, in
parallel, and summarises the dataset (durations, frame rates, resolutions). A video file is decoded
in full, then read the way training reads it: short clips spread over the video, each reached by
a seek to the keyframe before it (:meth:`VideoReader.read`), so a file that decodes from the start
but not after a seek fails here, not in training. Rotated and anamorphic videos are listed with
how they are read (upright, square pixels; sizes are the displayed ones). Frame datasets (a folder
of JPEG frames per video) get every frame decoded: missing folders and frames, empty folders,
damaged, EXIF-oriented and non-JPEG frames are reported by path. A packed frame store reports the
videos ``pack-frames`` left out and decodes every packed frame again. Videos shorter than a base
clip's span (``num_frames`` at ``sampling_rate``) are counted and named: training reads all they
have and repeats their last frame.

Example::

    report = check_videos(load_manifest("data/train.csv"), workers=8)
    print(format_report(report))
    report.failures        # (VideoCheck(path=..., metadata=None, error='...'), ...)
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from lightning_multigrid.data.clip_params import ClipParams, span_frames
from lightning_multigrid.data.decoding.errors import VideoDecodeError, unreadable
from lightning_multigrid.data.decoding.frame_names import DEFAULT_LAYOUT, FrameLayout
from lightning_multigrid.data.decoding.frames import check_frame_folder
from lightning_multigrid.data.decoding.metadata import FrameFolder, MetadataCache, VideoMetadata
from lightning_multigrid.data.decoding.video import VideoReader
from lightning_multigrid.data.manifests.entries import Manifest, VideoEntry
from lightning_multigrid.data.manifests.store_folder import HEADER_FILE
from lightning_multigrid.data.store.format import store_failures
from lightning_multigrid.data.store.reader import PackedFrameReader
from lightning_multigrid.data.tools.processes import map_in_processes
from lightning_multigrid.grid import DEFAULT_NUM_FRAMES, DEFAULT_SAMPLING_RATE

__all__ = [
    "CheckReport",
    "VideoCheck",
    "check_frames",
    "check_stored_video",
    "check_video",
    "check_videos",
    "format_report",
    "incomplete_decode",
]

# Clips read after the full decode, as training reads them (evenly spread, the last frames included).
CHECKED_CLIPS = 9
# Videos named in the report's geometry and short-video notes (the rest are counted).
_NAMED_VIDEOS = 5
# What the summary calls the checked items, by manifest format.
_ITEMS = {"video": "video files", "frames": "frame folders", "store": "videos of the packed store"}


@dataclass(frozen=True, slots=True)
class VideoCheck:
    """The outcome for one video: its metadata (or frame folder), or why it cannot be decoded."""

    path: str
    metadata: VideoMetadata | None
    error: str | None = None
    folder: FrameFolder | None = None  # frame datasets

    @property
    def num_frames(self) -> int | None:
        """The frames of a readable video (its metadata's or its folder's); ``None`` for a failure."""
        found = self.metadata or self.folder
        return None if found is None else found.num_frames


@dataclass(frozen=True, slots=True)
class CheckReport:
    """Every video's outcome, in manifest order, and what the manifest lists (``format``)."""

    results: tuple[VideoCheck, ...]
    format: Literal["video", "frames", "store"] = "video"

    @property
    def failures(self) -> tuple[VideoCheck, ...]:
        return tuple(r for r in self.results if r.error is not None)

    @property
    def ok(self) -> bool:
        return not self.failures

    def metadata_cache(self) -> MetadataCache:
        """The metadata of the readable videos, to save for datasets (``metadata_file``)."""
        cache = MetadataCache()
        for result in self.results:
            if result.metadata is not None:
                cache.put(result.path, result.metadata)
        return cache


def check_video(path: str) -> VideoCheck:
    """Open, probe and decode every frame of one video (no colour conversion), then read
    :data:`CHECKED_CLIPS` short clips spread over it as training reads them (seeking)."""
    try:
        with VideoReader(path) as video:
            shortfall = incomplete_decode(video.decode_all(), video.metadata.num_frames)
            if shortfall is not None:
                return VideoCheck(path, None, shortfall)
            _read_clips(video)
            return VideoCheck(path, video.metadata)
    except VideoDecodeError as error:
        return VideoCheck(path, None, error.reason)
    except OSError as error:
        return VideoCheck(path, None, unreadable(error))


def incomplete_decode(decoded: int, expected: int) -> str | None:
    """Why a video whose decoding gave ``decoded`` of its ``expected`` frames is bad, or ``None``: the same
    words in ``check-data`` and ``pack-frames``."""
    if decoded < expected:
        return f"decoded only {decoded} of its {expected} frames (damaged or truncated)"
    return None


def _read_clips(video: VideoReader) -> None:
    """Read two-frame clips at evenly spread frames as training does; raises VideoDecodeError as training would."""
    last = video.metadata.num_frames - 1
    for start in sorted({round(k * last / (CHECKED_CLIPS - 1)) for k in range(CHECKED_CLIPS)}):
        video.read(ClipParams((start, min(start + 1, last)), 8, 8, 0, 0, 8))


def check_frames(entry: VideoEntry, layout: FrameLayout = DEFAULT_LAYOUT) -> VideoCheck:
    """Decode every frame of one frame folder, listed as training lists it (``layout``).

    Any ``OSError`` (a permission error, a file gone meanwhile) is a failure with its reason, as
    training skips such a video.
    """
    try:
        return VideoCheck(entry.name, None, folder=check_frame_folder(entry, layout))
    except VideoDecodeError as error:
        return VideoCheck(entry.name, None, error.reason)
    except OSError as error:
        return VideoCheck(entry.name, None, unreadable(error))


def check_stored_video(entry: VideoEntry, store: str) -> VideoCheck:
    """Decode every frame of one video of a packed frame store (every level), as :func:`check_frames` does."""
    try:
        video = _store_reader(store, os.stat(os.path.join(store, HEADER_FILE)).st_mtime_ns).check_video(entry)
    except VideoDecodeError as error:
        return VideoCheck(entry.name, None, error.reason)
    except OSError as error:
        return VideoCheck(entry.name, None, unreadable(error))
    return VideoCheck(entry.name, None, folder=FrameFolder(entry.path, video.width, video.height, video.num_frames))


@functools.cache
def _store_reader(store: str, modified: int) -> PackedFrameReader:
    """One opened store per process (and per packing of it: ``modified`` is its header's time)."""
    return PackedFrameReader(store)


def check_videos(
    manifest: Manifest | Sequence[str],
    workers: int | None = None,
    progress: bool = True,
    layout: FrameLayout = DEFAULT_LAYOUT,
) -> CheckReport:
    """Check every video, in parallel processes, with a progress bar on stderr.

    Args:
        manifest: a manifest, or video paths.
        workers: processes; default the CPU count, ``0`` or ``1`` checks in this process.
        progress: show a tqdm progress bar.
        layout: frame datasets: which files are frames and whether gaps are allowed, as the
            ``filename_tmpl`` and ``allow_frame_gaps`` of the DataModule (its ``ReaderSettings.layout``).

    Raises:
        ValueError: when ``workers`` is negative, or ``layout`` is set for a video manifest.
    """
    from tqdm import tqdm

    if workers is not None and (isinstance(workers, bool) or workers < 0):
        raise ValueError(f"`workers` must be >= 0, got {workers!r}.")
    is_frames = isinstance(manifest, Manifest) and manifest.format == "frames"
    if isinstance(manifest, Manifest):
        layout.check_applies(manifest.format, manifest.source)
    else:
        layout.check_applies("video", "the list")
    items: list[Any]
    check: Callable[[Any], VideoCheck]
    packed: list[VideoCheck] = []
    if isinstance(manifest, Manifest) and manifest.format == "store":
        # The videos pack-frames left out (it decoded every frame once), then every packed frame decoded again.
        packed = [VideoCheck(name, None, reason) for name, reason in store_failures(manifest.source)]
        items = list(manifest.entries)
        check = functools.partial(check_stored_video, store=manifest.source)
    elif isinstance(manifest, Manifest) and is_frames:
        items = list(manifest.entries)
        check = functools.partial(check_frames, layout=layout)
    else:
        items = [e.path for e in manifest.entries] if isinstance(manifest, Manifest) else [str(p) for p in manifest]
        check = check_video
    bar = tqdm(total=len(items), unit="video", desc="check-data", disable=not progress, file=sys.stderr)
    results: list[VideoCheck] = packed
    with bar:
        for result in map_in_processes(check, items, workers, chunksize=None):
            results.append(result)
            bar.update()
    return CheckReport(tuple(results), manifest.format if isinstance(manifest, Manifest) else "video")


def format_report(
    report: CheckReport, num_frames: int = DEFAULT_NUM_FRAMES, sampling_rate: int = DEFAULT_SAMPLING_RATE
) -> str:
    """Failures (one line each: path and reason), then a summary of the readable videos, and the videos
    shorter than the base clip's span (:func:`~lightning_multigrid.data.clip_params.span_frames` of
    ``num_frames`` at stride ``sampling_rate``, the DataModule's arguments): their clips repeat the
    last frame."""
    lines = [f"FAILED {r.path}: {r.error}" for r in report.failures]
    good = [r.metadata for r in report.results if r.metadata is not None]
    folders = [r.folder for r in report.results if r.folder is not None]
    total = len(report.results)
    if folders:
        lines.append(f"{len(folders)} of {total} {_ITEMS[report.format]} decode, {total - len(folders)} fail.")
        by_size = sorted(folders, key=lambda f: (f.width * f.height, f.width))
        lines += [
            f"frames          {sum(f.num_frames for f in folders)} in all, "
            f"{min(f.num_frames for f in folders)}-{max(f.num_frames for f in folders)} per video",
            f"resolution      {by_size[0].width}x{by_size[0].height} to {by_size[-1].width}x{by_size[-1].height}",
        ]
        lines += _short_notes(report, num_frames, sampling_rate)
        return "\n".join(lines)
    lines.append(f"{len(good)} of {total} {_ITEMS[report.format]} decode, {total - len(good)} fail.")
    if good:
        seconds = sum(m.duration for m in good)
        hours, rest = divmod(round(seconds), 3600)
        sizes = sorted(good, key=lambda m: (m.width * m.height, m.width))
        lines += [
            f"total duration  {hours}:{rest // 60:02d}:{rest % 60:02d} ({seconds:.1f} s), "
            f"{min(m.duration for m in good):.2f}-{max(m.duration for m in good):.2f} s per video",
            f"frames          {sum(m.num_frames for m in good)} in all, "
            f"{min(m.num_frames for m in good)}-{max(m.num_frames for m in good)} per video",
            f"fps             {min(m.fps for m in good):.2f}-{max(m.fps for m in good):.2f}",
            f"resolution      {sizes[0].width}x{sizes[0].height} to {sizes[-1].width}x{sizes[-1].height}, "
            f"short side {min(min(m.width, m.height) for m in good)}-{max(min(m.width, m.height) for m in good)} px",
        ]
        lines += _geometry_notes(report)
        lines += _short_notes(report, num_frames, sampling_rate)
    return "\n".join(lines)


def _short_notes(report: CheckReport, num_frames: int, sampling_rate: int) -> list[str]:
    """Videos shorter than a base clip's span: counted, the first few named, with what training does."""
    span = span_frames(num_frames, sampling_rate)
    lengths = [(r.path, r.num_frames) for r in report.results if r.num_frames is not None]
    short = [(path, frames) for path, frames in lengths if frames < span]
    if not short:
        return []
    lines = [
        f"short videos    {len(short)} of {len(lengths)} have fewer frames than a base clip spans ({span}: "
        f"{num_frames} frames at stride {sampling_rate}): their clips repeat the last frame"
    ]
    lines += [f"  {path}: {frames} frames" for path, frames in short[:_NAMED_VIDEOS]]
    if len(short) > _NAMED_VIDEOS:
        lines.append(f"  ... and {len(short) - _NAMED_VIDEOS} more")
    return lines


def _geometry_notes(report: CheckReport) -> list[str]:
    """Rotated and anamorphic videos: counted, the first few named, with how they are read."""
    shaped = [(r.path, r.metadata) for r in report.results if r.metadata is not None and r.metadata.geometry()]
    if not shaped:
        return []
    rotated = sum(m.rotated for _, m in shaped)
    anamorphic = sum(m.anamorphic for _, m in shaped)
    lines = [
        f"geometry        {rotated} rotated, {anamorphic} anamorphic: read as players show them (upright, square "
        "pixels); sizes above are the displayed ones"
    ]
    lines += [f"  {path}: {m.geometry()}, read as {m.width}x{m.height}" for path, m in shaped[:_NAMED_VIDEOS]]
    if len(shaped) > _NAMED_VIDEOS:
        lines.append(f"  ... and {len(shaped) - _NAMED_VIDEOS} more")
    return lines
