"""`full_grid_share` and the per-grid summary on a real Trainer (tiny 3D CNN, real H.264 videos)."""

from __future__ import annotations

import logging

import pytest

from lightning_multigrid.callback import MultigridCallback
from lightning_multigrid.schedule import GridShape

from test_callback import MILESTONES, RecordingNet, fit, make_datamodule, train_manifest  # noqa: F401 (fixture)


@pytest.mark.slow
def test_full_grid_fine_tuning_runs_every_iteration_at_the_base_shape(synthetic_dataset, train_manifest, caplog):
    caplog.set_level(logging.INFO)
    model = RecordingNet()
    datamodule = make_datamodule(synthetic_dataset, train_manifest)
    callback = MultigridCallback(bn_base_size=2, precise_bn_batches=0, milestones=MILESTONES, full_grid_share=0.5)
    trainer = fit(model, datamodule, callback)
    schedule = callback.schedule
    assert schedule is not None and trainer.current_epoch == schedule.max_epochs
    fine_tuning = [s for s in schedule.stages if s.fine_tuning]
    # 4 baseline epochs, milestone 2: fine-tuning is ceil(0.5 * 4) = 2 epochs without short cycle.
    assert sum(s.num_epochs for s in fine_tuning) == 2 and all(s.short_cycle == () for s in fine_tuning)
    for stage in fine_tuning:
        for epoch in range(stage.start_epoch, stage.end_epoch):
            steps = [s for s in model.steps if s["epoch"] == epoch]
            # 32 clips in batches of 1: the loader was reloaded, so Lightning ran the whole epoch.
            assert len(steps) == schedule.iterations_in_epoch(epoch, 32) == 32
            assert {s["shape"][:3] for s in steps} == {(1, 3, 8)}
            assert {s["shape"][3:] for s in steps} == {(32, 32)}
    # The printed summary lists each grid's iterations; the full grid's include both epochs.
    assert "Per grid, per device:" in caplog.text
    assert GridShape(1, 8, 32) in schedule.distinct_grids()
