"""ShortCycleBatchSampler and EpochShardSampler: pure index logic, no decoding."""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, SequentialSampler

from lightning_multigrid.data.clip_params import ClipRequest
from lightning_multigrid.data.sampler import EpochShardSampler, ShortCycleBatchSampler, clip_seed
from lightning_multigrid.schedule import GridShape, MultigridSchedule, build_schedule
from lightning_multigrid.schedule.config import MultigridConfig, MultigridOptions

MODES: dict[str, dict[str, Any]] = {
    "long+short": dict(long_cycle=True, short_cycle=True),
    "long": dict(long_cycle=True, short_cycle=False),
    "short": dict(long_cycle=False, short_cycle=True),
    "none": dict(long_cycle=False, short_cycle=False),
}


class Echo:
    """A dataset that returns the request it is asked for."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, request: ClipRequest) -> ClipRequest:
        return request


def make_schedule(mode: str = "long+short", devices: int = 1) -> MultigridSchedule:
    # B=2, T=8, S=32: long-cycle shapes 2x23 (b=16), 4x23 (b=8), 4x32 (b=4), 8x32 (b=2).
    config = MultigridConfig(
        base=GridShape(2, 8, 32),
        sampling_rate=2,
        max_epochs=12,
        milestones=(8,),
        devices=devices,
        options=MultigridOptions(**MODES[mode]),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_schedule(config)


def epoch_batches(batch_sampler: ShortCycleBatchSampler, epoch: int) -> list[list[ClipRequest]]:
    batch_sampler.set_epoch(epoch)
    return list(batch_sampler)


def grid_of(batch: list[ClipRequest]) -> tuple[int, int]:
    (grid,) = {(r.num_frames, r.crop_size) for r in batch}
    return grid


def test_short_cycle_order_and_batch_sizes_literal() -> None:
    schedule = make_schedule()
    stage = schedule.stage_at(0)
    assert stage.shape == GridShape(16, 2, 23)  # t = 8/4, s = round(32/sqrt2), b = 2 * 8*32^2/(2*23^2) ~ 16
    # Short cycle at 23: crops 16, 23, 23 with batches 16 * round((23/16)^2) = 32, 16, 16.
    assert stage.short_cycle == (GridShape(32, 2, 16), GridShape(16, 2, 23), GridShape(16, 2, 23))
    batch_sampler = ShortCycleBatchSampler(EpochShardSampler(100, shuffle=False), schedule)
    batches = epoch_batches(batch_sampler, 0)
    # 100 clips = 64 (one cycle of 32+16+16) + 32 + 4 (partial batch of 16).
    assert [len(b) for b in batches] == [32, 16, 16, 32, 4]
    assert [grid_of(b) for b in batches] == [(2, 16), (2, 23), (2, 23), (2, 16), (2, 23)]
    assert [r.index for b in batches for r in b] == list(range(100))  # consecutive indices
    assert len(batch_sampler) == 5


@pytest.mark.parametrize("mode", list(MODES))
def test_every_stage_yields_the_schedule_shapes(mode: str) -> None:
    schedule = make_schedule(mode)
    dataset_size = 101
    batch_sampler = ShortCycleBatchSampler(EpochShardSampler(dataset_size, seed=3), schedule, seed=1)
    for stage in schedule.stages:
        for epoch in (stage.start_epoch, stage.end_epoch - 1):
            batches = epoch_batches(batch_sampler, epoch)
            assert len(batches) == len(batch_sampler) == schedule.iterations_in_epoch(epoch, dataset_size)
            for i, batch in enumerate(batches):
                grid = schedule.grid_at(epoch, i)
                assert grid_of(batch) == (grid.num_frames, grid.crop_size)
                assert len(batch) == grid.batch_size or i == len(batches) - 1
                assert 0 < len(batch) <= grid.batch_size
                assert {r.sampling_rate_range for r in batch} == {stage.sampling_rate}
                assert {r.scale_range for r in batch} == {schedule.jitter_scales_for(grid.crop_size)}
            assert sorted(r.index for b in batches for r in b) == list(range(dataset_size))


def test_stride_and_scale_ranges_literal() -> None:
    schedule = make_schedule()
    batch_sampler = ShortCycleBatchSampler(EpochShardSampler(64, shuffle=False), schedule)
    first, second = epoch_batches(batch_sampler, 0)[:2]
    # 2 frames of a baseline 8-frame clip at stride 2: strides 2 .. 2 * 8/2 = 8.
    assert first[0].sampling_rate_range == (2.0, 8.0)
    # Jitter for S=32: (256, 320) * 32/224 = (37, 46); the minimum scales with the crop.
    assert first[0].scale_range == (round(37 * 16 / 32), 46)
    assert second[0].scale_range == (round(37 * 23 / 32), 46)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("drop_last", [False, True])
def test_len_equals_batches_yielded(mode: str, drop_last: bool) -> None:
    schedule = make_schedule(mode)
    for dataset_size in (1, 7, 64, 97):
        batch_sampler = ShortCycleBatchSampler(EpochShardSampler(dataset_size), schedule, drop_last=drop_last)
        for epoch in range(schedule.max_epochs):
            batches = epoch_batches(batch_sampler, epoch)
            assert len(batches) == len(batch_sampler)
            if not drop_last:
                assert len(batches) == schedule.iterations_in_epoch(epoch, dataset_size)
            else:
                assert all(len(b) == schedule.grid_at(epoch, i).batch_size for i, b in enumerate(batches))


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("dataset_size", [50, 53])
def test_two_ranks_equal_length_same_shapes_disjoint_cover(mode: str, dataset_size: int) -> None:
    schedule = make_schedule(mode, devices=2)
    ranks = [
        ShortCycleBatchSampler(EpochShardSampler(dataset_size, num_replicas=2, rank=rank, seed=5), schedule, seed=9)
        for rank in range(2)
    ]
    for epoch in range(schedule.max_epochs):
        per_rank = [epoch_batches(bs, epoch) for bs in ranks]
        assert len(per_rank[0]) == len(per_rank[1]) == len(ranks[0]) == len(ranks[1])
        assert len(per_rank[0]) == schedule.iterations_in_epoch(epoch, dataset_size)
        assert [grid_of(b) for b in per_rank[0]] == [grid_of(b) for b in per_rank[1]]
        assert [len(b) for b in per_rank[0]] == [len(b) for b in per_rank[1]]
        indices = [r.index for batches in per_rank for b in batches for r in b]
        padding = 2 * math.ceil(dataset_size / 2) - dataset_size
        assert len(indices) == dataset_size + padding
        assert set(indices) == set(range(dataset_size))
        seeds = [r.seed for batches in per_rank for b in batches for r in b]
        assert len(set(seeds)) == len(seeds)  # no two clips of an epoch share random draws


def test_seeds_reproducible_differ_across_epochs_and_base_seeds() -> None:
    schedule = make_schedule()

    def seeds(epoch: int, seed: int = 0) -> list[int]:
        batch_sampler = ShortCycleBatchSampler(EpochShardSampler(40, seed=2), schedule, seed=seed)
        return [r.seed for b in epoch_batches(batch_sampler, epoch) for r in b]

    assert seeds(0) == seeds(0)
    assert seeds(3, seed=7) == seeds(3, seed=7)
    assert not set(seeds(0)) & set(seeds(1))
    assert not set(seeds(0)) & set(seeds(0, seed=1))
    assert all(0 <= s < 2**63 for s in seeds(0))
    # The seed of a clip depends on (base seed, epoch, position) only, not on which video it is.
    assert seeds(0)[:3] == [clip_seed(0, 0, p) for p in range(3)]


def test_shuffled_order_reproducible_and_changes_with_epoch() -> None:
    schedule = make_schedule()

    def order(epoch: int) -> list[int]:
        bs = ShortCycleBatchSampler(EpochShardSampler(40, seed=2), schedule)
        return [r.index for b in epoch_batches(bs, epoch) for r in b]

    assert order(1) == order(1)
    assert order(1) != order(2)


def test_epoch_is_read_from_the_inner_sampler() -> None:
    schedule = make_schedule()
    last = schedule.stages[-1]
    sampler = EpochShardSampler(64, seed=0)
    batch_sampler = ShortCycleBatchSampler(sampler, schedule)
    assert batch_sampler.epoch == 0
    sampler.set_epoch(last.start_epoch)  # what Lightning does: the batch sampler is not told
    assert batch_sampler.epoch == last.start_epoch
    batches = list(batch_sampler)
    assert grid_of(batches[-1]) == (last.shape.num_frames, schedule.grid_at(last.start_epoch, len(batches) - 1).crop_size)
    assert len(batch_sampler) == schedule.iterations_in_epoch(last.start_epoch, 64)
    batch_sampler.set_epoch(2)  # and set_epoch on the batch sampler forwards to the inner one
    assert sampler.epoch == 2


def test_epoch_without_an_epoch_aware_inner_sampler() -> None:
    schedule = make_schedule("long")
    batch_sampler = ShortCycleBatchSampler(SequentialSampler(range(30)), schedule)
    batch_sampler.set_epoch(schedule.stages[-1].start_epoch)
    assert grid_of(next(iter(batch_sampler))) == (8, 32)


def test_start_epoch_sets_the_inner_sampler_epoch() -> None:
    schedule = make_schedule()
    sampler = EpochShardSampler(64)
    batch_sampler = ShortCycleBatchSampler(sampler, schedule, start_epoch=5)
    assert sampler.epoch == 5 and batch_sampler.epoch == 5
    assert len(batch_sampler) == schedule.iterations_in_epoch(5, 64)


def test_lightning_style_reinstantiation_keeps_arguments() -> None:
    schedule = make_schedule()
    batch_sampler = ShortCycleBatchSampler(EpochShardSampler(50), schedule, drop_last=True, seed=4, start_epoch=3)
    new_sampler: DistributedSampler[int] = DistributedSampler(range(50), num_replicas=2, rank=1, shuffle=True, seed=0)  # type: ignore[arg-type]
    names = ("plan", "drop_last", "seed", "start_epoch")
    clone = type(batch_sampler)(new_sampler, **{name: getattr(batch_sampler, name) for name in names})
    assert clone.sampler is new_sampler
    assert (clone.plan, clone.drop_last, clone.seed, clone.epoch) == (schedule, True, 4, 3)
    assert len(list(clone)) == len(clone)


def test_lightning_update_dataloader_injects_distributed_sampler() -> None:
    """Lightning's own re-instantiation path, as used with ``use_distributed_sampler=True``."""
    from lightning_fabric.utilities.data import _replace_dunder_methods

    from lightning_multigrid._lightning import submodule

    _update_dataloader = submodule("utilities.data")._update_dataloader

    schedule = make_schedule(devices=2)
    dataset = Echo(50)
    # Lightning wraps __init__ like this while it calls `train_dataloader()`.
    with _replace_dunder_methods(DataLoader, "dataset"), _replace_dunder_methods(BatchSampler):
        loader: DataLoader[Any] = DataLoader(
            dataset,  # type: ignore[arg-type]
            batch_sampler=ShortCycleBatchSampler(EpochShardSampler(50), schedule, seed=4, start_epoch=0),
            collate_fn=lambda batch: batch,
        )
    injected: DistributedSampler[int] = DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=True, seed=0)  # type: ignore[arg-type]
    updated = _update_dataloader(loader, injected)
    batch_sampler = updated.batch_sampler
    assert isinstance(batch_sampler, ShortCycleBatchSampler)
    assert batch_sampler.sampler is injected and batch_sampler.seed == 4
    injected.set_epoch(schedule.stages[1].start_epoch)  # Lightning sets the epoch on the inner sampler
    batches = list(updated)
    assert len(batches) == len(updated) == schedule.iterations_in_epoch(schedule.stages[1].start_epoch, 50)
    grid = schedule.grid_at(schedule.stages[1].start_epoch, 0)
    assert grid_of(batches[0]) == (grid.num_frames, grid.crop_size)


