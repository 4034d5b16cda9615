"""Datasets that serve clips from videos decoded once into RAM (the benchmarks' in-memory source).

Decoding is taken out of the timed loop, as on a GPU box whose loader keeps up. Clip parameters
come from the same draw as for decoding (``sample_clip_params`` / ``eval_clip_params``); the crop
box is mapped back onto the source frame and only that region is resized (antialiased bilinear),
which matches resize-then-crop up to sub-pixel rounding at a fraction of the cost.

Copied from ``benchmarks/train.py``'s ``FramesInMemory`` (and extended to evaluation) so the
accuracy benchmark does not depend on that script.
"""

from __future__ import annotations

from typing import Any

import av
import numpy as np
import torch
import torch.nn.functional as F

from lightning_multigrid.data.clip_params import ClipParams
from lightning_multigrid.data.dataset import EvalVideoDataset, TrainVideoDataset
from lightning_multigrid.data.decoding.video import VideoReader

__all__ = ["EvalFramesInMemory", "TrainFramesInMemory"]


class _FramesInMemory:
    """Decodes every video of ``self.manifest`` once; ``_load`` cuts clips from RAM.

    The clip parameters come from the same draw as for decoding. The crop box is mapped back onto
    the source frame and only that region is resized (antialiased bilinear), which matches
    resize-then-crop up to sub-pixel rounding at a fraction of the cost.
    """

    manifest: Any
    metadata: Any

    def _decode_all(self) -> None:
        self.frames: dict[str, torch.Tensor] = {}  # path -> uint8 (T, 3, H, W)
        for entry in self.manifest.entries:
            if entry.path in self.frames:
                continue
            with VideoReader(entry.path) as reader:
                self.metadata.put(entry.path, reader.metadata)
            with av.open(entry.path) as container:
                rgb = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
            self.frames[entry.path] = torch.from_numpy(np.stack(rgb)).permute(0, 3, 1, 2).contiguous()

    def _load(self, video_index: int, draw: Any) -> torch.Tensor:
        path = self.manifest.entries[video_index].path
        params: ClipParams = draw(self.metadata.get(path))
        source = self.frames[path]
        height, width = source.shape[-2:]
        scale_y, scale_x = height / params.resize_height, width / params.resize_width
        crop = params.crop_size
        top, left = round(params.crop_y * scale_y), round(params.crop_x * scale_x)
        bottom, right = round((params.crop_y + crop) * scale_y), round((params.crop_x + crop) * scale_x)
        region = source[list(params.frame_indices), :, top:bottom, left:right]
        clip = F.interpolate(region, size=(crop, crop), mode="bilinear", antialias=True)
        if params.flip:
            clip = clip.flip(-1)
        return clip.permute(1, 0, 2, 3).contiguous()  # (C, T, H, W)


class TrainFramesInMemory(_FramesInMemory, TrainVideoDataset):
    """:class:`TrainVideoDataset` over frames held in RAM (same arguments)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._decode_all()


class EvalFramesInMemory(_FramesInMemory, EvalVideoDataset):
    """:class:`EvalVideoDataset` over frames held in RAM (same arguments)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._decode_all()
