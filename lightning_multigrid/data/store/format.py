"""The packed frame store on disk: its files, its index, and reading them back.

A store is a folder written by ``lightning-multigrid pack-frames``
(:func:`~lightning_multigrid.data.tools.pack.pack_frames`, through
:mod:`~lightning_multigrid.data.store.write`)::

    train.store/
      store.json                     header (:class:`~lightning_multigrid.data.store.header.StoreHeader`):
                                     levels, files, class names, videos' names and labels, the videos
                                     left out when packing (and why); written last
      videos-<token>.npz             per video: first frame id, frame count, source size, size per level
      L160-<token>.bin               every frame's JPEG bytes at level 0, video after video
      L160-<token>.offsets.npy       int64 byte offsets into it, one per frame plus the end
      L113-<token>.bin, ...          the same per extra level (optional)

``store.json`` is the commit point: it is renamed into place after every file it names, and those
carry a token new to each packing run, so an interrupted run (or one that is re-packing over an
older store) never leaves a header naming half-written files; a folder with no ``store.json`` is
refused as incomplete. Level ``k`` holds each video resized to short side ``levels[k]``, never
upscaled: a video smaller than a level keeps its own size there, and a level that would repeat the
size of the level above holds no bytes for that video (its size is recorded as 0 x 0).

A packing run never rewrites a file: it writes a new generation (files named with its token) and
switches ``store.json`` to it. Readers hold the generation they opened (a shared ``flock`` on its
``videos-<token>.npz``, held by the opened :class:`FrameStore`, inherited by forked workers and taken
again by spawned ones), and a packing run removes an older generation only when it can take that lock
exclusively (:func:`remove_unused_generations`): a run reading the store while it is packed again
keeps reading the frames it started with; their files go at the first packing after it lets go.
Packing runs into one folder take turns (:func:`packing_lock`, an exclusive ``flock`` on the folder).

Reading is by offset into memory maps (no file opened per frame, no header parsed): the offsets
are ``np.load(mmap_mode="r")`` and the bytes an ``mmap``, opened once per process.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from lightning_multigrid.data.manifests.entries import Manifest, ManifestError
from lightning_multigrid.data.manifests.store_folder import HEADER_FILE
from lightning_multigrid.data.store.header import StoreHeader, generation_token, level_name, read_header, videos_file

__all__ = [
    "FrameStore",
    "StoredVideo",
    "choose_level",
    "packing_lock",
    "read_store_manifest",
    "remove_released_generations",
    "remove_unused_generations",
    "store_digest",
    "store_failures",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StoredVideo:
    """A video of the store as clip sampling sees it (a ``ClipSource``): the size of the frames it was
    packed from, so clip parameters are the ones a frame-folder or video reader draws from the same seed.

    Attributes:
        width: source frame width in pixels.
        height: source frame height in pixels.
        num_frames: frames in the video.
    """

    width: int
    height: int
    num_frames: int


def choose_level(short_sides: np.ndarray | list[int], drawn_short_side: int) -> int:
    """The smallest stored level whose short side is at least ``drawn_short_side``; level 0 when none is.

    Args:
        short_sides: one video's short side per level, largest first; 0 where the level holds no
            frames of it.
        drawn_short_side: the clip's short side after its resize, pixels.
    """
    chosen = 0
    for level, side in enumerate(short_sides):
        if side >= drawn_short_side:
            chosen = level
    return chosen


class FrameStore:
    """An opened store: its header and per-video arrays at once, its frame bytes mapped on first read.

    Pickles without its maps (DataLoader workers reopen them), so one per reader travels to every
    worker cheaply.

    Args:
        path: the store folder.

    Raises:
        ManifestError: when the folder holds no complete store (naming the fix), or its files do
            not match its header.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        self.header, hold = _hold_generation(Path(path))
        self._hold: IO[bytes] | None = hold
        arrays = np.load(Path(path) / self.header.videos_file)
        self.first_frame: np.ndarray = arrays["first_frame"]  # int64 (videos,)
        self.num_frames: np.ndarray = arrays["num_frames"]  # int64 (videos,)
        self.source_size: np.ndarray = arrays["source_size"]  # int32 (videos, 2): width, height
        self.level_size: np.ndarray = arrays["level_size"]  # int32 (videos, levels, 2); 0 x 0: absent
        self.level_short_side: np.ndarray = self.level_size.min(axis=2)  # (videos, levels)
        self.levels: tuple[int, ...] = self.header.levels
        self._index = {entry.name: i for i, entry in enumerate(self.header.entries)}
        self._maps: list[tuple[np.ndarray, mmap.mmap]] | None = None
        self._check_files()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_maps"] = None  # a map does not travel to a worker: it reopens its own
        state["_hold"] = None  # nor an open file: a spawned worker takes its own hold
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        hold = _hold_videos_file(Path(self.path), self.header)
        if hold is None:
            raise ManifestError(
                f"{self.path}: the frame store was packed again and the files this run opened were removed "
                "(no process held them): start the run again."
            )
        self._hold = hold

    @property
    def token(self) -> str:
        """The generation this store holds (its packing run's token)."""
        return self.header.token

    def repacked(self) -> bool:
        """Whether the folder's ``store.json`` now names another generation (the store was packed again since
        this one was opened), or names none (it is being packed again, or was removed)."""
        try:
            return read_header(Path(self.path)).token != self.token
        except ManifestError:
            return True

    def close(self) -> None:
        """Let the generation go: drop the maps of its files and release the shared lock on it, so the next
        packing (or :func:`remove_released_generations`) may remove its files. Reads after this fail."""
        for _, data in self._maps or []:
            with contextlib.suppress(BufferError):  # a view still held: the map goes with it
                data.close()
        self._maps = None
        if self._hold is not None:
            self._hold.close()  # releases the flock (forked workers' copies end with the workers)
            self._hold = None

    @property
    def num_videos(self) -> int:
        return len(self.first_frame)

    def video_index(self, name: str) -> int:
        """The position of a video (:attr:`VideoEntry.name`) in the store.

        Raises:
            KeyError: when the store does not hold it.
        """
        return self._index[name]

    def video(self, index: int) -> StoredVideo:
        width, height = self.source_size[index]
        return StoredVideo(int(width), int(height), int(self.num_frames[index]))

    def frame_bytes(self, index: int, level: int, frames: list[int]) -> list[memoryview]:
        """The JPEG bytes of ``frames`` (0-based, sorted, of video ``index``) at ``level``: views into the map."""
        offsets, data = self._level(level)
        first = int(self.first_frame[index]) + frames[0]
        # One slice of the offsets to Python ints: a clip's frames lie close together.
        span = offsets[first : first + frames[-1] - frames[0] + 2].tolist()
        view = memoryview(data)
        return [view[span[f - frames[0]] : span[f - frames[0] + 1]] for f in frames]

    def level_name(self, level: int) -> str:
        return level_name(self.levels[level])

    def _level(self, level: int) -> tuple[np.ndarray, mmap.mmap]:
        if self._maps is None:
            self._maps = [self._open_level(k) for k in range(len(self.levels))]
        return self._maps[level]

    def _open_level(self, level: int) -> tuple[np.ndarray, mmap.mmap]:
        files = self.header.files[level]
        offsets = np.load(Path(self.path) / files.offsets, mmap_mode="r")
        with open(Path(self.path) / files.frames, "rb") as file:
            # An empty file cannot be mapped; a level of no bytes is never read.
            data = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) if files.num_bytes else mmap.mmap(-1, 1)
        return offsets, data

    def _check_files(self) -> None:
        """The files the header names exist with the recorded sizes: a store damaged or mixed after packing is
        refused here, not halfway through an epoch."""
        total = self.header.total_frames
        for files in self.header.files:
            frames, offsets = Path(self.path) / files.frames, Path(self.path) / files.offsets
            if not frames.is_file() or frames.stat().st_size != files.num_bytes:
                raise ManifestError(
                    f"{self.path}: {frames.name} is missing or not the size its header records ({files.num_bytes} bytes): "
                    "the store was changed after packing; pack it again with `lightning-multigrid pack-frames`."
                )
            if not offsets.is_file() or np.load(offsets, mmap_mode="r").shape != (total + 1,):
                raise ManifestError(
                    f"{self.path}: {offsets.name} is missing or does not hold {total + 1} offsets: pack the store again."
                )


