"""Checkpoints of a Python-API run load under torch's weights-only loader (Lightning's default), also
without this package imported: the DataModule's and the module's hyper-parameters are plain values
(issue 35, item 1). A real Trainer fits `VideoClassifier` with `MultigridCallback` on real H.264
videos, then the checkpoint is resumed, validated, loaded and used as `weights`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_multigrid import EvalViews, MultigridCallback, MultigridVideoDataModule, VideoClassifier
from lightning_multigrid._checks import check_value, plain_value
from lightning_multigrid._lightning import pl
from lightning_multigrid.data.reader_settings import ReaderSettings
from lightning_multigrid.data.synthetic import SyntheticData, SyntheticDataset
from lightning_multigrid.grid import GridShape
from lightning_multigrid.schedule.config import MultigridOptions, ShortRun

BASE: dict[str, Any] = dict(batch_size=2, num_frames=4, crop_size=32, sampling_rate=2, num_workers=0, flip=False)


def trainer(tmp_path: Path | None = None) -> pl.Trainer:
    """Saves `tmp_path/ckpt/last.ckpt` when given ``tmp_path``."""
    saving = [pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)] if tmp_path is not None else []
    return pl.Trainer(
        max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_train_batches=2, limit_val_batches=1, enable_checkpointing=bool(saving),
        callbacks=[MultigridCallback(precise_bn_batches=0), *saving],
    )


def grouped_settings(data: SyntheticDataset, tmp_path: Path) -> dict[str, Any]:
    return dict(
        train_manifest=data.train_manifest, val_manifest=data.val_manifest, root_dir=data.root,  # paths, not strings
        reader_settings=ReaderSettings(interpolation="AREA"), eval_views=EvalViews(num_views=2),
    )


def synthetic(data: SyntheticDataset, tmp_path: Path) -> dict[str, Any]:
    return dict(synthetic=SyntheticData(tmp_path / "synthetic", size=(4, 2)))  # type: ignore[arg-type]  # a Path


@pytest.mark.parametrize("settings", [grouped_settings, synthetic])
def test_a_python_api_checkpoint_resumes_validates_and_loads(synthetic_dataset, tmp_path: Path, settings: Any) -> None:
    given = settings(synthetic_dataset, tmp_path)
    datamodule = MultigridVideoDataModule(**BASE, **given)
    model = VideoClassifier(num_classes=4, tiny_width=4, weights=None)
    trainer(tmp_path).fit(model, datamodule=datamodule)
    ckpt = str(tmp_path / "ckpt" / "last.ckpt")

    # Lightning's default loader, in a process that never imported this package.
    script = f"import sys, torch; torch.load({ckpt!r}); assert not any(m.startswith('lightning_multigrid') for m in sys.modules)"
    subprocess.run([sys.executable, "-c", script], check=True)

    trainer().fit(VideoClassifier(num_classes=4, tiny_width=4), datamodule=MultigridVideoDataModule(**BASE, **given),
                          ckpt_path=ckpt)  # the finished run: restored, nothing left to train
    trainer().validate(VideoClassifier(num_classes=4, tiny_width=4), datamodule=datamodule, ckpt_path=ckpt)
    loaded = MultigridVideoDataModule.load_from_checkpoint(ckpt)
    assert (loaded.reader_settings, loaded.eval_views, loaded.base_shape) == (
        datamodule.reader_settings, datamodule.eval_views, datamodule.base_shape
    )
    assert str(loaded.train_manifest) == str(datamodule.train_manifest)
    restored = VideoClassifier.load_from_checkpoint(ckpt)
    assert all(torch.equal(value, model.state_dict()[key]) for key, value in restored.state_dict().items())
    fine_tuned = VideoClassifier(num_classes=3, tiny_width=4, weights=ckpt)
    assert fine_tuned.pretrained


@pytest.mark.parametrize("value", [
    ReaderSettings(frame_decode="device", filename_tmpl="{video}_{:06d}.jpg"), EvalViews(3, 3),
    SyntheticData("/data/synthetic", size=(8, 4), format="store"), GridShape(2, 4, 32),
    MultigridOptions(short_run=ShortRun(0.3)),
])
def test_every_frozen_value_round_trips_through_plain_values(value: Any, tmp_path: Path) -> None:
    plain = plain_value(value)
    torch.save(plain, tmp_path / "plain.pt")
    assert torch.load(tmp_path / "plain.pt") == plain  # weights-only
    if not isinstance(value, MultigridOptions):  # the options rebuild their ShortRun with from_dict
        assert check_value("value", plain, type(value)) == value
    else:
        assert MultigridOptions.from_dict(plain) == value


def test_check_value_names_the_argument() -> None:
    with pytest.raises(TypeError, match="`eval_views` must be a EvalViews or None, got 3"):
        check_value("eval_views", 3, EvalViews, allow_none=True)
    with pytest.raises(ValueError, match="`num_crops` must be 1 or 3"):
        check_value("eval_views", {"num_views": 1, "num_crops": 2}, EvalViews)
