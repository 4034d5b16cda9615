"""Resume from a checkpoint saved anywhere in an epoch ends with the uninterrupted run's weights,
and a resume that cannot be exact is refused before the first step (issue 27, item 4).

A real Trainer fits the tiny 3D CNN of ``test_callback.py`` on real H.264 videos. The run is killed
right after a checkpoint is written (the next step raises, as a SIGKILL would stop it there), and a
new Trainer, model, callback and DataModule resume from it with ``ckpt_path="last"``.
Epoch lengths of this schedule (32 clips, base batch 1): 3, 6, 7, 13, 13, 13 batches.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from test_callback_settings import IndexRecordingNet
from torch.utils.data import DataLoader

from lightning_multigrid import ClipSampling, EpochShardSampler, GridShape, ShortCycleBatchSampler
from lightning_multigrid._lightning import pl
from lightning_multigrid.callback import MultigridCallback
from lightning_multigrid.data.dataset import TrainVideoDataset

from test_callback import BASE, MAX_EPOCHS, make_datamodule
from test_callback import train_manifest as train_manifest  # the module-scoped fixture

ModelCheckpoint = pl.callbacks.ModelCheckpoint

KEYS = ("epoch", "batch_idx", "shape", "index", "lr", "bn")


class KillAfterStep(pl.Callback):
    """Stops the run at the start of the step after ``step``: the checkpoint written at ``step`` is the last."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError(f"killed after step {self.step}")


class KillAfterEpoch(pl.Callback):
    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.current_epoch == self.epoch + 1:
            raise RuntimeError(f"killed after epoch {self.epoch}")


def run(
    datamodule: pl.LightningDataModule,
    *callbacks: pl.Callback,
    ckpt_path: str | None = None,
    model: IndexRecordingNet | None = None,
    max_epochs: int = MAX_EPOCHS,
    **trainer_args: Any,
) -> IndexRecordingNet:
    pl.seed_everything(0, verbose=False)
    model = model or IndexRecordingNet()
    trainer = pl.Trainer(
        max_epochs=max_epochs, accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0, deterministic=True,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks), callbacks=list(callbacks),
        **trainer_args,
    )
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return model


def multigrid() -> MultigridCallback:
    return MultigridCallback(bn_base_size=2, precise_bn_batches=0)


@pytest.fixture(scope="module")
def uninterrupted(synthetic_dataset, train_manifest) -> IndexRecordingNet:
    return run(make_datamodule(synthetic_dataset, train_manifest), multigrid())


def epoch_ends(model: IndexRecordingNet) -> list[int]:
    """Global step at the end of each epoch."""
    counts = [sum(1 for s in model.steps if s["epoch"] == e) for e in range(max(s["epoch"] for s in model.steps) + 1)]
    return [sum(counts[: e + 1]) for e in range(len(counts))]


def assert_same_tail(resumed: IndexRecordingNet, uninterrupted: IndexRecordingNet, step: int) -> None:
    """The resumed run trained exactly the uninterrupted run's steps after ``step``, to the same weights."""
    assert [tuple(s[k] for k in KEYS) for s in resumed.steps] == [tuple(s[k] for k in KEYS) for s in uninterrupted.steps[step:]]
    for name, value in uninterrupted.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], value, rtol=0, atol=0, msg=name)


# ------------------------------------------------------------------ every position in an epoch


@pytest.mark.parametrize("epoch, position, num_workers", [
    (2, "first batch", 0),
    (2, "middle", 0),
    (2, "last batch", 0),  # 7 batches, the next epoch 13: it started at batch 7 before the fix
    (0, "last batch", 0),  # 3 batches, the next 6
    (2, "epoch end", 0),
    (2, "middle", 2),      # workers and chunked batches draw the same clips
])
def test_resume_from_any_position_ends_with_identical_weights(
    synthetic_dataset, train_manifest, uninterrupted, tmp_path, epoch, position, num_workers
):
    ends = [0, *epoch_ends(uninterrupted)]
    assert ends[1:4] == [3, 9, 16]  # the premise: epochs of different lengths
    start, end = ends[epoch], ends[epoch + 1]
    step = {"first batch": start + 1, "middle": start + 3, "last batch": end, "epoch end": end}[position]
    if position == "epoch end":
        saver = ModelCheckpoint(dirpath=tmp_path, save_last=True, save_top_k=-1, every_n_epochs=1)
        kill: pl.Callback = KillAfterEpoch(epoch)
    else:
        saver = ModelCheckpoint(dirpath=tmp_path, save_last=True, save_top_k=-1, every_n_train_steps=step)
        kill = KillAfterStep(step)
    data = dict(num_workers=num_workers, persistent_workers=False)
    with pytest.raises(RuntimeError, match="killed after"):
        run(make_datamodule(synthetic_dataset, train_manifest, **data), multigrid(), saver, kill)

    resumed = run(
        make_datamodule(synthetic_dataset, train_manifest, **data), multigrid(),
        ModelCheckpoint(dirpath=tmp_path, save_last=True, save_top_k=-1), ckpt_path="last",
    )
    assert_same_tail(resumed, uninterrupted, step)