def test_clip_requests_cross_a_dataloader_unchanged() -> None:
    schedule = make_schedule()
    batch_sampler = ShortCycleBatchSampler(EpochShardSampler(20), schedule)
    loader: DataLoader[Any] = DataLoader(Echo(20), batch_sampler=batch_sampler, collate_fn=lambda batch: batch)  # type: ignore[arg-type]
    assert list(loader) == list(batch_sampler)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(dataset_size=0), "dataset_size"),
        (dict(dataset_size=10, num_replicas=0), "num_replicas"),
        (dict(dataset_size=10, num_replicas=2, rank=2), "rank"),
    ],
)
def test_epoch_shard_sampler_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EpochShardSampler(**kwargs)


def test_epoch_shard_sampler_matches_distributed_sampler() -> None:
    for rank in range(3):
        ours = EpochShardSampler(10, num_replicas=3, rank=rank, seed=1)
        torchs: DistributedSampler[int] = DistributedSampler(range(10), num_replicas=3, rank=rank, seed=1)  # type: ignore[arg-type]
        ours.set_epoch(4)
        torchs.set_epoch(4)
        assert list(ours) == list(torchs) and len(ours) == 4


def test_batch_sampler_rejects_bad_arguments() -> None:
    schedule = make_schedule()
    with pytest.raises(TypeError, match="sampler"):
        ShortCycleBatchSampler(iter(range(3)), schedule)
    with pytest.raises(ValueError, match="start_epoch"):
        ShortCycleBatchSampler(EpochShardSampler(3), schedule, start_epoch=-1)
    with pytest.raises(ValueError, match="epoch"):
        ShortCycleBatchSampler(EpochShardSampler(3), schedule).set_epoch(-2)
    with pytest.raises(ValueError, match="start_iteration"):
        ShortCycleBatchSampler(EpochShardSampler(3), schedule, start_epoch=0, start_iteration=-1)
    with pytest.raises(ValueError, match="`start_iteration` needs `start_epoch`"):
        ShortCycleBatchSampler(EpochShardSampler(3), schedule, start_iteration=2)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("skip", [1, 4])
