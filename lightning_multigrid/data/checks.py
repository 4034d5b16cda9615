"""Data settings that would fail late, refused before the first step.

``check_drop_last``: with ``drop_last=True`` an epoch whose grids take more clips per batch than a
device has trains no step, and Lightning ends the run there (a multigrid run announcing thousands
of steps returns after 0). ``check_eval_labels``: a validation label the training classes lack
would fail at the first validation batch, with no file or line named. ``check_store_fits``: a packed
frame store made for smaller grids than the run draws. ``check_synthetic_arguments``:
the built-in synthetic dataset's arguments, which exclude the manifests; ``existing_manifest``: a manifest a
stage needs, given and found.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Protocol

from lightning_multigrid.data.manifests.entries import Manifest, ManifestError
from lightning_multigrid.data.store.reader import PackedFrameReader
from lightning_multigrid.data.synthetic import check_texture_cell
from lightning_multigrid.grid import GridPlan, count_batches

__all__ = [
    "check_drop_last", "check_eval_labels", "check_store_fits", "check_synthetic_arguments", "existing_manifest",
]


class _HasManifest(Protocol):
    @property
    def manifest(self) -> Manifest: ...


def check_drop_last(plan: GridPlan, dataset_size: int, world_size: int) -> None:
    """Raise when ``drop_last`` leaves an epoch of ``plan`` without a single batch.

    Args:
        plan: the grids per epoch (the baseline's ``FixedGrid``, or the multigrid schedule).
        dataset_size: training clips (videos) in all.
        world_size: devices the clips are shared between.

    Raises:
        ValueError: naming the epochs, their batch and the clips per device, and the fixes.
    """
    clips = math.ceil(dataset_size / world_size)
    for start, end in plan.epoch_spans():
        cycle = plan.cycle_at(start)
        sizes = [grid.batch_size for grid in cycle]
        if sum(batches for batches, _ in count_batches(clips, sizes, drop_last=True)) == 0:
            epochs = f"epochs {start}-{end - 1}" if end is not None else "every epoch"
            raise ValueError(
                f"`drop_last=True` leaves {epochs} without a batch: their "
                f"grid {cycle[-1].num_frames}x{cycle[-1].crop_size}px takes at least {min(sizes)} clips per "
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


def check_store_fits(reader: object, argument: str, short_side: int, what: str) -> None:
    """Refuse a packed frame store whose level 0 is smaller than the short sides a split draws.

    Args:
        reader: the split's dataset's reader (anything but a store reader passes).
        argument: the DataModule argument that named the store, for the message.
        short_side: the largest short side the split draws, pixels.
        what: where ``short_side`` comes from, in words.

    Raises:
        ValueError: naming both sizes and the fix.
    """
    if not isinstance(reader, PackedFrameReader):
        return
    store = reader.store
    if store.levels[0] < short_side:
        raise ValueError(
            f"`{argument}` {store.path} is a frame store packed with level 0 at a short side of {store.levels[0]} px, "
            f"but this run draws short sides up to {short_side} px ({what}): every frame would be upscaled. Pack it "
            f"again for this run (`lightning-multigrid pack-frames <manifest> {store.path} --crop-size <crop_size>`, "
            "with `--jitter-scales` as the DataModule's), or train at a crop whose short sides fit the store."
        )


def check_synthetic_arguments(
    synthetic_size: tuple[int, int], synthetic_texture_cell: int | None, **manifest_args: str | None
) -> None:
    """With ``synthetic_dir``: no manifest arguments, ``(train, val)`` counts >= 1, a texture cell in range."""
    given = [name for name, value in manifest_args.items() if value is not None]
    if given:
        raise ValueError(
            f"`synthetic_dir` uses the built-in synthetic dataset, but {', '.join(f'`{n}`' for n in given)} "
            "also given: pass either `synthetic_dir` or your manifests."
        )
    if len(synthetic_size) != 2 or synthetic_size[0] < 1 or synthetic_size[1] < 1:
        raise ValueError(f"`synthetic_size` must be (train, val) video counts >= 1, got {synthetic_size!r}.")
    check_texture_cell("synthetic_texture_cell", synthetic_texture_cell)


def existing_manifest(argument: str, path: str | None) -> str:
    """``path`` if the manifest ``argument`` names is given and exists.

    Raises:
        ValueError: when ``path`` is ``None``.
        FileNotFoundError: when it does not exist.
    """
    if path is None:
        raise ValueError(f"`{argument}` is required for this stage: pass the manifest file.")
    if not Path(path).exists():
        raise FileNotFoundError(f"`{argument}` {path} does not exist: check the path.")
    return path
