"""``PackedFrameReader``: clips read by offset from a packed frame store (:mod:`.format`).

One more :class:`~lightning_multigrid.data.decoding.readers.ClipReader`. ``source()`` answers from the
store's index (the size of the frames it was packed from, so the same seed draws the same clip
parameters as :class:`~lightning_multigrid.data.decoding.readers.FrameFolderReader` on those frames);
``read()`` picks, per clip, the smallest stored level whose short side is at least the clip's drawn
short side (:func:`~lightning_multigrid.data.store.format.choose_level`) and slices the sampled
frames' JPEG bytes out of that level's memory map: no file opened, no header parsed per frame.

- ``frame_decode="workers"``: the clip is decoded in the worker at reduced size where the drawn size
  allows, resized and cropped as the frame-folder reader does
  (:func:`~lightning_multigrid.data.decoding.jpeg.decode_clip_crops`);
- ``frame_decode="device"``: the bytes leave as the
  :class:`~lightning_multigrid.data.decoding.frames.EncodedClip` the frame-folder reader returns,
  for :func:`~lightning_multigrid.data.decoding.device.decode_batch`.

Frames were fully decoded once when packed; damage after that (a frame that fails to decode now) is
a skip as with any reader: a :class:`~lightning_multigrid.data.decoding.errors.VideoDecodeError`
naming the video and the frame, counted by the dataset (``strict`` raises).
"""

from __future__ import annotations

import io
import logging
import os

import torch
from PIL import Image

from lightning_multigrid.data.clip_params import ClipParams, assemble_clip, check_clip_params, distinct_frames
from lightning_multigrid.data.decoding.errors import VideoDecodeError, describe_error, refuse_still_picture
from lightning_multigrid.data.decoding.frames import IMAGE_ERRORS, EncodedClip
from lightning_multigrid.data.decoding.jpeg import JpegFrameError, decode_clip_crops
from lightning_multigrid.data.decoding.readers import FrameDecode, check_frame_decode
from lightning_multigrid.data.manifests.entries import VideoEntry
from lightning_multigrid.data.store.format import FrameStore, StoredVideo, choose_level, remove_released_generations

__all__ = ["PackedFrameReader", "release_store", "repacked_store"]

logger = logging.getLogger(__name__)


