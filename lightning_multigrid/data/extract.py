"""Turn a video dataset into a frame dataset: ``lightning-multigrid extract-frames``.

Each video becomes a folder of JPEG frames ``img_00001.jpg, img_00002.jpg, ...`` (mmaction2's
rawframes naming), at the same relative place under the output directory as the video under the
manifest's directory, without its extension. Videos are decoded with PyAV in parallel
processes, optionally resized (short side) and resampled in time (fps). A folder is finished when
its ``.done`` file (holding the frame count) exists: an interrupted run picks up where it stopped,
redoing only unfinished folders. Videos that cannot be decoded are reported as ``check-data``
reports them, and left out of the written manifest (``folder label num_frames`` lines).

Example::

    report = extract_frames(load_manifest("kinetics/train.csv"), "kinetics_frames", short_side=256)
    report.manifest       # kinetics_frames/train.txt
"""

from __future__ import annotations

import math
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import av

from lightning_multigrid.data.check import VideoCheck
from lightning_multigrid.data.clip_params import resized_size
from lightning_multigrid.data.decode import VideoDecodeError, VideoReader, _describe
from lightning_multigrid.data.frame_manifest import write_frame_manifest
from lightning_multigrid.data.manifest import Manifest, VideoEntry

__all__ = ["DONE_FILE", "ExtractReport", "extract_frames", "extract_video"]

DONE_FILE = ".done"
FRAME_NAME = "img_{:05d}.jpg"


@dataclass(frozen=True, slots=True)
class ExtractReport:
    """What :func:`extract_frames` did.

    Attributes:
        manifest: the frame manifest written (the videos that were extracted, or found done).
        extracted: videos extracted by this run.
        already_done: videos skipped because an earlier run finished them.
        failures: videos that could not be decoded, with the reason (as ``check-data``).
    """

    manifest: Path
    extracted: int
    already_done: int
    failures: tuple[VideoCheck, ...]


@dataclass(frozen=True, slots=True)
class _Job:
    video: str
    folder: str
    short_side: int | None
    fps: float | None
    quality: int


def extract_video(
    video: str, folder: str, short_side: int | None = None, fps: float | None = None, quality: int = 90
) -> int:
    """Write the frames of one video as JPEGs into ``folder``; returns the frame count.

    Args:
        video: the video file.
        folder: the output folder (created; stale frames of an unfinished run are replaced).
        short_side: resize so the short side has this many pixels; ``None`` keeps the size.
        fps: keep frames at this rate (the first frame at or after each ``k / fps`` seconds);
            ``None`` keeps every frame.
        quality: JPEG quality, 1-100.

    Raises:
        VideoDecodeError: when the video cannot be opened or decoded, or yields no frame.
    """
    with VideoReader(video) as reader:  # names missing, empty, truncated and non-video files
        metadata = reader.metadata
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    (out / DONE_FILE).unlink(missing_ok=True)
    for stale in out.glob("img_*.jpg"):
        stale.unlink()
    size = None
    if short_side is not None:
        size = resized_size(metadata.width, metadata.height, short_side)
    written = 0
    next_time = -math.inf
    try:
        with av.open(video) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"  # whole-file decode: frame threads pay off here
            for frame in container.decode(stream):
                if fps is not None:
                    time = float(frame.time) if frame.time is not None else written / fps
                    if time + 1e-6 < next_time:
                        continue
                    next_time = (math.floor(time * fps + 1e-6) + 1) / fps
                image = frame.to_image(width=size[0], height=size[1]) if size else frame.to_image()
                written += 1
                image.save(out / FRAME_NAME.format(written), quality=quality)
    except (av.FFmpegError, OSError) as error:
        raise VideoDecodeError(video, f"decoding failed after {written} frames ({_describe(error)})") from None
    if written == 0:
        raise VideoDecodeError(video, "no frame could be decoded")
    # Written last: its presence means the folder is complete.
    (out / DONE_FILE).write_text(str(written), encoding="utf-8")
    return written


