"""Turn a video dataset into a frame dataset: ``lightning-multigrid extract-frames``.

Each video becomes a folder of JPEG frames ``img_00001.jpg, img_00002.jpg, ...`` (mmaction2's
rawframes naming), at the same relative place under the output directory as the video under the
manifest's directory, without its extension. Videos are decoded with PyAV in parallel
processes, optionally resized (short side) and resampled in time (fps). Frames are written as
players show the video, as training reads it: a rotated (phone) video upright, an anamorphic one
stretched to square pixels, at the displayed size the probe reports. A folder is finished when
its ``.done`` file exists; it records the video it holds, the frame count and the settings (short
side, fps, quality): an interrupted run picks up where it stopped, redoing only unfinished folders
and folders extracted with other settings, so one manifest never mixes sizes or frame rates; a
folder finished for another video (the train and val manifests extracted into one output, with
videos of the same names) is refused, never reused. Videos that cannot be decoded are reported as
``check-data`` reports them, and left out of the written manifest (``folder label num_frames``
lines; a folder with spaces in double quotes).

Class names go to ``classnames.txt`` in the output, and the manifest's labels are indices into it.
A file already there (another split's) is never rewritten: this manifest's labels are numbered by
its names, and names it lacks are appended, so every split extracted into one output keeps one
numbering, even one that lacks a class.

Safe to re-run: everything that would fail at the end (the manifest's path, a folder name no
manifest line can hold) is refused before the first video is decoded; the output never becomes
part of the input (the output is marked with ``FRAMES_OUTPUT_MARKER``, and a folder-per-class
listing, here or when training on the videos, never reads it as a class) and never overwrites it;
an interrupted run (Ctrl-C, ``SIGTERM``) leaves no worker process behind.

Example::

    report = extract_frames(load_manifest("kinetics/train.csv"), "kinetics_frames", short_side=256)
    report.manifest       # kinetics_frames/train.txt
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import av
from PIL import Image

from lightning_multigrid._checks import check_int
from lightning_multigrid.data.clip_params import resized_size
from lightning_multigrid.data.decoding.display import displayed_rgb
from lightning_multigrid.data.decoding.errors import VideoDecodeError, describe_error
from lightning_multigrid.data.decoding.video import VideoReader
from lightning_multigrid.data.manifests.entries import Manifest, VideoEntry, read_class_names
from lightning_multigrid.data.manifests.frames import manifest_field, write_frame_manifest
from lightning_multigrid.data.manifests.videos import FRAMES_OUTPUT_MARKER
from lightning_multigrid.data.tools.check import VideoCheck
from lightning_multigrid.data.tools.processes import map_in_processes

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
    redone: int = 0  # of ``extracted``: folders an earlier run extracted with other settings


@dataclass(frozen=True, slots=True)
class _Settings:
    """What decides a folder's frames; recorded in its ``.done`` file with the video and its frame count."""

    short_side: int | None
    fps: float | None
    quality: int

    def record(self, num_frames: int, video: str) -> str:
        return json.dumps({"video": _identity(video), "num_frames": num_frames, **asdict(self)})


@dataclass(frozen=True, slots=True)
class _Job:
    video: str
    folder: str
    settings: _Settings


