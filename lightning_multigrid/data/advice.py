"""What would make ``MultigridVideoDataModule``'s loading faster, for the data-wait summary.

The advice fits how the training clips are read (video files, frame folders, a packed frame store,
an in-memory reader or another one given through ``use_datasets``) and the settings the
DataModule has, so a run that reads a store is not told to read one.
"""

from __future__ import annotations

from lightning_multigrid.data.decoding.readers import ClipReader, FrameFolderReader, VideoFileReader, returns_encoded
from lightning_multigrid.data.loaders import LoaderSettings
from lightning_multigrid.data.store.reader import PackedFrameReader

__all__ = ["loading_advice"]


def loading_advice(reader: ClipReader, loaders: LoaderSettings, decode_ahead: int) -> str:
    """Changes that make loading faster for a DataModule reading with ``reader``, most effective first.

    Args:
        reader: the training set's reader.
        loaders: the DataModule's loader settings.
        decode_ahead: the DataModule's ``decode_ahead``.

    Returns:
        A phrase listing the changes, comma-separated, without a final stop.
    """
    tips: list[str] = []
    if isinstance(reader, VideoFileReader):
        tips.append(
            "reading frames from a packed frame store instead of the video files (`lightning-multigrid pack-frames` "
            "reads the videos; docs/data.md): a coarse grid then decodes small JPEGs, not whole video frames"
        )
    elif isinstance(reader, FrameFolderReader):
        tips.append(
            "packing the frame folders into a frame store (`lightning-multigrid pack-frames`): one file read by "
            "offset instead of a file opened per frame, and frames stored no larger than the grids draw"
        )
    elif isinstance(reader, PackedFrameReader) and len(reader.store.levels) == 1:
        tips.append("a store with smaller levels for the coarse grids (`pack-frames --levels 2`)")
    # Device decode is never advised: on the H200 it trained slower than the workers' decode
    # (113.0 against 29.7 s for the baseline, docs/gpu.md), and on a CPU it decodes in the training
    # process. A run that uses it is told the workers measured faster.
    if returns_encoded(reader):
        tips.append(
            "decoding in the workers (`reader_settings: {frame_decode: workers}`), measured faster than the "
            "device decode (docs/gpu.md)"
        )
        if decode_ahead < 2:
            tips.append(f"decoding further ahead of the step (`decode_ahead: 2`, now {decode_ahead})")
    tips.append(f"more loader workers (`num_workers`, now {loaders.num_workers})")
    if loaders.num_workers > 1 and not loaders.chunk_batches:
        tips.append("`chunk_batches: true`, so a coarse grid's large batch is decoded by several workers")
    return ", ".join(tips)