class PackedFrameReader:
    """Clips from a packed frame store, decoded in the workers or left as JPEG bytes for the device.

    Args:
        store: the store folder (``lightning-multigrid pack-frames``) or an opened
            :class:`~lightning_multigrid.data.store.format.FrameStore`.
        frame_decode: ``"workers"`` returns decoded clips; ``"device"`` the sampled frames' JPEG bytes.

    Raises:
        ManifestError: when the folder is not a complete store.
        ValueError: when ``frame_decode`` is not ``"workers"`` or ``"device"``.
    """

    def __init__(self, store: str | os.PathLike[str] | FrameStore, frame_decode: FrameDecode = "workers") -> None:
        check_frame_decode(frame_decode)
        self.store = store if isinstance(store, FrameStore) else FrameStore(store)
        self.frame_decode = frame_decode
        self._warned_upscale = False

    @property
    def encoded(self) -> bool:
        """Whether clips leave as JPEG bytes for the device (``frame_decode="device"``)."""
        return self.frame_decode == "device"

    def source(self, entry: VideoEntry) -> StoredVideo:
        return self._stored(entry)

    def read(self, entry: VideoEntry, params: ClipParams) -> torch.Tensor | EncodedClip:
        index = self._index_of(entry)
        store = self.store
        check_clip_params(params, int(store.num_frames[index]), entry.name)
        level = self.level_for(index, params)
        wanted, order = distinct_frames(params)
        data = store.frame_bytes(index, level, wanted)
        if self.encoded:
            return self._encoded(entry, level, wanted, order, data, params)
        width, height = (int(side) for side in store.level_size[index, level])
        try:
            frames = decode_clip_crops(data, params, width, height)
        except JpegFrameError as error:
            name = self.frame_name(entry, level, wanted[error.position])
            raise VideoDecodeError(entry.name, f"frame {name} cannot be decoded ({describe_error(error.error)})") from None
        return torch.from_numpy(assemble_clip(frames, order, params.flip))

    def check_video(self, entry: VideoEntry) -> StoredVideo:
        """Decode every frame of a video at every level in full, as ``check-data`` does for frame folders.

        Raises:
            VideoDecodeError: naming the first frame that does not decode.
        """
        index = self._index_of(entry)
        video = self._stored(entry)
        frames = list(range(video.num_frames))
        for level in range(len(self.store.levels)):
            if self.store.level_short_side[index][level] == 0:
                continue  # this level holds no frames of the video
            for frame, jpeg in zip(frames, self.store.frame_bytes(index, level, frames)):
                try:
                    with Image.open(io.BytesIO(jpeg)) as image:
                        image.load()
                except IMAGE_ERRORS as error:
                    name = self.frame_name(entry, level, frame)
                    raise VideoDecodeError(entry.name, f"frame {name} cannot be decoded ({describe_error(error)})") from None
        return video

    def level_for(self, index: int, params: ClipParams) -> int:
        """The level a clip of video ``index`` is read from: the smallest at least its drawn short side."""
        drawn = min(params.resize_width, params.resize_height)
        if drawn > self.store.levels[0] and not self._warned_upscale:
            self._warned_upscale = True  # once per process: every clip of such a run would repeat it
            logger.warning(
                "A clip draws a short side of %d px, above the store %s's level 0 (%d px): its frames are "
                "upscaled. Pack the store for the grids you train (`pack-frames --crop-size`, `--jitter-scales`).",
                drawn, self.store.path, self.store.levels[0],
            )
        return choose_level(self.store.level_short_side[index], drawn)

    def frame_name(self, entry: VideoEntry, level: int, frame: int) -> str:
        """A frame in messages: its video, 1-based number and the level file it was read from."""
        return f"{frame + 1} of {entry.name} (level {self.store.level_name(level)} of the store {self.store.path})"

    def _stored(self, entry: VideoEntry) -> StoredVideo:
        """The video as sampling sees it; a still picture (packed by an older version) is a bad video, as
        in every reader."""
        video = self.store.video(self._index_of(entry))
        refuse_still_picture(entry.name, video.num_frames, f"the store {self.store.path}")
        return video

    def _index_of(self, entry: VideoEntry) -> int:
        try:
            return self.store.video_index(entry.name)
        except KeyError:
            raise VideoDecodeError(entry.name, f"the store {self.store.path} does not hold this video") from None

    def _encoded(
        self,
        entry: VideoEntry,
        level: int,
        wanted: list[int],
        order: tuple[int, ...],
        data: list[memoryview],
        params: ClipParams,
    ) -> EncodedClip:
        jpegs = []
        for frame, jpeg in zip(wanted, data):
            # Two byte compares, not a header parse: packing decoded every frame once; this catches a
            # store damaged since (cut or overwritten frames) in the worker, where the clip can be replaced.
            if len(jpeg) < 4 or jpeg[:2] != b"\xff\xd8" or bytes(jpeg[-2:]) != b"\xff\xd9":
                raise VideoDecodeError(
                    entry.name, f"frame {self.frame_name(entry, level, frame)} is not a whole JPEG (damaged store)"
                )
            jpegs.append(bytearray(jpeg))
        paths = tuple(self.frame_name(entry, level, frame) for frame in wanted)
        return EncodedClip(jpegs, order, params, entry.name, paths)


def repacked_store(dataset: object) -> FrameStore | None:
    """The packed store ``dataset`` reads (through its ``reader``) if that store was packed again since the
    dataset opened it; ``None`` when it was not, or the dataset reads no store."""
    reader = getattr(dataset, "reader", None)
    if isinstance(reader, PackedFrameReader) and reader.store.repacked():
        return reader.store
    return None


def release_store(store: FrameStore) -> None:
    """Let an opened store's generation go (:meth:`FrameStore.close`) and remove its files now where no other
    run reads them (:func:`~lightning_multigrid.data.store.format.remove_released_generations`)."""
    store.close()
    removed = remove_released_generations(store.path)
    if removed:
        logger.info("%s: removed the files of %d older packing(s) no run reads any more.", store.path, len(removed))
