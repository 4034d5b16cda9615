"""Data settings that would fail late, refused before the first step.

``check_drop_last``: with ``drop_last=True`` an epoch whose grids take more clips per batch than a
device has trains no step, and Lightning ends the run there (a multigrid run announcing thousands
of steps returns after 0). ``check_eval_classes``: validation or test data numbering its classes
otherwise than training would be scored against shifted labels, or fail at the first validation
batch. ``check_store_fits``: a packed frame store made for smaller grids than the run draws.
``check_decode_ahead``: more batches decoded ahead than 2 only hold device memory.
``check_base_batch_settable``: the base batch changes only while no schedule built from it is served.
``check_synthetic_alone``: the built-in synthetic dataset excludes the manifests;
``existing_manifest``: a manifest a stage needs, given and found.
"""

from __future__ import annotations

import math
from pathlib import Path

from lightning_multigrid._checks import check_int
from lightning_multigrid.data.manifests.classes import align_classes, describe_classes
from lightning_multigrid.data.manifests.entries import Manifest, ManifestError
from lightning_multigrid.data.store.reader import PackedFrameReader
from lightning_multigrid.grid import GridPlan, count_batches

__all__ = [
    "check_base_batch_settable", "check_decode_ahead", "check_drop_last", "check_eval_classes", "check_store_fits",
    "check_synthetic_alone", "existing_manifest",
]


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


def check_eval_classes(training: Manifest, evaluation: Manifest, argument: str) -> None:
    """Raise unless an evaluation dataset's manifest numbers its classes as the training manifest does.

    The DataModule builds its evaluation datasets mapped onto the training classes
    (:func:`~lightning_multigrid.data.manifests.classes.align_classes`); one given with
    ``use_datasets`` must already be.

    Raises:
        ManifestError: naming the evaluation manifest, the video (and line) and the class when training
            lacks it; or both sets of class facts and the fix when they differ otherwise.
    """
    aligned = align_classes(evaluation, training, argument)  # raises on a class training lacks
    # What the targets are made of: the labels, single- or multi-label, and a multi-hot's width.
    width = training.num_classes if training.multi_label else None
    if (evaluation.entries, evaluation.multi_label, evaluation.num_classes if width else None) != (
        aligned.entries, aligned.multi_label, width
    ):
        raise ManifestError(
            f"`{argument}` dataset {evaluation.source} has {describe_classes(evaluation)}, the training "
            f"dataset {training.source} {describe_classes(training)}: its labels or targets "
            "would not match the model's. Build it on the training classes: pass "
            "`lightning_multigrid.data.manifests.classes.align_classes(load_manifest(...), train_dataset.manifest, "
            f"{argument!r})` as its manifest."
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


def check_base_batch_settable(value: object, base_batch: int, *, serving_schedule: bool) -> None:
    """Refuse a new base batch ``value`` while a multigrid schedule built from ``base_batch`` is served."""
    if serving_schedule:
        raise ValueError(
            f"MultigridVideoDataModule: cannot set `batch_size={value!r}` while a multigrid schedule built from "
            f"base batch {base_batch} is served. Set it before `fit` (Lightning's batch-size "
            "finder does so before MultigridCallback builds its schedule)."
        )


def check_decode_ahead(decode_ahead: int) -> None:
    """Refuse a ``decode_ahead`` that is not 0, 1 or 2 batches."""
    if check_int("decode_ahead", decode_ahead, 0) > 2:
        raise ValueError(f"`decode_ahead` must be 0, 1 or 2 batches, got {decode_ahead!r}: more only holds device memory.")


def check_synthetic_alone(synthetic: object, **manifest_args: str | None) -> None:
    """With ``synthetic`` (not ``None``), none of the manifest arguments: the built-in dataset's files stand in for them."""
    given = [name for name, value in manifest_args.items() if value is not None]
    if synthetic is not None and given:
        raise ValueError(
            f"`synthetic` uses the built-in synthetic dataset, but {', '.join(f'`{n}`' for n in given)} "
            "also given: pass either `synthetic` or your manifests."
        )


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
