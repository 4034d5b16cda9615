"""MultigridVideoDataModule on real H.264 files: grids per iteration, loader reuse, ranks, bad videos."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

from lightning_multigrid._lightning import pl
from lightning_multigrid.data.datamodule import MultigridVideoDataModule
from lightning_multigrid.data.dataset import EvalVideoDataset, TrainVideoDataset
from lightning_multigrid.data.decoding.errors import VideoDecodeError
from lightning_multigrid.data.reader_settings import ReaderSettings
from lightning_multigrid.data.sampler import ShortCycleBatchSampler
from lightning_multigrid.data.synthetic import SyntheticData, SyntheticDataset
from lightning_multigrid.data.transfer import normalize_video
from lightning_multigrid.grid import ClipSampling, EvalViews, FixedGrid
from lightning_multigrid.schedule import GridShape, MultigridConfig, MultigridSchedule, build_schedule

# Base shape B=1, T=8, S=32, tau=2; the 16-video synthetic set gives 1 to 7 batches an epoch.
BASE: dict[str, Any] = dict(batch_size=1, num_frames=8, crop_size=32, sampling_rate=2)


def make_schedule(max_epochs: int = 4, devices: int = 1, **options: Any) -> MultigridSchedule:
    # max_epochs=4: epochs 0-2 at 2x23 (b=8), 3 at 4x23, 4 at 4x32, 5 at 8x32, short cycle on.
    config = MultigridConfig(
        base=GridShape(BASE["batch_size"], BASE["num_frames"], BASE["crop_size"]),
        sampling_rate=BASE["sampling_rate"], max_epochs=max_epochs, devices=devices, **options,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_schedule(config)


def make_datamodule(data: SyntheticDataset, rank: int = 0, world_size: int = 1, **overrides: Any) -> MultigridVideoDataModule:
    kwargs: dict[str, Any] = dict(
        train_manifest=str(data.train_manifest),
        val_manifest=str(data.val_manifest),
        class_names=str(data.class_names_file),
        num_workers=0,
        flip=False,
        seed=3,
        **BASE,
    )
    kwargs.update(overrides)
    datamodule = MultigridVideoDataModule(**kwargs)
    # What the DataModule reads from its Trainer; a real Trainer in the fit tests below.
    datamodule.trainer = SimpleNamespace(current_epoch=0, global_rank=rank, world_size=world_size)
    datamodule.setup("fit")
    return datamodule


def epoch_loader(datamodule: MultigridVideoDataModule, epoch: int) -> DataLoader[Any]:
    datamodule.trainer.current_epoch = epoch
    loader = datamodule.train_dataloader()
    loader.batch_sampler.sampler.set_epoch(epoch)  # type: ignore[union-attr]  # as Lightning does
    return loader


def expected_shape(schedule: MultigridSchedule, epoch: int, iteration: int) -> tuple[int, ...]:
    grid = schedule.grid_at(epoch, iteration)
    return (grid.batch_size, 3, grid.num_frames, grid.crop_size, grid.crop_size)


def test_train_loader_follows_the_schedule_every_epoch(synthetic_dataset: SyntheticDataset) -> None:
    schedule = make_schedule()
    datamodule = make_datamodule(synthetic_dataset)
    datamodule.serve(schedule)
    assert datamodule.plan is schedule
    loaders = []
    for epoch in range(schedule.max_epochs):
        loader = epoch_loader(datamodule, epoch)
        loaders.append(loader)
        batches = list(loader)
        assert len(batches) == len(loader) == schedule.iterations_in_epoch(epoch, 16)
        seen = []
        for i, batch in enumerate(batches):
            video = batch["video"]
            assert video.dtype == torch.uint8
            expected = expected_shape(schedule, epoch, i)
            if i < len(batches) - 1:
                assert tuple(video.shape) == expected
            else:  # the last batch may be partial
                assert tuple(video.shape[1:]) == expected[1:] and video.shape[0] <= expected[0]
            seen += batch["index"].tolist()
        assert sorted(seen) == list(range(16))
    # One loader object (and one set of persistent workers) through every shape change.
    assert all(loader is loaders[0] for loader in loaders)
    assert len({schedule.stage_at(epoch).shape for epoch in range(schedule.max_epochs)}) > 1


def test_cached_loader_reports_the_length_of_the_requested_epoch(synthetic_dataset: SyntheticDataset) -> None:
    # Lightning calls len() after train_dataloader() and before set_epoch(): it must be right.
    schedule = make_schedule(max_epochs=6, milestones=(4,))  # epochs 7 and 8 share the base shape
    datamodule = make_datamodule(synthetic_dataset)
    datamodule.serve(schedule)
    for epoch in (6, 7, 8):
        datamodule.trainer.current_epoch = epoch
        loader = datamodule.train_dataloader()
        assert len(loader) == schedule.iterations_in_epoch(epoch, 16)
        assert loader.batch_sampler.epoch == epoch  # type: ignore[union-attr]


def test_on_after_batch_transfer_normalises_on_the_device(synthetic_dataset: SyntheticDataset) -> None:
    datamodule = make_datamodule(synthetic_dataset, mean=(0.4, 0.5, 0.6), std=(0.2, 0.25, 0.3))
    batch = next(iter(datamodule.train_dataloader()))
    raw = batch["video"].clone()
    out = datamodule.on_after_batch_transfer(batch, 0)
    assert out["video"].dtype == torch.float32
    mean = torch.tensor([0.4, 0.5, 0.6]).view(3, 1, 1, 1)
    std = torch.tensor([0.2, 0.25, 0.3]).view(3, 1, 1, 1)
    torch.testing.assert_close(out["video"], (raw.float() / 255 - mean) / std)
    assert out["skipped"] == []  # the key stays, paths were collected


def test_normalize_video_two_pathways_and_float_input() -> None:
    slow = torch.full((2, 3, 2, 4, 4), 255, dtype=torch.uint8)
    fast = torch.zeros((2, 3, 8, 4, 4), dtype=torch.uint8)
    out = normalize_video([slow, fast], (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    assert isinstance(out, list)
    torch.testing.assert_close(out[0], torch.ones_like(out[0]))
    torch.testing.assert_close(out[1], -torch.ones_like(out[1]))
    halves = torch.full((1, 3, 1, 2, 2), 0.5)
    torch.testing.assert_close(normalize_video(halves, (0.5,) * 3, (0.5,) * 3), torch.zeros_like(halves))
    assert halves.eq(0.5).all()  # float input is not modified in place


def test_baseline_without_a_schedule(synthetic_dataset: SyntheticDataset) -> None:
    datamodule = make_datamodule(synthetic_dataset, batch_size=3)
    assert datamodule.plan == FixedGrid(GridShape(3, 8, 32), ClipSampling(sampling_rate=2))
    assert datamodule.base_shape == GridShape(3, 8, 32) and datamodule.clip_sampling.sampling_rate == 2
    assert datamodule.train_dataset_size == 16
    for epoch in (0, 5):
        loader = epoch_loader(datamodule, epoch)
        shapes = [tuple(b["video"].shape) for b in loader]
        assert len(shapes) == len(loader) == math.ceil(16 / 3)
        assert shapes == [(3, 3, 8, 32, 32)] * 5 + [(1, 3, 8, 32, 32)]
    assert epoch_loader(datamodule, 9) is loader  # one fixed shape: one loader


def test_two_ranks_same_length_same_shapes_disjoint_videos(synthetic_dataset: SyntheticDataset) -> None:
    schedule = make_schedule(devices=2)
    ranks = [make_datamodule(synthetic_dataset, rank=r, world_size=2) for r in range(2)]
    for datamodule in ranks:
        datamodule.serve(schedule)
    for epoch in (0, 3, 5):
        per_rank = [list(epoch_loader(dm, epoch)) for dm in ranks]
        assert len(per_rank[0]) == len(per_rank[1]) == schedule.iterations_in_epoch(epoch, 16)
        assert [b["video"].shape for b in per_rank[0]] == [b["video"].shape for b in per_rank[1]]
        indices = [i for batches in per_rank for b in batches for i in b["index"].tolist()]
        assert sorted(indices) == list(range(16))  # 16 videos, 8 per rank, no padding needed


def test_validation_and_test_views_sharded_over_ranks(synthetic_dataset: SyntheticDataset) -> None:
    ranks = [
        make_datamodule(synthetic_dataset, rank=r, world_size=2, batch_size=4, eval_views=EvalViews(2, 3))
        for r in range(2)
    ]
    seen = []
    for datamodule in ranks:
        loader = datamodule.val_dataloader()
        assert isinstance(loader, DataLoader)
        assert datamodule.val_dataloader() is loader  # reused, so persistent workers survive
        for batch in loader:
            assert tuple(batch["video"].shape) == (4, 3, 8, 32, 32)
            seen += list(zip(batch["index"].tolist(), batch["view"].tolist()))
    assert sorted(seen) == [(v, k) for v in range(8) for k in range(6)]
    test_module = make_datamodule(synthetic_dataset)
    test_module.setup("test")  # no test manifest: the validation manifest
    assert len(test_module.test_dataloader()) == 8


def test_slowfast_pathways(synthetic_dataset: SyntheticDataset) -> None:
    datamodule = make_datamodule(synthetic_dataset, batch_size=2, slowfast_alpha=4)
    batch = next(iter(datamodule.train_dataloader()))
    slow, fast = batch["video"]
    assert tuple(slow.shape) == (2, 3, 2, 32, 32) and tuple(fast.shape) == (2, 3, 8, 32, 32)
    slow, fast = datamodule.on_after_batch_transfer(batch, 0)["video"]
    assert slow.dtype == fast.dtype == torch.float32


def test_bad_video_is_replaced_and_counted_once(synthetic_dataset: SyntheticDataset, videos: Any, tmp_path: Path) -> None:
    bad = videos.broken("random_bytes")
    manifest = tmp_path / "train.csv"
    lines = synthetic_dataset.train_manifest.read_text().splitlines()
    root = synthetic_dataset.root
    manifest.write_text("".join(f"{root / line}\n" for line in lines) + f"{bad} 0\n")
    datamodule = make_datamodule(synthetic_dataset, train_manifest=str(manifest))
    assert datamodule.train_dataset_size == 17
    for epoch in range(2):
        for batch in epoch_loader(datamodule, epoch):
            datamodule.on_after_batch_transfer(batch, 0)
    assert datamodule.skipped_videos == 1
    assert datamodule.skipped_video_paths == (str(bad),)
    restored = make_datamodule(synthetic_dataset)
    restored.load_state_dict(datamodule.state_dict())
    assert restored.skipped_video_paths == (str(bad),)

    strict = make_datamodule(synthetic_dataset, train_manifest=str(manifest), strict=True)
    with pytest.raises(VideoDecodeError, match="random_bytes"):
        for _ in strict.train_dataloader():
            pass


def test_lightning_distributed_sampler_injection(synthetic_dataset: SyntheticDataset) -> None:
    """``use_distributed_sampler=True``: Lightning swaps the inner sampler; grids follow its epoch."""
    from lightning_fabric.utilities.data import _replace_dunder_methods

    from lightning_multigrid._lightning import submodule

    _update_dataloader = submodule("utilities.data")._update_dataloader

    schedule = make_schedule(devices=2)
    datamodule = make_datamodule(synthetic_dataset)
    datamodule.serve(schedule)
    datamodule.trainer.current_epoch = 3
    with _replace_dunder_methods(DataLoader, "dataset"), _replace_dunder_methods(BatchSampler):
        loader = datamodule.train_dataloader()
    injected: DistributedSampler[int] = DistributedSampler(loader.dataset, num_replicas=2, rank=1, shuffle=True, seed=0)
    updated = _update_dataloader(loader, injected)
    assert isinstance(updated.batch_sampler, ShortCycleBatchSampler)
    assert updated.batch_sampler.sampler is injected and injected.epoch == 3
    assert len(updated) == schedule.iterations_in_epoch(3, 16)
    assert [tuple(b["video"].shape) for b in updated] == [expected_shape(schedule, 3, 0)]


def test_synthetic_generates_once(tmp_path: Path) -> None:
    datamodule = MultigridVideoDataModule(
        synthetic=SyntheticData(str(tmp_path / "synthetic"), size=(4, 2)), num_workers=0, **BASE
    )
    datamodule.prepare_data()
    assert (tmp_path / "synthetic" / "train.csv").is_file()
    stamp = (tmp_path / "synthetic" / "train.csv").stat().st_mtime_ns
    datamodule.setup("fit")
    assert (tmp_path / "synthetic" / "train.csv").stat().st_mtime_ns == stamp
    assert datamodule.train_dataset_size == 4 and datamodule.num_classes == 4
    assert datamodule._datasets.train is not None and datamodule._datasets.train.flip is False  # left/right labels


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(batch_size=0), ValueError, "`batch_size`"),
        (dict(crop_size=-1), ValueError, "`crop_size`"),
        (dict(eval_views=(2, 3)), TypeError, "`eval_views` must be a EvalViews"),
        (dict(reader_settings={"frame_decode": "gpu"}), ValueError, "`frame_decode` must be .workers. or .device., got .gpu."),
        (dict(synthetic="data/synthetic"), TypeError, "`synthetic` must be a SyntheticData"),
        (dict(sampling_rate=2.5), ValueError, "`sampling_rate` must be a positive integer"),
        (dict(num_workers=-1), ValueError, "`num_workers`"),
        (dict(drop_last="yes"), ValueError, "`drop_last` must be True or False"),
        (dict(jitter_scales=(20, 40)), ValueError, "`jitter_scales`"),
        (dict(std=(0.2, 0.0, 0.2)), ValueError, "`std`"),
        (dict(slowfast_alpha=0), ValueError, "`slowfast_alpha`"),
        (dict(synthetic=SyntheticData("x"), train_manifest="y"), ValueError, "`train_manifest`"),
    ],
)
def test_bad_arguments_raise_naming_them(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        MultigridVideoDataModule(**{**BASE, **kwargs})


def test_missing_manifests_raise_in_setup(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="`train_manifest`"):
        MultigridVideoDataModule(train_manifest=str(tmp_path / "nope.csv"), **BASE).setup("fit")
    with pytest.raises(ValueError, match="`train_manifest` is required"):
        MultigridVideoDataModule(**BASE).setup("fit")
    with pytest.raises(ValueError, match="`val_manifest` is required"):
        MultigridVideoDataModule(**BASE).setup("validate")


def test_serve_none_goes_back_to_the_base_shape(synthetic_dataset: SyntheticDataset) -> None:
    datamodule = make_datamodule(synthetic_dataset)
    baseline = datamodule.plan
    assert baseline == FixedGrid(datamodule.base_shape, datamodule.clip_sampling)
    schedule = make_schedule()
    datamodule.serve(schedule)
    assert datamodule.plan is schedule
    datamodule.serve(None)
    assert datamodule.plan is baseline
    assert [len(b["index"]) for b in epoch_loader(datamodule, 0)] == [1] * 16  # B=1 again, not the schedule's grids


# ---------------------------------------------------------------- a real Trainer


class TinyVideoNet(pl.LightningModule):
    """A 3D CNN that accepts any batch, frames and crop, and records what it was fed."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv3d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(4, 4)
        )
        self.seen: list[tuple[int, int, tuple[int, ...], torch.dtype]] = []

    def forward(self, video: torch.Tensor) -> torch.Tensor:
        return self.net(video)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        video = batch["video"]
        self.seen.append((self.current_epoch, batch_idx, tuple(video.shape), video.dtype))
        return nn.functional.cross_entropy(self(video), batch["label"])

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.log("val_loss", nn.functional.cross_entropy(self(batch["video"]), batch["label"]), batch_size=len(batch["label"]))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class LoaderRecorder(pl.Callback):
    """The train loader object and its worker processes, per epoch."""

    def __init__(self) -> None:
        self.loaders: list[Any] = []
        self.worker_pids: list[tuple[int, ...]] = []

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        if batch_idx == 0:
            loader = trainer.train_dataloader
            self.loaders.append(loader)
            iterator = getattr(loader, "_iterator", None)
            self.worker_pids.append(tuple(w.pid for w in getattr(iterator, "_workers", ())))


