"""Does the training batch have the grid the schedule planned? Shapes only: no data is read.

The callback sets the LR factor and the BatchNorm grouping, and logs the grid, from the schedule;
all three are wrong when the DataModule does not serve that grid (a ``serve()`` that never reaches
the train loader trains at the base shape with up to 8x the LR). :class:`BatchGridCheck` compares
the video's shape with the planned grid before every training step; reading ``Tensor.shape`` needs
no host-device sync. Validation and precise-BN batches never pass through it.

The video is ``batch["video"]`` of a dict, the first item of a tuple or list (``(video, label)``),
or the batch itself; a list of 5-D tensors is the ``[slow, fast]`` pathways (the fast one has the
grid's frames). Layout ``(N, C, T, H, W)`` or ``(N, T, C, H, W)``. What the schedule fixes is
checked: the frames and the crop, and a batch no larger than planned (a collate that drops
unreadable clips, or an epoch's last batch, gives fewer). No Lightning here.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from lightning_multigrid.grid import GridShape

__all__ = ["BatchGridCheck", "video_shapes"]


def video_shapes(batch: Any) -> list[tuple[int, ...]] | None:
    """The shapes of the batch's video tensor (one, or one per pathway); ``None`` when it has none."""
    if isinstance(batch, torch.Tensor):
        return [tuple(batch.shape)] if batch.dim() == 5 else None
    if isinstance(batch, Mapping):
        return video_shapes(batch["video"]) if "video" in batch else None
    if isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)) and len(batch) > 0:
        if all(isinstance(item, torch.Tensor) and item.dim() == 5 for item in batch):
            return [tuple(item.shape) for item in batch]  # pathways
        return video_shapes(batch[0])
    return None


# The video layouts a training batch may have, and the index of the frames dimension in each.
LAYOUTS = {"(N, C, T, H, W)": 2, "(N, T, C, H, W)": 1}


def grid_differences(shapes: list[tuple[int, ...]], grid: GridShape, frames_dim: int) -> list[str]:
    """What in the video (one shape, or one per pathway) differs from ``grid`` read with frames at ``frames_dim``.

    The schedule fixes the frames (the fast pathway's: the largest) and the crop, and the batch at
    most: a batch may hold fewer clips (an epoch's last batch, a collate that drops unreadable clips).
    """
    differences = []
    clips = max(shape[0] for shape in shapes)
    if not 0 < clips <= grid.batch_size:
        differences.append(f"{clips} clips, more than the {grid.batch_size} planned" if clips else "no clips")
    frames = max(shape[frames_dim] for shape in shapes)
    if frames != grid.num_frames:
        differences.append(f"{frames} frames, not {grid.num_frames}")
    for height, width in sorted({shape[-2:] for shape in shapes}):
        if (height, width) != (grid.crop_size, grid.crop_size):
            differences.append(f"{height}x{width} px, not {grid.crop_size}x{grid.crop_size}")
    return differences


class BatchGridCheck:
    """Refuses a training batch whose video is not at the planned grid (warns once when it finds no video)."""

    def __init__(self) -> None:
        self._warned = False

    def __call__(self, batch: Any, grid: GridShape, *, epoch: int, batch_idx: int) -> None:
        """Check one training batch against ``grid``, the schedule's grid of ``(epoch, batch_idx)``.

        Frames and crop must be the grid's, in either layout of :data:`LAYOUTS`; the batch may hold
        fewer clips than planned, never more.

        Raises:
            ValueError: naming the received shape, what differs from the planned grid, and the fix.
        """
        shapes = video_shapes(batch)
        if shapes is None:
            if not self._warned:
                self._warned = True
                warnings.warn(
                    "MultigridCallback cannot check that training batches have the schedule's grid: it finds no "
                    "5-D video tensor in the batch (looked at a tensor, batch['video'], batch[0], or a "
                    "list of pathway tensors). Make sure your train loader serves the plan given to `serve(plan)`.",
                    stacklevel=2,
                )
            return
        found = {layout: grid_differences(shapes, grid, dim) for layout, dim in LAYOUTS.items()}
        layout = min(found, key=lambda name: len(found[name]))  # the first (N, C, T, H, W) on a tie
        if not found[layout]:
            return
        received = " and ".join(str(shape) for shape in shapes)
        raise ValueError(
            f"MultigridCallback: training batch {batch_idx} of epoch {epoch} has video of shape {received} (read as "
            f"{layout}: {'; '.join(found[layout])}), but the multigrid schedule's grid there is {grid.batch_size} "
            f"clips x {grid.num_frames} frames x {grid.crop_size}x{grid.crop_size} px (a batch may hold fewer clips, "
            "never more): the train loader does not follow the schedule, so the LR factor and BatchNorm grouping set "
            "for that grid, and the grid logged, would be wrong. Build the train loader from the plan that "
            "`serve(plan)` receives, in `train_dataloader()` with `ShortCycleBatchSampler(sampler, plan)`, decoding "
            "each clip to its `ClipRequest`'s `num_frames` and `crop_size` (docs/data.md); or use "
            "`MultigridVideoDataModule`."
        )
