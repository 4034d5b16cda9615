"""A store's header, ``store.json``: one value, its JSON form, and the names of a generation's files.

:class:`StoreHeader` is the one owner of the header's keys: the writer
(:mod:`~lightning_multigrid.data.store.write`) builds one and writes :meth:`StoreHeader.to_json`;
the reader (:mod:`~lightning_multigrid.data.store.format`) reads one with :func:`read_header`. Every
file of a packing run (a generation) carries the run's token, named by :func:`frames_file`,
:func:`offsets_file` and :func:`videos_file`; :func:`generation_token` tells a generation's file from
the folder's other files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from lightning_multigrid.data.manifests.entries import Manifest, ManifestError, VideoEntry
from lightning_multigrid.data.manifests.store_folder import HEADER_FILE

__all__ = [
    "STORE_FORMAT",
    "STORE_VERSION",
    "LevelFiles",
    "PackFailure",
    "Packing",
    "StoreHeader",
    "frames_file",
    "generation_token",
    "level_name",
    "offsets_file",
    "read_header",
    "videos_file",
]

STORE_FORMAT = "lightning-multigrid frame store"
STORE_VERSION = 1
# A generation's files: `L<side>-<token>.bin`, `L<side>-<token>.offsets.npy`, `videos-<token>.npz`.
_GENERATION_FILE = re.compile(r"^(?:L\d+|videos)-(?P<token>[0-9a-f]+)\.(?:bin|offsets\.npy|npz)$")
# What stores packed before the chroma subsampling was recorded hold.
_UNRECORDED_SUBSAMPLING = "4:2:0"


def level_name(side: int) -> str:
    """A level in file names and messages: ``L<short side>``."""
    return f"L{side}"


def frames_file(side: int, token: str) -> str:
    """A level's frame bytes, every frame's JPEG video after video."""
    return f"{level_name(side)}-{token}.bin"


def offsets_file(side: int, token: str) -> str:
    """A level's int64 byte offsets into its frame bytes, one per frame plus the end."""
    return f"{level_name(side)}-{token}.offsets.npy"


def videos_file(token: str) -> str:
    """Per video: first frame id, frame count, source size, size per level (NumPy arrays)."""
    return f"videos-{token}.npz"


def generation_token(file_name: str) -> str | None:
    """The token of the generation a file belongs to; ``None`` for a file of no generation."""
    match = _GENERATION_FILE.match(file_name)
    return match["token"] if match else None


@dataclass(frozen=True, slots=True)
class LevelFiles:
    """One level's files (:func:`frames_file`, :func:`offsets_file`) and the size of its frame bytes."""

    frames: str
    offsets: str
    num_bytes: int


class PackFailure(NamedTuple):
    """A video left out when packing (a ``(name, reason)`` pair)."""

    name: str  # the video's name (its :attr:`VideoEntry.name`)
    reason: str  # why, in ``check-data``'s words


@dataclass(frozen=True, slots=True)
class Packing:
    """How a store was packed: from what, for which grids, with which JPEG encoding.

    Attributes:
        source: the manifest (file or folder per class) the store was packed from.
        source_format: its format, ``"frames"`` or ``"video"``.
        digest: what identifies the packed content (by default the manifest file's SHA-256); ``None`` when
            none was recorded.
        crop_size: the base crop the store was packed for, pixels.
        jitter_scales: the training short sides it was packed for, ``None``: the default for the crop.
        quality: JPEG quality of resized frames.
        subsampling: their chroma subsampling, ``"4:4:4"`` or ``"4:2:0"``.
    """

    source: str
    source_format: str
    digest: str | None
    crop_size: int
    jitter_scales: tuple[int, int] | None
    quality: int
    subsampling: str


