"""Video data: manifests, clip parameters, readers that decode at the requested grid, datasets and the DataModule.

``manifests/`` reads which videos a dataset holds; ``clip_params`` draws what to cut from each;
``decoding/`` turns that into pixels (PyAV for video files; a folder of JPEG frames decoded at
reduced size in the workers or batched on the GPU; RAM), each behind the ``ClipReader`` door the
datasets use; ``store/`` the packed frame store and its reader; ``tools/`` holds ``extract-frames``,
``pack-frames`` and ``check-data``. Every reader gives the same
clips from the same seeds. Everything here but ``datamodule`` works in a plain PyTorch loop (no
Lightning import).
"""

from lightning_multigrid.data.clip_params import ClipParams, ClipRequest, eval_clip_params, sample_clip_params
from lightning_multigrid.data.dataset import EvalVideoDataset, TrainVideoDataset, collate_clips
from lightning_multigrid.data.decoding.device import DeviceDecode, EncodedBatch, decode_batch, decode_clips
from lightning_multigrid.data.decoding.errors import VideoDecodeError
from lightning_multigrid.data.decoding.frame_names import FrameLayout
from lightning_multigrid.data.decoding.frames import EncodedClip, open_frame_folder, read_clip, read_encoded_clip
from lightning_multigrid.data.decoding.metadata import FrameFolder, MetadataCache, VideoMetadata
from lightning_multigrid.data.decoding.readers import ClipReader, FrameFolderReader, InMemoryReader, VideoFileReader
from lightning_multigrid.data.decoding.video import VideoReader, probe_video
from lightning_multigrid.data.loaders import ChunkedDataLoader
from lightning_multigrid.data.manifests.entries import Manifest, ManifestError, VideoEntry, read_class_names
from lightning_multigrid.data.manifests.frames import read_frame_manifest, write_frame_manifest
from lightning_multigrid.data.manifests.load import load_manifest
from lightning_multigrid.data.manifests.videos import read_folder_manifest, read_manifest, write_manifest
from lightning_multigrid.data.store.reader import PackedFrameReader
from lightning_multigrid.data.synthetic import SyntheticDataset, generate_synthetic_dataset, write_video
from lightning_multigrid.data.tools.extract import extract_frames
from lightning_multigrid.data.tools.pack import pack_frames
from lightning_multigrid.models.pathways import slowfast_pathways

__all__ = [
    "ChunkedDataLoader",
    "ClipReader",
    "ClipParams",
    "ClipRequest",
    "DeviceDecode",
    "EncodedBatch",
    "EncodedClip",
    "EvalVideoDataset",
    "FrameFolder",
    "FrameFolderReader",
    "FrameLayout",
    "InMemoryReader",
    "Manifest",
    "ManifestError",
    "MetadataCache",
    "PackedFrameReader",
    "SyntheticDataset",
    "TrainVideoDataset",
    "VideoDecodeError",
    "VideoEntry",
    "VideoMetadata",
    "VideoFileReader",
    "VideoReader",
    "collate_clips",
    "decode_batch",
    "decode_clips",
    "eval_clip_params",
    "extract_frames",
    "generate_synthetic_dataset",
    "load_manifest",
    "open_frame_folder",
    "pack_frames",
    "probe_video",
    "read_class_names",
    "read_clip",
    "read_encoded_clip",
    "read_folder_manifest",
    "read_frame_manifest",
    "read_manifest",
    "sample_clip_params",
    "slowfast_pathways",
    "write_frame_manifest",
    "write_manifest",
    "write_video",
]
