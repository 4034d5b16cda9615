"""MultigridCallback checks every argument when it is built, and tells a user-written DataModule
which optional capability it lacks (on a real Trainer)."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from lightning_multigrid._lightning import pl
from lightning_multigrid.callback import MultigridCallback
from lightning_multigrid.data.clip_params import ClipRequest
from lightning_multigrid.data.sampler import EpochShardSampler, ShortCycleBatchSampler
from lightning_multigrid.grid import ClipSampling, FixedGrid, GridPlan, GridShape
from lightning_multigrid.schedule.config import DEFAULT_SHORT_RUN, DEFAULTS, ShortRun

from test_callback import RecordingNet


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"enabled": 1}, "`enabled` must be True or False"),
        ({"long_cycle": "yes"}, "`long_cycle` must be True or False"),
        ({"short_cycle": None}, "`short_cycle` must be True or False"),
        ({"manage_lr": 0}, "`manage_lr` must be True or False"),
        ({"short_run": "true"}, r"`short_run` must be True, False or a ShortRun\(coarse_share, max_lr_factor\)"),
        ({"epoch_factor": -1}, "`epoch_factor` must be a positive number, got -1"),
        ({"epoch_factor": float("inf")}, "`epoch_factor` must be a positive number"),
        ({"milestones": [5, 3]}, r"`milestones` must be strictly increasing and > 0, got \[5, 3\]"),
        ({"milestones": [0]}, "`milestones` must be strictly increasing and > 0"),
        ({"milestones": [2.5]}, "`milestones` must be integers"),
        ({"bn_base_size": 0}, "`bn_base_size` must be a positive integer, got 0"),
        ({"precise_bn_batches": -1}, "`precise_bn_batches` must be an integer >= 0, got -1"),
        ({"precise_bn_batches": 2.5}, "`precise_bn_batches` must be an integer >= 0"),
        ({"long_cycle_factors": []}, "`long_cycle_factors` must name at least one shape"),
        ({"long_cycle_factors": [(0.5, 1.5)]}, r"`long_cycle_factors` must be \(t_factor, s_factor\) pairs in \(0, 1\]"),
        ({"long_cycle_factors": [0.5]}, r"`long_cycle_factors` must be \(t_factor, s_factor\) pairs"),
        ({"short_cycle_factors": (0.5,)}, r"`short_cycle_factors` must be two factors in \(0, 1\]"),
        ({"short_cycle_factors": (0.5, 0)}, "`short_cycle_factors`"),
        ({"full_grid_share": 1.5}, r"`full_grid_share` must be a number in \[0, 1\], got 1.5"),
        ({"short_run": True, "full_grid_share": 0.25}, "`short_run` and `full_grid_share`=0.25"),
        ({"short_run": ShortRun(), "full_grid_share": 0.25}, "`short_run` and `full_grid_share`=0.25"),
    ],
)
def test_every_argument_is_checked_at_construction(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        MultigridCallback(**kwargs)


@pytest.mark.parametrize(
    "short_run, expected",
    [(False, None), (True, DEFAULT_SHORT_RUN), (ShortRun(coarse_share=0.25, max_lr_factor=2), ShortRun(0.25, 2))],
)
def test_short_run_is_one_value_in_the_options(short_run: bool | ShortRun, expected: ShortRun | None) -> None:
    callback = MultigridCallback(short_run=short_run)
    assert callback.options.short_run == expected
    assert callback.options == dataclasses.replace(DEFAULTS, short_run=expected)


def test_the_issue_example_raises_at_construction() -> None:
    with pytest.raises(ValueError, match="`epoch_factor`"):
        MultigridCallback(epoch_factor=-1, bn_base_size=0)


# ------------------------------------------------------------------ a user's own DataModule


class RandomClips(torch.utils.data.Dataset):
    """Random uint8-range float clips at each request's grid."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, request: ClipRequest) -> dict[str, Any]:
        generator = torch.Generator().manual_seed(request.seed)
        video = torch.rand(3, request.num_frames, request.crop_size, request.crop_size, generator=generator)
        return {"video": video, "label": request.index % 4}


class UsersDataModule(pl.LightningDataModule):
    """The smallest DataModule MultigridCallback trains with: base grid, sampling, ``serve``; no extras."""

    def __init__(self) -> None:
        super().__init__()
        self.base_shape = GridShape(2, 4, 16)
        self.clip_sampling = ClipSampling(sampling_rate=1)
        self.plan: GridPlan = FixedGrid(self.base_shape, self.clip_sampling)

    def serve(self, plan: GridPlan | None) -> None:
        self.plan = plan if plan is not None else FixedGrid(self.base_shape, self.clip_sampling)

    def train_dataloader(self) -> DataLoader[Any]:
        epoch = self.trainer.current_epoch
        sampler = ShortCycleBatchSampler(EpochShardSampler(8), self.plan, start_epoch=epoch)
        return DataLoader(RandomClips(), batch_sampler=sampler)


def fit_users_datamodule(callback: MultigridCallback) -> list[warnings.WarningMessage]:
    trainer = pl.Trainer(
        max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
        callbacks=[callback],
    )
    model = RecordingNet()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, datamodule=UsersDataModule())
    assert model.steps, "the user's DataModule trains"
    assert callback.schedule is not None
    return caught


def test_missing_precise_bn_dataloader_is_a_warning_that_names_it() -> None:
    caught = fit_users_datamodule(MultigridCallback(milestones=[1]))
    messages = [str(w.message) for w in caught if "precise_bn_dataloader" in str(w.message)]
    assert len(messages) == 1
    assert "UsersDataModule does not have" in messages[0] and "`precise_bn_batches=0`" in messages[0]


def test_no_warning_when_precise_bn_is_off() -> None:
    caught = fit_users_datamodule(MultigridCallback(milestones=[1], precise_bn_batches=0))
    assert not [w for w in caught if "precise_bn_dataloader" in str(w.message)]
