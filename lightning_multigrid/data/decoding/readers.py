"""The dataset's only door to a decoder: a :class:`ClipReader` per source of pixels.

A reader answers two questions about a video of the manifest: what sampling reads of it
(:meth:`ClipReader.source`: its size and frame count) and the clip at drawn parameters
(:meth:`ClipReader.read`). The datasets draw the parameters in between
(:mod:`~lightning_multigrid.data.clip_params`), so every reader gives the same clip from the same
seed. And one about itself: whether its clips leave as JPEG bytes to decode on the device
(:attr:`ClipReader.encoded`); the DataModule's decode-ahead and loading advice ask it, nothing else.
A new source of pixels (another library, a cache) is one more class, passed to the dataset as
``reader=``:

- :class:`VideoFileReader`: encoded video files, decoded with PyAV in the workers;
- :class:`FrameFolderReader`: folders of JPEG frames, decoded in the workers or read as JPEG bytes
  for decoding on the device (``frame_decode="device"``);
- :class:`InMemoryReader`: videos decoded once into RAM (the benchmarks take decoding out of the
  timed loop with it);
- :class:`~lightning_multigrid.data.store.reader.PackedFrameReader`: a packed frame store
  (``pack-frames``), read by offset from memory maps, decoded in the workers or on the device.

Readers raise :class:`~lightning_multigrid.data.decoding.errors.VideoDecodeError` (or ``OSError``)
for a bad video; the dataset skips it. Their caches are per process: each DataLoader worker fills
its own, keyed by the video (:attr:`VideoEntry.name`), never by its folder.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Literal, Protocol

import torch
import torch.nn.functional as F

from lightning_multigrid.data.clip_params import ClipParams, ClipSource
from lightning_multigrid.data.decoding.frame_names import DEFAULT_LAYOUT, FrameLayout
from lightning_multigrid.data.decoding.frames import EncodedClip, open_frame_folder, read_clip, read_encoded_clip
from lightning_multigrid.data.decoding.metadata import FrameFolder, MetadataCache, VideoMetadata
from lightning_multigrid.data.decoding.video import Interpolation, VideoReader, decoder_threads_per_worker
from lightning_multigrid.data.manifests.entries import VideoEntry

__all__ = [
    "ClipReader", "FrameDecode", "FrameFolderReader", "InMemoryReader", "VideoFileReader", "check_frame_decode",
    "returns_encoded",
]

FrameDecode = Literal["workers", "device"]


def check_frame_decode(frame_decode: object) -> None:
    """Raise ``ValueError`` unless ``frame_decode`` is a :data:`FrameDecode`."""
    if frame_decode not in ("workers", "device"):
        raise ValueError(f"`frame_decode` must be 'workers' or 'device', got {frame_decode!r}.")


class ClipReader(Protocol):
    """Where a dataset's clips come from."""

    @property
    def encoded(self) -> bool:
        """Whether :meth:`read` returns JPEG bytes (:class:`~lightning_multigrid.data.decoding.frames.EncodedClip`)
        to decode on the device, rather than pixels."""
        ...

    def source(self, entry: VideoEntry) -> ClipSource:
        """What sampling reads of the video: width, height and frame count.

        Raises:
            VideoDecodeError: when the video cannot be opened.
        """
        ...

    def read(self, entry: VideoEntry, params: ClipParams) -> torch.Tensor | EncodedClip:
        """The clip at ``params``: uint8 ``(3, T, crop_size, crop_size)``, or JPEG bytes to decode later.

        Raises:
            VideoDecodeError: when the clip cannot be decoded.
        """
        ...


def returns_encoded(reader: ClipReader) -> bool:
    """Whether ``reader`` returns JPEG bytes (:attr:`ClipReader.encoded`), the one place that asks.

    A reader of the user's own written before ``encoded`` joined the protocol returns pixels.
    """
    return getattr(reader, "encoded", False) is True


