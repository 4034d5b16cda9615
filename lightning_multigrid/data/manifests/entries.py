"""What every manifest reads to: video entries, the manifest, and the parsing of labels and class names.

Labels are 0-based class indices, or class names when a class-names file is given (one name per
line, line ``i`` is class ``i``; or a PySlowFast ``classids.json`` mapping names to indices). The
video manifests (:mod:`~lightning_multigrid.data.manifests.videos`) and the frame manifests
(:mod:`~lightning_multigrid.data.manifests.frames`) share these readers.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

__all__ = [
    "VIDEO_EXTENSIONS",
    "Manifest",
    "ManifestError",
    "ManifestKind",
    "VideoEntry",
    "check_manifest_kind",
    "check_root",
    "is_header",
    "labels_parse",
    "num_classes_of",
    "parse_labels",
    "read_class_names",
    "resolve_class_names",
    "split_line",
]

VIDEO_EXTENSIONS: tuple[str, ...] = (".mp4", ".avi", ".mkv", ".webm", ".mov", ".m4v", ".mpg", ".mpeg")


ManifestKind = Literal["auto", "video", "frames"]


class ManifestError(ValueError):
    """A manifest or class-names file cannot be read; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class VideoEntry:
    """One video of a dataset.

    Attributes:
        path: the file (or, in a frame dataset, the folder of JPEG frames), joined with the
            dataset root.
        labels: 0-based class indices; exactly one for a single-label dataset.
        num_frames: frames the manifest says the folder holds (frame datasets; ``None``: not given).
        frame_paths: the frame files in display order, when the manifest lists them (PySlowFast's
            frame-list CSV); empty: list the folder.
        video_id: the video's id in a frame-list CSV (several videos may share a folder there).
        line_number: the manifest line it was read from (1-based; its first frame's line in a
            frame-list CSV), for messages; not part of equality.
    """

    path: str
    labels: tuple[int, ...]
    num_frames: int | None = None
    frame_paths: tuple[str, ...] = ()
    video_id: str | None = None
    line_number: int | None = field(default=None, compare=False)

    @property
    def name(self) -> str:
        """The video in messages and per-video bookkeeping (skips, failures): its path, and its id
        when it has one (videos of a frame-list CSV may share a folder)."""
        return self.path if self.video_id is None else f"{self.path} [video {self.video_id}]"

    @property
    def label(self) -> int:
        """The class index of a single-label video.

        Raises:
            ValueError: when the video has several labels.
        """
        if len(self.labels) != 1:
            raise ValueError(
                f"Video {self.path} has {len(self.labels)} labels {list(self.labels)}; "
                "`label` is for single-label datasets, use `labels`."
            )
        return self.labels[0]


@dataclass(frozen=True, slots=True)
class Manifest:
    """The videos of a dataset, with their labels, read once at construction.

    Attributes:
        entries: the videos, in file order.
        num_classes: number of classes (from the class names, else the largest label + 1).
        multi_label: whether videos may have several labels (targets are multi-hot).
        class_names: names of classes ``0 .. num_classes-1``, when known.
        source: the manifest file or class-folder root it was read from.
        format: ``"video"`` (one encoded file per entry), ``"frames"`` (a folder of JPEG
            frames per entry, see :mod:`lightning_multigrid.data.manifests.frames`) or ``"store"``
            (a packed frame store, :mod:`lightning_multigrid.data.store.format`; ``source`` is its folder).
    """

    entries: tuple[VideoEntry, ...]
    num_classes: int
    multi_label: bool = False
    class_names: tuple[str, ...] | None = None
    source: str = ""
    format: Literal["video", "frames", "store"] = "video"

    def __len__(self) -> int:
        return len(self.entries)


def check_manifest_kind(kind: object) -> None:
    """Raise ``ValueError`` unless ``kind`` is a :data:`ManifestKind`."""
    if kind not in ("auto", "video", "frames"):
        raise ValueError(f"`manifest_kind` must be 'auto', 'video' or 'frames', got {kind!r}.")


def read_class_names(path: str | os.PathLike[str]) -> tuple[str, ...]:
    """Read class names: one per line (line ``i`` is class ``i``) or a JSON ``{name: index}``.

    Raises:
        FileNotFoundError: when the file does not exist.
        ManifestError: on a duplicate name, a gap in the JSON indices, or an empty file.
    """
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"Class-names file {file} does not exist: check `class_names`.")
    text = file.read_text(encoding="utf-8-sig")
    names = _class_names_from_json(file, text) if file.suffix == ".json" else _class_names_from_lines(file, text)
    if not names:
        raise ManifestError(f"{file}: the class-names file is empty: write one class name per line.")
    return tuple(names)


