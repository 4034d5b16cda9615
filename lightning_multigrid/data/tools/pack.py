"""Write a packed frame store: ``lightning-multigrid pack-frames``.

From a frame manifest (what ``extract-frames`` writes) or straight from a video manifest (each video
decoded once with PyAV), every frame is decoded in full once, here, and checked as ``check-data``
checks it: a video with a frame that does not decode (or a folder that is missing, empty, short of
frames or mixes sizes; a video file that is not one or decodes short) is a bad video, named with
``check-data``'s words, recorded in the store's header and left out. The good videos' frames are
resized to each level's short side (never up: a smaller source keeps its size, and its bytes when
they are JPEG already) and handed to the store's writer (:mod:`~lightning_multigrid.data.store.write`),
which appends them, video after video, to one file per level
(:mod:`~lightning_multigrid.data.store.format`). This module is the command: its options, checks,
progress and messages.

Level 0 is the largest short side the grids draw, the maximum of the jitter scales
(:meth:`~lightning_multigrid.grid.ClipSampling.scales_for_base`: 160 for a 112 crop, 320 for 224):
anything larger would be decoded and thrown away at every grid. Extra levels at 1/sqrt(2) steps below
it are optional (``levels``); on CPU they were measured to add little (docs/data.md).

Safe to interrupt and re-run: the files are written under names new to the run, renamed when
complete, and the header that makes the folder a store is renamed into place last; a re-run
rebuilds the store (an older complete store keeps loading until the new one replaces it, and a run
reading it keeps its files until it lets go). Packing runs into one folder take turns (the second
waits for the first), so two runs started together never remove each other's files. The
videos are read and encoded in a process pool that never outlives the command
(:mod:`~lightning_multigrid.data.tools.processes`).

Example::

    report = pack_frames(load_manifest("frames/train.txt"), "train.store", crop_size=112)
    report.levels        # (160,)
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from PIL import Image

from lightning_multigrid._checks import check_int, check_positive_int
from lightning_multigrid.data.decoding.errors import VideoDecodeError, describe_error, unreadable
from lightning_multigrid.data.decoding.frame_names import DEFAULT_LAYOUT, FrameLayout
from lightning_multigrid.data.decoding.frames import jpeg_end, load_checked_frame, open_frame_folder
from lightning_multigrid.data.manifests.entries import Manifest, VideoEntry
from lightning_multigrid.data.manifests.store_folder import is_store
from lightning_multigrid.data.store.header import Packing
from lightning_multigrid.data.store.write import PackedVideo, store_writer
from lightning_multigrid.data.tools.check import VideoCheck, incomplete_decode
from lightning_multigrid.data.tools.processes import map_in_processes
from lightning_multigrid.grid import ClipSampling

__all__ = ["DEFAULT_SUBSAMPLING", "SUBSAMPLINGS", "PackReport", "manifest_digest", "pack_frames", "store_levels"]

Subsampling = Literal["4:4:4", "4:2:0"]
SUBSAMPLINGS: tuple[Subsampling, ...] = ("4:4:4", "4:2:0")
# Chosen from benchmarks/store_colour.py (docs/data.md): half the colour difference of 4:2:0 from the frames
# on textured colour, for 1.4x the bytes and about 1.25x the decode CPU.
DEFAULT_SUBSAMPLING: Subsampling = "4:4:4"


@dataclass(frozen=True, slots=True)
class PackReport:
    """What :func:`pack_frames` wrote.

    Attributes:
        store: the store folder.
        videos: videos packed.
        frames: frames packed (per level).
        levels: each level's short side in pixels, level 0 first.
        level_bytes: bytes of each level's frame file.
        failures: the videos left out, with the reason (as ``check-data`` reports them).
    """

    store: Path
    videos: int
    frames: int
    levels: tuple[int, ...]
    level_bytes: tuple[int, ...]
    failures: tuple[VideoCheck, ...]


def store_levels(crop_size: int, jitter_scales: tuple[int, int] | None = None, levels: int = 1) -> tuple[int, ...]:
    """Short sides of a store's levels for a base crop: the jitter maximum, then 1/sqrt(2) steps below it.

    Raises:
        ValueError: when ``crop_size`` < 1 or ``levels`` < 1, the crop does not fit the jitter scales, or
            a level would fall below 1 pixel or repeat the one above.
    """
    check_positive_int("crop_size", crop_size)
    check_int("levels", levels, 1)
    sampling = ClipSampling(jitter_scales=jitter_scales)
    sampling.check_fits(crop_size)
    top = sampling.scales_for_base(crop_size)[1]
    sides = tuple(round(top / math.sqrt(2) ** k) for k in range(levels))
    if len(set(sides)) != len(sides) or sides[-1] < 1:
        raise ValueError(f"`levels`={levels} below a level 0 of {top} px gives levels {list(sides)}: use fewer levels.")
    return sides


@dataclass(frozen=True, slots=True)
class _Job:
    entry: VideoEntry
    kind: str  # "frames" or "video"
    levels: tuple[int, ...]
    quality: int
    subsampling: Subsampling
    layout: FrameLayout


def pack_frames(
    manifest: Manifest,
    output: str | os.PathLike[str],
    crop_size: int = 112,
    jitter_scales: tuple[int, int] | None = None,
    levels: int = 1,
    quality: int = 90,
    subsampling: Subsampling = DEFAULT_SUBSAMPLING,
    layout: FrameLayout = DEFAULT_LAYOUT,
    workers: int | None = None,
    progress: bool = True,
    source_digest: str | None = None,
) -> PackReport:
    """Pack every video of a frame or video manifest into a store at ``output``.

    Args:
        manifest: a frame manifest or a video manifest.
        output: the store folder (created; an older store there is replaced when this one is complete).
        crop_size: the base crop the store is for; with ``jitter_scales`` it sets level 0
            (:func:`store_levels`).
        jitter_scales: ``(min, max)`` training short side at the base crop, as the DataModule's;
            default ``(256, 320) * crop_size / 224``.
        levels: stored levels: level 0 and ``levels - 1`` more at 1/sqrt(2) steps (default 1).
        quality: JPEG quality 1-100 of resized frames (frames already at their level keep their bytes).
        subsampling: chroma subsampling of resized frames: ``"4:4:4"`` (full colour resolution, the
            default) or ``"4:2:0"`` (colour at half resolution both ways: about 0.7x the bytes and 0.8x
            the decode CPU, twice the colour difference from the frames on textured colour; what stores
            packed before this option hold, and still read). Measured in docs/data.md.
        layout: frame manifests: which files are frames (as the datasets' ``filename_tmpl``,
            ``allow_frame_gaps``).
        workers: processes; default the CPU count, ``0`` or ``1`` packs in this process.
        progress: show a tqdm progress bar on stderr.
        source_digest: what identifies the packed content, recorded in the header (``packed_from.digest``,
            read back by :func:`~lightning_multigrid.data.store.format.store_digest`); default the SHA-256
            of the manifest file's bytes (``None`` for a folder per class).

    Raises:
        ValueError: before any frame is read: on out-of-range options, an output that is a file, a
            folder holding something other than a store, or a folder this process cannot write (a
            read-only disk); after reading, when no video could be packed.
    """
    sides = store_levels(crop_size, jitter_scales, levels)
    if isinstance(quality, bool) or not isinstance(quality, int) or not 1 <= quality <= 100:
        raise ValueError(f"`quality` must be an integer in [1, 100], got {quality!r}.")
    if subsampling not in SUBSAMPLINGS:
        raise ValueError(f"`subsampling` must be one of {', '.join(map(repr, SUBSAMPLINGS))}, got {subsampling!r}.")
    if workers is not None:
        check_int("workers", workers, 0)
    if manifest.format not in ("frames", "video"):
        raise ValueError(f"{manifest.source} is already a frame store: `pack-frames` reads frame or video manifests.")
    layout.check_applies(manifest.format, manifest.source)
    out = Path(output)
    _check_output(out, manifest)
    digest = source_digest if source_digest is not None else manifest_digest(manifest.source)
    packing = Packing(manifest.source, manifest.format, digest, crop_size, jitter_scales, quality, subsampling)
    jobs = [_Job(entry, manifest.format, sides, quality, subsampling, layout) for entry in manifest.entries]
    with store_writer(out, sides) as writer:  # another packing run into `out` finishes first
        for job, packed in _packed_videos(jobs, workers, progress):
            writer.add(job.entry, packed)
        if not writer.entries:
            first = writer.failures[0] if writer.failures else None
            raise ValueError(
                f"No video of {manifest.source} could be packed"
                + (f", e.g. {first.name}: {first.reason}" if first else "")
                + ". Run `lightning-multigrid check-data` on it to list the bad files."
            )
        writer.commit(manifest, packing)
    failures = tuple(VideoCheck(f.name, None, f.reason) for f in writer.failures)
    return PackReport(out, len(writer.entries), writer.total_frames, sides, writer.level_bytes(), failures)


def manifest_digest(source: str | os.PathLike[str]) -> str | None:
    """The SHA-256 of a manifest file's bytes (hex); ``None`` when ``source`` is not a file (a folder per class)."""
    path = Path(source)
    if not path.is_file():
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _check_output(out: Path, manifest: Manifest) -> None:
    """Refuse, before any work, an output that would clobber something that is not a store, or that cannot be written."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"The store {out} would replace a file: pass a folder name (it is created).")
    _check_writable(out)
    if out.is_dir() and not is_store(out) and any(out.iterdir()):
        raise ValueError(
            f"The store folder {out} exists and holds files that are not a frame store: pass a new or empty folder."
        )
    source = Path(manifest.source)
    if source.is_dir() and (out.resolve() == source.resolve() or source.resolve() in out.resolve().parents):
        raise ValueError(
            f"The store {out} would lie inside the folder-per-class input {source} (and be read as a class): "
            "pass a folder outside it."
        )


def _check_writable(out: Path) -> None:
    """Refuse a store folder this process cannot write: a read-only disk or folder (packing writes the
    ``.packing`` marker and its files there; the folder and its parents are created where absent)."""
    folder = out
    while not folder.exists() and folder.parent != folder:
        folder = folder.parent  # the nearest folder that exists is the one written first
    # `effective_ids`: the permissions of the user this process runs as (`seteuid`), as `open` sees them.
    effective = os.access in os.supports_effective_ids
    if not os.access(folder, os.W_OK | os.X_OK, effective_ids=effective):
        where = "" if folder == out else f" (in {folder})"
        raise ValueError(
            f"The store folder {out} cannot be written{where}: the folder or its disk is read-only for this user. "
            "Pass a store folder you can write to."
        )


def _packed_videos(jobs: list[_Job], workers: int | None, progress: bool) -> Iterator[tuple[_Job, PackedVideo]]:
    from tqdm import tqdm

    bar = tqdm(total=len(jobs), unit="video", desc="pack-frames", disable=not progress, file=sys.stderr)
    with bar:
        for job, packed in zip(jobs, map_in_processes(_pack_video, jobs, workers)):
            bar.update()
            yield job, packed


def _pack_video(job: _Job) -> PackedVideo:
    """One video's frames at every level, each frame decoded and checked once; a bad video's reason."""
    try:
        return _pack_frame_folder(job) if job.kind == "frames" else _pack_video_file(job)
    except VideoDecodeError as error:
        return PackedVideo(error=error.reason)
    except OSError as error:  # a permission error, a file gone meanwhile: as training and check-data
        return PackedVideo(error=unreadable(error))


def _pack_frame_folder(job: _Job) -> PackedVideo:
    folder = open_frame_folder(job.entry, job.layout)
    packed = PackedVideo.of_size(folder.width, folder.height, job.levels)
    keeps_size = packed.source_size in packed.level_sizes
    for index in range(folder.num_frames):
        with load_checked_frame(folder, index) as image:
            # A JPEG already at a level's size is stored as it is (checked just now), cut at its end
            # marker: bytes after it are ignored in every mode, and the store holds only the image.
            data = _image_bytes(Path(folder.frame_path(index)).read_bytes()) if keeps_size else None
            _add_frame(packed, image, data, job)
    return packed


def _image_bytes(data: bytes) -> bytes:
    end = jpeg_end(data)
    return data if end is None or end == len(data) else data[:end]


def _pack_video_file(job: _Job) -> PackedVideo:
    import av

    from lightning_multigrid.data.decoding.display import displayed_rgb
    from lightning_multigrid.data.decoding.video import VideoReader

    path = job.entry.path
    with VideoReader(path) as video:  # names missing, empty, non-video files as check-data does
        metadata = video.metadata
    packed = PackedVideo.of_size(metadata.width, metadata.height, job.levels)
    decoded = 0
    try:
        with av.open(path) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"  # whole-file decode: frame threads pay off here
            for frame in container.decode(stream):
                # As players show it (upright, square pixels), as extract-frames writes it.
                image = Image.fromarray(displayed_rgb(frame, metadata, metadata.width, metadata.height))
                _add_frame(packed, image, None, job)
                decoded += 1
    except (av.FFmpegError, OSError) as error:
        raise VideoDecodeError(path, f"decoding failed ({describe_error(error)})") from None
    shortfall = incomplete_decode(decoded, metadata.num_frames)
    if shortfall is not None:
        raise VideoDecodeError(path, shortfall)
    return packed


def _add_frame(packed: PackedVideo, image: Image.Image, data: bytes | None, job: _Job) -> None:
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    for size, frames in zip(packed.level_sizes, packed.frames):
        if size == (0, 0):
            continue
        if size == packed.source_size and data is not None:
            frames.append(data)  # a JPEG already at this level's size: its bytes, untouched
            continue
        resized = rgb if size == rgb.size else rgb.resize(size, Image.Resampling.BICUBIC)
        buffer = io.BytesIO()
        resized.save(buffer, format="JPEG", quality=job.quality, subsampling=job.subsampling)
        frames.append(buffer.getvalue())