def read_store_manifest(path: str | os.PathLike[str]) -> Manifest:
    """The videos of a store as a :class:`Manifest` with ``format="store"`` (``source`` is the store folder).

    Raises:
        ManifestError: as :class:`FrameStore` (a header naming absent files included).
    """
    header = read_header(Path(path))
    _check_present(Path(path), header)  # one message naming what is absent, before any video is read
    return header.manifest(str(path))


def store_digest(path: str | os.PathLike[str]) -> str | None:
    """What the store was packed from, as ``pack-frames`` recorded it (``packed_from.digest``: by default the
    SHA-256 of the manifest file); ``None`` when the folder holds no complete store or the packing recorded none."""
    try:
        return read_header(Path(path)).packing.digest
    except ManifestError:
        return None


def remove_released_generations(folder: str | os.PathLike[str]) -> list[str]:
    """Remove now the files of older generations no reader holds, if no packing run is under way and the
    folder can be written; returns the tokens removed. Called by a reader that let a generation go: else
    its files stay on disk until the next packing into the folder."""
    path = Path(folder)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return []
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the packing lock: a packing run removes them itself
        except BlockingIOError:
            return []
        try:
            keep = read_header(path).token
        except ManifestError:
            return []
        try:
            return remove_unused_generations(path, keep)
        except OSError:  # a read-only disk: nothing to remove there
            return []
    finally:
        os.close(fd)


