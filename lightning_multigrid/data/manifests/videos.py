"""Video lists: which files a dataset holds and their labels.

Three layouts, the ones video datasets ship with:

- a **manifest file** in the Kinetics / PySlowFast / pytorchvideo format, one video per line:
  ``path label``, separated by whitespace or a comma, paths relative to a root directory
  (default: the manifest's directory), an optional header line (``path label``)::

      train/abseiling/-3B32lodo2M_000059_000069.mp4 0
      train/air_drumming/-VtLx-mcPds_000012_000022.mp4 1

- **multi-label** lines (Charades style): the label field is a comma-separated list,
  ``path 3,17,42``; a manifest with any such line is multi-label;
- a **folder per class**: ``root/<class>/<video>``, classes in sorted name order.

Labels are 0-based class indices, or class names when a class-names file is given (one name per
line, line ``i`` is class ``i``; or a PySlowFast ``classids.json`` mapping names to indices).

Example::

    manifest = read_manifest("kinetics/train.csv", root="kinetics", class_names="kinetics/classnames.txt")
    manifest.entries[0]        # VideoEntry(path='kinetics/train/abseiling/x.mp4', labels=(0,))
    manifest.num_classes       # 400
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
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
    "load_manifest",
    "read_class_names",
    "read_folder_manifest",
    "read_manifest",
    "write_manifest",
]

VIDEO_EXTENSIONS: tuple[str, ...] = (".mp4", ".avi", ".mkv", ".webm", ".mov", ".m4v", ".mpg", ".mpeg")


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
        format: ``"video"`` (one encoded file per entry) or ``"frames"`` (a folder of JPEG
            frames per entry, see :mod:`lightning_multigrid.data.manifests.frames`).
    """

    entries: tuple[VideoEntry, ...]
    num_classes: int
    multi_label: bool = False
    class_names: tuple[str, ...] | None = None
    source: str = ""
    format: Literal["video", "frames"] = "video"

    def __len__(self) -> int:
        return len(self.entries)


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
    base = _check_root(root, default=file.parent)
    names = _resolve_class_names(class_names)
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
            candidates = _split_line(line)
            if not candidates:
                raise ManifestError(
                    f"{file}:{line_number}: malformed line {line!r}: expected `path label` "
                    "(or `path label1,label2` for multi-label), separated by whitespace or a comma."
                )
            parsed = [c for c in candidates if _parses(c[1], index_of)]
            if not parsed and is_first and all(_is_header(video) for video, _ in candidates):
                continue
            video, label_field = (parsed or candidates)[0]
            labels = _parse_labels(label_field, index_of, file, line_number, line)
            any_multi = any_multi or len(labels) > 1
            entries.append(VideoEntry(str(base / video), labels, line_number=line_number))
    if not entries:
        raise ManifestError(
            f"{file}: the manifest lists no videos: write one `path label` line per video."
        )
    return _make_manifest(entries, names, any_multi if multi_label is None else multi_label, str(file))


def read_folder_manifest(
    root: str | os.PathLike[str],
    extensions: Iterable[str] = VIDEO_EXTENSIONS,
    exclude: Iterable[str | os.PathLike[str]] = (),
) -> Manifest:
    """List a folder-per-class dataset: ``root/<class>/<video>``, classes in sorted order.

    Args:
        root: the directory holding one sub-directory per class.
        extensions: file name endings of videos (case-insensitive); other files are ignored.
        exclude: folders that are not classes, such as an output folder placed inside ``root``
            (``extract-frames`` passes its own): a sub-directory that is one, or that holds one
            and no video, is left out.

    Raises:
        FileNotFoundError: when ``root`` is not a directory.
        ManifestError: when there are no class folders or no videos.
    """
    base = _check_root(root, default=None)
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


ManifestKind = Literal["auto", "video", "frames"]


def check_manifest_kind(kind: object) -> None:
    """Raise ``ValueError`` unless ``kind`` is a :data:`ManifestKind`."""
    if kind not in ("auto", "video", "frames"):
        raise ValueError(f"`manifest_kind` must be 'auto', 'video' or 'frames', got {kind!r}.")


def _is_excluded(folder: Path, excluded: list[Path], suffixes: tuple[str, ...]) -> bool:
    resolved = folder.resolve()
    if resolved in excluded:
        return True
    holds_excluded = any(resolved in path.parents for path in excluded)
    return holds_excluded and not any(f.is_file() and f.name.lower().endswith(suffixes) for f in folder.iterdir())


