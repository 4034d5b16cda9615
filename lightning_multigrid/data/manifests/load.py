"""One loader for every manifest: a video manifest, a frame manifest, a folder per class, told apart by content."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from lightning_multigrid.data.manifests.entries import (
    VIDEO_EXTENSIONS,
    Manifest,
    ManifestError,
    ManifestKind,
    check_manifest_kind,
    check_root,
    split_line,
)
from lightning_multigrid.data.manifests.frames import FRAME_CSV_HEADER, read_frame_manifest, split_fields
from lightning_multigrid.data.manifests.store_folder import is_store
from lightning_multigrid.data.manifests.videos import read_folder_manifest, read_manifest
from lightning_multigrid.data.store.format import read_store_manifest

__all__ = ["detect_manifest_kind", "is_frame_manifest", "load_manifest"]


def load_manifest(
    source: str | os.PathLike[str] | Manifest,
    root: str | os.PathLike[str] | None = None,
    class_names: str | os.PathLike[str] | Sequence[str] | None = None,
    kind: ManifestKind = "auto",
) -> Manifest:
    """A manifest from a manifest file, a folder of class folders, a packed frame store, or an already read one.

    A file whose paths are folders (``folder label [num_frames]``) or that is PySlowFast's
    frame-list CSV is read as a frame dataset
    (:func:`~lightning_multigrid.data.manifests.frames.read_frame_manifest`).

    Args:
        source: the manifest file, a folder per class, a packed frame store's folder
            (``lightning-multigrid pack-frames``; read with
            :func:`~lightning_multigrid.data.store.format.read_store_manifest`), or a :class:`Manifest`.
        root: directory the manifest's paths are relative to; default its directory.
        class_names: a class-names file or the names, for labels given as names.
        kind: ``"video"`` (``path label`` lines of video files), ``"frames"`` (a frame dataset), or
            ``"auto"``: told from the content (:func:`detect_manifest_kind`).

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
    if is_store(source):
        if root is not None or class_names is not None:
            raise ValueError(
                f"{source} is a packed frame store: it holds its labels and class names; do not pass `root` or "
                "`class_names`."
            )
        return read_store_manifest(source)
    if Path(source).is_dir():
        if root is not None or class_names is not None:
            raise ValueError(
                f"{source} is a folder per class: its classes are the folder names; "
                "do not pass `root` or `class_names`."
            )
        return read_folder_manifest(source)
    if kind == "auto" and Path(source).is_file():
        check_root(root, default=Path(source).parent)
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
    candidates = [video for video, _ in split_line(line)]
    if any(Path(c).suffix.lower() in VIDEO_EXTENSIONS for c in candidates):
        return "video"
    splits = [f for f in split_fields(line) if len(f) in (2, 3) and f[0] and f[1]]
    # `folder label num_frames` in the first reading that has 2-3 fields: a frame count (labels
    # may be names here). `clip 1,2,3` is a multi-label 2-field line, not a frame count.
    if splits and len(splits[0]) == 3 and splits[0][2].isdigit():
        return "frames"
    if base is not None:
        # Every reading's first field, also of a line with an extra column (then named by the reader).
        paths = [f[0] for f in split_fields(line) if f and f[0]]
        if any((base / p).is_dir() for p in [*paths, *candidates]):
            return "frames"
        if any((base / p).is_file() for p in [*candidates, *paths]):
            return "video"
    words = line.split()
    return "video" if words and Path(words[0]).suffix.lower() in VIDEO_EXTENSIONS else None  # `a.mp4 0 x`
