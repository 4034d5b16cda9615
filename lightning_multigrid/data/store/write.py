"""Writing a store: one packing run's generation of files, made the store by its header, renamed last.

``pack-frames`` (:mod:`~lightning_multigrid.data.tools.pack`) decodes and encodes the frames into
:class:`PackedVideo` values; :func:`store_writer` appends them to the level files under the run's
token and :meth:`StoreWriter.commit` finishes the files and switches ``store.json`` to them
(:mod:`~lightning_multigrid.data.store.format` has the layout). Files are written under ``.partial``
names and renamed when complete; the folder holds the packing marker until a header names a complete
generation, so an interrupted run leaves a folder refused as incomplete, never a half-written store.

Example::

    with store_writer(Path("train.store"), levels=(160,)) as writer:
        for entry, packed in packed_videos:      # PackedVideo values: JPEG bytes per level and frame
            writer.add(entry, packed)
        writer.commit(manifest, packing)         # store.json now names this run's files
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from lightning_multigrid.data.clip_params import resized_size
from lightning_multigrid.data.manifests.entries import Manifest, VideoEntry
from lightning_multigrid.data.manifests.store_folder import HEADER_FILE, PACKING_MARKER
from lightning_multigrid.data.store.format import packing_lock, remove_unused_generations
from lightning_multigrid.data.store.header import (
    LevelFiles,
    PackFailure,
    Packing,
    StoreHeader,
    frames_file,
    offsets_file,
    videos_file,
)

__all__ = ["PackedVideo", "StoreWriter", "store_writer"]


@dataclass(slots=True)
class PackedVideo:
    """One video's frames at every level (or why it is bad).

    Attributes:
        source_size: the frames' width and height, pixels.
        level_sizes: each level's frame size; 0 x 0 where the level holds no frames of the video.
        frames: the JPEG bytes, ``[level][frame]``.
        error: why the video is left out (``check-data``'s words); ``None`` for a good video.
    """

    source_size: tuple[int, int] = (0, 0)
    level_sizes: list[tuple[int, int]] = field(default_factory=list)
    frames: list[list[bytes]] = field(default_factory=list)
    error: str | None = None

    @classmethod
    def of_size(cls, width: int, height: int, levels: tuple[int, ...]) -> PackedVideo:
        """No frames yet, each level's size for a source of ``width x height``: never upscaled; 0 x 0 where a
        level would repeat the size of the level above (it then holds no bytes of this video)."""
        sizes: list[tuple[int, int]] = []
        for side in levels:
            size = (width, height) if min(width, height) <= side else resized_size(width, height, side)
            sizes.append((0, 0) if size in sizes else size)
        return cls((width, height), sizes, [[] for _ in levels])


@contextlib.contextmanager
def store_writer(folder: Path, levels: tuple[int, ...]) -> Iterator[StoreWriter]:
    """A writer of a new generation into ``folder`` (created), holding :func:`packing_lock` meanwhile.

    The folder is marked as being packed, and ``.partial`` files an interrupted run left are removed; on
    leaving, this run's unfinished files are removed, and the marker stays until a store is complete, so
    a folder that never got one is refused as incomplete rather than read as something else.
    """
    with packing_lock(folder):  # another packing run into the folder finishes first; none starts meanwhile
        (folder / PACKING_MARKER).write_text(f"pack-frames started by process {os.getpid()}\n", encoding="utf-8")
        _remove(folder, lambda name: name.endswith(".partial"))  # an interrupted run's
        writer = StoreWriter(folder, levels)
        try:
            yield writer
        finally:
            writer.close()
            _remove(folder, lambda name: name.endswith(".partial") and writer.token in name)


class StoreWriter:
    """Appends packed videos to the level files under this run's token; :meth:`commit` makes them a store.

    Attributes:
        token: this run's generation.
        entries: the videos added, with their frame counts.
        failures: the videos left out, with the reason.
        total_frames: frames added per level.
    """

    def __init__(self, folder: Path, levels: tuple[int, ...]) -> None:
        self.folder = folder
        self.levels = levels
        self.token = secrets.token_hex(4)
        self.files: list[IO[bytes]] = []
        for side in levels:
            self.files.append(open(self._partial(frames_file(side, self.token)), "wb"))  # noqa: SIM115 -- closed in close()
        self.offsets = [array("q", [0]) for _ in levels]
        self.entries: list[VideoEntry] = []
        self.failures: list[PackFailure] = []
        self.first_frame: list[int] = []
        self.source_sizes: list[tuple[int, int]] = []
        self.level_sizes: list[list[tuple[int, int]]] = []
        self.total_frames = 0

    def add(self, entry: VideoEntry, packed: PackedVideo) -> None:
        if packed.error is not None:
            self.failures.append(PackFailure(entry.name, packed.error))
            return
        count = max(len(frames) for frames in packed.frames)
        for file, offsets, frames in zip(self.files, self.offsets, packed.frames):
            end = offsets[-1]
            for k in range(count):
                if frames:  # a level absent for this video keeps its offsets flat
                    file.write(frames[k])
                    end += len(frames[k])
                offsets.append(end)
        self.entries.append(VideoEntry(entry.path, entry.labels, count, video_id=entry.video_id))
        self.first_frame.append(self.total_frames)
        self.source_sizes.append(packed.source_size)
        self.level_sizes.append(packed.level_sizes)
        self.total_frames += count

    def level_bytes(self) -> tuple[int, ...]:
        return tuple(int(offsets[-1]) for offsets in self.offsets)

    def commit(self, manifest: Manifest, packing: Packing) -> None:
        """Finish every file, rename it into place, then the header; remove what older runs left.

        Args:
            manifest: the manifest packed: its classes are the store's.
            packing: how the store was packed, recorded in the header.
        """
        renames: list[str] = []
        for file, side, offsets in zip(self.files, self.levels, self.offsets):
            _finish(file)
            renames.append(frames_file(side, self.token))
            with open(self._partial(offsets_file(side, self.token)), "wb") as handle:
                np.save(handle, np.frombuffer(offsets, dtype=np.int64))
                _finish(handle)
            renames.append(offsets_file(side, self.token))
        videos = videos_file(self.token)
        with open(self._partial(videos), "wb") as handle:
            np.savez(
                handle,
                first_frame=np.asarray(self.first_frame, dtype=np.int64),
                num_frames=np.asarray([e.num_frames for e in self.entries], dtype=np.int64),
                source_size=np.asarray(self.source_sizes, dtype=np.int32).reshape(-1, 2),
                level_size=np.asarray(self.level_sizes, dtype=np.int32).reshape(-1, len(self.levels), 2),
            )
            _finish(handle)
        renames.append(videos)
        for name in renames:
            os.replace(self._partial(name), self.folder / name)
        header = self._header(manifest, packing, videos)
        with open(self._partial(HEADER_FILE), "w", encoding="utf-8") as text:
            json.dump(header.to_json(), text)
            _finish(text)
        os.replace(self._partial(HEADER_FILE), self.folder / HEADER_FILE)  # the commit point
        # Older packings' files, unless a run still reads them (they go at a later packing).
        remove_unused_generations(self.folder, self.token)
        (self.folder / PACKING_MARKER).unlink(missing_ok=True)

    def close(self) -> None:
        for file in self.files:
            file.close()

    def _partial(self, name: str) -> Path:
        return self.folder / f"{name}.partial"

    def _header(self, manifest: Manifest, packing: Packing, videos: str) -> StoreHeader:
        files = tuple(
            LevelFiles(frames_file(side, self.token), offsets_file(side, self.token), num_bytes)
            for side, num_bytes in zip(self.levels, self.level_bytes())
        )
        return StoreHeader(
            token=self.token,
            levels=self.levels,
            files=files,
            videos_file=videos,
            total_frames=self.total_frames,
            entries=tuple(self.entries),
            num_classes=manifest.num_classes,
            multi_label=manifest.multi_label,
            class_names=manifest.class_names,
            failures=tuple(self.failures),
            packing=packing,
        )


def _finish(file: IO[Any]) -> None:
    """Flush to disk: the renames that follow must never publish a file whose bytes are still in flight."""
    file.flush()
    os.fsync(file.fileno())


def _remove(folder: Path, wanted: Callable[[str], bool]) -> None:
    for path in folder.iterdir():
        if path.is_file() and wanted(path.name):
            path.unlink()