def load_manifest(
    source: str | os.PathLike[str] | Manifest,
    root: str | os.PathLike[str] | None = None,
    class_names: str | os.PathLike[str] | Sequence[str] | None = None,
    kind: ManifestKind = "auto",
) -> Manifest:
    """A manifest from a manifest file, a folder of class folders, or an already read one.

    A file whose paths are folders (``folder label [num_frames]``) or that is PySlowFast's
    frame-list CSV is read as a frame dataset (:func:`~lightning_multigrid.data.manifests.frames.read_frame_manifest`).

    Args:
        source: the manifest file, a folder per class, or a :class:`Manifest`.
        root: directory the manifest's paths are relative to; default its directory.
        class_names: a class-names file or the names, for labels given as names.
        kind: ``"video"`` (``path label`` lines of video files), ``"frames"`` (a frame dataset), or
            ``"auto"``: told from the content
            (:func:`~lightning_multigrid.data.manifests.frames.detect_manifest_kind`).

    Raises:
        FileNotFoundError: when the file or folder does not exist.
        ValueError: when ``root`` or ``class_names`` are given with a folder or a ``Manifest``, or
            ``kind`` is not one of the three.
        ManifestError: as :func:`read_manifest` and :func:`read_folder_manifest`, and when
            ``kind="auto"`` and the content cannot tell.
    """
    check_manifest_kind(kind)
    if isinstance(source, Manifest):
        if root is not None or class_names is not None:
            raise ValueError("`root` and `class_names` apply to a manifest file, not to a `Manifest` object.")
        return source
    if Path(source).is_dir():
        if root is not None or class_names is not None:
            raise ValueError(
                f"{source} is a folder per class: its classes are the folder names; "
                "do not pass `root` or `class_names`."
            )
        return read_folder_manifest(source)
    from lightning_multigrid.data.manifests.frames import detect_manifest_kind, read_frame_manifest

    if kind == "auto" and Path(source).is_file():
        _check_root(root, default=Path(source).parent)
        detected = detect_manifest_kind(source, root)
        if detected is None:
            raise ManifestError(
                f"{source}: cannot tell whether it lists video files or frame folders: its paths have no video "
                f"extension ({', '.join(VIDEO_EXTENSIONS[:3])}, ...), no frame count, and none of the first lines "
                f"exists under {root if root is not None else Path(source).parent}. Check `root_dir` (--root), "
                "or state the kind: `manifest_kind='frames'` or `'video'` (--manifest-kind)."
            )
        kind = "frames" if detected == "frames" else "video"
    if kind == "frames":
        return read_frame_manifest(source, root=root, class_names=class_names)
    return read_manifest(source, root=root, class_names=class_names)


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


def _check_root(root: str | os.PathLike[str] | None, default: Path | None) -> Path:
    if root is None:
        if default is None:
            raise ValueError("`root` must be given.")
        return default
    base = Path(root)
    if not base.is_dir():
        raise FileNotFoundError(f"Dataset root {base} is not a directory: check `root`.")
    return base


def _resolve_class_names(class_names: str | os.PathLike[str] | Sequence[str] | None) -> tuple[str, ...] | None:
    if class_names is None:
        return None
    if isinstance(class_names, (str, os.PathLike)):
        return read_class_names(class_names)
    names = tuple(str(n) for n in class_names)
    if not names or len(set(names)) != len(names):
        raise ValueError(f"`class_names` must be unique and non-empty, got {list(names)[:10]!r}.")
    return names


def _split_line(line: str) -> list[tuple[str, str]]:
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


def _is_header(video: str) -> bool:
    """A first line like ``path label`` has no path to a video where the path should be."""
    return not ("/" in video or "\\" in video or Path(video).suffix.lower() in VIDEO_EXTENSIONS)


def _parses(label_field: str, index_of: dict[str, int] | None) -> bool:
    for token in label_field.split(","):
        token = token.strip()
        if not (token.isdigit() or (index_of is not None and token in index_of)):
            return False
    return True


def _parse_labels(
    label_field: str, index_of: dict[str, int] | None, file: Path, line_number: int, line: str
) -> tuple[int, ...]:
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


def _make_manifest(
    entries: list[VideoEntry], names: tuple[str, ...] | None, multi_label: bool, source: str
) -> Manifest:
    num_classes = len(names) if names is not None else 1 + max(max(e.labels) for e in entries)
    return Manifest(tuple(entries), num_classes, multi_label, names, source)
