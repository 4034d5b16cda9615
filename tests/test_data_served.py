"""What the DataModule holds, without a Trainer: the readers' `encoded`, the Trainer's facts, the served
datasets, and the split sources built by keyword."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lightning_multigrid.data.decoding.readers import FrameFolderReader, InMemoryReader, VideoFileReader
from lightning_multigrid.data.reader_settings import ReaderSettings
from lightning_multigrid.data.served_datasets import ServedDatasets
from lightning_multigrid.data.splits import SplitSources
from lightning_multigrid.data.trainer_facts import TrainerFacts, trainer_facts
from lightning_multigrid.grid import ClipSampling, EvalViews, FixedGrid, GridShape


def test_each_reader_says_whether_its_clips_leave_as_jpeg_bytes() -> None:
    assert VideoFileReader().encoded is False and InMemoryReader().encoded is False
    assert FrameFolderReader().encoded is False
    assert FrameFolderReader(frame_decode="device").encoded is True


def test_trainer_facts_without_a_trainer_are_the_single_process_start() -> None:
    assert trainer_facts(None) == TrainerFacts(epoch=0, rank=0, world_size=1, start_iteration=0, resumed=False, device=None)
    stand_in = SimpleNamespace(current_epoch=2, global_rank=1, world_size=4, strategy=SimpleNamespace(root_device=torch.device("cpu")))
    assert trainer_facts(stand_in) == TrainerFacts(2, 1, 4, 0, True, torch.device("cpu"))  # epoch 2: a restored position


def test_served_datasets_name_the_splits_given_and_the_stage_that_reads_each() -> None:
    datasets = ServedDatasets()
    given: object = SimpleNamespace(reader=None)
    assert datasets.use(None, given, None) == ["val"]  # type: ignore[arg-type]
    assert datasets.require_eval("val") is given
    with pytest.raises(RuntimeError, match=r"`test_dataloader\(\)` needs `setup\('test'\)` first"):
        datasets.require_eval("test")
    with pytest.raises(RuntimeError, match=r"The training set is read in `setup\('fit'\)`"):
        datasets.require_train()
    with pytest.raises(ValueError, match="supports fit, validate and test, got stage 'predict'"):
        datasets.read("predict", None)  # type: ignore[arg-type]


def test_split_sources_are_built_by_keyword() -> None:
    fields = dict(
        train_manifest="train.txt", val_manifest=None, test_manifest=None, root_dir=None, class_names=None,
        manifest_kind="auto", reader_settings=ReaderSettings(), flip=True, strict=False, slowfast_alpha=None,
        baseline=FixedGrid(GridShape(2, 4, 32), ClipSampling(2)), views=EvalViews(),
    )
    assert SplitSources(**fields).train_manifest == "train.txt"  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        SplitSources(*fields.values())  # type: ignore[misc]