def test_epoch_schedulers_step_after_a_last_batch_checkpoint(synthetic_dataset, train_manifest, tmp_path):
    # With `manage_lr=False` the user's epoch scheduler sets the LR: stepped once for the saved
    # epoch's end, which the resume skips (MultiStepLR at 2 -> 0.1x from epoch 2 on).
    def callback() -> MultigridCallback:
        return MultigridCallback(bn_base_size=2, precise_bn_batches=0, manage_lr=False, milestones=[2])

    full = run(make_datamodule(synthetic_dataset, train_manifest), callback())
    step = epoch_ends(full)[1]  # the last batch of epoch 1: the scheduler steps to 0.01 after it
    with pytest.raises(RuntimeError, match="killed after"):
        run(make_datamodule(synthetic_dataset, train_manifest), callback(),
            ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=step), KillAfterStep(step))
    resumed = run(make_datamodule(synthetic_dataset, train_manifest), callback(),
                  ModelCheckpoint(dirpath=tmp_path, save_last=True), ckpt_path="last")
    assert resumed.steps[0]["lr"] == pytest.approx(0.01)
    assert_same_tail(resumed, full, step)


# ------------------------------------------------------------------ the docs' own DataModule


def docs_datamodule() -> type[pl.LightningDataModule]:
    """The class of docs/data.md's own-DataModule example, run as the docs print it."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "data.md").read_text(encoding="utf-8")
    block = text.split("## Your own DataModule", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    block = block.split("\nmodel = ", 1)[0]  # the classes, without the example's own fit
    # the Lightning package this process uses (the docs import `lightning.pytorch`)
    block = block.replace("import lightning.pytorch as pl\n", "from lightning_multigrid._lightning import pl\n", 1)
    namespace: dict[str, Any] = {}
    exec(compile(block, "docs/data.md", "exec"), namespace)
    return namespace["VideoData"]


class ExampleData(docs_datamodule()):  # type: ignore[misc]
    """docs/data.md's own-DataModule example, with the base shape of these tests."""

    base_shape = GridShape(**{k: BASE[k] for k in ("batch_size", "num_frames", "crop_size")})
    clip_sampling = ClipSampling(sampling_rate=BASE["sampling_rate"])

    def __init__(self, dataset: TrainVideoDataset, skip_trained: bool = True) -> None:
        super().__init__(num_workers=0)
        self.train_set = self.dataset = dataset  # these tests' videos instead of the example's made-up ones
        self.skip_trained = skip_trained  # False: the example as it was before the fix

    def train_dataloader(self):
        if self.skip_trained:
            return super().train_dataloader()
        sampler = EpochShardSampler(len(self.dataset), num_replicas=self.trainer.world_size, rank=self.trainer.global_rank)
        batch_sampler = ShortCycleBatchSampler(sampler, self.plan, start_epoch=self.trainer.current_epoch)
        return DataLoader(self.dataset, batch_sampler=batch_sampler, num_workers=0)

    # -- the model of these tests takes float video
    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        batch["video"] = batch["video"].float() / 255
        return batch


def test_own_datamodule_of_the_docs_trains_the_baseline_without_the_callback(synthetic_dataset, train_manifest):
    # Nothing serves a plan without MultigridCallback: the example trains its base shape, every clip once an epoch.
    class Batches4(ExampleData):
        base_shape = GridShape(batch_size=4, num_frames=BASE["num_frames"], crop_size=BASE["crop_size"])

    dataset = TrainVideoDataset(str(train_manifest), root=str(synthetic_dataset.root), flip=False)
    model = run(Batches4(dataset), max_epochs=2)
    assert [s["shape"] for s in model.steps] == [(4, 3, BASE["num_frames"], BASE["crop_size"], BASE["crop_size"])] * 16
    for epoch in (0, 1):
        assert sorted(i for s in model.steps if s["epoch"] == epoch for i in s["index"]) == list(range(32))


