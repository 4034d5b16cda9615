"""The DataModule's datasets, read from its manifests: the training set, and evaluation sets on its classes.

Training owns the class facts: an evaluation manifest is mapped onto the training classes as it is
read (:func:`~lightning_multigrid.data.manifests.classes.align_classes`), and an evaluation dataset
given with ``use_datasets`` is checked against them
(:func:`~lightning_multigrid.data.checks.check_eval_classes`). Each dataset's reader is built here,
once, from the DataModule's :class:`~lightning_multigrid.data.reader_settings.ReaderSettings`; a
packed frame store smaller than the short sides its split draws is refused
(:func:`~lightning_multigrid.data.checks.check_store_fits`). No Lightning: testable without a Trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lightning_multigrid.data.checks import check_eval_classes, check_store_fits, existing_manifest
from lightning_multigrid.data.dataset import EvalVideoDataset, TrainVideoDataset
from lightning_multigrid.data.manifests.classes import align_classes
from lightning_multigrid.data.manifests.entries import Manifest, ManifestKind
from lightning_multigrid.data.reader_settings import ReaderSettings
from lightning_multigrid.data.sources import load_manifest
from lightning_multigrid.grid import EvalViews, FixedGrid

__all__ = ["SplitSources"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SplitSources:
    """Where the DataModule's splits come from and how their datasets are cut, built by keyword from its
    arguments as they are now.

    Attributes:
        train_manifest: the training manifest (``None``: not given), as are ``val_manifest`` and
            ``test_manifest`` (``None``: the validation manifest).
        root_dir: directory the manifests' paths are relative to; ``None``: each manifest's own.
        class_names: class-names file, for labels written as names.
        manifest_kind: ``"video"``, ``"frames"`` or ``"auto"``.
        reader_settings: the decoder settings each split's reader is built with.
        flip: random horizontal flips of training clips.
        strict: raise on an undecodable video instead of replacing it.
        slowfast_alpha: ``[slow, fast]`` pathways, or ``None``.
        baseline: the base shape and clip sampling: the largest short side training draws, and the
            evaluation views' shape.
        views: the evaluation views per video.
    """

    train_manifest: str | None
    val_manifest: str | None
    test_manifest: str | None
    root_dir: str | None
    class_names: str | None
    manifest_kind: ManifestKind
    reader_settings: ReaderSettings
    flip: bool
    strict: bool
    slowfast_alpha: int | None
    baseline: FixedGrid
    views: EvalViews

    def manifest(self, path: str, class_names: str | tuple[str, ...] | None = None) -> Manifest:
        """The manifest at ``path``, labels written as names read with ``class_names`` (default
        :attr:`class_names`).

        :attr:`root_dir` and the class names apply to manifest files only: a packed frame store and a
        folder per class hold their own paths and class names, so a split of either beside a manifest
        file that needs them is read without them (the DataModule's settings are shared by its splits).
        """
        if Path(path).is_dir():
            return load_manifest(path, kind=self.manifest_kind)
        names = self.class_names if class_names is None else class_names
        return load_manifest(path, root=self.root_dir, class_names=names, kind=self.manifest_kind)

    def train(self, dataset: TrainVideoDataset | None) -> TrainVideoDataset:
        """The training set: ``dataset`` if given, else read from ``train_manifest`` on the reader its
        format asks for; a packed store smaller than the largest short side training draws refused.

        Raises:
            ValueError: when ``train_manifest`` is needed and not given, or the store is too small.
            FileNotFoundError: when it does not exist.
        """
        if dataset is None:
            manifest = self.manifest(existing_manifest("train_manifest", self.train_manifest))
            dataset = TrainVideoDataset(
                manifest, self.reader_settings.reader_for(manifest), flip=self.flip, strict=self.strict,
                slowfast_alpha=self.slowfast_alpha,
            )
        largest = self.baseline.clip_sampling.scales_for_base(self.baseline.base_shape.crop_size)[1]
        check_store_fits(dataset.reader, "train_manifest", largest, "the `jitter_scales` maximum")
        return dataset

    def num_classes(self) -> int:
        """Classes of the training (else validation) manifest, read from it.

        Raises:
            ValueError: when neither is given.
        """
        path = self.train_manifest or self.val_manifest
        if path is None:
            raise ValueError("`num_classes` needs a `train_manifest` or `val_manifest`.")
        return self.manifest(path).num_classes

    def training_manifest(self, train: TrainVideoDataset | None) -> Manifest | None:
        """The owner of the class facts: the training set's manifest, read if the set is not there yet;
        ``None`` without ``train_manifest``."""
        if train is not None:
            return train.manifest
        if self.train_manifest is None:
            return None
        return self.manifest(existing_manifest("train_manifest", self.train_manifest))

    def evaluation(
        self, dataset: EvalVideoDataset | None, split: Literal["val", "test"], train: TrainVideoDataset | None
    ) -> EvalVideoDataset:
        """The evaluation set of ``split``: ``dataset`` if given, else read from its manifest
        (``test_manifest`` defaults to ``val_manifest``); its classes checked against training's.

        Raises:
            ValueError: when the manifest is needed and not given, or a store is too small (naming it).
            FileNotFoundError: when the manifest does not exist.
            ManifestError: when its classes are not training's (naming the argument, the video and class).
        """
        use_test = split == "test" and self.test_manifest is not None
        argument, path = ("test_manifest", self.test_manifest) if use_test else ("val_manifest", self.val_manifest)
        training = self.training_manifest(train)
        if dataset is None:
            dataset = self._read_evaluation(argument, existing_manifest(argument, path), training)
        if training is not None:
            check_eval_classes(training, dataset.manifest, argument)
        return dataset

    def _read_evaluation(self, argument: str, path: str, training: Manifest | None) -> EvalVideoDataset:
        """The evaluation views of a manifest, its classes mapped onto the training classes: training owns them."""
        # Without a class-names file, labels written as names read as the training classes.
        manifest = self.manifest(path, self.class_names or (training.class_names if training is not None else None))
        if training is not None:
            manifest = align_classes(manifest, training, argument)
        dataset = EvalVideoDataset(
            manifest, self.reader_settings.reader_for(manifest), base_shape=self.baseline.base_shape,
            clip_sampling=self.baseline.clip_sampling, views=self.views, strict=self.strict,
            slowfast_alpha=self.slowfast_alpha,
        )
        check_store_fits(dataset.reader, argument, dataset.short_side, "the evaluation short side")
        return dataset
