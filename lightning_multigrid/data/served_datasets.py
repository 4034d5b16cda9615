"""The datasets a DataModule serves, each given with ``use_datasets`` or read from its manifests.

The training, validation and test datasets, read by :class:`~lightning_multigrid.data.splits.SplitSources`
the first time a stage needs them and kept from then on, as is a dataset given with ``use_datasets``. A
split read from a packed frame store that was packed again since (the DataModule kept between fits) is
read again, from the new packing; a given one is kept. No Lightning here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from lightning_multigrid.data.dataset import EvalVideoDataset, TrainVideoDataset
from lightning_multigrid.data.splits import SplitSources
from lightning_multigrid.data.store.reader import release_store, repacked_store

__all__ = ["SPLITS", "ServedDatasets", "Split"]

Split = Literal["train", "val", "test"]
SPLITS: tuple[Split, ...] = ("train", "val", "test")


class ServedDatasets:
    """The training, validation and test datasets of one DataModule (``None``: not read yet)."""

    def __init__(self) -> None:
        self.train: TrainVideoDataset | None = None
        self.val: EvalVideoDataset | None = None
        self.test: EvalVideoDataset | None = None
        self._given: set[Split] = set()  # the splits whose dataset came from `use_datasets`

    def use(self, train: TrainVideoDataset | None, val: EvalVideoDataset | None, test: EvalVideoDataset | None) -> list[Split]:
        """Serve the datasets given (``None``: that split as it is) from now on; the splits they replace."""
        given = {split: dataset for split, dataset in zip(SPLITS, (train, val, test)) if dataset is not None}
        for split, dataset in given.items():
            setattr(self, split, dataset)
        self._given.update(given)
        return list(given)

    def read(self, stage: str, sources: SplitSources) -> None:
        """Read the datasets ``stage`` needs that are not there yet, and check them
        (:meth:`SplitSources.train <lightning_multigrid.data.splits.SplitSources.train>`,
        :meth:`~lightning_multigrid.data.splits.SplitSources.evaluation`).

        Raises:
            ValueError: on a stage other than ``"fit"``, ``"validate"`` and ``"test"``, and as the
                sources raise.
        """
        if stage == "fit":
            self.train = sources.train(self.train)
            if self.val is not None or sources.val_manifest is not None:  # else no validation
                self.val = sources.evaluation(self.val, "val", self.train)
        elif stage == "validate":
            self.val = sources.evaluation(self.val, "val", self.train)
        elif stage == "test":
            self.test = sources.evaluation(self.test, "test", self.train)
        else:
            raise ValueError(f"MultigridVideoDataModule supports fit, validate and test, got stage {stage!r}.")

    def read_repacked_again(self, close_loaders: Callable[[Split], None]) -> list[str]:
        """Drop each dataset read from a store packed again since, to be read again from the new packing:
        ``close_loaders(split)`` stops the loaders built on it, then the old packing is let go (its lock
        released, its files removed where no other run reads them). A given dataset is kept.

        Returns:
            A warning for each given dataset (``use_datasets``) kept on its old packing.
        """
        kept = []
        for split in SPLITS:
            store = repacked_store(getattr(self, split))
            if store is not None and split in self._given:
                kept.append(
                    f"The {split} dataset given with `use_datasets` reads the frame store {store.path} as it was when "
                    "opened; the store was packed again since, and this run keeps the old packing. To train on the "
                    "new one, pass a dataset opened on the store again (`use_datasets`)."
                )
            elif store is not None:
                close_loaders(split)
                setattr(self, split, None)
                release_store(store)
        return kept

    def num_classes(self, sources: Callable[[], SplitSources]) -> int:
        """Classes of the training (else validation, test) set; without one read, of the training (else
        validation) manifest, read from ``sources()``."""
        if (dataset := self.train or self.val or self.test) is not None:
            return dataset.num_classes
        return sources().num_classes()

    def require_train(self) -> TrainVideoDataset:
        """The training set.

        Raises:
            RuntimeError: before it is read (``setup('fit')``).
        """
        if self.train is None:
            raise RuntimeError("The training set is read in `setup('fit')`: call it first.")
        return self.train

    def require_eval(self, split: Literal["val", "test"]) -> EvalVideoDataset:
        """The evaluation set of ``split``.

        Raises:
            RuntimeError: before it is read (``setup``), naming the stages that read it.
        """
        dataset = self.val if split == "val" else self.test
        if dataset is None:
            stages = "`setup('fit')` or `setup('validate')`" if split == "val" else "`setup('test')`"
            raise RuntimeError(f"`{split}_dataloader()` needs {stages} first.")
        return dataset