def extract_video(
    video: str, folder: str, short_side: int | None = None, fps: float | None = None, quality: int = 90
) -> int:
    """Write the frames of one video as JPEGs into ``folder``; returns the frame count.

    Args:
        video: the video file.
        folder: the output folder (created; stale frames of an unfinished run are replaced).
        short_side: shrink so the short side has at most this many pixels (a smaller video keeps
            its size: never upscaled, as the store's levels); ``None`` keeps the size.
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
    # Displayed sizes: the stored frames are stretched to square pixels and turned upright.
    width, height = (metadata.width, metadata.height)
    if short_side is not None and short_side < min(width, height):  # never upscaled: it adds bytes, not detail
        width, height = resized_size(metadata.width, metadata.height, short_side)
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
                written += 1
                picture = Image.fromarray(displayed_rgb(frame, metadata, width, height))
                picture.save(out / FRAME_NAME.format(written), quality=quality)
    except (av.FFmpegError, OSError) as error:
        raise VideoDecodeError(video, f"decoding failed after {written} frames ({describe_error(error)})") from None
    if written == 0:
        raise VideoDecodeError(video, "no frame could be decoded")
    # Written last: its presence means the folder is complete (with these settings).
    (out / DONE_FILE).write_text(_Settings(short_side, fps, quality).record(written, video), encoding="utf-8")
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
        short_side: shrink frames to at most this short side in pixels, never upscale (``None``: keep).
        fps: resample to this frame rate (``None``: keep every frame).
        quality: JPEG quality, 1-100.
        workers: processes; default the CPU count, ``0`` or ``1`` extracts in this process.
        progress: show a tqdm progress bar.

    Raises:
        ValueError: before any video is decoded: on out-of-range options, a frame manifest as
            input, two videos that would share a folder, a folder name no manifest line can
            hold, an output that would overwrite the input manifest or lie inside the input, or a
            frame folder an earlier run finished for another video.
        ManifestError: when the output's ``classnames.txt`` cannot be read.
    """
    _check_options(manifest, short_side, fps, quality, workers)
    out = Path(output_dir)
    manifest_path = out / (manifest_name or f"{Path(manifest.source).stem or 'frames'}.txt")
    folders = _folders_for(manifest, out)
    _check_output(manifest, out, manifest_path, manifest_name, folders)
    for folder in folders:
        manifest_field(Path(os.path.relpath(folder, out)).as_posix())  # refused now, not after extracting
    class_names, label_of = _output_classes(out / "classnames.txt", manifest.class_names)
    settings = _Settings(short_side, fps, quality)
    done: dict[str, int] = {}
    jobs = []
    redone = 0
    for entry, folder in zip(manifest.entries, folders):
        count, same = _finished(folder, settings, entry.path)
        if count is not None and same:
            done[entry.path] = count
        else:
            redone += count is not None
            jobs.append(_Job(entry.path, folder, settings))
    out.mkdir(parents=True, exist_ok=True)
    (out / FRAMES_OUTPUT_MARKER).write_text("lightning-multigrid extract-frames output: not a class folder\n")
    already_done = len(done)
    failures: list[VideoCheck] = []
    _run_jobs(jobs, workers, progress, done, failures)
    entries = [
        VideoEntry(folder, tuple(label_of.get(label, label) for label in entry.labels), done[entry.path])
        for entry, folder in zip(manifest.entries, folders)
        if entry.path in done
    ]
    write_frame_manifest(manifest_path, entries, root=out)
    if class_names is not None:
        _write_class_names(out / "classnames.txt", class_names)
    return ExtractReport(manifest_path, len(done) - already_done, already_done, tuple(failures), redone)


def _check_output(
    manifest: Manifest, out: Path, manifest_path: Path, manifest_name: str | None, folders: list[str]
) -> None:
    """Refuse an output that would overwrite the input or become part of it (before any work)."""
    if manifest_name is not None and (Path(manifest_name).name != manifest_name or manifest_name in ("", ".", "..")):
        raise ValueError(f"`manifest_name` must be a file name without folders, got {manifest_name!r}.")
    if out.exists() and not out.is_dir():
        raise ValueError(f"`output_dir` {out} is a file: pass a folder (it is created if missing).")
    if manifest_path.is_dir():
        raise ValueError(f"The frame manifest {manifest_path} would replace a folder: pass another `manifest_name`.")
    source = Path(manifest.source)
    if source.is_file() and manifest_path.resolve() == source.resolve():
        raise ValueError(
            f"The frame manifest {manifest_path} would overwrite the input manifest {source}: pass another "
            "`output_dir` or `manifest_name` (--manifest-name)."
        )
    resolved = out.resolve()
    for entry, folder in zip(manifest.entries, folders):
        if _is_within(Path(entry.path).resolve(), Path(folder).resolve()):
            raise ValueError(
                f"The frame folder {folder} of input video {entry.path} would hold (or be) the video: the output "
                "would become part of the input; pass another `output_dir`."
            )
    if source.is_dir() and manifest.class_names is not None and _is_within(resolved, source.resolve()):
        top = resolved.relative_to(source.resolve()).parts[:1]
        if top and top[0] in manifest.class_names:
            raise ValueError(
                f"`output_dir` {out} is read as class {top[0]!r} of the folder-per-class input {source}: read the "
                "input with `read_folder_manifest(root, exclude=[output_dir])` (the CLI does), or pass an "
                "`output_dir` outside it."
            )


