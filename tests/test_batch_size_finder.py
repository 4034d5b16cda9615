"""Lightning's batch-size finder tunes the DataModule's base batch (issue 27, item 10): each trial
trains base-shape batches of the size tried, and the size found is the base of the multigrid fit
that follows. A real ``Tuner`` on the tiny 3D CNN and real H.264 videos."""

from __future__ import annotations

import pytest
from test_callback_settings import IndexRecordingNet

from lightning_multigrid._lightning import pl
from lightning_multigrid.callback import MultigridCallback

from test_callback import make_datamodule
from test_callback import train_manifest as train_manifest  # the module-scoped fixture

Tuner = pl.tuner.Tuner


def test_tuner_scales_the_base_batch_then_multigrid_fits_on_it(synthetic_dataset, train_manifest, tmp_path):
    datamodule = make_datamodule(synthetic_dataset, train_manifest)  # base batch 1
    model = IndexRecordingNet()
    callback = MultigridCallback(bn_base_size=2, precise_bn_batches=0)
    trainer = pl.Trainer(
        max_epochs=4, accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, num_sanity_val_steps=0, limit_val_batches=0, default_root_dir=tmp_path,
        callbacks=[callback],
    )
    found = Tuner(trainer).scale_batch_size(model, datamodule=datamodule, init_val=2, max_trials=3, steps_per_trial=1)
    # Power scaling without an out-of-memory error: trials at 2, 4 and 8 clips, one step each.
    assert found == 8
    assert [s["shape"] for s in model.steps] == [(2, 3, 8, 32, 32), (4, 3, 8, 32, 32), (8, 3, 8, 32, 32)]
    assert datamodule.base_shape.batch_size == datamodule.batch_size == datamodule.hparams["batch_size"] == 8

    model.steps.clear()
    trainer.fit(model, datamodule=datamodule)
    assert callback.schedule is not None and callback.schedule.config.base.batch_size == 8
    # The coarsest grid of base batch 8 takes 8 x 16 clips: all 32 of the epoch in one batch.
    assert callback.schedule.grid_at(0, 0).batch_size == 8 * 16
    assert model.steps[0]["shape"] == (32, 3, 2, 16, 16)
    assert datamodule.batch_size == 8  # served back at the base shape after fit


def test_batch_size_cannot_change_under_a_served_schedule(synthetic_dataset, train_manifest):
    datamodule = make_datamodule(synthetic_dataset, train_manifest)

    class SetBatchSize(pl.Callback):
        def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            datamodule.batch_size = 4

    trainer = pl.Trainer(
        max_epochs=2, accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, num_sanity_val_steps=0, limit_val_batches=0,
        callbacks=[MultigridCallback(bn_base_size=2, precise_bn_batches=0), SetBatchSize()],
    )
    with pytest.raises(ValueError, match="cannot set `batch_size=4` while a multigrid schedule built from base batch 1"):
        trainer.fit(IndexRecordingNet(), datamodule=datamodule)
