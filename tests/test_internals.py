"""The private Lightning and torch attributes the package reads (lightning_multigrid/_internals.py):
each checked against the installed versions, so a rename upstream fails here."""

from __future__ import annotations

import csv

import pytest
import torch
from torch.optim.lr_scheduler import LinearLR, MultiStepLR, SequentialLR
from torch.utils.data import DataLoader, TensorDataset

from lightning_multigrid._internals import (
    drop_train_loader,
    ensure_train_loader,
    finish_epoch_saved_at_its_last_batch,
    is_logging_step,
    iterations_done_in_epoch,
    layer_sync_of,
    logger_step,
    max_epochs_filled_in,
    raise_recompile_limit,
    sequential_lr_parts,
    setting_owner,
    watch_train_fetches,
)
from lightning_multigrid._lightning import TorchSyncBatchNorm, pl

ModelCheckpoint = pl.callbacks.ModelCheckpoint


class _Linear(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.loaders_built = 0
        self.done_at_load: list[int] = []

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()

    def train_dataloader(self):
        self.loaders_built += 1
        self.done_at_load.append(iterations_done_in_epoch(self.trainer))
        return DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=2)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _trainer(tmp_path, **kwargs) -> pl.Trainer:
    args = dict(
        default_root_dir=tmp_path, max_epochs=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    return pl.Trainer(**{**args, **kwargs})


def test_drop_train_loader_makes_the_fit_loop_build_it_again(tmp_path):
    model = _Linear()
    trainer = _trainer(tmp_path)
    trainer.fit(model)
    assert model.loaders_built == 1
    trainer.fit_loop.setup_data()  # a built loader is kept...
    assert model.loaders_built == 1
    drop_train_loader(trainer)
    trainer.fit_loop.setup_data()  # ...until it is dropped
    assert model.loaders_built == 2


class _LengthAtFitStart(pl.Callback):
    """Builds the train loader in ``on_fit_start`` (before the fit loop would) and reads its length."""

    def on_fit_start(self, trainer, pl_module):
        self.before = trainer.num_training_batches
        ensure_train_loader(trainer)
        self.length = trainer.num_training_batches
        ensure_train_loader(trainer)  # a second call keeps the loader it built
        self.built = pl_module.loaders_built


def test_build_train_loader_gives_the_length_before_the_first_epoch(tmp_path):
    model = _Linear()
    seen = _LengthAtFitStart()
    trainer = _trainer(tmp_path, limit_train_batches=3, callbacks=[seen])
    trainer.fit(model)
    # Not known before; 3 of the 4 batches (8 samples of 2) with `limit_train_batches`.
    assert seen.before == float("inf") and seen.length == 3
    assert seen.built == 1 and model.loaders_built == 1  # the fit loop kept the loader built at fit start


def test_layer_sync_of_sees_sync_batchnorm():
    # On one device Lightning ignores sync_batchnorm; two DDP processes (not launched here) use it.
    ddp = {"strategy": "ddp", "accelerator": "cpu", "devices": 2, "logger": False}
    assert isinstance(layer_sync_of(pl.Trainer(sync_batchnorm=True, **ddp).strategy), TorchSyncBatchNorm)
    assert layer_sync_of(pl.Trainer(**ddp).strategy) is None


def test_sequential_lr_parts():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    ramp = LinearLR(optimizer, start_factor=0.1, total_iters=3)
    steps = MultiStepLR(optimizer, [5])
    schedulers, milestones = sequential_lr_parts(SequentialLR(optimizer, [ramp, steps], milestones=[3]))
    assert schedulers == [ramp, steps]
    assert milestones == [3]


@pytest.mark.filterwarnings("ignore:.*(callbacks used to create the checkpoint|dataloader is not resumable).*")
def test_iterations_done_in_epoch_reads_a_mid_epoch_resume(tmp_path):
    # 4 batches an epoch; a checkpoint after step 6 is 2 batches into epoch 1.
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=6, save_top_k=-1)
    first = _Linear()
    _trainer(tmp_path, max_epochs=2, enable_checkpointing=True, callbacks=[checkpoint]).fit(first)
    assert first.done_at_load == [0]  # a fresh fit
    resumed = _Linear()
    _trainer(tmp_path, max_epochs=2).fit(resumed, ckpt_path=str(tmp_path / "epoch=1-step=6.ckpt"))
    assert resumed.done_at_load == [2]
    assert iterations_done_in_epoch(None) == 0  # no Trainer (a DataModule used on its own)


def test_setting_owner_writes_what_the_trainer_reads(tmp_path):
    trainer = _trainer(tmp_path, max_epochs=3, max_steps=50)
    for name, value in (("max_epochs", 7), ("max_steps", -1), ("val_check_interval", 0.5)):
        setattr(setting_owner(trainer, name), name, value)
    assert (trainer.max_epochs, trainer.max_steps, trainer.val_check_interval) == (7, -1, 0.5)