def _is_within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _output_classes(path: Path, names: tuple[str, ...] | None) -> tuple[tuple[str, ...] | None, dict[int, int]]:
    """The output's class names (those of its ``classnames.txt``, this manifest's new ones appended)
    and each of this manifest's class indices in them; a split never renumbers another's classes."""
    if names is None:
        return None, {}
    existing = read_class_names(path) if path.is_file() else ()
    merged = (*existing, *(name for name in names if name not in existing))
    index_of = {name: i for i, name in enumerate(merged)}
    return merged, {i: index_of[name] for i, name in enumerate(names)}


def _write_class_names(path: Path, names: tuple[str, ...]) -> None:
    text = "".join(f"{n}\n" for n in names)
    if path.is_file() and path.read_text(encoding="utf-8-sig") == text:
        return  # unchanged (possibly the input's own class-names file): leave it be
    path.write_text(text, encoding="utf-8")


def _check_options(
    manifest: Manifest, short_side: int | None, fps: float | None, quality: int, workers: int | None
) -> None:
    if manifest.format != "video":
        raise ValueError(f"{manifest.source} is already a frame dataset: `extract-frames` reads video manifests.")
    if short_side is not None:
        check_int("short_side", short_side, 1)
    if fps is not None and (isinstance(fps, bool) or not isinstance(fps, (int, float)) or not 0 < fps < math.inf):
        raise ValueError(f"`fps` must be > 0, got {fps!r}.")
    if isinstance(quality, bool) or not isinstance(quality, int) or not 1 <= quality <= 100:
        raise ValueError(f"`quality` must be an integer in [1, 100], got {quality!r}.")
    if workers is not None:
        check_int("workers", workers, 0)


def _run_jobs(
    jobs: list[_Job], workers: int | None, progress: bool, done: dict[str, int], failures: list[VideoCheck]
) -> None:
    """Extract the videos of ``jobs`` in this process or a process pool, recording each result."""
    from tqdm import tqdm

    bar = tqdm(total=len(jobs), unit="video", desc="extract-frames", disable=not progress, file=sys.stderr)
    with bar:
        for job, (count, error) in zip(jobs, map_in_processes(_run_job, jobs, workers)):
            _record(job, count, error, done, failures)
            bar.update()


def _run_job(job: _Job) -> tuple[int, str | None]:
    try:
        settings = job.settings
        return extract_video(job.video, job.folder, settings.short_side, settings.fps, settings.quality), None
    except VideoDecodeError as error:
        return 0, error.reason


def _record(job: _Job, count: int, error: str | None, done: dict[str, int], failures: list[VideoCheck]) -> None:
    if error is None:
        done[job.video] = count
    else:
        failures.append(VideoCheck(job.video, None, error))


def _finished(folder: str, settings: _Settings, video: str) -> tuple[int | None, bool]:
    """``(frame count, extracted from video with settings)`` of a finished folder; ``(None, False)``
    if unfinished.

    Raises:
        ValueError: when the folder was finished for another video: it is never reused for this one.
    """
    try:
        record = json.loads((Path(folder) / DONE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, False
    if isinstance(record, int):  # an earlier version recorded the count alone: settings unknown
        return record, False
    if not isinstance(record, dict) or not isinstance(record.get("num_frames"), int):
        return None, False
    owner = record.get("video")
    if owner is not None and owner != _identity(video):
        raise ValueError(
            f"The frame folder {folder} holds the frames of video {owner} (extracted earlier), not of {video}: "
            "two videos map to it (two manifests of videos with the same names extracted into one `output_dir`?). "
            f"Extract each manifest into its own `output_dir` (e.g. frames/train and frames/val), or delete {folder} "
            "to extract this video there."
        )
    recorded = {k: record.get(k) for k in ("short_side", "fps", "quality")}
    # Without a recorded video (an earlier version), which video it holds is unknown: redo it.
    return record["num_frames"], owner is not None and recorded == asdict(settings)


def _identity(video: str) -> str:
    """The video a folder holds, as its ``.done`` records it: the absolute path, links resolved."""
    return str(Path(video).resolve())


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
