"""What MultigridCallback logs and when, on a real Trainer: the `multigrid/*` values on Lightning's
logging steps and at each stage's first step, equal to what trained; and the data-wait meter, whose
end-of-fit summary names the grid a slow loader paces and no other."""

from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, SequentialSampler

from lightning_multigrid._lightning import pl
from lightning_multigrid.callback import MultigridCallback
from lightning_multigrid.data.clip_params import ClipRequest
from lightning_multigrid.data.sampler import ShortCycleBatchSampler
from lightning_multigrid.fit.meter import DataWaitMeter
from lightning_multigrid.grid import ClipSampling, FixedGrid, GridPlan, GridShape

from test_callback import BASE_LR, MILESTONES, RecordingNet, fit, make_datamodule, train_manifest  # noqa: F401


def _rows(logger: pl.loggers.CSVLogger) -> list[dict[str, str]]:
    with open(Path(logger.log_dir) / "metrics.csv") as file:
        return list(csv.DictReader(file))


def test_values_logged_on_logging_steps_and_stage_starts_match_what_trained(synthetic_dataset, train_manifest, tmp_path):
    every = 3
    logger = pl.loggers.CSVLogger(tmp_path)
    model = RecordingNet("multistep")
    callback = MultigridCallback(precise_bn_batches=0, milestones=MILESTONES)
    fit(model, make_datamodule(synthetic_dataset, train_manifest), callback, logger=logger, log_every_n_steps=every)
    schedule = callback.schedule
    assert schedule is not None
    logged = {int(r["step"]): r for r in _rows(logger) if r.get("multigrid/batch_size")}
    # One optimizer, no accumulation: the logger's step s is the s-th training step.
    first_of_stage = {
        s for s, step in enumerate(model.steps)
        if s == 0 or schedule.stage_at(step["epoch"]) is not schedule.stage_at(model.steps[s - 1]["epoch"])
    }
    logging_steps = {s for s in range(len(model.steps)) if (s + 1) % every == 0}
    assert len(first_of_stage) == len(schedule.stages) > 1
    assert set(logged) == logging_steps | first_of_stage  # nothing logged at the other steps
    for s, row in logged.items():
        step = model.steps[s]
        grid = schedule.grid_at(step["epoch"], step["batch_idx"])
        _, _, frames, crop, _ = step["shape"]
        assert (float(row["multigrid/num_frames"]), float(row["multigrid/crop_size"])) == (frames, crop) == (
            grid.num_frames, grid.crop_size)
        assert float(row["multigrid/batch_size"]) == grid.batch_size >= step["shape"][0]
        assert float(row["multigrid/lr_factor"]) == schedule.stage_at(step["epoch"]).lr_factor
        assert float(row["multigrid/lr"]) == pytest.approx(step["lr"], rel=1e-6)
        assert float(row["multigrid/bn_groups"]) == step["bn"][1]
        if s in logging_steps:  # the loader's share and the skip count need a logging step
            assert 0.0 <= float(row["multigrid/data_wait"]) < 1.0
            assert float(row["multigrid/skipped_videos"]) == 0.0
        else:
            assert not row.get("multigrid/data_wait")
    assert BASE_LR in {step["lr"] for step in model.steps}


# ---------------------------------------------------------------- the data-wait meter


class _Clips(Dataset[dict[str, Any]]):
    """Blank clips of the requested shape; a clip at ``slow_crop`` takes ``delay_s`` to 'decode'."""

    def __init__(self, size: int, slow_crop: int | None, delay_s: float) -> None:
        self.size, self.slow_crop, self.delay_s = size, slow_crop, delay_s

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, request: ClipRequest) -> dict[str, Any]:  # type: ignore[override]
        if request.crop_size == self.slow_crop:
            time.sleep(self.delay_s)
        return {"video": torch.zeros(3, request.num_frames, request.crop_size, request.crop_size),
                "label": request.index % 2}


