"""Video lists: which files a dataset holds and their labels.

Three layouts, the ones video datasets ship with:

- a **manifest file** in the Kinetics / PySlowFast / pytorchvideo format, one video per line:
  ``path label``, separated by whitespace or a comma, paths relative to a root directory
  (default: the manifest's directory), an optional header line (``path label``)::

      train/abseiling/-3B32lodo2M_000059_000069.mp4 0
      train/air_drumming/-VtLx-mcPds_000012_000022.mp4 1

- **multi-label** lines (Charades style): the label field is a comma-separated list,
  ``path 3,17,42``; a manifest with any such line is multi-label;
- a **folder per class**: ``root/<class>/<video>``, classes in sorted name order. A folder holding
  :data:`FRAMES_OUTPUT_MARKER` is an ``extract-frames`` output placed inside the root, and a packed frame
  store (``pack-frames``) one, never a class.

Labels are read as :mod:`~lightning_multigrid.data.manifests.entries` says.

Example::

    manifest = read_manifest("kinetics/train.csv", root="kinetics", class_names="kinetics/classnames.txt")
    manifest.entries[0]        # VideoEntry(path='kinetics/train/abseiling/x.mp4', labels=(0,))
    manifest.num_classes       # 400
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from lightning_multigrid.data.manifests.entries import (
    VIDEO_EXTENSIONS,
    Manifest,
    ManifestError,
    VideoEntry,
    check_root,
    is_header,
    labels_parse,
    num_classes_of,
    parse_labels,
    resolve_class_names,
    split_line,
)
from lightning_multigrid.data.manifests.store_folder import is_store

__all__ = ["FRAMES_OUTPUT_MARKER", "read_folder_manifest", "read_manifest", "write_manifest"]

logger = logging.getLogger("lightning_multigrid.data")

# Written by `extract-frames` into its output folder: a folder-per-class listing leaves it out, so an
# output placed inside a video root never becomes a class (which would shift every later label).
FRAMES_OUTPUT_MARKER = ".extract-frames"


def read_manifest(
    path: str | os.PathLike[str],
    root: str | os.PathLike[str] | None = None,
    class_names: str | os.PathLike[str] | Sequence[str] | None = None,
    multi_label: bool | None = None,
) -> Manifest:
    """Read a ``path label`` manifest (Kinetics / PySlowFast / pytorchvideo, or Charades multi-label).

    Args:
        path: the manifest file.
        root: directory the video paths are relative to; default the manifest's directory.
            Absolute paths in the manifest are kept.
        class_names: a class-names file or the names themselves; needed for labels given as
            names, and then also bounds integer labels.
        multi_label: force multi-label targets; by default a manifest is multi-label when any
            line has more than one label.

    Raises:
        FileNotFoundError: when the manifest or ``root`` does not exist.
        ManifestError: on a malformed line, an unknown or negative label, or an empty manifest,
            naming the file and line.
    """
    file = Path(path)
    if not file.is_file():
        hint = " (it is a directory: use `read_folder_manifest` for a folder per class)" if file.is_dir() else ""
        raise FileNotFoundError(f"Manifest {file} does not exist{hint}: check the manifest path.")
    base = check_root(root, default=file.parent)
    names = resolve_class_names(class_names)
    index_of = {name: i for i, name in enumerate(names)} if names is not None else None

    entries: list[VideoEntry] = []
    any_multi = False
    first_line = True
    with file.open(encoding="utf-8-sig") as lines:  # -sig: a byte-order mark is not part of line 1
        for line_number, raw in enumerate(lines, start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            is_first, first_line = first_line, False
            candidates = split_line(line)
            if not candidates:
                raise ManifestError(
                    f"{file}:{line_number}: malformed line {line!r}: expected `path label` "
                    "(or `path label1,label2` for multi-label), separated by whitespace or a comma."
                )
            if is_first and is_header(line, index_of, base):
                logger.info("%s:%d: skipped the header line %r.", file, line_number, line)
                continue
            parsed = [c for c in candidates if labels_parse(c[1], index_of)]
            if not parsed:
                _check_columns(line, candidates, file, line_number)
            video, label_field = (parsed or candidates)[0]
            labels = parse_labels(label_field, index_of, file, line_number, line)
            any_multi = any_multi or len(labels) > 1
            entries.append(VideoEntry(str(base / video), labels, line_number=line_number))
    if not entries:
        raise ManifestError(
            f"{file}: the manifest lists no videos: write one `path label` line per video."
        )
    is_multi = any_multi if multi_label is None else multi_label
    return Manifest(tuple(entries), num_classes_of(entries, names), is_multi, names, str(file))


def read_folder_manifest(
    root: str | os.PathLike[str],
    extensions: Iterable[str] = VIDEO_EXTENSIONS,
    exclude: Iterable[str | os.PathLike[str]] = (),
) -> Manifest:
    """List a folder-per-class dataset: ``root/<class>/<video>``, classes in sorted order.

    Args:
        root: the directory holding one sub-directory per class.
        extensions: file name endings of videos (case-insensitive); other files are ignored.
        exclude: folders that are not classes, such as an output folder placed inside ``root``:
            a sub-directory that is one, or that holds one and no video, is left out; so is one
            holding :data:`FRAMES_OUTPUT_MARKER` (an ``extract-frames`` output) or a packed frame
            store (``pack-frames``), with an info log.

    Raises:
        FileNotFoundError: when ``root`` is not a directory.
        ManifestError: when there are no class folders or no videos.
    """
    base = check_root(root, default=None)
    suffixes = tuple(e.lower() for e in extensions)
    excluded = [Path(p).resolve() for p in exclude]
    classes = sorted(
        d.name
        for d in base.iterdir()
        if d.is_dir() and not d.name.startswith(".") and not _is_excluded(d, excluded, suffixes)
    )
    if not classes:
        raise ManifestError(f"{base}: no class folders; expected `{base}/<class>/<video>`.")
    entries = [
        VideoEntry(str(video), (label,))
        for label, name in enumerate(classes)
        for video in sorted((base / name).iterdir())
        if video.is_file() and video.name.lower().endswith(suffixes)
    ]
    if not entries:
        raise ManifestError(
            f"{base}: the class folders hold no videos with extensions {list(suffixes)}; "
            "check the root or pass `extensions`."
        )
    return Manifest(tuple(entries), len(classes), False, tuple(classes), str(base))


def write_manifest(
    path: str | os.PathLike[str], entries: Iterable[VideoEntry], root: str | os.PathLike[str] | None = None
) -> None:
    """Write ``path label`` lines (labels comma-separated), paths relative to ``root`` when inside it."""
    file = Path(path)
    base = Path(root) if root is not None else file.parent
    lines = []
    for entry in entries:
        video = Path(entry.path)
        try:
            video = video.relative_to(base)
        except ValueError:
            pass
        if any(c.isspace() for c in str(video)) and "," in str(video):
            raise ValueError(f"Path {video} has both whitespace and a comma: no manifest line can hold it.")
        lines.append(f"{video.as_posix()} {','.join(map(str, entry.labels))}\n")
    file.write_text("".join(lines), encoding="utf-8")


def _is_excluded(folder: Path, excluded: list[Path], suffixes: tuple[str, ...]) -> bool:
    if (folder / FRAMES_OUTPUT_MARKER).is_file():
        logger.info("%s: left out of the classes: it is an `extract-frames` output (it holds %s).", folder, FRAMES_OUTPUT_MARKER)
        return True
    if is_store(folder):
        logger.info("%s: left out of the classes: it is a packed frame store (`pack-frames` output).", folder)
        return True
    resolved = folder.resolve()
    if resolved in excluded:
        return True
    holds_excluded = any(resolved in path.parents for path in excluded)
    return holds_excluded and not any(f.is_file() and f.name.lower().endswith(suffixes) for f in folder.iterdir())


def _check_columns(line: str, candidates: list[tuple[str, str]], file: Path, line_number: int) -> None:
    """Name a line with columns after its video's label (``a.mp4 0 x``), rather than reading ``x`` as a label."""
    words = line.split()
    if len(words) > 2 and Path(words[0]).suffix.lower() in VIDEO_EXTENSIONS and not any(
        Path(video).suffix.lower() in VIDEO_EXTENSIONS for video, _ in candidates
    ):
        raise ManifestError(
            f"{file}:{line_number}: malformed line {line!r}: expected `path label`, got {len(words)} columns "
            f"{words}: remove the columns after the label (a multi-label line is `path 3,17,42`)."
        )
