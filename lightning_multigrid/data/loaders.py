"""Every DataLoader the DataModule serves: training clips at a plan's grids, evaluation views.

No Lightning here: the builders take the rank and world size, the plan and the epoch, so they
work in a plain PyTorch loop too. :class:`CachedLoader` keeps one loader while what it was built
for (a :class:`LoaderKey`) holds, so persistent workers live on across epochs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, SequentialSampler

from lightning_multigrid._checks import check_bool, check_int, check_positive_int
from lightning_multigrid.data.dataset import collate_clips
from lightning_multigrid.data.loader import ChunkedDataLoader
from lightning_multigrid.data.sampler import EpochShardSampler, ShortCycleBatchSampler
from lightning_multigrid.grid import GridPlan, GridShape

__all__ = ["CachedLoader", "LoaderKey", "LoaderSettings", "build_eval_loader", "build_train_loader"]


@dataclass(frozen=True, slots=True)
class LoaderSettings:
    """How loaders run: worker processes, pinned memory, the training tail and chunking.

    Raises:
        ValueError: naming a setting out of range.

    Attributes:
        batch_size: base clips per device: the evaluation batch, and the smallest chunk of a
            chunked training batch.
        num_workers: DataLoader worker processes per loader.
        pin_memory: pin host memory of batches.
        persistent_workers: keep workers alive between epochs (ignored with ``num_workers=0``).
        drop_last: drop the last, partial training batch of an epoch.
        chunk_batches: with several workers, cut each training batch into chunks decoded in
            parallel (:class:`~lightning_multigrid.data.loader.ChunkedDataLoader`).
    """

    batch_size: int
    num_workers: int
    pin_memory: bool = False
    persistent_workers: bool = True
    drop_last: bool = False
    chunk_batches: bool = True

    def __post_init__(self) -> None:
        check_positive_int("batch_size", self.batch_size)
        check_int("num_workers", self.num_workers, 0)
        for name in ("pin_memory", "persistent_workers", "drop_last", "chunk_batches"):
            check_bool(name, getattr(self, name))


class LoaderKey(NamedTuple):
    """What a cached loader was built for; a different key means a new loader."""

    cycle: tuple[GridShape, ...] | None  # None: serves every grid of the plan
    rank: int
    world_size: int
    resume: tuple[int, int] | None = None  # (epoch, iteration) a mid-epoch resume starts at


def build_train_loader(
    dataset: Dataset[Any],
    plan: GridPlan,
    settings: LoaderSettings,
    *,
    epoch: int,
    rank: int,
    world_size: int,
    seed: int,
    start_iteration: int = 0,
) -> DataLoader[Any]:
    """Shuffled training clips of ``dataset`` at ``plan``'s grid of every iteration, from ``epoch`` on.

    Args:
        dataset: a dataset of clip requests (``TrainVideoDataset``) with a length.
        plan: the grids of every epoch.
        settings: worker and batch settings.
        epoch: the 0-based epoch the loader serves first.
        rank: 0-based rank of this process.
        world_size: number of ranks.
        seed: seed of the shuffle and of every clip's draws.
        start_iteration: iterations of ``epoch`` already trained (mid-epoch resume), skipped.
    """
    # Under Lightning this is built inside a *_dataloader hook, so Lightning can swap the inner
    # sampler for its DistributedSampler and keep the batch sampler's settings.
    sampler = EpochShardSampler(len(dataset), num_replicas=world_size, rank=rank, shuffle=True, seed=seed)  # type: ignore[arg-type]
    batch_sampler = ShortCycleBatchSampler(
        sampler, plan, drop_last=settings.drop_last, seed=seed, start_epoch=epoch, start_iteration=start_iteration
    )
    if settings.chunk_batches and settings.num_workers > 1:
        return ChunkedDataLoader(
            dataset,
            batch_sampler=batch_sampler,
            min_chunk_size=settings.batch_size,
            num_workers=settings.num_workers,
            collate_fn=collate_clips,
            pin_memory=settings.pin_memory,
            persistent_workers=settings.persistent_workers,
        )
    return DataLoader(
        dataset,
        batch_sampler=batch_sampler,
        num_workers=settings.num_workers,
        collate_fn=collate_clips,
        pin_memory=settings.pin_memory,
        persistent_workers=settings.persistent_workers and settings.num_workers > 0,
    )


def build_eval_loader(dataset: Dataset[Any], settings: LoaderSettings, *, rank: int, world_size: int) -> DataLoader[Any]:
    """Evaluation views of ``dataset`` in order, ``settings.batch_size`` per batch, split over ranks."""
    sampler: Sampler[int]
    if world_size > 1:
        # Pads by repeating a few views so every rank runs the same number of steps.
        sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=False)
    else:
        sampler = SequentialSampler(dataset)  # type: ignore[arg-type]
    return DataLoader(
        dataset,
        batch_size=settings.batch_size,
        sampler=sampler,
        num_workers=settings.num_workers,
        collate_fn=collate_clips,
        pin_memory=settings.pin_memory,
        persistent_workers=settings.persistent_workers and settings.num_workers > 0,
    )


class CachedLoader:
    """One training loader, kept while its :class:`LoaderKey` holds."""

    def __init__(self) -> None:
        self._key: LoaderKey | None = None
        self._loader: DataLoader[Any] | None = None

    def get(self, key: LoaderKey, epoch: int, build: Callable[[], DataLoader[Any]]) -> DataLoader[Any]:
        """The loader for ``key``, set to ``epoch``: the kept one if built for ``key``, else ``build()``."""
        if self._loader is not None and self._key == key:
            # Lightning sizes the epoch (len) before it calls set_epoch: set it now.
            batch_sampler = self._loader.batch_sampler
            assert isinstance(batch_sampler, ShortCycleBatchSampler)
            batch_sampler.set_epoch(epoch)
            return self._loader
        self.clear()  # let the old loader's workers go before new ones start
        self._loader = build()
        self._key = key
        return self._loader

    def clear(self) -> None:
        """Forget the kept loader (its workers stop when nothing else holds it)."""
        self._key = None
        self._loader = None
