"""Data settings that would fail late, refused before the first step.

``check_drop_last``: with ``drop_last=True`` an epoch whose grids take more clips per batch than a
device has trains no step, and Lightning ends the run there (a multigrid run announcing thousands
of steps returns after 0). ``check_eval_labels``: a validation label the training classes lack
would fail at the first validation batch, with no file or line named.
"""

from __future__ import annotations

import math
from typing import Protocol

from lightning_multigrid.data.manifests.entries import Manifest, ManifestError
from lightning_multigrid.schedule import MultigridSchedule, count_batches

__all__ = ["check_drop_last", "check_eval_labels"]


class _HasManifest(Protocol):
    @property
    def manifest(self) -> Manifest: ...


def check_drop_last(schedule: MultigridSchedule, dataset_size: int, world_size: int) -> None:
    """Raise when ``drop_last`` leaves an epoch of ``schedule`` without a single batch.

    Args:
        schedule: the grids per epoch (the baseline's one stage, or the multigrid schedule).
        dataset_size: training clips (videos) in all.
        world_size: devices the clips are shared between.

    Raises:
        ValueError: naming the epochs, their batch and the clips per device, and the fixes.
    """
    clips = math.ceil(dataset_size / world_size)
    for stage in schedule.stages:
        sizes = [grid.batch_size for grid in schedule.cycle_at(stage.start_epoch)]
        if sum(batches for batches, _ in count_batches(clips, sizes, drop_last=True)) == 0:
            raise ValueError(
                f"`drop_last=True` leaves epochs {stage.start_epoch}-{stage.end_epoch - 1} without a batch: their "
                f"grid {stage.shape.num_frames}x{stage.shape.crop_size}px takes at least {min(sizes)} clips per "
                f"batch, but each of the {world_size} device(s) gets {clips} training clips, so training would "
                "stop there after 0 steps. Set `drop_last=False`, or train on more videos "
                "(a smaller `batch_size` shrinks every grid's batch)."
            )


def check_eval_labels(train: _HasManifest, evaluation: _HasManifest | None, argument: str) -> None:
    """Raise when an evaluation video has a label outside the training classes.

    Raises:
        ManifestError: naming the evaluation manifest, the line and the label, and the fix.
    """
    if evaluation is None:
        return
    num_classes = train.manifest.num_classes
    for entry in evaluation.manifest.entries:
        outside = [label for label in entry.labels if label >= num_classes]
        if outside:
            where = f"{evaluation.manifest.source}:{entry.line_number}" if entry.line_number else evaluation.manifest.source
            raise ManifestError(
                f"{where}: `{argument}` label {outside[0]} of {entry.name} is not one of the {num_classes} training "
                f"classes (0-{num_classes - 1}, from {train.manifest.source}): fix the label, or give both "
                "manifests the same `class_names`."
            )
