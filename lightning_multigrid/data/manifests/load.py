"""A manifest file's kind, told from its content: video files or frame folders.

:func:`~lightning_multigrid.data.sources.load_manifest` reads every source (a manifest file of either
kind, a folder per class, a packed frame store); it moved above ``manifests/`` as it reads stores too,
and is still found here by name on first access, so importing this module loads nothing of ``store/``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_multigrid._lazy import lazy_attribute
from lightning_multigrid.data.manifests.entries import VIDEO_EXTENSIONS, split_line
from lightning_multigrid.data.manifests.frames import FRAME_CSV_HEADER, split_fields

if TYPE_CHECKING:
    from lightning_multigrid.data.sources import load_manifest

__all__ = ["detect_manifest_kind", "is_frame_manifest", "load_manifest"]


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, {"load_manifest": "lightning_multigrid.data.sources"}, name)


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
