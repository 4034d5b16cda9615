"""Video data: manifests, clip decoding at the requested grid, datasets and the DataModule.

Everything here but ``datamodule`` works in a plain PyTorch loop (no Lightning import).
"""

from lightning_multigrid.data.dataset import EvalVideoDataset, TrainVideoDataset, collate_clips, slowfast_pathways
from lightning_multigrid.data.decode import (
    MetadataCache,
    VideoDecodeError,
    VideoMetadata,
    VideoReader,
    probe_video,
)
from lightning_multigrid.data.manifest import (
    Manifest,
    ManifestError,
    VideoEntry,
    load_manifest,
    read_class_names,
    read_folder_manifest,
    read_manifest,
    write_manifest,
)
from lightning_multigrid.data.request import ClipRequest
from lightning_multigrid.data.sampling import ClipParams, eval_clip_params, sample_clip_params
from lightning_multigrid.data.synthetic import SyntheticDataset, generate_synthetic_dataset, write_video

__all__ = [
    "ClipParams",
    "ClipRequest",
    "EvalVideoDataset",
    "Manifest",
    "ManifestError",
    "MetadataCache",
    "SyntheticDataset",
    "TrainVideoDataset",
    "VideoDecodeError",
    "VideoEntry",
    "VideoMetadata",
    "VideoReader",
    "collate_clips",
    "eval_clip_params",
    "generate_synthetic_dataset",
    "load_manifest",
    "probe_video",
    "read_class_names",
    "read_folder_manifest",
    "read_manifest",
    "sample_clip_params",
    "slowfast_pathways",
    "write_manifest",
    "write_video",
]
