"""Exact resume with dropout: ``VideoClassifier``'s defaults (``dropout_rate=0.5``) resumed from a
checkpoint end with the uninterrupted run's weights, bit for bit on CPU (issue 41, item 3).

Lightning saves no random state; ``MultigridCallback`` keeps every rank's in its checkpoint state
(:mod:`lightning_multigrid.fit.rng`). A real Trainer fits the tiny 3D CNN of ``VideoClassifier`` on real
H.264 videos; the run is killed after a checkpoint and a new Trainer, model, callback and DataModule
resume with ``ckpt_path="last"``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from test_resume import KillAfterEpoch, KillAfterStep

from lightning_multigrid import VideoClassifier
from lightning_multigrid._lightning import pl
from lightning_multigrid.callback import MultigridCallback
from lightning_multigrid.fit.rng import collect_rng_state, restore_rng_state

from test_callback import MAX_EPOCHS, make_datamodule
from test_callback import train_manifest as train_manifest  # the module-scoped fixture

ModelCheckpoint = pl.callbacks.ModelCheckpoint


class StepRecorder(pl.Callback):
    """The epoch, global step and loss of every training step."""

    def __init__(self) -> None:
        self.losses: list[tuple[int, int, float]] = []

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.losses.append((trainer.current_epoch, trainer.global_step, float(outputs["loss"])))

    def epoch_ends(self) -> list[int]:
        """The global step at the end of each epoch."""
        return [step for k, (epoch, step, _) in enumerate(self.losses) if k + 1 == len(self.losses) or self.losses[k + 1][0] != epoch]


def fit(data: dict[str, Any], *callbacks: pl.Callback, ckpt_path: str | None = None) -> VideoClassifier:
    pl.seed_everything(0, verbose=False)
    model = VideoClassifier(num_classes=4, tiny_width=4)  # the defaults: dropout_rate=0.5
    assert model.hparams.dropout_rate == 0.5
    trainer = pl.Trainer(
        max_epochs=MAX_EPOCHS, accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0, deterministic=True,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        callbacks=[MultigridCallback(bn_base_size=2, precise_bn_batches=0), *callbacks],
    )
    trainer.fit(model, datamodule=data["make"](), ckpt_path=ckpt_path)
    return model


@pytest.fixture(scope="module")
def data(synthetic_dataset, train_manifest) -> dict[str, Any]:
    return {"make": lambda **kw: make_datamodule(synthetic_dataset, train_manifest, **kw)}


@pytest.fixture(scope="module")
def uninterrupted(data) -> tuple[VideoClassifier, StepRecorder]:
    recorder = StepRecorder()
    model = fit(data, recorder)
    return model, recorder


def assert_same_weights(resumed: VideoClassifier, uninterrupted: VideoClassifier) -> None:
    for name, value in uninterrupted.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], value, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("position", ["epoch 0 end", "epoch 2 end", "epoch 3 end", "epoch 2 middle", "epoch 3 last batch"])
def test_resume_with_dropout_ends_with_identical_weights(data, uninterrupted, tmp_path: Path, position: str):
    model, full = uninterrupted
    ends = full.epoch_ends()
    epoch, where = int(position.split()[1]), position.split(maxsplit=2)[2]
    if where == "end":
        saver = ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_epochs=1)
        kill: pl.Callback = KillAfterEpoch(epoch)
        step = ends[epoch]
    else:
        step = ends[epoch] if where == "last batch" else ends[epoch - 1] + 2
        saver, kill = ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=step), KillAfterStep(step)
    with pytest.raises(RuntimeError, match="killed after"):
        fit(data, saver, kill)
    recorder = StepRecorder()
    resumed = fit(data, recorder, ModelCheckpoint(dirpath=tmp_path, save_last=True), ckpt_path="last")
    assert recorder.losses == full.losses[step:]  # every step's loss, dropout masks included
    assert_same_weights(resumed, model)


def test_resume_with_persistent_workers_ends_with_identical_weights(data, tmp_path: Path):
    # A loader with persistent workers draws its workers' base seed from torch's generator only when its
    # iterator is new: the uninterrupted run reuses it from epoch to epoch (while the grid holds), the
    # resumed run makes a new one. The epochs' steps draw the same numbers either way.
    workers = dict(num_workers=2, persistent_workers=True)
    loader = {"make": lambda: data["make"](**workers)}
    full = fit(loader)
    with pytest.raises(RuntimeError, match="killed after"):
        fit(loader, ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_epochs=1), KillAfterEpoch(3))
    assert_same_weights(fit(loader, ckpt_path=str(tmp_path / "last.ckpt")), full)


def test_the_random_state_round_trips_and_loads_weights_only(tmp_path: Path):
    import random

    import numpy as np

    state = collect_rng_state()
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.rand(7), np.random.rand(5), random.random()  # move on
    torch.save(state, tmp_path / "state.pt")
    restore_rng_state(torch.load(tmp_path / "state.pt", weights_only=True))
    drawn = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(drawn[0], expected[0]) and np.array_equal(drawn[1], expected[1]) and drawn[2] == expected[2]


@pytest.mark.slow
def test_ddp_resume_restores_each_ranks_own_random_state(synthetic_dataset, tmp_path: Path):
    """2-process DDP (gloo): each rank draws its own dropout masks (seeded 0 and 1); resumed from an epoch-end
    checkpoint, each rank gets its own state back, and both end with the uninterrupted run's weights."""
    import json

    from conftest import run_ddp_script

    script = Path(__file__).with_name("ddp_resume.py")
    ckpt_dir = tmp_path / "ckpt"
    results = {}
    for mode in ("full", "stop", "resume"):
        out = tmp_path / mode
        out.mkdir()
        run_ddp_script([str(script), str(out), str(synthetic_dataset.root), str(synthetic_dataset.train_manifest), mode,
                        str(ckpt_dir)], cwd=out, timeout_s=240)
        results[mode] = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]
    (state,) = (v for k, v in torch.load(ckpt_dir / "last.ckpt", weights_only=True)["callbacks"].items() if "Multigrid" in k)
    assert not torch.equal(state["rng"][0]["torch"], state["rng"][1]["torch"])  # the ranks' states differ
    for rank in range(2):
        full, stop, resumed = (results[mode][rank] for mode in ("full", "stop", "resume"))
        assert stop["losses"] == full["losses"][: len(stop["losses"])]
        assert resumed["losses"] == full["losses"][len(stop["losses"]):]  # every step, dropout masks included
        assert resumed["final"] == full["final"]


def test_a_checkpoint_without_random_state_is_resumed_and_said(data, tmp_path: Path, caplog):
    # A checkpoint of an earlier version: its schedule resumes, and the log says the draws will differ.
    with pytest.raises(RuntimeError, match="killed after"):
        fit(data, ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_epochs=1), KillAfterEpoch(0))
    checkpoint = torch.load(tmp_path / "last.ckpt", weights_only=True)
    (state,) = (v for k, v in checkpoint["callbacks"].items() if "MultigridCallback" in k)
    del state["rng"], state["pretrained"]
    torch.save(checkpoint, tmp_path / "old.ckpt")
    with caplog.at_level("INFO"):
        fit(data, ckpt_path=str(tmp_path / "old.ckpt"))
    assert "the checkpoint holds no random state (saved by an earlier version)" in caplog.text