@pytest.mark.parametrize("skip_trained", [True, False])
def test_own_datamodule_of_the_docs_resumes_mid_epoch_exactly(synthetic_dataset, train_manifest, tmp_path, skip_trained):
    def data() -> ExampleData:
        dataset = TrainVideoDataset(str(train_manifest), root=str(synthetic_dataset.root), flip=False)
        return ExampleData(dataset, skip_trained)

    full = run(data(), multigrid())
    step = epoch_ends(full)[1] + 3  # the middle of epoch 2
    with pytest.raises(RuntimeError, match="killed after"):
        run(data(), multigrid(), ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=step),
            KillAfterStep(step))
    model = IndexRecordingNet()
    resume = (data(), multigrid(), ModelCheckpoint(dirpath=tmp_path, save_last=True))
    if skip_trained:
        assert_same_tail(run(*resume, model=model, ckpt_path="last"), full, step)
        return
    with pytest.raises(ValueError, match=r"resumes mid-epoch, after batch 3 of epoch 2.*starts epoch 2 at iteration 0"):
        run(*resume, model=model, ckpt_path="last")
    assert model.steps == []  # refused before the first step


# ------------------------------------------------------------------ resumes refused


@pytest.fixture(scope="module")
def checkpoints(synthetic_dataset, train_manifest, tmp_path_factory) -> dict[str, Path]:
    """End-of-epoch-0 checkpoints of a multigrid and of a baseline run."""
    paths = {}
    for name, callbacks in (("multigrid", [multigrid()]), ("baseline", [])):
        directory = tmp_path_factory.mktemp(name)
        with pytest.raises(RuntimeError, match="killed after"):
            run(make_datamodule(synthetic_dataset, train_manifest), *callbacks, KillAfterEpoch(0),
                ModelCheckpoint(dirpath=directory, save_last=True, every_n_epochs=1), limit_train_batches=2)
        paths[name] = directory / "last.ckpt"
    return paths


@pytest.mark.parametrize("callbacks, match", [
    ([], "saved by a multigrid run .* but this fit has no enabled MultigridCallback"),
    ([MultigridCallback(enabled=False)], "saved by a multigrid run .* but this fit has no enabled MultigridCallback"),
])
def test_multigrid_checkpoint_without_multigrid_is_refused(synthetic_dataset, train_manifest, checkpoints, callbacks, match):
    model = IndexRecordingNet()
    with pytest.raises(ValueError, match=match):
        run(make_datamodule(synthetic_dataset, train_manifest), *callbacks, model=model,
            ckpt_path=str(checkpoints["multigrid"]), limit_train_batches=2)
    assert model.steps == []


def test_baseline_checkpoint_with_multigrid_is_refused(synthetic_dataset, train_manifest, checkpoints):
    model = IndexRecordingNet()
    with pytest.raises(ValueError, match=r"was saved without MultigridCallback .* at epoch 1, step 2"):
        run(make_datamodule(synthetic_dataset, train_manifest), multigrid(), model=model,
            ckpt_path=str(checkpoints["baseline"]), limit_train_batches=2)
    assert model.steps == []


def test_another_batch_size_is_refused(synthetic_dataset, train_manifest, checkpoints):
    # After an out-of-memory error a user halves (here: doubles) the batch: the checkpoint's schedule
    # would still serve its own grids.
    model = IndexRecordingNet()
    with pytest.raises(ValueError, match=r"built for base=GridShape\(batch_size=1, .* has base=GridShape\(batch_size=2"):
        run(make_datamodule(synthetic_dataset, train_manifest, batch_size=2), multigrid(), model=model,
            ckpt_path=str(checkpoints["multigrid"]), limit_train_batches=2)
    assert model.steps == []


@pytest.mark.parametrize("finished", [True, False], ids=["finished-run", "epoch-0"])
def test_another_max_epochs_is_refused(synthetic_dataset, train_manifest, checkpoints, tmp_path, finished):
    """A longer baseline moves every stage: a finished run resumed with a larger `max_epochs` trained 0 steps and
    returned as if done (issue 35, item 7)."""
    ckpt = checkpoints["multigrid"]
    if finished:
        run(make_datamodule(synthetic_dataset, train_manifest), multigrid(),
            ModelCheckpoint(dirpath=tmp_path, save_last=True), limit_train_batches=2)
        ckpt = tmp_path / "last.ckpt"
    model = IndexRecordingNet()
    with pytest.raises(ValueError, match=rf"built for a {MAX_EPOCHS}-epoch baseline .* this Trainer has `max_epochs`="
                                         rf"{2 * MAX_EPOCHS}.*Resume with `max_epochs={MAX_EPOCHS}`"):
        run(make_datamodule(synthetic_dataset, train_manifest), multigrid(), model=model, ckpt_path=str(ckpt),
            limit_train_batches=2, max_epochs=2 * MAX_EPOCHS)
    assert model.steps == []
