"""Video data: manifests, clip parameters, readers that decode at the requested grid, datasets and the DataModule.

``manifests/`` reads which videos a dataset holds; ``clip_params`` draws what to cut from each;
``decoding/`` turns that into pixels (PyAV for video files; a folder of JPEG frames decoded at
reduced size in the workers or batched on the GPU; RAM), each behind the ``ClipReader`` door the
datasets use; ``store/`` the packed frame store and its reader; ``tools/`` holds ``extract-frames``,
``pack-frames`` and ``check-data``. Every reader gives the same
clips from the same seeds. Everything here but ``datamodule`` works in a plain PyTorch loop (no
Lightning import).

The public names (``__all__``) are what a user assembles a data pipeline from, in a plain PyTorch
loop or their own DataModule: the datasets and ``collate_clips``, the batch samplers, the
``ClipRequest`` they exchange, the readers and their ``ReaderSettings`` (with ``FrameLayout``: which
files of a frame folder are frames), the manifest, ``check_videos`` (``check-data`` from Python) and
the errors to catch. Each is imported on first access, so importing one module of the package (the
batch sampler, say) loads neither PyAV nor the tools. Everything else is reached by its module path
(``lightning_multigrid.data.tools.pack``, ``lightning_multigrid.data.decoding.video``, ...);
``MultigridVideoDataModule`` (it imports Lightning) is public at the package root,
``lightning_multigrid``, with ``ReaderSettings`` (its ``reader_settings``; the same class as here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning_multigrid._lazy import lazy_attribute

if TYPE_CHECKING:
    from lightning_multigrid.data.clip_params import ClipRequest
    from lightning_multigrid.data.dataset import EvalVideoDataset, TrainVideoDataset, collate_clips
    from lightning_multigrid.data.decoding.errors import VideoDecodeError
    from lightning_multigrid.data.decoding.frame_names import FrameLayout
    from lightning_multigrid.data.decoding.readers import ClipReader, FrameFolderReader, InMemoryReader, VideoFileReader
    from lightning_multigrid.data.manifests.entries import Manifest, ManifestError
    from lightning_multigrid.data.reader_settings import ReaderSettings
    from lightning_multigrid.data.sampler import EpochShardSampler, ShortCycleBatchSampler
    from lightning_multigrid.data.sources import load_manifest
    from lightning_multigrid.data.store.reader import PackedFrameReader
    from lightning_multigrid.data.tools.check import check_videos

# name -> module that defines it, imported on first access.
_LAZY = {
    "EvalVideoDataset": "lightning_multigrid.data.dataset",
    "TrainVideoDataset": "lightning_multigrid.data.dataset",
    "collate_clips": "lightning_multigrid.data.dataset",
    "ShortCycleBatchSampler": "lightning_multigrid.data.sampler",
    "EpochShardSampler": "lightning_multigrid.data.sampler",
    "ClipRequest": "lightning_multigrid.data.clip_params",
    "ClipReader": "lightning_multigrid.data.decoding.readers",
    "FrameFolderReader": "lightning_multigrid.data.decoding.readers",
    "InMemoryReader": "lightning_multigrid.data.decoding.readers",
    "VideoFileReader": "lightning_multigrid.data.decoding.readers",
    "PackedFrameReader": "lightning_multigrid.data.store.reader",
    "ReaderSettings": "lightning_multigrid.data.reader_settings",
    "FrameLayout": "lightning_multigrid.data.decoding.frame_names",
    "Manifest": "lightning_multigrid.data.manifests.entries",
    "ManifestError": "lightning_multigrid.data.manifests.entries",
    "load_manifest": "lightning_multigrid.data.sources",
    "VideoDecodeError": "lightning_multigrid.data.decoding.errors",
    "check_videos": "lightning_multigrid.data.tools.check",
}

# What users construct, pass or catch (tests/test_data_api.py pins it and checks it against _LAZY and
# the TYPE_CHECKING imports above, which let type checkers see each name).
__all__ = [
    "ClipReader",
    "ClipRequest",
    "EpochShardSampler",
    "EvalVideoDataset",
    "FrameFolderReader",
    "FrameLayout",
    "InMemoryReader",
    "Manifest",
    "ManifestError",
    "PackedFrameReader",
    "ReaderSettings",
    "ShortCycleBatchSampler",
    "TrainVideoDataset",
    "VideoDecodeError",
    "VideoFileReader",
    "check_videos",
    "collate_clips",
    "load_manifest",
]


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _LAZY, name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