@pytest.mark.parametrize(("num_workers", "max_epochs"), [(0, 4), (2, 3)])
def test_trainer_fit_with_a_schedule(synthetic_dataset: SyntheticDataset, num_workers: int, max_epochs: int) -> None:
    # max_epochs=3: the shape changes after epoch 0; max_epochs=4: epochs 0 and 1 share a shape.
    schedule = make_schedule(max_epochs=max_epochs)
    datamodule = MultigridVideoDataModule(
        train_manifest=str(synthetic_dataset.train_manifest),
        val_manifest=str(synthetic_dataset.val_manifest),
        num_workers=num_workers,
        persistent_workers=True,
        flip=False,
        **BASE,
    )
    datamodule.serve(schedule)
    model, recorder = TinyVideoNet(), LoaderRecorder()
    trainer = pl.Trainer(
        max_epochs=2,
        accelerator="cpu",
        limit_train_batches=3,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        reload_dataloaders_every_n_epochs=1,  # ask every epoch; the DataModule reuses what it can
        callbacks=[recorder],
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(does not have many workers|too few batches).*")
        trainer.fit(model, datamodule=datamodule)

    expected = [
        (epoch, i, expected_shape(schedule, epoch, i), torch.float32)
        for epoch in range(2)
        for i in range(min(3, schedule.iterations_in_epoch(epoch, 16)))
    ]
    # Partial last batches keep the grid but hold fewer clips.
    assert [(e, i, s[1:], d) for e, i, s, d in model.seen] == [(e, i, s[1:], d) for e, i, s, d in expected]
    assert all(s[0] <= x[0] for (_, _, s, _), (_, _, x, _) in zip(model.seen, expected))
    # One loader for the whole fit; with workers, across a shape change, and they survive it.
    assert recorder.loaders[0] is recorder.loaders[1]
    if num_workers:
        assert schedule.stage_at(0).shape != schedule.stage_at(1).shape
        assert len(recorder.worker_pids[0]) == 2
        assert recorder.worker_pids[0] == recorder.worker_pids[1]


# ---------------------------------------------------------------- frame datasets


def frame_datamodule(manifests: tuple[Path, Path], **overrides: Any) -> MultigridVideoDataModule:
    kwargs: dict[str, Any] = dict(
        train_manifest=str(manifests[0]), val_manifest=str(manifests[1]), num_workers=0, flip=True, seed=3, **BASE
    )
    kwargs.update(overrides)
    return MultigridVideoDataModule(**kwargs)


def test_device_decode_batches_match_worker_decode(synthetic_frames: tuple[Path, Path]) -> None:
    """Same seeds, same clip parameters: on_after_batch_transfer decodes what the workers would have."""
    batches = {}
    for mode in ("workers", "device"):
        datamodule = frame_datamodule(synthetic_frames, reader_settings=ReaderSettings(frame_decode=mode), slowfast_alpha=4)
        datamodule.trainer = SimpleNamespace(current_epoch=0, global_rank=0, world_size=1)
        datamodule.setup("fit")
        datamodule.serve(make_schedule())
        batch = next(iter(datamodule.train_dataloader()))
        batches[mode] = datamodule.on_after_batch_transfer(batch, 0)
    workers, device = batches["workers"], batches["device"]
    assert [p.shape for p in device["video"]] == [p.shape for p in workers["video"]]
    assert device["video"][1].shape == expected_shape(make_schedule(), 0, 0)
    assert device["video"][0].shape[2] == math.ceil(device["video"][1].shape[2] / 4)  # slow: every 4th frame
    for fast_device, fast_workers in zip(device["video"], workers["video"]):
        assert (fast_device - fast_workers).abs().mean() < 0.05  # normalised units: ~1/255 / 0.225 per level
    assert torch.equal(device["label"], workers["label"])


def test_frame_decode_on_device_needs_a_frame_dataset(synthetic_dataset: SyntheticDataset) -> None:
    with pytest.raises(ValueError, match="needs a frame dataset"):
        make_datamodule(synthetic_dataset, reader_settings=ReaderSettings(frame_decode="device"))
    with pytest.raises(ValueError, match="`frame_decode` must be"):
        ReaderSettings(frame_decode="gpu")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("frame_decode", "num_workers", "accelerator"),
    [
        ("workers", 2, "cpu"),
        ("device", 2, "cpu"),  # big batches cut into worker chunks, JPEG clips joined, decoded on the CPU
        pytest.param(
            "device", 2, "gpu",
            marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")],
        ),
    ],
)
def test_trainer_fit_on_a_frame_dataset(
    synthetic_frames: tuple[Path, Path], frame_decode: str, num_workers: int, accelerator: str
) -> None:
    schedule = make_schedule(max_epochs=3)
    datamodule = frame_datamodule(
        synthetic_frames, reader_settings=ReaderSettings(frame_decode=frame_decode), num_workers=num_workers, flip=False
    )
    datamodule.serve(schedule)
    model = TinyVideoNet()
    trainer = pl.Trainer(
        max_epochs=2, accelerator=accelerator, devices=1, limit_train_batches=3, limit_val_batches=1, num_sanity_val_steps=0,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        reload_dataloaders_every_n_epochs=1,
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(does not have many workers|too few batches).*")
        trainer.fit(model, datamodule=datamodule)
    expected = [
        (epoch, i, expected_shape(schedule, epoch, i)[1:], torch.float32)
        for epoch in range(2)
        for i in range(min(3, schedule.iterations_in_epoch(epoch, 16)))
    ]
    assert [(e, i, s[1:], d) for e, i, s, d in model.seen] == expected
    assert "val_loss" in trainer.callback_metrics


def test_use_datasets_serves_the_given_datasets(synthetic_dataset: SyntheticDataset) -> None:
    datamodule = make_datamodule(synthetic_dataset)
    names = str(synthetic_dataset.class_names_file)
    train = TrainVideoDataset(str(synthetic_dataset.train_manifest), class_names=names, flip=False)
    val = EvalVideoDataset(str(synthetic_dataset.val_manifest), base_shape=GridShape(1, 8, 32),
                           clip_sampling=ClipSampling(2, (32, 32)), class_names=names)
    datamodule.use_datasets(train=train, val=val)
    datamodule.setup("fit")  # keeps them: no manifest is read again
    assert datamodule.train_dataloader().dataset is train
    assert datamodule.val_dataloader().dataset is val
