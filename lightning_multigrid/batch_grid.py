"""Does the training batch have the grid the schedule planned? Shapes only: no data is read.

The callback sets the LR factor and the BatchNorm grouping, and logs the grid, from the schedule;
all three are wrong when the DataModule does not serve that grid (a ``serve()`` that never reaches
the train loader trains at the base shape with up to 8x the LR). :class:`BatchGridCheck` compares
the video's shape with the planned grid before every training step; reading ``Tensor.shape`` needs
no host-device sync. Validation and precise-BN batches never pass through it.

The video is ``batch["video"]`` of a dict, the first item of a tuple or list (``(video, label)``),
or the batch itself; a list of 5-D tensors is the ``[slow, fast]`` pathways (the fast one has the
grid's frames). Layout ``(N, C, T, H, W)``. No Lightning here.
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


class BatchGridCheck:
    """Refuses a training batch whose video is not at the planned grid (warns once when it finds no video)."""

    def __init__(self) -> None:
        self._warned = False

    def __call__(self, batch: Any, grid: GridShape, *, epoch: int, batch_idx: int, last_batch: bool) -> None:
        """Check one training batch against ``grid``, the schedule's grid of ``(epoch, batch_idx)``.

        ``last_batch``: the epoch's last batch, which may hold fewer clips (``drop_last=False``).

        Raises:
            ValueError: naming the received and the expected shape and the fix.
        """
        shapes = video_shapes(batch)
        if shapes is None:
            if not self._warned:
                self._warned = True
                warnings.warn(
                    "MultigridCallback cannot check that training batches have the schedule's grid: it finds no "
                    "(N, C, T, H, W) video tensor in the batch (looked at a tensor, batch['video'], batch[0], or a "
                    "list of pathway tensors). Make sure your train loader serves the plan given to `serve(plan)`.",
                    stacklevel=2,
                )
            return
        clips = {shape[0] for shape in shapes}
        frames = max(shape[2] for shape in shapes)
        crops = {(shape[3], shape[4]) for shape in shapes}
        clips_ok = clips == {grid.batch_size} or (last_batch and len(clips) == 1 and 0 < min(clips) < grid.batch_size)
        if clips_ok and frames == grid.num_frames and crops == {(grid.crop_size, grid.crop_size)}:
            return
        received = " and ".join(str(shape) for shape in shapes)
        raise ValueError(
            f"MultigridCallback: training batch {batch_idx} of epoch {epoch} has video of shape {received} "
            f"(clips, channels, frames, height, width), but the multigrid schedule's grid there is "
            f"{grid.batch_size} clips x {grid.num_frames} frames x {grid.crop_size}x{grid.crop_size} px: the DataModule "
            "does not serve the schedule, so the LR factor and BatchNorm grouping set for that grid, and the grid "
            "logged, would be wrong. Keep the plan that `serve(plan)` receives and build the train loader from it in "
            "`train_dataloader()` with `ShortCycleBatchSampler(sampler, plan)`, decoding each clip to its "
            "`ClipRequest`'s `num_frames` and `crop_size` (docs/data.md); or use `MultigridVideoDataModule`."
        )
