"""What is known about a video before any pixel is decoded: metadata types and their cache.

- :class:`VideoMetadata` (with :class:`FrameTimestamps`): a video file's size, frame count,
  timestamps and keyframes, probed once from the packets (``VideoReader``) or read from a JSON
  file written by ``lightning-multigrid check-data --write-metadata``;
- :class:`MetadataCache`: those by path, per process; an entry read from a file whose video changed
  since (its size or modification time differ) is dropped, so the video is probed again;
- :class:`FrameFolder`: a frame dataset's video, its frames' files and size.

Clip sampling reads only ``width``, ``height`` and ``num_frames`` of either
(:class:`~lightning_multigrid.data.clip_params.ClipSource`).
"""

from __future__ import annotations

import json
import logging
import os
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["FrameFolder", "FrameTimestamps", "MetadataCache", "VideoMetadata", "file_stamp"]

logger = logging.getLogger("lightning_multigrid.data")

# Version 2 added the display geometry (rotation, pixel aspect) and the file stamps.
METADATA_FILE_VERSION = 2


@dataclass(frozen=True, slots=True)
class FrameTimestamps:
    """Presentation timestamps of every frame in display order, in the stream's time base.

    Constant-frame-rate videos are stored as ``start + i * step`` (a few bytes, whatever their
    length, so a per-process cache of a whole dataset stays small); others keep every timestamp.
    """

    start: int
    step: int  # 0 when the spacing varies
    count: int
    explicit: bytes = b""  # int64 timestamps, only when the spacing varies

    @classmethod
    def from_sorted(cls, pts: list[int]) -> FrameTimestamps:
        if len(pts) < 2:
            return cls(pts[0] if pts else 0, 0, len(pts))
        step = pts[1] - pts[0]
        if all(b - a == step for a, b in zip(pts, pts[1:])):
            return cls(pts[0], step, len(pts))
        return cls(pts[0], 0, len(pts), array("q", pts).tobytes())

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> int:
        if not 0 <= index < self.count:
            raise IndexError(f"frame index {index} out of range for {self.count} frames")
        if self.explicit:
            return int(np.frombuffer(self.explicit, dtype=np.int64, count=1, offset=8 * index)[0])
        return self.start + index * self.step

    def last_step(self) -> int:
        """Spacing before the last frame (the last frame is taken to last as long)."""
        if self.count < 2:
            return 0
        return self[self.count - 1] - self[self.count - 2]

    def to_list(self) -> list[int]:
        if self.explicit:
            return np.frombuffer(self.explicit, dtype=np.int64).tolist()
        return [self.start + i * self.step for i in range(self.count)]