def _class_names_from_json(file: Path, text: str) -> list[str]:
    """PySlowFast's ``classids.json``: ``{name: index}`` with indices ``0 .. n - 1``."""
    try:
        mapping = json.loads(text)
    except json.JSONDecodeError as error:
        raise ManifestError(f"{file}:{error.lineno}: not valid JSON ({error.msg}).") from None
    if not isinstance(mapping, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in mapping.values()
    ):
        raise ManifestError(f"{file}: expected a JSON object mapping class names to integer indices.")
    if sorted(mapping.values()) != list(range(len(mapping))):
        raise ManifestError(
            f"{file}: class indices must be 0 .. {len(mapping) - 1} without gaps or repeats, "
            f"got {sorted(mapping.values())[:10]}..."
        )
    names = [""] * len(mapping)
    for name, index in mapping.items():
        names[index] = str(name)
    return names


def _class_names_from_lines(file: Path, text: str) -> list[str]:
    """One name per line, blank lines skipped; a repeated name is an error."""
    names = []
    seen: dict[str, int] = {}
    for line_number, line in enumerate(text.splitlines(), start=1):
        name = line.strip()
        if not name:
            continue
        if name in seen:
            raise ManifestError(
                f"{file}:{line_number}: class name {name!r} repeats line {seen[name]}; names must be unique."
            )
        seen[name] = line_number
        names.append(name)
    return names


def check_root(root: str | os.PathLike[str] | None, default: Path | None) -> Path:
    """The directory manifest paths are relative to: ``root``, else ``default``; raises if it is not one."""
    if root is None:
        if default is None:
            raise ValueError("`root` must be given.")
        return default
    base = Path(root)
    if not base.is_dir():
        raise FileNotFoundError(f"Dataset root {base} is not a directory: check `root`.")
    return base


def resolve_class_names(class_names: str | os.PathLike[str] | Sequence[str] | None) -> tuple[str, ...] | None:
    """Class names from a file (:func:`read_class_names`) or given as names; ``None`` stays ``None``."""
    if class_names is None:
        return None
    if isinstance(class_names, (str, os.PathLike)):
        return read_class_names(class_names)
    names = tuple(str(n) for n in class_names)
    if not names or len(set(names)) != len(names):
        raise ValueError(f"`class_names` must be unique and non-empty, got {list(names)[:10]!r}.")
    return names


def num_classes_of(entries: Sequence[VideoEntry], names: tuple[str, ...] | None) -> int:
    """Classes of a manifest: its class names, else one more than the largest label (unlabelled videos count none)."""
    if names is not None:
        return len(names)
    return 1 + max((max(e.labels) for e in entries if e.labels), default=0)


def split_line(line: str) -> list[tuple[str, str]]:
    """Readings of ``path label``: split on the last whitespace, then on the first comma.

    Paths may hold spaces (comma-separated lines), and so may class names; the caller takes the
    first reading whose label parses.
    """
    candidates = []
    parts = line.rsplit(maxsplit=1)
    if len(parts) == 2 and parts[0].rstrip(","):
        candidates.append((parts[0].rstrip(","), parts[1]))
    if "," in line:
        video, labels = line.split(",", 1)
        if video.strip() and labels.strip():
            candidates.append((video.strip(), labels.strip()))
    return candidates


def is_header(line: str, index_of: dict[str, int] | None, base: Path) -> bool:
    """Whether a manifest's first line is a column header (``path label``, ``folder label num_frames``).

    One rule for video and frame manifests: none of its words is a number, a class name, a path
    (a folder separator or a video extension) or a file or folder under ``base``. A first line
    that is a video with a bad label is then an error, not a skipped header.
    """
    words = [w.strip('"') for w in re.split(r"[\s,]+", line) if w.strip('"')]
    return bool(words) and not any(
        labels_parse(word, index_of)
        or "/" in word
        or "\\" in word
        or Path(word).suffix.lower() in VIDEO_EXTENSIONS
        or (base / word).exists()
        for word in words
    )


def labels_parse(label_field: str, index_of: dict[str, int] | None) -> bool:
    """Whether every comma-separated token of ``label_field`` is a class index or a known class name."""
    for token in label_field.split(","):
        token = token.strip()
        if not (token.isdigit() or (index_of is not None and token in index_of)):
            return False
    return True


def parse_labels(
    label_field: str, index_of: dict[str, int] | None, file: Path, line_number: int, line: str
) -> tuple[int, ...]:
    """The class indices of a comma-separated label field; a ``ManifestError`` names file and line."""
    labels = []
    for token in label_field.split(","):
        token = token.strip()
        if index_of is not None and token in index_of:
            labels.append(index_of[token])
        elif token.lstrip("-").isdigit():
            value = int(token)
            if value < 0:
                raise ManifestError(f"{file}:{line_number}: label {value} is negative; labels are 0-based.")
            if index_of is not None and value >= len(index_of):
                raise ManifestError(
                    f"{file}:{line_number}: label {value} is out of range for {len(index_of)} class names."
                )
            labels.append(value)
        elif index_of is None:
            raise ManifestError(
                f"{file}:{line_number}: label {token!r} is not a class index in {line!r}; "
                "pass `class_names` to use class names as labels."
            )
        else:
            raise ManifestError(
                f"{file}:{line_number}: unknown label {token!r} in {line!r}: it is not one of the "
                f"{len(index_of)} class names."
            )
    return tuple(labels)
