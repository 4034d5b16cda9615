"""``ReaderSettings``: the decoder settings of a dataset's reader, one value, checked once where it is made.

The settings travel whole: the DataModule builds them from its flat arguments in ``__init__`` (a bad
setting fails before any file is read) and with them, in ``setup``, the reader each split's
manifest asks for (:meth:`ReaderSettings.reader_for`), which it hands to the datasets. A dataset
given no reader builds the default one for its manifest with the default settings. Adding a reader
option is one field here plus the reader's own code.

It lives above the rooms whose readers it builds (``decoding/``, ``store/``): the store's reader is
built on the decoders, so ``decoding/`` never imports ``store/``.

Example::

    settings = ReaderSettings(frame_decode="device", filename_tmpl="{video}_{:06d}.jpg")
    manifest = load_manifest("frames/train.txt")
    TrainVideoDataset(manifest, settings.reader_for(manifest))   # or TrainVideoDataset(manifest, settings)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import get_args

from lightning_multigrid.data.decoding.frame_names import FrameLayout
from lightning_multigrid.data.decoding.readers import (
    ClipReader,
    FrameDecode,
    FrameFolderReader,
    VideoFileReader,
    check_frame_decode,
)
from lightning_multigrid.data.decoding.video import Interpolation
from lightning_multigrid.data.manifests.entries import Manifest
from lightning_multigrid.data.store.reader import PackedFrameReader

__all__ = ["ReaderSettings"]


@dataclass(frozen=True, slots=True)
class ReaderSettings:
    """How a dataset's clips are decoded, for every format a manifest may have.

    Args:
        metadata_file: video files: precomputed metadata (``check-data --write-metadata``) to skip probing.
        interpolation: video files: the swscale resize filter (frames are resized bilinearly).
        frame_decode: frame datasets and packed stores: ``"workers"`` (default) decodes the JPEGs in
            the DataLoader workers; ``"device"`` returns the clip's JPEG bytes and parameters
            (:class:`~lightning_multigrid.data.decoding.frames.EncodedClip`) for decoding on the device
            (:func:`~lightning_multigrid.data.decoding.device.decode_clips`).
        filename_tmpl: frame datasets: the frames' file names, e.g. ``"img_{:05d}.jpg"`` or
            ``"{video}_{:06d}.jpg"``; ``None`` detects each folder's
            (:mod:`~lightning_multigrid.data.decoding.frame_names`). Other files are never read as frames.
        allow_frame_gaps: frame datasets: read folders whose frame numbers skip as consecutive
            frames, instead of skipping them as bad videos.

    Attributes:
        layout: the :class:`~lightning_multigrid.data.decoding.frame_names.FrameLayout` of
            ``filename_tmpl`` and ``allow_frame_gaps``, built (and checked) once.

    Raises:
        ValueError: on a setting out of its range, naming it.
    """

    metadata_file: str | os.PathLike[str] | None = None
    interpolation: Interpolation = "BILINEAR"
    frame_decode: FrameDecode = "workers"
    filename_tmpl: str | None = None
    allow_frame_gaps: bool = False
    layout: FrameLayout = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_frame_decode(self.frame_decode)
        if self.interpolation not in get_args(Interpolation):
            raise ValueError(
                f"`interpolation` must be one of {', '.join(map(repr, get_args(Interpolation)))}, "
                f"got {self.interpolation!r}."
            )
        # Checks `filename_tmpl` and `allow_frame_gaps` (naming them) before any file is read.
        object.__setattr__(self, "layout", FrameLayout(self.filename_tmpl, self.allow_frame_gaps))

    def reader_for(self, manifest: Manifest) -> ClipReader:
        """The reader ``manifest``'s format asks for: video files, frame folders or a packed frame store.

        Raises:
            ValueError: when settings for frame folders (``filename_tmpl``, ``allow_frame_gaps``) or
                ``frame_decode="device"`` are given for a manifest of video files, naming the fix.
            FileNotFoundError: when ``metadata_file`` does not exist.
            ManifestError: when a store's folder is not a complete store.
        """
        self.layout.check_applies(manifest.format, manifest.source)
        if manifest.format == "store":
            return PackedFrameReader(manifest.source, self.frame_decode)
        if manifest.format == "frames":
            return FrameFolderReader(self.layout, self.frame_decode)
        if self.frame_decode == "device":
            raise ValueError(
                f"`frame_decode='device'` needs a frame dataset, but {manifest.source} lists video files: "
                "convert it with `lightning-multigrid extract-frames`, or decode in the workers."
            )
        return VideoFileReader(self.metadata_file, self.interpolation)