def extract_frames(
    manifest: Manifest,
    output_dir: str | os.PathLike[str],
    manifest_name: str | None = None,
    short_side: int | None = None,
    fps: float | None = None,
    quality: int = 90,
    workers: int | None = None,
    progress: bool = True,
) -> ExtractReport:
    """Extract every video of a manifest into a frame dataset and write its manifest.

    Args:
        manifest: a video manifest.
        output_dir: where the frame folders and the manifest go.
        manifest_name: file name of the written manifest; default the source manifest's stem
            plus ``.txt`` (``train.csv`` -> ``train.txt``).
        short_side: resize frames to this short side in pixels (``None``: keep).
        fps: resample to this frame rate (``None``: keep every frame).
        quality: JPEG quality, 1-100.
        workers: processes; default the CPU count, ``0`` or ``1`` extracts in this process.
        progress: show a tqdm progress bar.

    Raises:
        ValueError: on out-of-range options, a frame manifest as input, or two videos that
            would share a folder.
    """
    _check_options(manifest, short_side, fps, quality, workers)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    folders = _folders_for(manifest, out)
    done: dict[str, int] = {}
    jobs = []
    for entry, folder in zip(manifest.entries, folders):
        count = _finished_count(folder)
        if count is not None:
            done[entry.path] = count
        else:
            jobs.append(_Job(entry.path, folder, short_side, fps, quality))
    already_done = len(done)
    failures: list[VideoCheck] = []
    _run_jobs(jobs, workers, progress, done, failures)
    name = manifest_name or f"{Path(manifest.source).stem or 'frames'}.txt"
    entries = [
        VideoEntry(folder, entry.labels, done[entry.path])
        for entry, folder in zip(manifest.entries, folders)
        if entry.path in done
    ]
    manifest_path = out / name
    write_frame_manifest(manifest_path, entries, root=out)
    if manifest.class_names is not None:
        (out / "classnames.txt").write_text("".join(f"{n}\n" for n in manifest.class_names), encoding="utf-8")
    return ExtractReport(manifest_path, len(done) - already_done, already_done, tuple(failures))


def _check_options(
    manifest: Manifest, short_side: int | None, fps: float | None, quality: int, workers: int | None
) -> None:
    if manifest.format != "video":
        raise ValueError(f"{manifest.source} is already a frame dataset: `extract-frames` reads video manifests.")
    if short_side is not None and short_side < 1:
        raise ValueError(f"`short_side` must be >= 1, got {short_side!r}.")
    if fps is not None and not fps > 0:
        raise ValueError(f"`fps` must be > 0, got {fps!r}.")
    if not 1 <= quality <= 100:
        raise ValueError(f"`quality` must be in [1, 100], got {quality!r}.")
    if workers is not None and workers < 0:
        raise ValueError(f"`workers` must be >= 0, got {workers!r}.")


def _run_jobs(
    jobs: list[_Job], workers: int | None, progress: bool, done: dict[str, int], failures: list[VideoCheck]
) -> None:
    """Extract the videos of ``jobs`` in this process or a process pool, recording each result."""
    from tqdm import tqdm

    processes = min((os.cpu_count() or 1) if workers is None else workers, len(jobs))
    bar = tqdm(total=len(jobs), unit="video", desc="extract-frames", disable=not progress, file=sys.stderr)
    with bar:
        if processes <= 1:
            results = map(_run_job, jobs)
            for job, (count, error) in zip(jobs, results):
                _record(job, count, error, done, failures)
                bar.update()
        else:
            with ProcessPoolExecutor(processes) as pool:
                for job, (count, error) in zip(jobs, pool.map(_run_job, jobs, chunksize=1)):
                    _record(job, count, error, done, failures)
                    bar.update()


def _run_job(job: _Job) -> tuple[int, str | None]:
    try:
        return extract_video(job.video, job.folder, job.short_side, job.fps, job.quality), None
    except VideoDecodeError as error:
        return 0, error.reason


def _record(job: _Job, count: int, error: str | None, done: dict[str, int], failures: list[VideoCheck]) -> None:
    if error is None:
        done[job.video] = count
    else:
        failures.append(VideoCheck(job.video, None, error))


def _finished_count(folder: str) -> int | None:
    marker = Path(folder) / DONE_FILE
    try:
        return int(marker.read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None


def _folders_for(manifest: Manifest, out: Path) -> list[str]:
    """One folder per video: its path under the manifest's directory (else the videos' common
    directory), extension dropped, so train and val manifests beside each other keep apart."""
    entries = manifest.entries
    parents = [os.path.dirname(os.path.abspath(e.path)) for e in entries]
    source = Path(manifest.source)
    base = os.path.abspath(source if source.is_dir() else source.parent)
    if not all(os.path.commonpath([base, p]) == base for p in parents):
        base = os.path.commonpath(parents)
    folders = []
    for entry in entries:
        relative = os.path.splitext(os.path.relpath(os.path.abspath(entry.path), base))[0]
        folders.append(str(out / relative))
    seen: dict[str, str] = {}
    for entry, folder in zip(entries, folders):
        if folder in seen:
            raise ValueError(
                f"Videos {seen[folder]} and {entry.path} would share the frame folder {folder}: rename one."
            )
        seen[folder] = entry.path
    return folders
