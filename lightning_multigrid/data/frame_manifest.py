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

Both give a :class:`~lightning_multigrid.data.manifest.Manifest` with ``format="frames"``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from lightning_multigrid.data.manifest import (
    Manifest,
    ManifestError,
    VideoEntry,
    _check_root,
    _parse_labels,
    _resolve_class_names,
)

__all__ = ["FRAME_CSV_HEADER", "is_frame_manifest", "read_frame_manifest", "write_frame_manifest"]

FRAME_CSV_HEADER: tuple[str, ...] = ("original_vido_id", "video_id", "frame_id", "path", "labels")


def is_frame_manifest(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None) -> bool:
    """Whether a manifest file lists frame folders (or is a frame-list CSV) rather than video files.

    Decided from the first lines that are not blank or comments: PySlowFast's header on the
    first, or a first field that is an existing directory under the root on any of the first 20
    (so a few missing folders at the top do not turn the dataset into a list of bad videos).
    """
    file = Path(path)
    if not file.is_file():
        return False
    base = Path(root) if root is not None else file.parent
    seen = 0
    with file.open(encoding="utf-8") as lines:
        for raw in lines:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            fields = line.split()
            if seen == 0 and tuple(fields[:5]) == FRAME_CSV_HEADER:
                return True
            if (base / fields[0]).is_dir():
                return True
            seen += 1
            if seen == 20:
                break
    return False


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
    with file.open(encoding="utf-8") as handle:
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

    Raises:
        ValueError: when a folder name holds whitespace (the format splits on it).
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
        if any(c.isspace() for c in str(folder)):
            raise ValueError(f"Frame folder {folder} holds whitespace: a frame manifest line cannot hold it.")
        count = "" if entry.num_frames is None else f" {entry.num_frames}"
        lines.append(f"{folder.as_posix()} {','.join(map(str, entry.labels))}{count}\n")
    file.write_text("".join(lines), encoding="utf-8")


def _read_folder_line(
    line_number: int, line: str, base: Path, index_of: dict[str, int] | None, file: Path
) -> VideoEntry:
    fields = line.split()
    if len(fields) not in (2, 3):
        raise ManifestError(
            f"{file}:{line_number}: malformed line {line!r}: expected `folder label [num_frames]` "
            "separated by whitespace (folder names without spaces)."
        )
    num_frames = None
    if len(fields) == 3:
        if not fields[2].isdigit() or int(fields[2]) < 1:
            raise ManifestError(f"{file}:{line_number}: `num_frames` {fields[2]!r} is not a positive integer in {line!r}.")
        num_frames = int(fields[2])
    labels = _parse_labels(fields[1], index_of, file, line_number, line)
    return VideoEntry(str(base / fields[0]), labels, num_frames)


def _read_frame_csv(
    lines: list[tuple[int, str]], base: Path, index_of: dict[str, int] | None, file: Path
) -> list[VideoEntry]:
    # video id -> [(frame_id, path)], labels; insertion order is the order of first appearance.
    frames: dict[str, list[tuple[int, str]]] = {}
    labels: dict[str, set[int]] = {}
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
        found = labels.setdefault(video, set())
        if label_field:
            found.update(_parse_labels(label_field, index_of, file, line_number, line))
    entries = []
    for video, listed in frames.items():
        paths = tuple(p for _, p in sorted(listed))
        folder = os.path.dirname(paths[0])
        entries.append(VideoEntry(folder, tuple(sorted(labels[video])), len(paths), paths, video))
    return entries