def store_failures(path: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """The videos ``pack-frames`` left out of a store, with the reason: ``[(name, reason), ...]``."""
    return list(read_header(Path(path)).failures)


@contextlib.contextmanager
def packing_lock(folder: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the right to pack into ``folder`` (created): one packing run at a time, in any process.

    An exclusive ``flock`` on the folder itself (no lock file to leave behind), waited for with a note
    on stderr. Re-entrant within a process, so a check-then-pack (:func:`ensure_synthetic_stores
    <lightning_multigrid.data.synthetic.ensure_synthetic_stores>`) can hold it around ``pack_frames``.
    """
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    key = str(path.resolve())
    if key in _PACKING:
        _PACKING[key] += 1
        try:
            yield
        finally:
            _PACKING[key] -= 1
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"pack-frames: waiting for another process that is packing into {path} ...", file=sys.stderr)
            fcntl.flock(fd, fcntl.LOCK_EX)
        _PACKING[key] = 1
        try:
            yield
        finally:
            del _PACKING[key]
    finally:
        os.close(fd)  # releases the lock


_PACKING: dict[str, int] = {}  # folders this process holds the packing lock of, with its depth


def remove_unused_generations(folder: str | os.PathLike[str], keep: str) -> list[str]:
    """Remove the files of every generation but ``keep`` (a token) that no reader holds; call holding
    :func:`packing_lock`, after ``store.json`` names ``keep``. Returns the tokens removed (sorted); those a
    reader holds are left in place, and logged.

    A generation's ``videos-<token>.npz`` is unlinked first, while its exclusive lock is held: a reader
    that opened it meanwhile finds it unlinked once it has its shared lock, and reads the header again.
    """
    base = Path(folder)
    by_token: dict[str, list[Path]] = {}
    for path in base.iterdir():
        token = generation_token(path.name)
        if token is not None and token != keep:
            by_token.setdefault(token, []).append(path)
    removed, in_use = [], []
    for token, paths in sorted(by_token.items()):
        videos = base / videos_file(token)
        with contextlib.ExitStack() as stack:
            if videos.exists():
                handle = stack.enter_context(open(videos, "rb"))
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    in_use.append(token)
                    continue
                videos.unlink()
            for path in paths:
                path.unlink(missing_ok=True)
            removed.append(token)
    if in_use:
        logger.info("%s: left in place the files of %d older packing(s) still read by a run.", base, len(in_use))
    return removed


def _hold_generation(folder: Path) -> tuple[StoreHeader, IO[bytes]]:
    """The store's header and a shared lock on the generation it names, so no packing run removes its files.

    Raises:
        ManifestError: when the header names files that are absent (naming them and the fix).
    """
    previous = None
    while True:
        header = read_header(folder)
        hold = _hold_videos_file(folder, header)
        if hold is not None:
            _check_present(folder, header)
            return header, hold
        if header.token == previous:
            _check_present(folder, header)  # the same header twice, its file absent: raises
        previous = header.token  # packed again meanwhile: read the new header


def _hold_videos_file(folder: Path, header: StoreHeader) -> IO[bytes] | None:
    """The generation's videos file, open with a shared lock; ``None`` when it is absent or was removed."""
    try:
        handle = open(folder / header.videos_file, "rb")  # noqa: SIM115 -- held for the store's life
    except FileNotFoundError:
        return None
    fcntl.flock(handle.fileno(), fcntl.LOCK_SH)
    if os.fstat(handle.fileno()).st_nlink == 0:  # removed between the open and the lock
        handle.close()
        return None
    return handle


def _check_present(folder: Path, header: StoreHeader) -> None:
    """Every file the header names exists, or one error naming the absent ones and the fix."""
    named = [header.videos_file, *(name for files in header.files for name in (files.frames, files.offsets))]
    missing = [name for name in named if not (folder / name).is_file()]
    if missing:
        raise ManifestError(
            f"{folder}: the frame store's {HEADER_FILE} names {', '.join(missing)}, which "
            f"{'is' if len(missing) == 1 else 'are'} not in the folder (removed, or copied without them): pack the "
            f"store again with `lightning-multigrid pack-frames <manifest> {folder}`."
        )

