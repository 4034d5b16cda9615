"""The callback checks every training batch against the schedule's grid (issue 27, item 9): a
DataModule whose ``serve()`` never reaches its loader is refused at its first batch, not trained at
the base shape with up to 8x the LR while the logs report grids that never ran. What the schedule
fixes is checked, in the layout the batch has: frames and crop, and a batch no larger than planned,
so a collate that drops unreadable clips and a `(N, T, C, H, W)` loader train (issue 35, item 4)."""

from __future__ import annotations

import warnings

import pytest
import torch
from test_callback_settings import IndexRecordingNet
from test_resume import ExampleData, run
from torch.utils.data import DataLoader

from lightning_multigrid import EpochShardSampler, FixedGrid, GridShape, ShortCycleBatchSampler
from lightning_multigrid.callback import MultigridCallback
from lightning_multigrid.data.dataset import TrainVideoDataset, collate_clips
from lightning_multigrid.fit.batch_grid import BatchGridCheck, video_shapes

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
    {"video": video(3, 3, 8, 16, 16)},  # fewer clips: a collate dropped one, or the epoch's last batch
    {"video": video(4, 8, 3, 16, 16)},  # (N, T, C, H, W)
    {"video": [video(4, 2, 3, 16, 16), video(4, 8, 3, 16, 16)]},
    (video(4, 3, 8, 16, 16), torch.zeros(4)),
    video(4, 3, 8, 16, 16),
    {"video": [video(4, 3, 2, 16, 16), video(4, 3, 8, 16, 16)]},  # [slow, fast] pathways
    ([video(4, 3, 2, 16, 16), video(4, 3, 8, 16, 16)], torch.zeros(4)),
])
def test_batches_at_the_grid_pass(batch):
    BatchGridCheck()(batch, GRID, epoch=0, batch_idx=0)


@pytest.mark.parametrize("batch, expected", [
    ({"video": video(8, 3, 8, 16, 16)}, r"\(8, 3, 8, 16, 16\)"),
    ({"video": video(4, 3, 16, 16, 16)}, r"\(4, 3, 16, 16, 16\)"),
    ({"video": video(4, 3, 8, 32, 32)}, r"\(4, 3, 8, 32, 32\)"),
    ({"video": [video(4, 3, 4, 16, 16), video(4, 3, 16, 16, 16)]}, r"\(4, 3, 4, 16, 16\) and \(4, 3, 16, 16, 16\)"),
    ({"video": video(4, 8, 3, 16, 16)[:, :, :, :, :8]}, r"\(4, 8, 3, 16, 8\) \(read as \(N, T, C, H, W\): 16x8 px, not"),
])
def test_batches_off_the_grid_are_refused(batch, expected):
    with pytest.raises(ValueError, match=expected + r" .* grid there is 4 clips x 8 frames x 16x16 px"):
        BatchGridCheck()(batch, GRID, epoch=1, batch_idx=5)


def test_what_differs_is_named_in_the_layout_closest_to_the_grid():
    check = BatchGridCheck()
    with pytest.raises(ValueError, match=r"read as \(N, C, T, H, W\): 5 clips, more than the 4 planned\)"):
        check({"video": video(5, 3, 8, 16, 16)}, GRID, epoch=0, batch_idx=9)
    with pytest.raises(ValueError, match=r"read as \(N, C, T, H, W\): 16 frames, not 8; 32x32 px, not 16x16\)"):
        check({"video": video(4, 3, 16, 32, 32)}, GRID, epoch=0, batch_idx=9)
    with pytest.raises(ValueError, match=r"read as \(N, T, C, H, W\): 5 clips, more than the 4 planned\)"):
        check({"video": video(5, 8, 3, 16, 16)}, GRID, epoch=0, batch_idx=9)


class DropsUnreadableClips(ExampleData):
    """A user's collate that drops the clips it could not read (here: every fifth video), as many do."""

    def train_dataloader(self):
        loader = super().train_dataloader()
        loader.collate_fn = lambda samples: collate_clips([s for s in samples if s["index"] % 5] or samples[:1])
        return loader


class ServesTimeFirst(ExampleData):
    """A DataModule serving `(N, T, C, H, W)` video, and its model, which takes it so."""

    def on_after_batch_transfer(self, batch, dataloader_idx):
        batch = super().on_after_batch_transfer(batch, dataloader_idx)
        batch["video"] = batch["video"].transpose(1, 2)
        return batch


class TimeFirstNet(IndexRecordingNet):
    def forward(self, video):
        return super().forward(video.transpose(1, 2))


