"""Frame datasets' lists: a folder of JPEG frames per video, the layout PySlowFast and mmaction2 read.

Two formats:

- a **frame manifest**, one video per line, whitespace-separated: ``folder label [num_frames]``
  (mmaction2's rawframes list; ``lightning-multigrid extract-frames`` writes it). Folders are
  relative to a root (default: the manifest's directory); the label field is a class index, a
  comma-separated list (multi-label) or a class name with ``class_names``; ``num_frames``, when
  given, is checked against the folder when the video is first read::

      train/abseiling/-3B32lodo2M 0 300
      train/air_drumming/-VtLx-mcPds 1 298

- **PySlowFast's frame-list CSV** (Charades, AVA, Something-Something), space-separated with the
  header ``original_vido_id video_id frame_id path labels``, one line per frame; a video's
  frames are its lines sorted by ``frame_id``, its labels the union of its frames' labels
  (quoted, comma-separated, possibly empty, as PySlowFast's Charades loader aggregates them)::

      original_vido_id video_id frame_id path labels
      46GP8 0 0 46GP8/46GP8-000001.jpg "118,31"
      46GP8 0 1 46GP8/46GP8-000002.jpg ""

Both give a :class:`~lightning_multigrid.data.manifests.videos.Manifest` with ``format="frames"``.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from lightning_multigrid.data.manifests.videos import (
    VIDEO_EXTENSIONS,
    Manifest,
    ManifestError,
    VideoEntry,
    _check_root,
    _parse_labels,
    _parses,
    _resolve_class_names,
    _split_line,
)

__all__ = [
    "FRAME_CSV_HEADER",
    "detect_manifest_kind",
    "is_frame_manifest",
    "manifest_field",
    "read_frame_manifest",
    "write_frame_manifest",
]

FRAME_CSV_HEADER: tuple[str, ...] = ("original_vido_id", "video_id", "frame_id", "path", "labels")


def is_frame_manifest(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None) -> bool:
    """Whether a manifest file lists frame folders (or is a frame-list CSV) rather than video files.

    ``False`` also when the content cannot tell (see :func:`detect_manifest_kind`).
    """
    return Path(path).is_file() and detect_manifest_kind(path, root) == "frames"


def detect_manifest_kind(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None) -> str | None:
    """``"video"`` or ``"frames"`` from a manifest's content, ``None`` when it cannot tell.

    PySlowFast's header makes a frame-list CSV. Otherwise each of the first lines votes: a path
    with a video extension (``.mp4``, ...) for video; a third, integer field (``folder label
    num_frames``) for frames; else, on the first 20 lines, an existing directory under the root
    for frames and an existing file for video. Missing entries at the top, commas and a wrong
    root do not turn a frame manifest into a video manifest.
    """
    file = Path(path)
    base = Path(root) if root is not None else file.parent
    votes = {"video": 0, "frames": 0}
    with file.open(encoding="utf-8-sig") as handle:
        data = [line for raw in handle if (line := raw.strip()) and not line.startswith("#")]
    if not data:
        return "video"  # its reader says that it lists no videos
    if tuple(data[0].split()[:5]) == FRAME_CSV_HEADER:
        return "frames"
    for number, line in enumerate(data[:1000]):
        vote = _vote(line, base if number < 20 else None)
        if vote is not None:
            votes[vote] += 1
    if votes["video"] == votes["frames"]:
        return None
    return "video" if votes["video"] > votes["frames"] else "frames"


def _vote(line: str, base: Path | None) -> str | None:
    candidates = [video for video, _ in _split_line(line)]
    if any(Path(c).suffix.lower() in VIDEO_EXTENSIONS for c in candidates):
        return "video"
    splits = [f for f in _splits(line) if len(f) in (2, 3) and f[0] and f[1]]
    # `folder label num_frames` in the first reading that has 2-3 fields: a frame count (labels
    # may be names here). `clip 1,2,3` is a multi-label 2-field line, not a frame count.
    if splits and len(splits[0]) == 3 and splits[0][2].isdigit():
        return "frames"
    if base is not None:
        paths = [f[0] for f in splits]
        if any((base / p).is_dir() for p in [*paths, *candidates]):
            return "frames"
        if any((base / p).is_file() for p in candidates):
            return "video"
    return None


def read_frame_manifest(
    path: str | os.PathLike[str],
    root: str | os.PathLike[str] | None = None,
    class_names: str | os.PathLike[str] | Sequence[str] | None = None,
    multi_label: bool | None = None,
) -> Manifest:
    """Read a frame manifest (``folder label [num_frames]``) or a PySlowFast frame-list CSV.

    Args:
        path: the manifest file.
        root: directory the folders (or frame paths) are relative to; default the manifest's
            directory.
        class_names: a class-names file or the names, for labels given as names.
        multi_label: force multi-label targets; by default a manifest is multi-label when any
            video has other than one label.

    Raises:
        FileNotFoundError: when the manifest or ``root`` does not exist.
        ManifestError: on a malformed line, an unknown label, a video without a label in a
            single-label manifest, or an empty manifest, naming the file and line.
    """
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"Frame manifest {file} does not exist: check the manifest path.")
    base = _check_root(root, default=file.parent)
    names = _resolve_class_names(class_names)
    index_of = {name: i for i, name in enumerate(names)} if names is not None else None
    with file.open(encoding="utf-8-sig") as handle:  # -sig: a byte-order mark is not part of line 1
        numbered = [(n, raw.strip()) for n, raw in enumerate(handle, start=1)]
    lines = [(n, line) for n, line in numbered if line and not line.startswith("#")]
    if lines and tuple(lines[0][1].split()[:5]) == FRAME_CSV_HEADER:
        entries = _read_frame_csv(lines[1:], base, index_of, file)
    else:
        entries = [_read_folder_line(n, line, base, index_of, file) for n, line in lines]
    if not entries:
        raise ManifestError(f"{file}: the manifest lists no videos: write one `folder label [num_frames]` line per video.")
    any_multi = any(len(e.labels) != 1 for e in entries)
    is_multi = any_multi if multi_label is None else multi_label
    if not is_multi:
        unlabelled = [e.path for e in entries if not e.labels]
        if unlabelled:
            raise ManifestError(f"{file}: video {unlabelled[0]} has no label; pass `multi_label=True` for Charades-style lists.")
    if names is not None:
        num_classes = len(names)
    else:
        num_classes = 1 + max((max(e.labels) for e in entries if e.labels), default=0)
    return Manifest(tuple(entries), num_classes, is_multi, names, str(file), "frames")


def write_frame_manifest(
    path: str | os.PathLike[str], entries: Iterable[VideoEntry], root: str | os.PathLike[str] | None = None
) -> None:
    """Write ``folder label num_frames`` lines, folders relative to ``root`` (default the file's directory).

    A folder with whitespace (a Kinetics class such as ``air drumming``) is written in double
    quotes, which :func:`read_frame_manifest` reads back.

    Raises:
        ValueError: when a folder name holds both whitespace and a double quote (no line can hold it).
    """
    file = Path(path)
    base = Path(root) if root is not None else file.parent
    lines = []
    for entry in entries:
        folder = Path(entry.path)
        try:
            folder = folder.relative_to(base)
        except ValueError:
            pass
        count = "" if entry.num_frames is None else f" {entry.num_frames}"
        lines.append(f"{manifest_field(folder.as_posix())} {','.join(map(str, entry.labels))}{count}\n")
    file.write_text("".join(lines), encoding="utf-8")


def manifest_field(folder: str) -> str:
    """``folder`` as the first field of a frame manifest line: quoted when it holds whitespace.

    Raises:
        ValueError: when it holds whitespace and a double quote, or a line break.
    """
    if not any(c.isspace() for c in folder):
        return folder
    if '"' in folder or "\n" in folder or "\r" in folder:
        raise ValueError(
            f"Frame folder {folder!r} holds whitespace and a double quote (or a line break): no frame manifest "
            "line can hold it; rename it."
        )
    return f'"{folder}"'


def _frame_fields(line: str, index_of: dict[str, int] | None) -> list[str] | None:
    """``[folder, label, (num_frames)]`` of a line separated by whitespace (folder possibly in double
    quotes) or by commas (as a spreadsheet saves it), whichever reads; ``None`` when neither does."""
    for fields in _splits(line):
        if len(fields) in (2, 3) and fields[0] and _parses(fields[1], index_of) and (
            len(fields) == 2 or fields[2].isdigit()
        ):
            return fields
    return None


def _splits(line: str) -> list[list[str]]:
    """The line split on whitespace (honouring double quotes), then on commas."""
    if line.startswith('"'):
        spaced = next(csv.reader([line.replace("\t", " ")], delimiter=" ", skipinitialspace=True))
    else:
        spaced = line.split()
    if "," not in line:
        return [spaced]
    return [spaced, [f.strip() for f in next(csv.reader([line], skipinitialspace=True))]]


def _read_folder_line(
    line_number: int, line: str, base: Path, index_of: dict[str, int] | None, file: Path
) -> VideoEntry:
    fields = _frame_fields(line, index_of) or _loose_fields(line)
    if len(fields) not in (2, 3):
        raise ManifestError(
            f"{file}:{line_number}: malformed line {line!r}: expected `folder label [num_frames]` "
            'separated by whitespace or commas (a folder with spaces in double quotes: `"air drumming/x" 1 300`).'
        )
    num_frames = None
    if len(fields) == 3:
        if not fields[2].isdigit() or int(fields[2]) < 1:
            raise ManifestError(f"{file}:{line_number}: `num_frames` {fields[2]!r} is not a positive integer in {line!r}.")
        num_frames = int(fields[2])
    labels = _parse_labels(fields[1], index_of, file, line_number, line)
    return VideoEntry(str(base / fields[0]), labels, num_frames, line_number=line_number)


def _loose_fields(line: str) -> list[str]:
    """The fields of a line that does not read, split as its separators say, for the error message."""
    if "," in line and len(line.split()) == 1:
        return [f.strip() for f in line.split(",")]
    return line.split()


def _read_frame_csv(
    lines: list[tuple[int, str]], base: Path, index_of: dict[str, int] | None, file: Path
) -> list[VideoEntry]:
    # video id -> [(frame_id, path)], labels; insertion order is the order of first appearance.
    frames: dict[str, list[tuple[int, str]]] = {}
    labels: dict[str, set[int]] = {}
    first_line: dict[str, int] = {}
    for line_number, line in lines:
        fields = line.split(maxsplit=4)
        if len(fields) < 4 or not fields[2].lstrip("-").isdigit():
            raise ManifestError(
                f"{file}:{line_number}: malformed line {line!r}: expected "
                f"`{' '.join(FRAME_CSV_HEADER)}` with an integer frame_id."
            )
        video, _, frame_id, frame_path = fields[:4]
        label_field = fields[4].strip().strip('"') if len(fields) == 5 else ""
        frames.setdefault(video, []).append((int(frame_id), str(base / frame_path)))
        first_line.setdefault(video, line_number)
        found = labels.setdefault(video, set())
        if label_field:
            found.update(_parse_labels(label_field, index_of, file, line_number, line))
    entries = []
    for video, listed in frames.items():
        paths = tuple(p for _, p in sorted(listed))
        folder = os.path.dirname(paths[0])
        entries.append(VideoEntry(folder, tuple(sorted(labels[video])), len(paths), paths, video, first_line[video]))
    return entries
