"""The callback checks every training batch against the schedule's grid (issue 27, item 9): a
DataModule whose ``serve()`` never reaches its loader is refused at its first batch, not trained at
the base shape with up to 8x the LR while the logs report grids that never ran."""

from __future__ import annotations

import warnings

import pytest
import torch
from test_callback_settings import IndexRecordingNet
from test_resume import ExampleData, run
from torch.utils.data import DataLoader

from lightning_multigrid import EpochShardSampler, FixedGrid, GridShape, ShortCycleBatchSampler
from lightning_multigrid.batch_grid import BatchGridCheck, video_shapes
from lightning_multigrid.callback import MultigridCallback
from lightning_multigrid.data.dataset import TrainVideoDataset

from test_callback import train_manifest as train_manifest  # the module-scoped fixture

GRID = GridShape(batch_size=4, num_frames=8, crop_size=16)


class ServeNeverReachesTheLoader(ExampleData):
    def serve(self, plan):
        self.served = plan  # kept, but train_dataloader below never reads it

    def train_dataloader(self):
        sampler = EpochShardSampler(len(self.dataset))
        batch_sampler = ShortCycleBatchSampler(sampler, FixedGrid(self.base_shape, self.clip_sampling))
        return DataLoader(self.dataset, batch_sampler=batch_sampler, num_workers=0)


def test_a_datamodule_that_ignores_the_plan_is_refused_at_its_first_batch(synthetic_dataset, train_manifest):
    dataset = TrainVideoDataset(str(train_manifest), root=str(synthetic_dataset.root), flip=False)
    model = IndexRecordingNet()
    with pytest.raises(ValueError, match=(
        r"training batch 0 of epoch 0 has video of shape \(1, 3, 8, 32, 32\) .* the multigrid schedule's grid "
        r"there is 16 clips x 2 frames x 16x16 px.*ShortCycleBatchSampler\(sampler, plan\)"
    )):
        run(ServeNeverReachesTheLoader(dataset), MultigridCallback(bn_base_size=2, precise_bn_batches=0), model=model)
    assert model.steps == []  # no step at the wrong grid


def video(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.uint8)


@pytest.mark.parametrize("batch", [
    {"video": video(4, 3, 8, 16, 16), "label": torch.zeros(4)},
    (video(4, 3, 8, 16, 16), torch.zeros(4)),
    video(4, 3, 8, 16, 16),
    {"video": [video(4, 3, 2, 16, 16), video(4, 3, 8, 16, 16)]},  # [slow, fast] pathways
    ([video(4, 3, 2, 16, 16), video(4, 3, 8, 16, 16)], torch.zeros(4)),
])
def test_batches_at_the_grid_pass(batch):
    BatchGridCheck()(batch, GRID, epoch=0, batch_idx=0, last_batch=False)


@pytest.mark.parametrize("batch, expected", [
    ({"video": video(8, 3, 8, 16, 16)}, r"\(8, 3, 8, 16, 16\)"),
    ({"video": video(4, 3, 16, 16, 16)}, r"\(4, 3, 16, 16, 16\)"),
    ({"video": video(4, 3, 8, 32, 32)}, r"\(4, 3, 8, 32, 32\)"),
    ({"video": [video(4, 3, 4, 16, 16), video(4, 3, 16, 16, 16)]}, r"\(4, 3, 4, 16, 16\) and \(4, 3, 16, 16, 16\)"),
    ({"video": video(3, 3, 8, 16, 16)}, r"\(3, 3, 8, 16, 16\)"),  # fewer clips, not the epoch's last batch
])
def test_batches_off_the_grid_are_refused(batch, expected):
    with pytest.raises(ValueError, match=expected + r" .* grid there is 4 clips x 8 frames x 16x16 px"):
        BatchGridCheck()(batch, GRID, epoch=1, batch_idx=5, last_batch=False)


def test_the_last_batch_of_an_epoch_may_be_partial():
    check = BatchGridCheck()
    check({"video": video(3, 3, 8, 16, 16)}, GRID, epoch=0, batch_idx=9, last_batch=True)
    with pytest.raises(ValueError, match="has video of shape"):
        check({"video": video(5, 3, 8, 16, 16)}, GRID, epoch=0, batch_idx=9, last_batch=True)


def test_a_batch_without_video_warns_once():
    check = BatchGridCheck()
    assert video_shapes({"image": video(4, 3, 16, 16)}) is None
    with pytest.warns(UserWarning, match="cannot check that training batches have the schedule's grid"):
        check({"image": video(4, 3, 16, 16)}, GRID, epoch=0, batch_idx=0, last_batch=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check({"image": video(4, 3, 16, 16)}, GRID, epoch=0, batch_idx=1, last_batch=False)
