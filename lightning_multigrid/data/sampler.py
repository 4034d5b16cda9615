"""Batch sampling for multigrid training: one grid per iteration, equal length on every rank.

:class:`ShortCycleBatchSampler` turns a stream of video indices into mini-batches of
:class:`~lightning_multigrid.data.clip_params.ClipRequest`, each batch at the grid the plan (a
:class:`~lightning_multigrid.grid.GridPlan`: the multigrid schedule, or the baseline's
:class:`~lightning_multigrid.grid.FixedGrid`) gives for its iteration. Workers decode straight to
that grid; nothing downstream has to know about the plan.

It works in a plain PyTorch loop and under Lightning: it subclasses ``BatchSampler``, takes the
index sampler as its first argument ``sampler`` and keeps every ``__init__`` argument as an
attribute of the same name, so Lightning can swap in its ``DistributedSampler``. Lightning calls
``set_epoch`` on that inner sampler only, so the epoch is read from ``sampler.epoch``.

Example::

    schedule = build_schedule(MultigridConfig(base=GridShape(8, 16, 112), max_epochs=30, milestones=(20,)))
    sampler = EpochShardSampler(len(dataset), num_replicas=world_size, rank=rank, seed=0)
    batch_sampler = ShortCycleBatchSampler(sampler, schedule, seed=0)  # or FixedGrid(GridShape(8, 16, 112))
    loader = DataLoader(dataset, batch_sampler=batch_sampler, num_workers=8)
    for epoch in range(schedule.max_epochs):
        batch_sampler.set_epoch(epoch)
        for batch in loader:
            ...
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sized

from torch.utils.data import BatchSampler, DistributedSampler, Sampler

from lightning_multigrid._checks import check_int, check_positive_int
from lightning_multigrid.data.clip_params import ClipRequest
from lightning_multigrid.grid import GridPlan, count_batches

__all__ = ["EpochShardSampler", "ShortCycleBatchSampler", "clip_seed"]

_MASK64 = (1 << 64) - 1


class EpochShardSampler(DistributedSampler):
    """Indices ``0 .. dataset_size - 1`` for one rank, reshuffled every epoch.

    Exactly :class:`torch.utils.data.DistributedSampler` over ``range(dataset_size)`` with the
    rank and world size given explicitly (no process group needed): the index list is shuffled
    with ``seed + epoch``, padded by repeating its head so every rank gets
    ``ceil(dataset_size / num_replicas)`` indices, and rank ``r`` takes every
    ``num_replicas``-th index starting at ``r``.

    Args:
        dataset_size: number of items (clips) in the dataset.
        num_replicas: number of ranks.
        rank: 0-based rank of this process.
        shuffle: shuffle the indices (with ``seed + epoch``).
        seed: base seed of the shuffle; must be the same on every rank.
        drop_last: drop the tail instead of padding, so no index repeats.

    Raises:
        ValueError: when ``dataset_size`` or ``num_replicas`` is not positive or ``rank`` is not in
            ``[0, num_replicas)``.
    """

    def __init__(
        self,
        dataset_size: int,
        *,
        num_replicas: int = 1,
        rank: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        check_positive_int("dataset_size", dataset_size)
        check_positive_int("num_replicas", num_replicas)
        if not isinstance(rank, int) or not 0 <= rank < num_replicas:
            raise ValueError(f"`rank` must be in [0, `num_replicas`={num_replicas}), got {rank!r}.")
        super().__init__(
            range(dataset_size),  # type: ignore[arg-type]
            num_replicas=num_replicas,
            rank=rank,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
        )
        self.dataset_size = dataset_size


class ShortCycleBatchSampler(BatchSampler):
    """Mini-batches of clip requests at the plan's grid of every iteration.

    Iteration ``i`` of epoch ``e`` takes the next ``plan.grid_at(e, i).batch_size``
    indices from ``sampler`` (consecutively; the last batch may be partial) and yields one
    :class:`ClipRequest` per index with that grid's ``num_frames`` and ``crop_size``, the epoch's
    frame-stride range and the jitter range for the crop. Every clip gets its own ``seed``, a
    hash of (``seed``, epoch, position of the clip in the epoch over all ranks), so a seeded run
    decodes the same clips whatever the number of workers, and no two clips of a run share one.

    The epoch is the inner sampler's ``epoch`` (``DistributedSampler`` and
    :class:`EpochShardSampler` have one; Lightning calls ``set_epoch`` on the inner sampler
    only); :meth:`set_epoch` sets it on both. Every rank yields the same number of batches with
    the same sequence of shapes as long as the inner samplers have the same length, which
    ``DistributedSampler`` guarantees.

    Args:
        sampler: index sampler with a length, usually :class:`EpochShardSampler` or
            ``DistributedSampler``; its indices are dataset indices.
        plan: the grids of every epoch: a ``MultigridSchedule``, or a ``FixedGrid`` for the baseline.
        drop_last: drop the last batch of an epoch when it is smaller than its grid's batch.
        seed: base seed of the per-clip random draws.
        start_epoch: when given, ``sampler.set_epoch(start_epoch)`` is called here, so the length
            is right before anyone calls ``set_epoch`` (Lightning sizes an epoch before it sets
            the epoch, and re-creates this object with the arguments it was built with).
        start_iteration: iterations of epoch ``start_epoch`` already trained (a run resumed from a
            mid-epoch checkpoint): iterating that epoch skips them, drawing the same clips and
            short-cycle grids as an uninterrupted run from iteration ``start_iteration`` on.
            ``len()`` stays the whole epoch's (Lightning counts the trained batches itself);
            other epochs are not affected.

    Raises:
        TypeError: when ``sampler`` has no length.
        ValueError: when ``start_epoch`` or ``start_iteration`` is negative, ``start_iteration``
            is given without ``start_epoch``.
    """

    def __init__(
        self,
        sampler: Sampler[int] | Iterable[int],
        plan: GridPlan,
        drop_last: bool = False,
        seed: int = 0,
        start_epoch: int | None = None,
        start_iteration: int = 0,
    ) -> None:
        # BatchSampler.__init__ is not called: it validates one fixed `batch_size`, and ours
        # changes every iteration.
        if not isinstance(sampler, Sized):
            raise TypeError(
                f"`sampler` must have a length (epochs are counted in batches), got {type(sampler).__name__}."
            )
        if start_epoch is not None and (isinstance(start_epoch, bool) or start_epoch < 0):
            raise ValueError(f"`start_epoch` must be None or >= 0, got {start_epoch!r}.")
        check_int("start_iteration", start_iteration, 0)
        if start_iteration and start_epoch is None:
            raise ValueError("`start_iteration` needs `start_epoch`: the epoch the skipped iterations belong to.")
        self.sampler = sampler
        self.plan = plan
        self.drop_last = drop_last
        self.seed = seed
        self.start_epoch = start_epoch
        self.start_iteration = start_iteration
        self._epoch = 0  # used only when the inner sampler keeps no epoch
        if start_epoch is not None:
            self.set_epoch(start_epoch)

    @property
    def epoch(self) -> int:
        """The 0-based epoch the next iteration serves: the inner sampler's ``epoch`` if it has one."""
        epoch = getattr(self.sampler, "epoch", None)
        return self._epoch if epoch is None else int(epoch)

    def set_epoch(self, epoch: int) -> None:
        """Set the 0-based epoch here and on the inner sampler (which reshuffles with it)."""
        check_int("epoch", epoch, 0)
        self._epoch = epoch
        set_epoch = getattr(self.sampler, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)

    def __iter__(self) -> Iterator[list[ClipRequest]]:  # type: ignore[override]
        epoch = self.epoch
        low, high = self.plan.sampling_rate_range_at(epoch)
        sampling_rate_range = (float(low), float(high))
        # Seeds are keyed by the clip's position in the global (all-rank) epoch order, which is
        # how DistributedSampler interleaves: rank r holds global positions r, r + n, r + 2n, ...
        num_replicas = int(getattr(self.sampler, "num_replicas", 1))
        rank = int(getattr(self.sampler, "rank", 0))

        # A resumed epoch draws its skipped batches too (unyielded), so later clips keep their
        # positions, seeds and short-cycle grids.
        skip = self.start_iteration if epoch == self.start_epoch else 0
        iteration = 0
        position = 0
        grid = self.plan.grid_at(epoch, iteration)
        scale_range = self.plan.jitter_scales_for(grid.crop_size)
        batch: list[ClipRequest] = []
        for index in self.sampler:
            seed = clip_seed(self.seed, epoch, position * num_replicas + rank)
            batch.append(
                ClipRequest(int(index), grid.num_frames, grid.crop_size, sampling_rate_range, scale_range, seed)
            )
            position += 1
            if len(batch) == grid.batch_size:
                if iteration >= skip:
                    yield batch
                batch = []
                iteration += 1
                grid = self.plan.grid_at(epoch, iteration)
                scale_range = self.plan.jitter_scales_for(grid.crop_size)
        if batch and not self.drop_last and iteration >= skip:
            yield batch

    def __len__(self) -> int:
        """Batches in the current epoch over ``len(sampler)`` clips (equal on every rank)."""
        sizes = [grid.batch_size for grid in self.plan.cycle_at(self.epoch)]
        counts = count_batches(len(self.sampler), sizes, drop_last=self.drop_last)  # type: ignore[arg-type]
        return sum(batches for batches, _ in counts)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(sampler={self.sampler!r}, epoch={self.epoch}, "
            f"drop_last={self.drop_last}, seed={self.seed})"
        )


def clip_seed(seed: int, epoch: int, position: int) -> int:
    """A 63-bit seed for the clip at 0-based ``position`` of ``epoch`` (SplitMix64 chained).

    Deterministic across processes and Python versions (no ``hash()``), and different for every
    (seed, epoch, position) in practice.
    """
    state = 0
    for value in (seed, epoch, position):
        state = _splitmix64((state ^ (value & _MASK64)) & _MASK64)
    return state >> 1


def _splitmix64(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)
