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

The layout is read from the channels, then checked against the planned grid: a batch is read in the
layout whose channel dimension (2 for time-first, 1 otherwise) holds RGB's 3 channels, else another
video's channel count (1-4: grey, flow, RGBA); ``(N, C, T, H, W)`` (the DataModule's, torchvision's)
on a tie. So 6 frames served at a 3-frame grid, ``(16, 3, 6, 16, 16)``, is 6 frames of RGB, not 3
frames of 6 channels. Where both readings are equally a video and only one is at the grid
(``(16, 2, 4, 16, 16)`` at a 2-frame grid: 4 frames of flow, or 2 frames of RGBA) the batch is
refused naming both, unless an earlier batch of the fit told the layout: a batch at the grid in one
reading only tells it, and it holds for the rest of the fit.
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
CHANNELS_FIRST, TIME_FIRST = LAYOUTS
# The channel counts a video has (grey, flow, RGB, RGBA): a dimension larger than this is no channel dimension.
MAX_VIDEO_CHANNELS = 4


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


def channel_rank(shapes: list[tuple[int, ...]], layout: str) -> int:
    """How much ``layout``'s channel dimension looks like a video's: 2 for RGB's 3 channels in every pathway,
    1 for counts of 1 to :data:`MAX_VIDEO_CHANNELS` (grey, flow, RGBA), 0 for none (feature maps)."""
    channels = {shape[3 - LAYOUTS[layout]] for shape in shapes}  # the other of dimensions 1 and 2
    if channels == {3}:
        return 2
    return 1 if all(1 <= count <= MAX_VIDEO_CHANNELS for count in channels) else 0


class BatchGridCheck:
    """Refuses a training batch whose video is not at the planned grid (warns once when it finds no video).

    One per fit: the layout a batch tells is kept for the batches after it.
    """

    def __init__(self) -> None:
        self._warned = False
        self.layout: str | None = None  # told by a batch; then every batch is read so

    def __call__(self, batch: Any, grid: GridShape, *, epoch: int, batch_idx: int) -> None:
        """Check one training batch against ``grid``, the schedule's grid of ``(epoch, batch_idx)``.

        Frames and crop must be the grid's, in the layout of :data:`LAYOUTS` the batch has (module
        docstring); the batch may hold fewer clips than planned, never more.

        Raises:
            ValueError: naming the received shape, what differs from the planned grid, and the fix; or,
                for a batch that reads as video in both layouts and at the grid in one, naming both readings.
        """
        shapes = video_shapes(batch)
        if shapes is None:
            self._warn_no_video()
            return
        found = {layout: grid_differences(shapes, grid, dim) for layout, dim in LAYOUTS.items()}
        layout = self._reading(shapes, found)
        if layout is None:
            raise ValueError(_ambiguous_message(shapes, grid, found[CHANNELS_FIRST], epoch, batch_idx))
        if found[layout]:
            raise ValueError(_off_grid_message(shapes, grid, layout, found[layout], epoch, batch_idx))
        if found[CHANNELS_FIRST] or found[TIME_FIRST]:  # at the grid in one reading only: it tells the layout
            self.layout = layout

    def _reading(self, shapes: list[tuple[int, ...]], found: dict[str, list[str]]) -> str | None:
        """The layout to read the batch in (module docstring); ``None`` when two equally video-like readings
        disagree about the grid and no batch told the layout before."""
        if self.layout is not None:
            return self.layout
        ranks = {layout: channel_rank(shapes, layout) for layout in LAYOUTS}
        if ranks[CHANNELS_FIRST] != ranks[TIME_FIRST]:
            return max(LAYOUTS, key=lambda name: ranks[name])
        if ranks[CHANNELS_FIRST] > 0 and bool(found[CHANNELS_FIRST]) != bool(found[TIME_FIRST]):
            return None
        return min(LAYOUTS, key=lambda name: len(found[name]))  # channels-first on a tie

    def _warn_no_video(self) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(
                "MultigridCallback cannot check that training batches have the schedule's grid: it finds no "
                "5-D video tensor in the batch (looked at a tensor, batch['video'], batch[0], or a "
                "list of pathway tensors). Make sure your train loader serves the plan given to `serve(plan)`.",
                stacklevel=3,
            )


def _planned(grid: GridShape) -> str:
    return f"{grid.batch_size} clips x {grid.num_frames} frames x {grid.crop_size}x{grid.crop_size} px"


def _off_grid_message(
    shapes: list[tuple[int, ...]], grid: GridShape, layout: str, differences: list[str], epoch: int, batch_idx: int
) -> str:
    received = " and ".join(str(shape) for shape in shapes)
    return (
        f"MultigridCallback: training batch {batch_idx} of epoch {epoch} has video of shape {received} (read as "
        f"{layout}: {'; '.join(differences)}), but the multigrid schedule's grid there is {_planned(grid)} "
        "(a batch may hold fewer clips, never more): the train loader does not follow the schedule, so the LR factor "
        "and BatchNorm grouping set for that grid, and the grid logged, would be wrong. Build the train loader from "
        "the plan that `serve(plan)` receives, in `train_dataloader()` with `ShortCycleBatchSampler(sampler, plan)`, "
        "decoding each clip to its `ClipRequest`'s `num_frames` and `crop_size` (docs/data.md); or use "
        "`MultigridVideoDataModule`."
    )


def _ambiguous_message(
    shapes: list[tuple[int, ...]], grid: GridShape, channels_first: list[str], epoch: int, batch_idx: int
) -> str:
    received = " and ".join(str(shape) for shape in shapes)
    return (
        f"MultigridCallback: training batch {batch_idx} of epoch {epoch} has video of shape {received}, which "
        f"reads two ways: as {TIME_FIRST} it has the grid's {grid.num_frames} frames, as {CHANNELS_FIRST} "
        f"{'; '.join(channels_first)} (the schedule's grid there is {_planned(grid)}); both hold a video's channel "
        "count, so the check cannot tell whether the loader follows the schedule. Serve the video as "
        f"{CHANNELS_FIRST} (as `MultigridVideoDataModule` does), or check that the loader decodes each clip to its "
        "`ClipRequest`'s `num_frames`."
    )
