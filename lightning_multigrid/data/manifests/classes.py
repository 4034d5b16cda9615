"""One owner for the class facts: the training manifest fixes the class names, their count and
whether targets are multi-label; a validation or test manifest is mapped onto it by class name.

Each manifest alone decides its own classes: a folder-per-class validation split that lacks class
``b`` numbers ``c`` as 1 where training numbers it 2, and a multi-label validation manifest with
fewer classes (or one label per line) builds multi-hot targets of another width than the model's.
:func:`align_classes` gives the evaluation manifest training's numbering, count and multi-label
setting, and refuses a class training lacks before anything is decoded.

Example::

    train = load_manifest("videos/train")             # classes abseiling, bowling, surfing
    val = align_classes(load_manifest("videos/val"), train, "val_manifest")
    val.class_names                                   # training's three, though val/ lacks bowling
"""

from __future__ import annotations

import dataclasses

from lightning_multigrid.data.manifests.entries import Manifest, ManifestError, VideoEntry

__all__ = ["align_classes", "describe_classes"]


def align_classes(manifest: Manifest, training: Manifest, argument: str) -> Manifest:
    """``manifest`` with training's class indices, class count, class names and multi-label setting.

    Labels are mapped by class name when both manifests name their classes; otherwise they are
    training's indices already (integer labels, or a shared class-names file) and are checked
    against training's count.

    Args:
        manifest: a validation or test manifest.
        training: the training manifest: the owner of the class facts.
        argument: the manifest's argument in messages (``"val_manifest"``, ``"test_manifest"``).

    Raises:
        ManifestError: naming the split, the video (and line) and the class, with the fix, when a
            video has a class training lacks, when only one side names its classes, or when a
            video has several labels but training is single-label.
    """
    mapping = _index_mapping(manifest, training, argument)
    entries = []
    for entry in manifest.entries:
        labels = tuple(mapping[label] if mapping is not None else label for label in entry.labels)
        _check_labels(entry, labels, manifest, training, argument)
        entries.append(dataclasses.replace(entry, labels=labels))
    return dataclasses.replace(
        manifest,
        entries=tuple(entries),
        num_classes=training.num_classes,
        multi_label=training.multi_label,
        class_names=training.class_names,
    )


def describe_classes(manifest: Manifest) -> str:
    """``4 classes ('a', 'b', ...), single-label``: the class facts of a manifest, for messages."""
    names = ""
    if manifest.class_names is not None:
        shown = ", ".join(repr(n) for n in manifest.class_names[:4])
        names = f" ({shown}{', ...' if len(manifest.class_names) > 4 else ''})"
    kind = "multi-label" if manifest.multi_label else "single-label"
    return f"{manifest.num_classes} classes{names}, {kind}"


def _index_mapping(manifest: Manifest, training: Manifest, argument: str) -> dict[int, int] | None:
    """Evaluation index -> training index by class name; ``None`` when both number by index alike."""
    if manifest.class_names is None:
        return None
    if training.class_names is None:
        fix = (
            # A store keeps the class names it was packed with: `class_names` does not apply to it.
            f"pack the training store again with its class names: `lightning-multigrid pack-frames <manifest> "
            f"{training.source} --class-names <file>` (the training classes in index order, one per line)"
            if training.format == "store"
            else "pass `class_names` (the training classes in index order, one per line)"
        )
        raise ManifestError(
            f"`{argument}` {manifest.source} names its classes ({describe_classes(manifest)}), but the training "
            f"{'store' if training.format == 'store' else 'manifest'} {training.source} gives class indices without "
            f"names, so they cannot be matched: {fix}."
        )
    if manifest.class_names == training.class_names:
        return None
    index_of = {name: i for i, name in enumerate(training.class_names)}
    return {i: index_of.get(name, -1) for i, name in enumerate(manifest.class_names)}


def _check_labels(
    entry: VideoEntry, labels: tuple[int, ...], manifest: Manifest, training: Manifest, argument: str
) -> None:
    where = f"{manifest.source}:{entry.line_number}" if entry.line_number else manifest.source
    for original, label in zip(entry.labels, labels):
        if label >= 0 and label < training.num_classes:
            continue
        if manifest.class_names is not None:
            raise ManifestError(
                f"{where}: `{argument}` video {entry.name} is of class {manifest.class_names[original]!r}, which the "
                f"training data ({training.source}: {describe_classes(training)}) lacks. Add training videos of that "
                f"class, or leave that class out of `{argument}`."
            )
        raise ManifestError(
            f"{where}: `{argument}` label {original} of {entry.name} is not one of the {training.num_classes} training "
            f"classes (0-{training.num_classes - 1}, from {training.source}): fix the label, or give both "
            "manifests the same `class_names`."
        )
    if len(labels) != 1 and not training.multi_label:
        raise ManifestError(
            f"{where}: `{argument}` video {entry.name} has {len(labels)} labels {list(labels)}, but the training "
            f"data ({training.source}) is single-label: one label per video, or train on a multi-label manifest."
        )