@pytest.mark.parametrize("data, net", [(DropsUnreadableClips, IndexRecordingNet), (ServesTimeFirst, TimeFirstNet)])
def test_loaders_that_follow_the_schedule_train(synthetic_dataset, train_manifest, data, net):
    dataset = TrainVideoDataset(str(train_manifest), root=str(synthetic_dataset.root), flip=False)
    # (preflight=False: the preflight's forward passes (N, C, T, H, W) clips, which TimeFirstNet does not take)
    callback = MultigridCallback(bn_base_size=2, precise_bn_batches=0, preflight=False)
    model = run(data(dataset), callback, model=net())
    assert callback.schedule is not None and model.steps
    for step in model.steps:
        grid = callback.schedule.grid_at(step["epoch"], step["batch_idx"])
        clips, *layout = step["shape"]
        frames = layout[1] if data is DropsUnreadableClips else layout[0]
        assert (frames, layout[-1]) == (grid.num_frames, grid.crop_size) and 0 < clips <= grid.batch_size
    if data is DropsUnreadableClips:
        assert any(step["shape"][0] < callback.schedule.grid_at(step["epoch"], step["batch_idx"]).batch_size
                   for step in model.steps)  # clips were dropped mid-epoch, and training went on


def test_a_batch_without_video_warns_once():
    check = BatchGridCheck()
    assert video_shapes({"image": video(4, 3, 16, 16)}) is None
    with pytest.warns(UserWarning, match="cannot check that training batches have the schedule's grid"):
        check({"image": video(4, 3, 16, 16)}, GRID, epoch=0, batch_idx=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check({"image": video(4, 3, 16, 16)}, GRID, epoch=0, batch_idx=1)


GRID_3 = GridShape(batch_size=16, num_frames=3, crop_size=16)


def test_frames_off_a_3_frame_grid_are_not_read_time_first():
    """Issue 41, item 7: 6 frames at a 3-frame grid passed, read as (N, T, C, H, W) with 6 channels."""
    with pytest.raises(ValueError, match=r"\(16, 3, 6, 16, 16\) \(read as \(N, C, T, H, W\): 6 frames, not 3\)"):
        BatchGridCheck()({"video": video(16, 3, 6, 16, 16)}, GRID_3, epoch=0, batch_idx=0)


def test_a_batch_that_reads_as_video_both_ways_is_refused_naming_both():
    # 4 frames of 2-channel flow, or 2 frames of RGBA: one reading at the 2-frame grid, one off it
    with pytest.raises(ValueError, match=(
        r"\(16, 2, 4, 16, 16\), which reads two ways: as \(N, T, C, H, W\) it has the grid's 2 frames, as "
        r"\(N, C, T, H, W\) 4 frames, not 2 .* Serve the video as \(N, C, T, H, W\)"
    )):
        BatchGridCheck()({"video": video(16, 2, 4, 16, 16)}, GridShape(16, 2, 16), epoch=0, batch_idx=0)
    BatchGridCheck()({"video": video(16, 3, 3, 16, 16)}, GRID_3, epoch=0, batch_idx=0)  # 3 both ways: at the grid


def test_the_layout_a_batch_tells_holds_for_the_fit():
    time_first = BatchGridCheck()
    time_first({"video": video(4, 8, 2, 16, 16)}, GRID, epoch=0, batch_idx=0)  # 8 channels is no video: time-first
    with pytest.raises(ValueError, match=r"read as \(N, C, T, H, W\): 2 frames, not 3"):  # untold: RGB's 3 reads first
        BatchGridCheck()({"video": video(16, 3, 2, 16, 16)}, GRID_3, epoch=0, batch_idx=1)
    time_first({"video": video(16, 3, 2, 16, 16)}, GRID_3, epoch=0, batch_idx=1)  # 3 frames of 2-channel flow
    time_first({"video": video(16, 2, 4, 16, 16)}, GridShape(16, 2, 16), epoch=0, batch_idx=2)
    assert time_first.layout == "(N, T, C, H, W)"
    channels_first = BatchGridCheck()
    channels_first({"video": video(16, 3, 2, 16, 16)}, GridShape(16, 2, 16), epoch=0, batch_idx=0)  # RGB, 2 frames
    assert channels_first.layout == "(N, C, T, H, W)"
    with pytest.raises(ValueError, match=r"\(16, 3, 4, 16, 16\) \(read as \(N, C, T, H, W\): 4 frames, not 3\)"):
        channels_first({"video": video(16, 3, 4, 16, 16)}, GRID_3, epoch=0, batch_idx=1)
