"""The built-in synthetic dataset trained from packed frame stores (`SyntheticData(format="store")`)."""

from __future__ import annotations

import encodings.utf_8_sig  # noqa: F401 -- imported before a block runs as a user who cannot read the stdlib
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from test_data_frame_layouts import as_other_user

from lightning_multigrid._lightning import pl
from lightning_multigrid.callback import MultigridCallback
from lightning_multigrid.data.datamodule import MultigridVideoDataModule
from lightning_multigrid.data.store.format import FrameStore
from lightning_multigrid.data.store.reader import PackedFrameReader
from lightning_multigrid.data.synthetic import SyntheticData
from lightning_multigrid.module import VideoClassifier


def _datamodule(root: Path, data_format: str = "mp4", seed: int = 0) -> MultigridVideoDataModule:
    return MultigridVideoDataModule(
        synthetic=SyntheticData(str(root), size=(8, 4), format=data_format),  # type: ignore[arg-type]
        batch_size=2, num_frames=4, crop_size=32, sampling_rate=1, num_workers=0, seed=seed,
    )


def test_the_synthetic_videos_are_packed_once_and_trained_from(tmp_path: Path) -> None:
    datamodule = _datamodule(tmp_path, "store")
    # Level 0 at the jitter maximum for a 32 crop: 32 * 320 / 224 = 45.7 -> 46 px.
    assert Path(datamodule.train_manifest).name == "train-L46.store" and datamodule.class_names is None
    model = VideoClassifier(num_classes=4, backbone="tiny", tiny_width=2, lr=0.01, milestones=[3])
    trainer = pl.Trainer(max_epochs=4, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         callbacks=[MultigridCallback(precise_bn_batches=0, preflight=False)])
    trainer.fit(model, datamodule=datamodule)
    assert trainer.global_step > 0
    assert isinstance(datamodule._datasets.train.reader, PackedFrameReader)
    assert datamodule._datasets.val.manifest.format == "store"
    header = Path(datamodule.train_manifest) / "store.json"
    packed_at = header.stat().st_mtime_ns
    _datamodule(tmp_path, "store").prepare_data()
    assert header.stat().st_mtime_ns == packed_at  # complete and packed from these videos: not packed again
    _datamodule(tmp_path, "store", seed=1).prepare_data()  # the dataset written again (another seed), then packed
    assert header.stat().st_mtime_ns > packed_at


def test_a_copied_dataset_uses_its_stores_also_on_a_read_only_disk(tmp_path: Path) -> None:
    """Issue 41, item 6: `cp -r` lands the manifests after the stores (packed again by file times), and a
    read-only copy failed writing `.packing`. Staleness is the content's: the digest the store records."""
    _datamodule(tmp_path / "original", "store").prepare_data()
    with tempfile.TemporaryDirectory() as shared:
        os.chmod(shared, 0o755)  # reachable by the other user
        copy = Path(shared) / "copy"
        shutil.copytree(tmp_path / "original", copy, copy_function=shutil.copy)  # new times, as `cp -r`
        later = time.time_ns() + 10**9
        for name in ("train.csv", "val.csv", "classnames.txt", "synthetic.json"):
            os.utime(copy / name, ns=(later, later))  # the manifests landed after the stores
        tokens = {store: FrameStore(copy / store).token for store in ("train-L46.store", "val-L46.store")}
        for path in [copy, *copy.rglob("*")]:
            os.chmod(path, 0o555 if path.is_dir() else 0o444)
        with as_other_user():
            datamodule = _datamodule(copy, "store")
            datamodule.prepare_data()
            datamodule.setup("fit")
            batch = next(iter(datamodule.train_dataloader()))
            datamodule.teardown("fit")
            datamodule._datasets.train.reader.store.close()
            datamodule._datasets.val.reader.store.close()
        assert batch["video"].shape == (2, 3, 4, 32, 32)
        assert {store: FrameStore(copy / store).token for store in tokens} == tokens  # not packed again
        assert not list(copy.rglob(".packing"))


def test_the_same_clips_as_the_videos_within_resampling(tmp_path: Path) -> None:
    videos, store = _datamodule(tmp_path), _datamodule(tmp_path, "store")
    for datamodule in (videos, store):
        datamodule.prepare_data()
        datamodule.setup("fit")
    request = next(iter(videos.train_dataloader().batch_sampler))[0]
    from_videos = videos._datasets.train[request]["video"].float()
    from_store = store._datasets.train[request]["video"].float()
    assert from_videos.shape == from_store.shape
    assert (from_videos - from_store).abs().mean() < 12  # mp4 decoded, then JPEG at 46 px: grey levels
    assert videos._datasets.train[request]["label"] == store._datasets.train[request]["label"]


@pytest.mark.parametrize(
    ("given", "match"),
    [
        ({"format": "jpeg"}, "`synthetic.format` must be 'mp4' or 'store', got 'jpeg'"),
        ({"size": (0, 4)}, r"`synthetic.size` must be \(train, val\) video counts >= 1"),
        ({"size": (8,)}, r"`synthetic.size` must be \(train, val\)"),
        ({"texture_cell": 0}, "`synthetic.texture_cell`"),
    ],
)
def test_synthetic_settings_are_checked(tmp_path: Path, given: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SyntheticData(str(tmp_path), **given)


def test_the_first_use_says_what_it_writes_and_packs_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _datamodule(tmp_path, "store").prepare_data()
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"writing 12 synthetic videos to {tmp_path} ..."
    assert re.fullmatch(r"wrote 12 synthetic videos in \d+\.\d s", lines[1])
    assert lines[2] == f"packing the synthetic videos of {tmp_path} into frame stores for crop 32 ..."
    assert re.fullmatch(r"packed the frame stores in \d+\.\d s", lines[3]) and len(lines) == 4  # not per video
    _datamodule(tmp_path, "store").prepare_data()
    assert capsys.readouterr().err == ""  # there already: nothing to say