@pytest.mark.parametrize(("given", "filled_in"), [
    ({}, True), ({"max_epochs": 3}, False), ({"max_epochs": 3000}, False), ({"max_steps": 4}, False),
    ({"callbacks": [pl.callbacks.Timer(duration="00:00:10:00")]}, False),
])
def test_max_epochs_filled_in_follows_lightnings_rule(tmp_path, given, filled_in):
    seen: list[bool] = []

    class Probe(pl.Callback):
        def setup(self, trainer, pl_module, stage):  # where MultigridCallback reads it
            seen.append(max_epochs_filled_in(trainer))
            raise InterruptedError("probed")

    args = dict(default_root_dir=tmp_path, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False)
    trainer = pl.Trainer(**args, **{**given, "callbacks": [Probe(), *given.get("callbacks", [])]})
    with pytest.raises(InterruptedError, match="probed"):
        trainer.fit(_Linear())
    assert seen == [filled_in]


def test_is_logging_step_and_logger_step_are_where_lightning_writes(tmp_path):
    class Probe(pl.Callback):
        def __init__(self) -> None:
            self.seen: list[tuple[bool, int]] = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            pl_module.log("probe", float(batch_idx), on_step=True, on_epoch=False)
            self.seen.append((is_logging_step(trainer), logger_step(trainer)))

    probe = Probe()
    logger = pl.loggers.CSVLogger(tmp_path)
    # 4 batches an epoch, 3 epochs, logging every 3 steps: Lightning writes at steps 2, 5, 8 and 11.
    _trainer(tmp_path, max_epochs=3, logger=logger, log_every_n_steps=3, callbacks=[probe]).fit(_Linear())
    assert [step for _, step in probe.seen] == list(range(12))
    with open(tmp_path / "lightning_logs/version_0/metrics.csv") as file:
        written = {int(row["step"]) for row in csv.DictReader(file)}
    assert {step for logging, step in probe.seen if logging} == written == {2, 5, 8, 11}


def test_raise_recompile_limit_sets_what_dynamo_reads():
    import torch._dynamo

    config = torch._dynamo.config
    before = config.recompile_limit
    try:
        assert raise_recompile_limit(before + 5) == before + 5 == config.recompile_limit
        assert raise_recompile_limit(1) == before + 5  # never lowered
    finally:
        config.recompile_limit = before


class _GrowingEpochs(_Linear):
    """Epoch e has 2 * (e + 1) batches (as multigrid epochs differ); records (epoch, batch_idx) and LRs."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, int, float]] = []

    def training_step(self, batch, batch_idx):
        self.seen.append((self.current_epoch, batch_idx, self.trainer.optimizers[0].param_groups[0]["lr"]))
        return super().training_step(batch, batch_idx)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.zeros(4 * (self.trainer.current_epoch + 1), 2)), batch_size=2)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return {"optimizer": optimizer, "lr_scheduler": MultiStepLR(optimizer, [1, 2], gamma=0.5)}


class _Finish(pl.Callback):
    def __init__(self) -> None:
        self.applied: list[bool] = []

    def on_train_start(self, trainer, pl_module):
        self.applied.append(finish_epoch_saved_at_its_last_batch(trainer))


class _StopAt(pl.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == 2:
            raise RuntimeError("stopped")


@pytest.mark.filterwarnings("ignore:.*(callbacks used to create the checkpoint|dataloader is not resumable).*")
@pytest.mark.parametrize("finish", [True, False])
def test_finish_epoch_saved_at_its_last_batch_starts_the_longer_next_epoch_at_batch_0(tmp_path, finish):
    # A checkpoint after the last of epoch 0's 2 batches; epoch 1 has 4. Lightning alone resumes it
    # at batch 2 of epoch 1 (it compares the 2 batches done with the new epoch's 4). The epoch
    # scheduler stepped for epoch 0's end before the save: once (0.1 -> 0.05), not twice.
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    with pytest.raises(RuntimeError, match="stopped"):
        _trainer(tmp_path, max_epochs=2, enable_checkpointing=True, reload_dataloaders_every_n_epochs=1,
                 callbacks=[checkpoint, _StopAt()]).fit(_GrowingEpochs())
    resumed, callback = _GrowingEpochs(), _Finish()
    _trainer(tmp_path, max_epochs=2, reload_dataloaders_every_n_epochs=1, callbacks=[callback] if finish else []).fit(
        resumed, ckpt_path=str(tmp_path / "epoch=0-step=2.ckpt"))
    if finish:
        assert callback.applied == [True]
        assert resumed.seen == [(1, 0, 0.05), (1, 1, 0.05), (1, 2, 0.05), (1, 3, 0.05)]
    else:  # what the function makes up for; if this fails, Lightning fixed it
        assert resumed.seen == [(1, 2, 0.05), (1, 3, 0.05)]


def test_watch_train_fetches_sees_each_fetch_of_a_training_batch_before_its_step(tmp_path):
    events: list[str] = []

    class Order(pl.Callback):
        def on_fit_start(self, trainer, pl_module):
            self.undo = watch_train_fetches(trainer, lambda: events.append("fetch"))

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            events.append("step")

    order = Order()
    trainer = _trainer(tmp_path, max_epochs=2, limit_val_batches=0, callbacks=[order])
    trainer.fit(_Linear())
    # 4 batches an epoch, each fetched just before its step (a sized loader: no fetch past its end).
    assert events == ["fetch", "step"] * 8
    order.undo()
    assert "_on_before_fetch" not in vars(trainer.fit_loop.epoch_loop)
