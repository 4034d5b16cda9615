"""The loaders a DataModule serves, each kept while what it was built for holds, their workers stopped when dropped.

One training loader and one precise-BatchNorm loader, each kept while its
:class:`~lightning_multigrid.data.loaders.LoaderKey` holds (so persistent workers live on across
epochs), and one evaluation loader per split, rank and world size. The training loader decodes JPEG
batches ahead of the step when its dataset's reader returns them
(:attr:`~lightning_multigrid.data.decoding.readers.ClipReader.encoded`). A loader dropped because its
dataset changed, or at teardown, stops its workers now (:meth:`ServedLoaders.close`): left to the
garbage collector, a loader's persistent workers may be shut down from inside a worker of the next
fit (``compare`` runs two), where torch fails with a traceback. No Lightning here.
"""

from __future__ import annotations

from collections.abc import Sized
from typing import Any

from torch.utils.data import DataLoader, Dataset

from lightning_multigrid._internals import shutdown_loader_workers
from lightning_multigrid.data.checks import check_drop_last
from lightning_multigrid.data.dataset import TrainVideoDataset
from lightning_multigrid.data.decoding.readers import returns_encoded
from lightning_multigrid.data.loaders import (
    CachedLoader,
    LoaderKey,
    LoaderSettings,
    build_eval_loader,
    build_train_loader,
)
from lightning_multigrid.data.prefetch import Decode, DecodeAhead
from lightning_multigrid.data.served_datasets import Split
from lightning_multigrid.data.trainer_facts import TrainerFacts
from lightning_multigrid.grid import GridPlan

__all__ = ["ServedLoaders"]


class ServedLoaders:
    """The training, precise-BatchNorm and evaluation loaders of one DataModule.

    Args:
        settings: how every loader runs (workers, pinned memory, chunking).
    """

    def __init__(self, settings: LoaderSettings) -> None:
        self.settings = settings
        self._train = CachedLoader()
        self._precise_bn = CachedLoader()
        self._eval: dict[tuple[Split, int, int], DataLoader[Any]] = {}

    def train(
        self, dataset: TrainVideoDataset, plan: GridPlan, at: TrainerFacts, *, seed: int, decode_ahead: int, decode: Decode
    ) -> DataLoader[Any]:
        """The training loader (:func:`~lightning_multigrid.data.loaders.build_train_loader`), set to ``at.epoch``.

        On one process one loader serves every grid of ``plan`` (the grid travels in each clip request).
        Under DDP with ``use_distributed_sampler`` (Lightning's default), Lightning re-creates the loader
        at every reload from the arguments it was first built with, to insert its DistributedSampler:
        there each cycle of grids gets a loader built at its own epoch. A mid-epoch resume gets its own.

        Args:
            decode_ahead: batches of JPEG bytes decoded this many ahead of the step on ``at.device`` by
                ``decode`` (:class:`~lightning_multigrid.data.prefetch.DecodeAhead`), when the reader
                returns them (:attr:`~lightning_multigrid.data.decoding.readers.ClipReader.encoded`) and
                there is a device; else (or 0) ``on_after_batch_transfer`` decodes them.
        """
        cycle = plan.cycle_at(at.epoch) if at.world_size > 1 else None
        key = LoaderKey(cycle, at.rank, at.world_size, (at.epoch, at.start_iteration) if at.start_iteration else None)
        ahead = None
        if decode_ahead and at.device is not None and returns_encoded(dataset.reader):
            ahead = DecodeAhead(decode, at.device, decode_ahead)
        return self._train.get(key, at.epoch, lambda: build_train_loader(
            dataset, plan, self.settings, epoch=at.epoch, rank=at.rank, world_size=at.world_size, seed=seed,
            start_iteration=at.start_iteration, decode_ahead=ahead,
        ))

    def precise_bn(self, dataset: Dataset[Any], plan: GridPlan, at: TrainerFacts, *, seed: int) -> DataLoader[Any]:
        """The precise-BatchNorm loader: training clips of ``plan``, one loader set to ``at.epoch``; drawn with
        ``seed + 1``, the training ``seed``'s next, so they are not the clips training draws in the same epoch."""
        key = LoaderKey(None, at.rank, at.world_size)
        return self._precise_bn.get(key, at.epoch, lambda: build_train_loader(
            dataset, plan, self.settings, epoch=at.epoch, rank=at.rank, world_size=at.world_size, seed=seed + 1,
        ))

    def evaluation(self, split: Split, dataset: Dataset[Any], batch_size: int, at: TrainerFacts) -> DataLoader[Any]:
        """The evaluation loader of ``split``, ``batch_size`` views per batch
        (:func:`~lightning_multigrid.data.loaders.build_eval_loader`)."""
        key = (split, at.rank, at.world_size)
        if key not in self._eval:
            self._eval[key] = build_eval_loader(
                dataset, self.settings, batch_size=batch_size, rank=at.rank, world_size=at.world_size
            )
        return self._eval[key]

    def check_batches_left(self, plan: GridPlan, train: Sized | None, world_size: int) -> None:
        """With ``drop_last``, refuse a plan with an epoch of 0 batches of ``train`` (it would end the run
        there; :func:`~lightning_multigrid.data.checks.check_drop_last`); ``None``: not read yet."""
        if self.settings.drop_last and train is not None:
            check_drop_last(plan, len(train), world_size)

    def forget(self) -> None:
        """Forget every loader (the base batch changed: the batch-size finder's trials): each is built again."""
        self._train.clear()
        self._precise_bn.clear()
        self._eval.clear()

    def close_train(self) -> None:
        """Stop the training and precise-BatchNorm loaders' workers now, and forget them."""
        self._train.close()
        self._precise_bn.close()

    def close_eval(self, split: Split | None = None) -> None:
        """Stop the workers of ``split``'s evaluation loaders (``None``: every split's) now, and forget them."""
        for key in [key for key in self._eval if split is None or key[0] == split]:
            shutdown_loader_workers(self._eval.pop(key))

    def close_split(self, split: Split) -> None:
        """Stop the workers of the loaders built on ``split``'s dataset (``"train"``, ``"val"`` or ``"test"``) now."""
        if split == "train":
            self.close_train()
        else:
            self.close_eval(split)

    def close(self) -> None:
        """Stop every loader's workers (and the decode-ahead thread) now, and forget them."""
        self.close_train()
        self.close_eval()
