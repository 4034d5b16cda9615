"""One owner for the class facts, splits kept apart, swapped datasets served, pathways agreed:
real folder-per-class trees of H.264 videos, real JPEG frame folders, a real Trainer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from lightning_multigrid._lightning import pl
from lightning_multigrid.cli.commands import main
from lightning_multigrid.data.datamodule import MultigridVideoDataModule
from lightning_multigrid.data.dataset import EvalVideoDataset, TrainVideoDataset
from lightning_multigrid.data.manifests.entries import ManifestError, read_class_names
from lightning_multigrid.data.sources import load_manifest
from lightning_multigrid.data.synthetic import SyntheticDataset
from lightning_multigrid.data.tools.extract import extract_frames
from lightning_multigrid.grid import ClipSampling, GridShape
from lightning_multigrid.module import VideoClassifier

from conftest import VideoFactory

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*(does not have many workers|too few batches|smaller than the logging)"),
    pytest.mark.filterwarnings("ignore:No positive samples found in target"),  # a class no val video has
]

BASE: dict[str, Any] = dict(batch_size=2, num_frames=4, crop_size=32, sampling_rate=1, num_workers=0, flip=False)


def class_tree(videos: VideoFactory, split: str, classes: tuple[str, ...], num_frames: int = 6) -> Path:
    """``videos/<split>/<class>/<split>_<class>.mp4``: one real H.264 video per class."""
    root = videos.directory / "videos" / split
    for name in classes:
        (root / name).mkdir(parents=True)
        videos.coded(f"videos/{split}/{name}/{split}_{name}.mp4", num_frames=num_frames)
    return root


class Recorder(pl.LightningModule):
    """A tiny 3D CNN recording the labels each split's batches carry, per video path."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv3d(3, 4, 3, padding=1), nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(4, num_classes))
        self.labels: dict[str, list[tuple[int, int]]] = {"train": [], "val": [], "test": []}

    def forward(self, video: torch.Tensor) -> torch.Tensor:
        return self.net(video)

    def _record(self, split: str, batch: dict[str, Any]) -> torch.Tensor:
        self.labels[split] += list(zip(batch["index"].tolist(), batch["label"].tolist()))
        return nn.functional.cross_entropy(self(batch["video"]), batch["label"])

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        return self._record("train", batch)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._record("val", batch)

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._record("test", batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def make_trainer(**kwargs: Any) -> pl.Trainer:
    options: dict[str, Any] = dict(
        max_epochs=1, accelerator="cpu", num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    return pl.Trainer(**{**options, **kwargs})


def labels_by_name(dataset: TrainVideoDataset | EvalVideoDataset, recorded: list[tuple[int, int]]) -> dict[str, int]:
    """Recorded ``(video index, label)`` pairs as ``{video file stem: label}``."""
    return {Path(dataset.manifest.entries[i].path).stem: label for i, label in recorded}


# ---------------------------------------------------------------------------- 1. one owner for the classes


def test_a_validation_split_lacking_a_class_keeps_the_training_labels(videos: VideoFactory) -> None:
    """Issue 27.1: val/ without `b` numbered `c` as 1 where training numbers it 2 (validation scored shifted labels)."""
    train = class_tree(videos, "train", ("a", "b", "c"))
    val = class_tree(videos, "val", ("a", "c"))
    datamodule = MultigridVideoDataModule(train_manifest=str(train), val_manifest=str(val), **BASE)
    model = Recorder(datamodule.num_classes)
    trainer = make_trainer()
    trainer.fit(model, datamodule=datamodule)
    trainer.test(model, datamodule=datamodule)
    assert datamodule.num_classes == 3
    val_set = datamodule.val_dataloader().dataset
    assert val_set.class_names == ("a", "b", "c") and val_set.num_classes == 3
    assert labels_by_name(val_set, model.labels["val"]) == {"val_a": 0, "val_c": 2}
    assert labels_by_name(datamodule.test_dataloader().dataset, model.labels["test"]) == {"val_a": 0, "val_c": 2}
    assert labels_by_name(datamodule.train_dataloader().dataset, model.labels["train"]) == {
        "train_a": 0, "train_b": 1, "train_c": 2
    }


def test_a_validation_class_training_lacks_is_refused_before_the_first_step(videos: VideoFactory) -> None:
    train = class_tree(videos, "train", ("a", "b"))
    val = class_tree(videos, "val", ("a", "zebra"))
    datamodule = MultigridVideoDataModule(train_manifest=str(train), val_manifest=str(val), **BASE)
    model = Recorder(2)
    trainer = make_trainer()
    with pytest.raises(ManifestError, match=r"`val_manifest` video .*val_zebra.mp4 is of class 'zebra', which the training "
                       r"data \(.*train: 2 classes \('a', 'b'\), single-label\) lacks. Add training videos of that class, "
                       r"or leave that class out of `val_manifest`."):
        trainer.fit(model, datamodule=datamodule)
    assert model.labels["train"] == [] and trainer.global_step == 0
    # trainer.validate and trainer.test map onto the training classes too.
    with pytest.raises(ManifestError, match="is of class 'zebra'"):
        trainer.validate(model, datamodule=MultigridVideoDataModule(train_manifest=str(train), val_manifest=str(val), **BASE))


@pytest.mark.parametrize("val_lines", ["few_classes", "one_label_per_line"])
def test_multi_label_validation_gets_the_training_width(videos: VideoFactory, tmp_path: Path, val_lines: str) -> None:
    """Issue 27.1: a multi-label val manifest with fewer classes (or one label per line, as the Charades
    config's class-names file allows) built multi-hots of another width and died at the first validation."""
    for i in range(4):
        videos.coded(f"v{i}.mp4", num_frames=6)
    (tmp_path / "train.csv").write_text("v0.mp4 0,4\nv1.mp4 1,3\nv2.mp4 2\nv3.mp4 3,4\n")
    if val_lines == "few_classes":  # no class-names file: val alone would count 3 classes
        (tmp_path / "val.csv").write_text("v0.mp4 0,2\nv1.mp4 1\n")
        names = None
    else:  # a class-names file, one label per line: val alone would be single-label
        (tmp_path / "classnames.txt").write_text("walk\nsit\nstand\nopen\nclose\n")
        (tmp_path / "val.csv").write_text("v0.mp4 walk\nv1.mp4 close\n")
        names = str(tmp_path / "classnames.txt")
    datamodule = MultigridVideoDataModule(
        train_manifest=str(tmp_path / "train.csv"), val_manifest=str(tmp_path / "val.csv"), class_names=names, **BASE
    )
    model = VideoClassifier(num_classes=datamodule.num_classes, multi_label=True, tiny_width=4, lr=0.01)
    trainer = make_trainer(limit_train_batches=1)
    trainer.fit(model, datamodule=datamodule)
    assert "val/map" in trainer.callback_metrics  # validated, with multi-hots of the model's width
    trainer.test(model, datamodule=datamodule)
    predictions = model.test_predictions
    assert predictions is not None and predictions.labels.shape == (2, 5)
    expected = [[1, 0, 1, 0, 0], [0, 1, 0, 0, 0]] if val_lines == "few_classes" else [[1, 0, 0, 0, 0], [0, 0, 0, 0, 1]]
    assert predictions.labels.tolist() == expected


def test_a_multi_label_validation_video_against_single_label_training_is_refused(videos: VideoFactory, tmp_path: Path) -> None:
    for i in range(2):
        videos.coded(f"v{i}.mp4", num_frames=6)
    (tmp_path / "train.csv").write_text("v0.mp4 0\nv1.mp4 1\n")
    (tmp_path / "val.csv").write_text("v0.mp4 0\nv1.mp4 0,1\n")
    datamodule = MultigridVideoDataModule(train_manifest=str(tmp_path / "train.csv"), val_manifest=str(tmp_path / "val.csv"), **BASE)
    with pytest.raises(ManifestError, match=r"val.csv:2: `val_manifest` video .*v1.mp4 has 2 labels \[0, 1\], but the "
                       r"training data .*train.csv\) is single-label"):
        datamodule.setup("fit")


def test_extract_frames_never_renumbers_another_splits_classes(videos: VideoFactory, tmp_path: Path) -> None:
    """Issue 27.1: extracting val/ (lacking `b`) rewrote classnames.txt to `a, c` and numbered `c` as 1."""
    train = class_tree(videos, "train", ("a", "b", "c"))
    val = class_tree(videos, "val", ("a", "c"))
    out = tmp_path / "frames"
    for split in (val, train):  # val first: the harder order
        main(["extract-frames", str(split), str(out), "--manifest-name", f"{split.name}.txt", "--workers", "1", "--no-progress"])
    names = read_class_names(out / "classnames.txt")
    assert names == ("a", "c", "b")  # val's two, then the one training adds: no index ever moves
    datamodule = MultigridVideoDataModule(
        train_manifest=str(out / "train.txt"), val_manifest=str(out / "val.txt"), class_names=str(out / "classnames.txt"), **BASE
    )
    datamodule.setup("fit")
    val_set, train_set = datamodule.val_dataloader().dataset, datamodule._datasets.train
    assert train_set is not None
    by_name = {Path(e.path).name: names[e.labels[0]] for e in (*train_set.manifest.entries, *val_set.manifest.entries)}
    assert by_name == {"train_a": "a", "train_b": "b", "train_c": "c", "val_a": "a", "val_c": "c"}


# ---------------------------------------------------------------------------- 2. extract-frames keeps splits apart


def test_two_manifests_with_the_same_video_names_never_share_frame_folders(videos: VideoFactory, tmp_path: Path) -> None:
    """Issue 27.2: val (absolute paths) reported "2 already done" and pointed at train's frames."""
    train = class_tree(videos, "train", ("a", "b"), num_frames=6)
    val = class_tree(videos, "val", ("a", "b"), num_frames=10)
    for split in (train, val):  # same file names in both splits
        for name in ("a", "b"):
            (split / name / f"{split.name}_{name}.mp4").rename(split / name / f"clip_{name}.mp4")
    lists = tmp_path / "lists"
    lists.mkdir()
    for split in (train, val):
        (lists / f"{split.name}.csv").write_text("".join(f"{split / n / f'clip_{n}.mp4'} {k}\n" for k, n in enumerate("ab")))
    out = tmp_path / "frames"
    first = extract_frames(load_manifest(lists / "train.csv"), out, workers=1, progress=False)
    assert first.manifest.read_text() == "a/clip_a 0 6\nb/clip_b 1 6\n"
    with pytest.raises(ValueError, match=rf"The frame folder {out / 'a/clip_a'} holds the frames of video "
                       rf"{train / 'a/clip_a.mp4'} \(extracted earlier\), not of {val / 'a/clip_a.mp4'}: .* Extract each "
                       r"manifest into its own `output_dir`"):
        extract_frames(load_manifest(lists / "val.csv"), out, workers=1, progress=False)
    assert not (out / "val.txt").exists()
    assert len(list((out / "a/clip_a").glob("img_*.jpg"))) == 6  # train's frames untouched
    # Each split in its own output: val's own 10 frames.
    report = extract_frames(load_manifest(lists / "val.csv"), tmp_path / "val_frames", workers=1, progress=False)
    assert report.manifest.read_text() == "a/clip_a 0 10\nb/clip_b 1 10\n"


def test_an_output_inside_the_video_root_is_never_a_class(videos: VideoFactory) -> None:
    """Issue 27.2: extracting into train/frames then training on train/ made `frames` a class, so train
    and val disagreed on every later class."""
    train = class_tree(videos, "train", ("a", "surfing"))
    val = class_tree(videos, "val", ("a", "surfing"))
    main(["extract-frames", str(train), str(train / "frames"), "--workers", "1", "--no-progress"])
    datamodule = MultigridVideoDataModule(train_manifest=str(train), val_manifest=str(val), **BASE)
    model = Recorder(datamodule.num_classes)
    trainer = make_trainer()
    trainer.fit(model, datamodule=datamodule)
    assert datamodule.num_classes == 2
    assert labels_by_name(datamodule.train_dataloader().dataset, model.labels["train"]) == {"train_a": 0, "train_surfing": 1}
    assert labels_by_name(datamodule.val_dataloader().dataset, model.labels["val"]) == {"val_a": 0, "val_surfing": 1}


# ---------------------------------------------------------------------------- 3, 7. swapped datasets, repeated test


def test_swapped_datasets_are_served_and_test_runs_twice(synthetic_dataset: SyntheticDataset, tmp_path: Path) -> None:
    """Issue 27.3: after `use_datasets`, trainer.test evaluated the old test set and a second fit trained on
    the old training set (cached loaders). Issue 27.7: a second trainer.test() raised UnboundLocalError."""
    names = str(synthetic_dataset.class_names_file)
    datamodule = MultigridVideoDataModule(
        train_manifest=str(synthetic_dataset.train_manifest), val_manifest=str(synthetic_dataset.val_manifest),
        class_names=names, **{**BASE, "num_frames": 4, "sampling_rate": 2},
    )
    model = Recorder(4)
    trainer = make_trainer(limit_train_batches=3, limit_val_batches=1)
    trainer.fit(model, datamodule=datamodule)
    trainer.test(model, datamodule=datamodule)
    trainer.test(model, datamodule=datamodule)  # twice: setup("test") again
    assert len(model.labels["test"]) == 2 * 8

    root = synthetic_dataset.root
    lines = synthetic_dataset.val_manifest.read_text().splitlines()
    (tmp_path / "small_test.csv").write_text("".join(f"{root / line}\n" for line in lines[:3]))
    test = EvalVideoDataset(str(tmp_path / "small_test.csv"), base_shape=GridShape(1, 4, 32),
                            clip_sampling=ClipSampling(2, (32, 32)), class_names=names)
    train_lines = synthetic_dataset.train_manifest.read_text().splitlines()
    (tmp_path / "small_train.csv").write_text("".join(f"{root / line}\n" for line in train_lines[:4]))
    train = TrainVideoDataset(str(tmp_path / "small_train.csv"), class_names=names, flip=False)
    datamodule.use_datasets(train=train, test=test)

    model.labels = {"train": [], "val": [], "test": []}
    trainer.test(model, datamodule=datamodule)
    assert len(model.labels["test"]) == 3 and datamodule.test_dataloader().dataset is test
    second = make_trainer(max_epochs=1, limit_val_batches=1)
    second.fit(model, datamodule=datamodule)
    assert datamodule.train_dataloader().dataset is train
    assert sorted(i for i, _ in model.labels["train"]) == [0, 1, 2, 3]  # the 4 new videos, one epoch


def test_a_swapped_validation_set_with_other_classes_is_refused(synthetic_dataset: SyntheticDataset, videos: VideoFactory) -> None:
    datamodule = MultigridVideoDataModule(
        train_manifest=str(synthetic_dataset.train_manifest), val_manifest=str(synthetic_dataset.val_manifest),
        class_names=str(synthetic_dataset.class_names_file), **BASE,
    )
    # Integer labels, built without the class-names file: the same targets, accepted.
    same = EvalVideoDataset(str(synthetic_dataset.val_manifest), base_shape=GridShape(1, 4, 32),
                            clip_sampling=ClipSampling(1, (32, 32)))
    datamodule.use_datasets(val=same)
    datamodule.setup("fit")
    other = class_tree(videos, "val", ("x", "y"))
    datamodule.use_datasets(
        val=EvalVideoDataset(str(other), base_shape=GridShape(1, 4, 32), clip_sampling=ClipSampling(1, (32, 32)))
    )
    with pytest.raises(ManifestError, match=r"`val_manifest` video .*val_x.mp4 is of class 'x', which the training data"):
        datamodule.setup("fit")


def test_a_swapped_multi_label_validation_set_of_another_width_is_refused(videos: VideoFactory, tmp_path: Path) -> None:
    for i in range(2):
        videos.coded(f"v{i}.mp4", num_frames=6)
    (tmp_path / "train.csv").write_text("v0.mp4 0,4\nv1.mp4 1\n")
    (tmp_path / "val.csv").write_text("v0.mp4 0,2\nv1.mp4 1\n")
    datamodule = MultigridVideoDataModule(train_manifest=str(tmp_path / "train.csv"), **BASE)
    datamodule.use_datasets(val=EvalVideoDataset(
        str(tmp_path / "val.csv"), base_shape=GridShape(1, 4, 32), clip_sampling=ClipSampling(1, (32, 32))
    ))
    with pytest.raises(ManifestError, match=r"`val_manifest` dataset .*val.csv has 3 classes, multi-label, the training "
                       r"dataset .*train.csv 5 classes, multi-label: .* Build it on the training classes: pass "
                       r"`lightning_multigrid.data.manifests.classes.align_classes\("):
        datamodule.setup("fit")


# ---------------------------------------------------------------------------- 8. pathways agreed


class TwoPathways(nn.Module):
    """A tiny two-pathway model: takes ``[slow, fast]``, pools each, one linear head."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.head = nn.Linear(6, num_classes)

    def forward(self, pathways: list[torch.Tensor]) -> torch.Tensor:
        return self.head(torch.cat([p.mean(dim=(2, 3, 4)) for p in pathways], dim=1))


@pytest.mark.parametrize(
    ("backbone", "model_alpha", "match"),
    [
        ("module", 2, r"The DataModule's `slowfast_alpha`=4 splits .* but the model's `slowfast_alpha` is 2: set both"),
        ("tiny", None, r"The DataModule's `slowfast_alpha`=4 splits clips into \[slow, fast\], but the model takes one clip"),
    ],
)
def test_a_data_slowfast_alpha_other_than_the_models_is_refused_before_the_first_step(
    synthetic_dataset: SyntheticDataset, backbone: str, model_alpha: int | None, match: str
) -> None:
    """Issue 27.8: a TypeError at step 0 (one-pathway model), or silent training with the data's alpha."""
    def make(data_alpha: int | None, alpha: int | None) -> tuple[MultigridVideoDataModule, VideoClassifier]:
        datamodule = MultigridVideoDataModule(
            train_manifest=str(synthetic_dataset.train_manifest), val_manifest=str(synthetic_dataset.val_manifest),
            slowfast_alpha=data_alpha, **BASE,
        )
        module = TwoPathways(4) if backbone == "module" else "tiny"
        return datamodule, VideoClassifier(num_classes=4, backbone=module, slowfast_alpha=alpha, tiny_width=4, lr=0.01)

    trainer = make_trainer(limit_train_batches=1, limit_val_batches=1)
    datamodule, model = make(4, model_alpha)
    with pytest.raises(ValueError, match=match):
        trainer.fit(model, datamodule=datamodule)
    assert trainer.global_step == 0
    # Agreeing settings train: the data splits with the model's alpha, or the model splits itself.
    for data_alpha, alpha in ((model_alpha, model_alpha), (None, model_alpha)):
        agreed = make_trainer(limit_train_batches=1, limit_val_batches=1)
        datamodule, model = make(data_alpha, alpha)
        agreed.fit(model, datamodule=datamodule)
        assert agreed.global_step == 1
