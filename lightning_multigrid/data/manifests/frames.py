"""Frame datasets' lists: a folder of JPEG frames per video, the layout PySlowFast and mmaction2 read.

Two formats:

- a **frame manifest**, one video per line, whitespace-separated: ``folder label [num_frames]``
  (mmaction2's rawframes list; ``lightning-multigrid extract-frames`` writes it). Folders are
  relative to a root (default: the manifest's directory); the label field is a class index, a
  comma-separated list (multi-label) or a class name with ``class_names``; ``num_frames``, when
  given, is checked against the folder when the video is first read; a header line is skipped as
  in video manifests (:func:`~lightning_multigrid.data.manifests.entries.is_header`)::

      train/abseiling/-3B32lodo2M 0 300
      train/air_drumming/-VtLx-mcPds 1 298

- **PySlowFast's frame-list CSV** (Charades, AVA, Something-Something), space-separated with the
  header ``original_vido_id video_id frame_id path labels``, one line per frame; a video's
  frames are its lines sorted by ``frame_id``, its labels the union of its frames' labels
  (quoted, comma-separated, possibly empty, as PySlowFast's Charades loader aggregates them)::

      original_vido_id video_id frame_id path labels
      46GP8 0 0 46GP8/46GP8-000001.jpg "118,31"
      46GP8 0 1 46GP8/46GP8-000002.jpg ""

Both give a :class:`~lightning_multigrid.data.manifests.entries.Manifest` with ``format="frames"``.
"""

from __future__ import annotations

import csv
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from lightning_multigrid.data.manifests.entries import (
    Manifest,
    ManifestError,
    VideoEntry,
    check_root,
    is_header,
    labels_parse,
    num_classes_of,
    parse_labels,
    resolve_class_names,
)

__all__ = ["FRAME_CSV_HEADER", "manifest_field", "read_frame_manifest", "split_fields", "write_frame_manifest"]

logger = logging.getLogger("lightning_multigrid.data")

FRAME_CSV_HEADER: tuple[str, ...] = ("original_vido_id", "video_id", "frame_id", "path", "labels")


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
    base = check_root(root, default=file.parent)
    names = resolve_class_names(class_names)
    index_of = {name: i for i, name in enumerate(names)} if names is not None else None
    with file.open(encoding="utf-8-sig") as handle:  # -sig: a byte-order mark is not part of line 1
        numbered = [(n, raw.strip()) for n, raw in enumerate(handle, start=1)]
    lines = [(n, line) for n, line in numbered if line and not line.startswith("#")]
    if lines and tuple(lines[0][1].split()[:5]) == FRAME_CSV_HEADER:
        entries = _read_frame_csv(lines[1:], base, index_of, file)
    else:
        if lines and is_header(lines[0][1], index_of, base):
            logger.info("%s:%d: skipped the header line %r.", file, *lines[0])
            lines = lines[1:]
        entries = [_read_folder_line(n, line, base, index_of, file) for n, line in lines]
    if not entries:
        raise ManifestError(f"{file}: the manifest lists no videos: write one `folder label [num_frames]` line per video.")
    any_multi = any(len(e.labels) != 1 for e in entries)
    is_multi = any_multi if multi_label is None else multi_label
    if not is_multi:
        unlabelled = [e.path for e in entries if not e.labels]
        if unlabelled:
            raise ManifestError(f"{file}: video {unlabelled[0]} has no label; pass `multi_label=True` for Charades-style lists.")
    return Manifest(tuple(entries), num_classes_of(entries, names), is_multi, names, str(file), "frames")


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
    for fields in split_fields(line):
        if len(fields) in (2, 3) and fields[0] and labels_parse(fields[1], index_of) and (
            len(fields) == 2 or fields[2].isdigit()
        ):
            return fields
    return None


def split_fields(line: str) -> list[list[str]]:
    """Readings of a frame manifest line: split on whitespace (honouring double quotes), then on commas."""
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
    labels = parse_labels(fields[1], index_of, file, line_number, line)
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
            found.update(parse_labels(label_field, index_of, file, line_number, line))
    entries = []
    for video, listed in frames.items():
        paths = tuple(p for _, p in sorted(listed))
        folder = os.path.dirname(paths[0])
        entries.append(VideoEntry(folder, tuple(sorted(labels[video])), len(paths), paths, video, first_line[video]))
    return entries