class _GridData(pl.LightningDataModule):
    """A user's own DataModule serving grids (the `GridDataModule` contract) from `_Clips`."""

    def __init__(self, slow_crop: int | None, size: int = 48) -> None:
        super().__init__()
        self.base_shape = GridShape(batch_size=2, num_frames=4, crop_size=16)
        self.clip_sampling = ClipSampling(sampling_rate=1)
        self.plan: GridPlan = FixedGrid(self.base_shape, self.clip_sampling)
        self.dataset = _Clips(size, slow_crop, delay_s=0.005)

    def serve(self, plan: GridPlan | None) -> None:
        self.plan = plan if plan is not None else FixedGrid(self.base_shape, self.clip_sampling)

    def train_dataloader(self) -> DataLoader[Any]:
        sampler = ShortCycleBatchSampler(SequentialSampler(range(len(self.dataset))), self.plan)
        return DataLoader(self.dataset, batch_sampler=sampler)


class _Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv3d(3, 2, 3, padding=1), nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(2, 2))

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        # A step as long as a real model's: the few hundred microseconds Lightning spends between
        # two steps (also counted as waiting) stay a small share of it.
        time.sleep(0.01)
        return nn.functional.cross_entropy(self.net(batch["video"]), batch["label"])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _SlowBatchEnd(pl.Callback):
    """What a slow logger write or checkpoint save does to a step: time after the step, before the next fetch."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        time.sleep(0.02)


class _SlowLogger(pl.loggers.CSVLogger):
    def log_metrics(self, metrics, step=None) -> None:
        time.sleep(0.02)
        super().log_metrics(metrics, step)


def _fit_short_cycle(datamodule: pl.LightningDataModule, tmp_path, slow_after_step: bool = False) -> MultigridCallback:
    # Short cycle only, base 2 x 4 x 16: crops 8 / 11 / 16 at batches 8 / 4 / 2, in turn; 300 clips:
    # 21 iterations of each grid (MIN_ITERATIONS timed: the first of the epoch is not).
    callback = MultigridCallback(long_cycle=False, precise_bn_batches=0, preflight=False)
    callbacks: list[pl.Callback] = [callback, _SlowBatchEnd()] if slow_after_step else [callback]
    trainer = pl.Trainer(
        max_epochs=1, accelerator="cpu", devices=1, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=callbacks, log_every_n_steps=1,
        logger=_SlowLogger(tmp_path) if slow_after_step else False,
    )
    trainer.fit(_Tiny(), datamodule=datamodule)
    return callback


def _summary(caplog) -> str:
    return next(r.getMessage() for r in caplog.records if "multigrid data wait" in r.getMessage())


@pytest.mark.parametrize("slow_crop", [8, None])
def test_summary_names_the_grid_a_slow_loader_paces(slow_crop, caplog, tmp_path):
    with caplog.at_level("INFO"):
        _fit_short_cycle(_GridData(slow_crop, size=300), tmp_path)
    summary = _summary(caplog)
    if slow_crop is None:
        assert "the model, not loading, set the pace" in summary
        return
    # 8 clips x 5 ms of waiting against a step of about 10 ms: 80% of the iteration.
    assert "loading set the pace at 1 of 3 grids" in summary
    assert "8 x 4 x 8:" in summary and "x 11:" not in summary and "x 16:" not in summary
    # A DataModule of the user's own: advice that fits any, not our DataModule's settings.
    assert "more DataLoader workers" in summary and "reader_settings" not in summary


def test_slow_work_after_the_step_is_not_data_wait(caplog, tmp_path):
    # A callback's on_train_batch_end and the logger's writes sleep 20 ms each per step, after a
    # step of 10 ms, and the loader is fast: loading does not set the pace, at any grid.
    with caplog.at_level("INFO"):
        callback = _fit_short_cycle(_GridData(None, size=300), tmp_path, slow_after_step=True)
    assert "the model, not loading, set the pace" in _summary(caplog)
    shares = {g.crop_size: w.share for g, w in callback._meter.grids.items()}
    assert len(shares) == 3 and max(shares.values()) < 0.1, shares


def test_summary_says_when_it_has_too_few_iterations_to_judge(caplog, tmp_path):
    # 48 clips: 3 or 4 iterations of each grid, however slow the loader.
    with caplog.at_level("INFO"):
        _fit_short_cycle(_GridData(8, size=48), tmp_path)
    summary = _summary(caplog)
    assert "too few iterations to judge" in summary and "8 x 4 x 8 (" in summary
    assert "set the pace" not in summary


def test_meter_shares_per_grid_and_pauses():
    ticks = iter([0.0, 0.0, 0.0, 0.5, 1.0, 3.0, 3.5, 4.0, 10.0, 11.0, 12.0, 13.0])
    meter = DataWaitMeter(limit=0.2, clock=lambda: next(ticks), min_iterations=1)
    coarse, base = GridShape(4, 2, 8), GridShape(1, 4, 16)
    meter.fetch_start()  # 0.0
    meter.batch_start()  # 0.0: the first batch has no previous end: not timed
    meter.batch_end(coarse)  # 0.0
    meter.fetch_start()  # 0.5: what ran before (a logger's write) is not a wait
    meter.fetch_start()  # not read: the wait began at the first fetch
    meter.batch_start()  # 1.0: waited 0.5 s
    meter.batch_end(coarse)  # 3.0: iteration 3 s
    meter.fetch_start()  # 3.5
    meter.batch_start()  # 4.0: waited 0.5 s
    meter.batch_end(base)  # 10.0: iteration 7 s
    meter.pause()  # e.g. a validation: the next gap is not a wait
    meter.fetch_start()  # 11.0
    meter.batch_start()  # 12.0
    meter.batch_end(base)  # 13.0
    assert meter.grids[coarse].share == pytest.approx(0.5 / 3) and meter.grids[coarse].iterations == 1
    assert meter.grids[base].share == pytest.approx(0.5 / 7) and meter.grids[base].iterations == 1
    assert meter.take_window_share() == pytest.approx(1 / 10)
    assert meter.take_window_share() is None
    assert meter.paced_by_loading() == []
    assert "the model, not loading, set the pace" in meter.summary()


def test_meter_judges_grids_timed_often_enough_and_gives_the_advice_it_is_given():
    clock = [0.0]
    meter = DataWaitMeter(limit=0.2, clock=lambda: clock[0], min_iterations=3)
    coarse, base = GridShape(4, 2, 8), GridShape(1, 4, 16)

    def iteration(grid: GridShape, wait_s: float, step_s: float) -> None:
        meter.fetch_start()
        clock[0] += wait_s
        meter.batch_start()
        clock[0] += step_s
        meter.batch_end(grid)

    for _ in range(4):  # 3 timed (the first has no previous end): judged
        iteration(coarse, 1.0, 1.0)
    for _ in range(2):  # 2 timed: too few
        iteration(base, 1.0, 1.0)
    summary = meter.summary("more loader workers (`num_workers`, now 2)")
    assert "loading set the pace at 1 of 1 grids judged" in summary and "4 x 2 x 8: 50% of 3 iterations" in summary
    assert "Not judged: too few iterations to judge (under 3 timed) at 1 x 4 x 16 (2)" in summary
    assert "Try more loader workers (`num_workers`, now 2), or fewer or larger long-cycle shapes" in summary
    assert "no iteration timed (the first batch of each epoch" in DataWaitMeter().summary()


def test_schedule_summary_of_a_datamodule_without_its_size_names_the_property(caplog, tmp_path):
    with caplog.at_level("INFO"):
        _fit_short_cycle(_GridData(None, size=24), tmp_path)
    table = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("Multigrid schedule"))
    assert "regime: give _GridData a `train_dataset_size` property (its training clips) to see the optimizer steps" in table
    assert "--dataset-size" not in table