def test_start_iteration_continues_the_epoch_where_it_stopped(mode: str, skip: int) -> None:
    # A mid-epoch resume: the same clips, seeds and short-cycle grids as the uninterrupted epoch
    # from iteration `skip` on; the epoch's length stays whole; the next epoch starts at 0.
    schedule = make_schedule(mode)
    epoch = schedule.stages[1].start_epoch
    full = ShortCycleBatchSampler(EpochShardSampler(50, seed=3), schedule, seed=4, start_epoch=epoch)
    resumed = ShortCycleBatchSampler(
        EpochShardSampler(50, seed=3), schedule, seed=4, start_epoch=epoch, start_iteration=skip
    )
    uninterrupted = list(full)
    assert list(resumed) == uninterrupted[skip:]
    assert len(resumed) == len(full) == len(uninterrupted)
    assert epoch_batches(resumed, epoch + 1) == epoch_batches(full, epoch + 1)


def test_start_iteration_survives_lightning_distributed_sampler_injection() -> None:
    # Under DDP with `use_distributed_sampler=True` Lightning rebuilds the batch sampler from the
    # arguments it was built with: a resumed loader must keep skipping the trained iterations.
    from lightning_fabric.utilities.data import _replace_dunder_methods

    from lightning_multigrid._lightning import submodule

    _update_dataloader = submodule("utilities.data")._update_dataloader

    schedule = make_schedule(devices=2)
    epoch = schedule.stages[1].start_epoch
    dataset = Echo(50)

    def loader(start_iteration: int) -> DataLoader[Any]:
        with _replace_dunder_methods(DataLoader, "dataset"), _replace_dunder_methods(BatchSampler):
            built: DataLoader[Any] = DataLoader(
                dataset,  # type: ignore[arg-type]
                batch_sampler=ShortCycleBatchSampler(
                    EpochShardSampler(50), schedule, seed=4, start_epoch=epoch, start_iteration=start_iteration
                ),
                collate_fn=lambda batch: batch,
            )
        injected: DistributedSampler[int] = DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=True, seed=0)  # type: ignore[arg-type]
        injected.set_epoch(epoch)
        return _update_dataloader(built, injected)

    full, resumed = list(loader(0)), list(loader(3))
    assert resumed == full[3:]
    assert len(loader(3)) == len(full)