@dataclass(frozen=True, slots=True)
class VideoMetadata:
    """What sampling needs to know about a video, probed once (no frame is decoded).

    Sizes are the displayed ones, as players show the video: a stored frame is first stretched to
    square pixels (``pixel_aspect``: its width times the pixel aspect, its height kept), then turned
    by ``rotation``. Every reader delivers frames this way up and this size.

    Attributes:
        width: displayed frame width in pixels.
        height: displayed frame height in pixels.
        num_frames: frames in the video stream.
        fps: average frames per second (``num_frames / duration``).
        duration: seconds from the first frame to the end of the last.
        time_base: seconds per timestamp unit.
        timestamps: presentation timestamp of every frame, display order.
        keyframe_pts: presentation timestamps of the keyframes, ascending.
        rotation: degrees a player turns the stored frames clockwise to show them (0, 90, 180 or
            270; the ``rotate`` value ffprobe prints for phone videos).
        pixel_aspect: the stored pixels' width over their height (the sample aspect ratio); not 1
            for anamorphic video.
        file_size: the file's size in bytes when probed (``None``: unknown).
        file_mtime_ns: the file's modification time when probed, in nanoseconds (``None``: unknown).
    """

    width: int
    height: int
    num_frames: int
    fps: float
    duration: float
    time_base: Fraction
    timestamps: FrameTimestamps
    keyframe_pts: tuple[int, ...]
    rotation: int = 0
    pixel_aspect: Fraction = Fraction(1)
    file_size: int | None = None
    file_mtime_ns: int | None = None

    @property
    def rotated(self) -> bool:
        return self.rotation != 0

    @property
    def anamorphic(self) -> bool:
        return self.pixel_aspect != 1

    def geometry(self) -> str:
        """How the stored frames are turned into the displayed ones, in words ("" when as stored)."""
        parts = []
        if self.anamorphic:
            ratio = self.pixel_aspect
            parts.append(f"anamorphic (pixel aspect {ratio.numerator}:{ratio.denominator}: stretched to square pixels)")
        if self.rotated:
            parts.append(f"rotated (turned {self.rotation} degrees clockwise, as players show it)")
        return ", ".join(parts)

    def is_stale(self, path: str) -> bool:
        """Whether the file at ``path`` changed since it was probed (size or modification time);
        ``False`` when the stamps are unknown."""
        if self.file_size is None or self.file_mtime_ns is None:
            return False
        try:
            return file_stamp(path) != (self.file_size, self.file_mtime_ns)
        except OSError:
            return True  # gone or unreadable: probing again names the problem

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data; :meth:`from_dict` reads it back."""
        ts = self.timestamps
        return {
            "width": self.width,
            "height": self.height,
            "num_frames": self.num_frames,
            "fps": self.fps,
            "duration": self.duration,
            "time_base": [self.time_base.numerator, self.time_base.denominator],
            "pts": {"start": ts.start, "step": ts.step, "count": ts.count}
            if not ts.explicit
            else {"list": ts.to_list()},
            "keyframe_pts": list(self.keyframe_pts),
            "rotation": self.rotation,
            "pixel_aspect": [self.pixel_aspect.numerator, self.pixel_aspect.denominator],
            "file_size": self.file_size,
            "file_mtime_ns": self.file_mtime_ns,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> VideoMetadata:
        pts = data["pts"]
        timestamps = (
            FrameTimestamps.from_sorted(list(pts["list"]))
            if "list" in pts
            else FrameTimestamps(int(pts["start"]), int(pts["step"]), int(pts["count"]))
        )
        return cls(
            width=int(data["width"]),
            height=int(data["height"]),
            num_frames=int(data["num_frames"]),
            fps=float(data["fps"]),
            duration=float(data["duration"]),
            time_base=Fraction(*data["time_base"]),
            timestamps=timestamps,
            keyframe_pts=tuple(data["keyframe_pts"]),
            rotation=int(data["rotation"]),
            pixel_aspect=Fraction(*data["pixel_aspect"]),
            file_size=None if data["file_size"] is None else int(data["file_size"]),
            file_mtime_ns=None if data["file_mtime_ns"] is None else int(data["file_mtime_ns"]),
        )


def file_stamp(path: str | os.PathLike[str]) -> tuple[int, int]:
    """``(size in bytes, modification time in ns)`` of a file: what tells a replaced video apart.

    Raises:
        OSError: when the file cannot be stat-ed.
    """
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns


class MetadataCache:
    """Video metadata by path, for one process.

    A dataset holds one; DataLoader workers each fill their own copy (forked or pickled), so
    each worker probes a video at most once. Keep workers alive between epochs
    (``persistent_workers=True``) or preload a file written by ``check-data --write-metadata``
    to avoid probing again.

    An entry read from a file is checked against its video once per process, when first asked
    for: a video replaced since the file was written (another size or modification time) would be
    read with a stale size and frame count, so its entry is dropped (and logged, naming the video
    and the file): the reader probes the video again.

    Args:
        file: a JSON file written by :meth:`save` to preload. Paths are kept absolute, so the
            file works whatever the working directory.

    Raises:
        FileNotFoundError: when ``file`` does not exist.
        ValueError: when ``file`` is not a metadata file, or was written by an earlier version
            (without rotation, pixel aspect and file stamps).
    """

    def __init__(self, file: str | os.PathLike[str] | None = None) -> None:
        self._entries: dict[str, VideoMetadata] = {}
        self._unchecked: set[str] = set()  # read from the file, not yet compared with the video
        self.file = None if file is None else str(file)
        if file is not None:
            self._entries = _read_metadata_file(Path(file))
            self._unchecked = set(self._entries)

    def get(self, path: str) -> VideoMetadata | None:
        key = os.path.abspath(path)
        metadata = self._entries.get(key)
        if metadata is not None and key in self._unchecked:
            self._unchecked.discard(key)
            if metadata.is_stale(key):
                del self._entries[key]
                logger.warning(
                    "The metadata file %s is stale for video %s: the video changed since the file was written "
                    "(another size or modification time); it is probed again. Write the file again with "
                    "`lightning-multigrid check-data MANIFEST --write-metadata FILE`.",
                    self.file,
                    path,
                )
                return None
        return metadata

    def put(self, path: str, metadata: VideoMetadata) -> None:
        key = os.path.abspath(path)
        self._entries[key] = metadata
        self._unchecked.discard(key)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, path: object) -> bool:
        return isinstance(path, str) and os.path.abspath(path) in self._entries

    def save(self, file: str | os.PathLike[str]) -> None:
        """Write every entry to a JSON file that ``MetadataCache(file)`` reads."""
        data = {"version": METADATA_FILE_VERSION, "videos": {key: value.to_dict() for key, value in self._entries.items()}}
        Path(file).write_text(json.dumps(data), encoding="utf-8")


def _read_metadata_file(path: Path) -> dict[str, VideoMetadata]:
    if not path.is_file():
        raise FileNotFoundError(f"Metadata file {path} does not exist: check `metadata_file`.")
    write = "`lightning-multigrid check-data MANIFEST --write-metadata FILE`"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise ValueError(f"Metadata file {path} is not a metadata cache ({error!r}); write it with {write}.") from None
    version = data.get("version") if isinstance(data, dict) else None
    if isinstance(version, int) and version != METADATA_FILE_VERSION:
        raise ValueError(
            f"Metadata file {path} was written by an earlier version (format {version}, without the videos' "
            f"rotation, pixel aspect and file stamps; this version reads format {METADATA_FILE_VERSION}): "
            f"write it again with {write}."
        )
    try:
        return {os.path.abspath(key): VideoMetadata.from_dict(value) for key, value in data["videos"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ValueError(f"Metadata file {path} is not a metadata cache ({error!r}); write it with {write}.") from None


@dataclass(frozen=True, slots=True)
class FrameFolder:
    """A video stored as JPEG frames: where the frames are and their size (no pixel decoded).

    The frame names are kept as a pattern (``prefix + zero-padded number + suffix``) when they
    follow one, as extracted frames do, so a per-process cache of a whole dataset stays small;
    otherwise as an explicit list.

    Attributes:
        path: the folder (for messages and caches).
        width: frame width in pixels.
        height: frame height in pixels.
        num_frames: frames in the video.
    """

    path: str
    width: int
    height: int
    num_frames: int
    pattern: tuple[str, int, int, str] | None = None  # prefix, minimum digits, first number, suffix
    names: tuple[str, ...] = ()  # full paths when there is no pattern

    def frame_path(self, index: int) -> str:
        """The file of 0-based frame ``index``."""
        if not 0 <= index < self.num_frames:
            raise IndexError(f"frame {index} out of range for the {self.num_frames} frames of {self.path}")
        if self.pattern is None:
            return self.names[index]
        prefix, digits, first, suffix = self.pattern
        return os.path.join(self.path, f"{prefix}{first + index:0{digits}d}{suffix}")