@dataclass(frozen=True, slots=True)
class StoreHeader:
    """A store's header: the generation it names, its levels and videos, how it was packed.

    Attributes:
        token: the generation's token (new to each packing run).
        levels: each level's short side in pixels, level 0 (the largest) first.
        files: each level's files.
        videos_file: the per-video arrays (:func:`videos_file`).
        total_frames: frames per level, over every video.
        entries: the videos packed, in store order, with their frame counts.
        num_classes: classes of the manifest packed.
        multi_label: whether its videos may have several labels.
        class_names: its class names, when known.
        failures: the videos left out when packing, with the reason.
        packing: how the store was packed.
    """

    token: str
    levels: tuple[int, ...]
    files: tuple[LevelFiles, ...]
    videos_file: str
    total_frames: int
    entries: tuple[VideoEntry, ...]
    num_classes: int
    multi_label: bool
    class_names: tuple[str, ...] | None
    failures: tuple[PackFailure, ...]
    packing: Packing

    def manifest(self, folder: str) -> Manifest:
        """The videos as a :class:`Manifest` with ``format="store"`` and ``source`` the store ``folder``."""
        return Manifest(self.entries, self.num_classes, self.multi_label, self.class_names, folder, "store")

    def to_json(self) -> dict[str, Any]:
        """The header as ``store.json`` holds it."""
        packing = self.packing
        return {
            "format": STORE_FORMAT,
            "version": STORE_VERSION,
            "token": self.token,
            "levels": list(self.levels),
            "files": [{"frames": f.frames, "offsets": f.offsets, "bytes": f.num_bytes} for f in self.files],
            "videos_file": self.videos_file,
            "total_frames": self.total_frames,
            "names": [e.name for e in self.entries],
            "paths": [e.path for e in self.entries],
            "video_ids": [e.video_id for e in self.entries],
            "labels": [list(e.labels) for e in self.entries],
            "frame_counts": [e.num_frames for e in self.entries],
            "num_classes": self.num_classes,
            "multi_label": self.multi_label,
            "class_names": list(self.class_names) if self.class_names is not None else None,
            "failures": [{"name": f.name, "reason": f.reason} for f in self.failures],
            "packed_from": {"source": packing.source, "format": packing.source_format, "digest": packing.digest},
            "packed_for": {
                "crop_size": packing.crop_size,
                "jitter_scales": list(packing.jitter_scales) if packing.jitter_scales else None,
            },
            "quality": packing.quality,
            "subsampling": packing.subsampling,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StoreHeader:
        """The header from ``store.json``'s content (its ``format`` and ``version`` checked by :func:`read_header`).

        Stores packed by older versions lack ``subsampling`` (their frames are 4:2:0) and
        ``packed_from.digest`` (``None``); ``names`` is not read: a video's name follows from its entry.

        Raises:
            KeyError, TypeError, ValueError: on a header with a key missing or of the wrong type.
        """
        packed_from, packed_for = data["packed_from"], data["packed_for"]
        jitter_scales = packed_for["jitter_scales"]
        return cls(
            token=str(data["token"]),
            levels=tuple(int(side) for side in data["levels"]),
            files=tuple(LevelFiles(str(f["frames"]), str(f["offsets"]), int(f["bytes"])) for f in data["files"]),
            videos_file=str(data["videos_file"]),
            total_frames=int(data["total_frames"]),
            entries=tuple(
                VideoEntry(path, tuple(labels), int(count), video_id=video_id)
                for path, video_id, labels, count in zip(
                    data["paths"], data["video_ids"], data["labels"], data["frame_counts"]
                )
            ),
            num_classes=int(data["num_classes"]),
            multi_label=bool(data["multi_label"]),
            class_names=tuple(data["class_names"]) if data["class_names"] is not None else None,
            failures=tuple(PackFailure(str(f["name"]), str(f["reason"])) for f in data["failures"]),
            packing=Packing(
                source=packed_from["source"],
                source_format=packed_from["format"],
                digest=str(packed_from["digest"]) if packed_from.get("digest") else None,
                crop_size=packed_for["crop_size"],
                jitter_scales=(jitter_scales[0], jitter_scales[1]) if jitter_scales else None,
                quality=data["quality"],
                subsampling=data.get("subsampling", _UNRECORDED_SUBSAMPLING),
            ),
        )


def read_header(folder: Path) -> StoreHeader:
    """The header of the store in ``folder``.

    Raises:
        ManifestError: when the folder holds no header (an incomplete store), or one that is not readable,
            not a store's, or of another version (each naming the fix).
    """
    header_file = folder / HEADER_FILE
    if not header_file.is_file():
        raise ManifestError(
            f"{folder} is an incomplete frame store (no {HEADER_FILE}: `pack-frames` was interrupted or is still "
            "running): run `lightning-multigrid pack-frames` again; it rebuilds the store."
        )
    try:
        data = json.loads(header_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ManifestError(f"{header_file}: not a readable store header ({error}); pack the store again.") from None
    if not isinstance(data, dict) or data.get("format") != STORE_FORMAT:
        raise ManifestError(f"{header_file}: not a {STORE_FORMAT} header.")
    if data.get("version") != STORE_VERSION:
        raise ManifestError(
            f"{header_file}: store version {data.get('version')!r}, this version of lightning-multigrid reads "
            f"{STORE_VERSION}: pack the store again."
        )
    try:
        return StoreHeader.from_json(data)
    except (KeyError, TypeError, ValueError) as error:
        raise ManifestError(
            f"{header_file}: not a readable store header (missing or malformed {error}); pack the store again."
        ) from None
