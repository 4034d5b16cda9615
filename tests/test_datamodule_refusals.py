"""Settings that would fail late (0 steps with `drop_last`, a validation label the training set
lacks) are refused before the first step, on real files and a real Trainer."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
from test_datamodule import BASE, TinyVideoNet, make_datamodule, make_schedule

from lightning_multigrid import MultigridCallback
from lightning_multigrid._lightning import pl
from lightning_multigrid.data.datamodule import MultigridVideoDataModule
from lightning_multigrid.data.manifests.entries import ManifestError
from lightning_multigrid.data.synthetic import SyntheticDataset


def fit(datamodule: MultigridVideoDataModule, model: TinyVideoNet, **callback: Any) -> pl.Trainer:
    trainer = pl.Trainer(
        max_epochs=4, accelerator="cpu", limit_val_batches=1, num_sanity_val_steps=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[MultigridCallback(**callback)],
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(does not have many workers|too few batches|ShortSchedule).*")
        trainer.fit(model, datamodule=datamodule)
    return trainer


def test_drop_last_with_batches_larger_than_the_dataset_is_refused_before_the_first_step(
    synthetic_dataset: SyntheticDataset,
) -> None:
    """Failure 9: the multigrid run returned after 0 steps (its first batches need more clips than there are)."""
    datamodule = MultigridVideoDataModule(
        train_manifest=str(synthetic_dataset.train_manifest), val_manifest=str(synthetic_dataset.val_manifest),
        num_workers=0, flip=False, drop_last=True, **{**BASE, "batch_size": 4},
    )
    model = TinyVideoNet()
    with pytest.raises(ValueError, match=r"`drop_last=True` leaves epochs 0-\d+ without a batch: .* 16 training "
                       r"clips, so training would stop there after 0 steps. Set `drop_last=False`"):
        fit(datamodule, model)
    assert model.seen == []


def test_drop_last_that_leaves_batches_trains(synthetic_dataset: SyntheticDataset) -> None:
    datamodule = make_datamodule(synthetic_dataset, drop_last=True)
    datamodule.serve(make_schedule())  # 16 clips fill at least one batch of every grid


def test_validation_label_outside_the_training_classes_is_refused_in_setup(
    synthetic_dataset: SyntheticDataset, tmp_path: Path
) -> None:
    """Failure 10: an IndexError at the first validation, naming no file or line."""
    root = synthetic_dataset.root
    lines = synthetic_dataset.val_manifest.read_text().splitlines()
    path, _ = lines[2].rsplit(maxsplit=1)
    lines[2] = f"{path} 7"
    val = tmp_path / "val.csv"
    val.write_text("".join(f"{root / line}\n" for line in lines))
    datamodule = MultigridVideoDataModule(
        train_manifest=str(synthetic_dataset.train_manifest), val_manifest=str(val), num_workers=0, **BASE
    )
    with pytest.raises(ManifestError, match=rf"{val}:3: `val_manifest` label 7 of .* is not one of the 4 training "
                       r"classes \(0-3, from .*train.csv\): fix the label"):
        datamodule.setup("fit")


@pytest.mark.parametrize("name", ["strict", "drop_last", "pin_memory", "persistent_workers", "chunk_batches", "flip"])
def test_switches_accept_only_real_booleans(name: str) -> None:
    """A string such as "false" would count as true (and `drop_last="false"` drop batches)."""
    with pytest.raises(ValueError, match=f"`{name}` must be True or False"):
        MultigridVideoDataModule(train_manifest="any.txt", **{name: "false"})