class VideoFileReader:
    """Encoded video files, decoded with PyAV straight to the clip's grid.

    Args:
        metadata_file: precomputed metadata (``check-data --write-metadata``) to skip probing.
        interpolation: swscale resize filter.
    """

    encoded = False  # decoded in the workers

    def __init__(
        self, metadata_file: str | os.PathLike[str] | None = None, interpolation: Interpolation = "BILINEAR"
    ) -> None:
        self.metadata = MetadataCache(metadata_file)
        self.interpolation = interpolation
        self._threads: tuple[int, int] | None = None  # (process id, decoder threads)
        # A video opened to probe it stays open for the read that follows: one open per clip.
        self._probed: VideoReader | None = None

    def source(self, entry: VideoEntry) -> VideoMetadata:
        metadata = self.metadata.get(entry.path)
        if metadata is None:
            self._close_probed()
            self._probed = self._open(entry.path, None)
            metadata = self._probed.metadata
            self.metadata.put(entry.path, metadata)
        return metadata

    def read(self, entry: VideoEntry, params: ClipParams) -> torch.Tensor:
        metadata = self.source(entry)  # opens a video not probed yet, and keeps it open
        video, self._probed = self._probed, None
        if video is None or video.path != str(entry.path):
            if video is not None:
                video.close()
            video = self._open(entry.path, metadata)
        with video:
            return video.read(params)

    def __getstate__(self) -> dict[str, object]:
        # Workers get a copy of the reader; an open container does not travel (nor pickle).
        state = dict(self.__dict__)
        state["_probed"] = None
        return state

    def _close_probed(self) -> None:
        if self._probed is not None:
            self._probed.close()
            self._probed = None

    def _open(self, path: str, metadata: VideoMetadata | None) -> VideoReader:
        if self._threads is None or self._threads[0] != os.getpid():
            # Decided in the process that decodes: a worker inherits the main process's copy.
            self._threads = (os.getpid(), decoder_threads_per_worker())
        return VideoReader(path, metadata, self.interpolation, self._threads[1])


class FrameFolderReader:
    """Folders of JPEG frames, decoded at reduced size in the workers or left encoded for the device.

    Args:
        layout: which files of a folder are frames (:mod:`~lightning_multigrid.data.decoding.frame_names`).
        frame_decode: ``"workers"`` returns decoded clips; ``"device"`` the sampled frames' JPEG
            bytes (:class:`~lightning_multigrid.data.decoding.frames.EncodedClip`), for
            :func:`~lightning_multigrid.data.decoding.device.decode_batch`.
    """

    def __init__(self, layout: FrameLayout = DEFAULT_LAYOUT, frame_decode: FrameDecode = "workers") -> None:
        check_frame_decode(frame_decode)
        self.layout = layout
        self.frame_decode = frame_decode
        # Per video, never per folder: videos of a frame-list CSV may share a folder.
        self._folders: dict[str, FrameFolder] = {}

    @property
    def encoded(self) -> bool:
        """Whether clips leave as JPEG bytes for the device (``frame_decode="device"``)."""
        return self.frame_decode == "device"

    def source(self, entry: VideoEntry) -> FrameFolder:
        folder = self._folders.get(entry.name)
        if folder is None:
            folder = self._folders[entry.name] = open_frame_folder(entry, self.layout)
        return folder

    def read(self, entry: VideoEntry, params: ClipParams) -> torch.Tensor | EncodedClip:
        folder = self.source(entry)
        if self.encoded:
            return read_encoded_clip(folder, params, entry.name)
        return read_clip(folder, params)


class InMemoryReader:
    """Video files decoded once, in full, into RAM; clips are cut from there.

    The crop box is mapped back onto the source frame and only that region is resized
    (antialiased bilinear): resize-then-crop up to sub-pixel rounding, at a fraction of the cost.
    Pixels differ slightly from :class:`VideoFileReader`'s (swscale); the clip parameters are the same.

    Args:
        entries: videos to decode now (a manifest's ``entries``); others are decoded when first read.
    """

    encoded = False  # clips are cut from decoded frames

    def __init__(self, entries: Iterable[VideoEntry] = ()) -> None:
        self._videos: dict[str, tuple[VideoMetadata, torch.Tensor]] = {}  # path -> metadata, uint8 (T, 3, H, W)
        for entry in entries:
            self._load(entry.path)

    def source(self, entry: VideoEntry) -> VideoMetadata:
        return self._load(entry.path)[0]

    def read(self, entry: VideoEntry, params: ClipParams) -> torch.Tensor:
        source = self._load(entry.path)[1]
        height, width = source.shape[-2:]
        scale_y, scale_x = height / params.resize_height, width / params.resize_width
        crop = params.crop_size
        top, left = round(params.crop_y * scale_y), round(params.crop_x * scale_x)
        bottom, right = round((params.crop_y + crop) * scale_y), round((params.crop_x + crop) * scale_x)
        # One copy of each frame's box (a third faster than advanced indexing, which gathers
        # element by element); the resize then reads only the boxes, in uint8.
        region = torch.stack([source[i, :, top:bottom, left:right] for i in params.frame_indices])
        clip = F.interpolate(region, size=(crop, crop), mode="bilinear", antialias=True)
        if params.flip:
            clip = clip.flip(-1)
        return clip.permute(1, 0, 2, 3).contiguous()  # (C, T, H, W)

    def _load(self, path: str) -> tuple[VideoMetadata, torch.Tensor]:
        if path not in self._videos:
            with VideoReader(path) as video:  # frames placed by timestamp, as VideoFileReader picks them
                self._videos[path] = video.metadata, torch.from_numpy(video.decode_rgb()).permute(0, 3, 1, 2).contiguous()
        return self._videos[path]
