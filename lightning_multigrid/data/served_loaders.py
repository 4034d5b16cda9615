"""The loaders a DataModule serves, each kept while what it was built for holds, their workers stopped when dropped.

One training loader and one precise-BatchNorm loader, each kept while its
:class:`~lightning_multigrid.data.loaders.LoaderKey` holds (so persistent workers live on across
epochs), and one evaluation loader per split, rank and world size. A loader dropped because its
dataset changed, or at teardown, stops its workers now (:meth:`ServedLoaders.close`): left to the
garbage collector, a loader's persistent workers may be shut down from inside a worker of the next
fit (``compare`` runs two), where torch fails with a traceback. No Lightning here.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader, Dataset

from lightning_multigrid._internals import shutdown_loader_workers
from lightning_multigrid.data.loaders import (
    CachedLoader,
    LoaderKey,
    LoaderSettings,
    build_eval_loader,
    build_train_loader,
)
from lightning_multigrid.data.prefetch import DecodeAhead
from lightning_multigrid.grid import GridPlan

__all__ = ["ServedLoaders"]


class ServedLoaders:
    """The training, precise-BatchNorm and evaluation loaders of one DataModule.

    Args:
        settings: how every loader runs (workers, batch, pinned memory).
    """

    def __init__(self, settings: LoaderSettings) -> None:
        self.settings = settings
        self._train = CachedLoader()
        self._precise_bn = CachedLoader()
        self._eval: dict[tuple[str, int, int], DataLoader[Any]] = {}

    def train(
        self, dataset: Dataset[Any], plan: GridPlan, key: LoaderKey, *, epoch: int, seed: int, start_iteration: int = 0,
        decode_ahead: DecodeAhead | None = None,
    ) -> DataLoader[Any]:
        """The training loader for ``key`` (:func:`~lightning_multigrid.data.loaders.build_train_loader`), set to ``epoch``."""
        return self._train.get(key, epoch, lambda: build_train_loader(
            dataset, plan, self.settings, epoch=epoch, rank=key.rank, world_size=key.world_size, seed=seed,
            start_iteration=start_iteration, decode_ahead=decode_ahead,
        ))

    def precise_bn(self, dataset: Dataset[Any], plan: GridPlan, key: LoaderKey, *, epoch: int, seed: int) -> DataLoader[Any]:
        """The precise-BatchNorm loader for ``key``: training clips of ``plan``, set to ``epoch``."""
        return self._precise_bn.get(key, epoch, lambda: build_train_loader(
            dataset, plan, self.settings, epoch=epoch, rank=key.rank, world_size=key.world_size, seed=seed,
        ))

    def evaluation(self, split: str, dataset: Dataset[Any], rank: int, world_size: int) -> DataLoader[Any]:
        """The evaluation loader of ``split`` (:func:`~lightning_multigrid.data.loaders.build_eval_loader`)."""
        key = (split, rank, world_size)
        if key not in self._eval:
            self._eval[key] = build_eval_loader(dataset, self.settings, rank=rank, world_size=world_size)
        return self._eval[key]

    def forget_train(self) -> None:
        """Forget the training loader (a new plan is served): the next ``train`` builds one."""
        self._train.clear()

    def reset(self, settings: LoaderSettings) -> None:
        """Serve with new ``settings`` (the batch-size finder's): every loader is built again."""
        self.settings = settings
        self._train.clear()
        self._precise_bn.clear()
        self._eval.clear()

    def close_train(self) -> None:
        """Stop the training and precise-BatchNorm loaders' workers now, and forget them."""
        self._train.close()
        self._precise_bn.close()

    def close_eval(self, split: str | None = None) -> None:
        """Stop the workers of ``split``'s evaluation loaders (``None``: every split's) now, and forget them."""
        for key in [key for key in self._eval if split is None or key[0] == split]:
            shutdown_loader_workers(self._eval.pop(key))

    def close(self) -> None:
        """Stop every loader's workers (and the decode-ahead thread) now, and forget them."""
        self.close_train()
        self.close_eval()
