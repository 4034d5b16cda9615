"""``MultigridVideoDataModule``: video clips at the grid of every iteration, or at a fixed shape.

Without a schedule it is a plain video DataModule at the base shape (the baseline run). With one
attached (``MultigridCallback`` does it in ``on_fit_start``) the train loader serves, for the
current epoch, the schedule's long-cycle grid with the short cycle inside the epoch. On one
process one loader serves every shape, so its persistent workers live through the whole fit;
under DDP a loader lasts one long-cycle shape.

Clips leave the workers as uint8 ``(N, C, T, H, W)``; :meth:`on_after_batch_transfer` turns them
into normalised float on the device, so 8x larger coarse-grid batches do not cost 4x more bytes
through worker queues and the host-to-device copy.

Example::

    datamodule = MultigridVideoDataModule(
        train_manifest="kinetics/train.csv", val_manifest="kinetics/val.csv",
        batch_size=8, num_frames=16, crop_size=112, sampling_rate=4, num_workers=8)
    trainer = pl.Trainer(max_epochs=100, callbacks=[MultigridCallback()])
    trainer.fit(model, datamodule=datamodule)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, DistributedSampler, Sampler, SequentialSampler
from typing_extensions import override

from lightning_multigrid._checks import check_bool, check_int
from lightning_multigrid.data.checks import check_drop_last, check_eval_labels
from lightning_multigrid.data.dataset import EvalVideoDataset, TrainVideoDataset, collate_clips
from lightning_multigrid.data.decoding.device import EncodedBatch, decode_batch
from lightning_multigrid.data.decoding.frame_names import FrameLayout
from lightning_multigrid.data.loader import ChunkedDataLoader
from lightning_multigrid.data.manifests.entries import ManifestKind, check_manifest_kind
from lightning_multigrid.data.manifests.load import load_manifest
from lightning_multigrid.data.sampler import EpochShardSampler, ShortCycleBatchSampler
from lightning_multigrid.data.synthetic import check_texture_cell, ensure_synthetic_dataset, synthetic_files
from lightning_multigrid.schedule import (
    GridShape,
    MultigridConfig,
    MultigridSchedule,
    build_schedule,
    check_jitter_scales,
)

__all__ = ["MultigridVideoDataModule", "normalize_video"]

# Kinetics statistics as used by PySlowFast and pytorchvideo, on [0, 1] RGB.
DEFAULT_MEAN: tuple[float, float, float] = (0.45, 0.45, 0.45)
DEFAULT_STD: tuple[float, float, float] = (0.225, 0.225, 0.225)


class _LoaderKey(NamedTuple):
    """What a cached loader was built for; a different key means a new loader."""

    shape: GridShape | None  # None: serves every shape
    rank: int
    world_size: int
    resume: tuple[int, int] | None = None  # (epoch, iteration) a mid-epoch resume starts at


def _check_sizes(
    *,
    frame_decode: str,
    batch_size: int,
    num_frames: int,
    crop_size: int,
    sampling_rate: int,
    num_views: int,
    num_workers: int,
    num_crops: int,
    slowfast_alpha: int | None,
) -> None:
    """Raise ``ValueError`` on a decode mode, size or count out of range, naming the argument."""
    if frame_decode not in ("workers", "device"):
        raise ValueError(f"`frame_decode` must be 'workers' or 'device', got {frame_decode!r}.")
    for name, value, low in (
        ("batch_size", batch_size, 1),
        ("num_frames", num_frames, 1),
        ("crop_size", crop_size, 1),
        ("sampling_rate", sampling_rate, 1),
        ("num_views", num_views, 1),
        ("num_workers", num_workers, 0),
    ):
        check_int(name, value, low)
    if num_crops not in (1, 3):
        raise ValueError(f"`num_crops` must be 1 or 3, got {num_crops!r}.")
    if slowfast_alpha is not None and (
        isinstance(slowfast_alpha, bool) or not isinstance(slowfast_alpha, int) or slowfast_alpha < 1
    ):
        raise ValueError(f"`slowfast_alpha` must be a positive integer or None, got {slowfast_alpha!r}.")


def _check_jitter_scales(jitter_scales: tuple[int, int] | None, crop_size: int) -> tuple[int, int] | None:
    """``jitter_scales`` as ints, or ``None``; raises ``ValueError`` when the crop would not fit."""
    if jitter_scales is None:
        return None
    jitter_scales = (int(jitter_scales[0]), int(jitter_scales[1]))
    check_jitter_scales(jitter_scales, crop_size)
    return jitter_scales


def _check_normalization(mean: tuple[float, float, float], std: tuple[float, float, float]) -> None:
    for name, stats in (("mean", mean), ("std", std)):
        if len(stats) != 3:
            raise ValueError(f"`{name}` must have 3 values (R, G, B), got {stats!r}.")
    if not all(s > 0 for s in std):
        raise ValueError(f"`std` must be > 0, got {std!r}.")


def _check_synthetic(
    synthetic_size: tuple[int, int], synthetic_texture_cell: int | None, **manifest_args: str | None
) -> None:
    """With ``synthetic_dir``: no manifest arguments, ``(train, val)`` counts >= 1, a texture cell in range."""
    given = [name for name, value in manifest_args.items() if value is not None]
    if given:
        raise ValueError(
            f"`synthetic_dir` uses the built-in synthetic dataset, but {', '.join(f'`{n}`' for n in given)} "
            "also given: pass either `synthetic_dir` or your manifests."
        )
    if len(synthetic_size) != 2 or synthetic_size[0] < 1 or synthetic_size[1] < 1:
        raise ValueError(f"`synthetic_size` must be (train, val) video counts >= 1, got {synthetic_size!r}.")
    check_texture_cell("synthetic_texture_cell", synthetic_texture_cell)


class MultigridVideoDataModule(pl.LightningDataModule):
    """Video classification data for multigrid (or baseline) training.

    Data comes from ``path label`` manifests (Kinetics / PySlowFast format; see
    :mod:`lightning_multigrid.data.manifests.videos`), from frame datasets (a folder of JPEG frames per
    video: ``folder label [num_frames]`` lines or PySlowFast's frame-list CSV, see
    :mod:`lightning_multigrid.data.manifests.frames`; recognised by their content), or from the
    built-in synthetic dataset generated into ``synthetic_dir``. Batches are dicts::

        {"video": uint8 (N, 3, T, H, W) or [slow, fast], "label": int64 (N,) or float (N, K),
         "index": int64 (N,), "skipped": list of paths}        # + "view": int64 (N,) in val/test

    and float, normalised ``"video"`` after :meth:`on_after_batch_transfer`.

    Args:
        train_manifest: training manifest file (or a folder with one sub-folder per class).
        val_manifest: validation manifest; no validation without one.
        test_manifest: test manifest; default the validation manifest.
        root_dir: directory the manifests' video paths are relative to; default each manifest's
            own directory.
        class_names: class-names file (one name per line, or PySlowFast ``classids.json``), needed
            when manifests give labels as names.
        synthetic_dir: generate the built-in synthetic dataset here on first use (when it holds no
            ``train.csv``/``val.csv`` yet) and use it; excludes the manifest arguments.
        synthetic_size: ``(train, val)`` videos to generate into ``synthetic_dir``.
        synthetic_texture_cell: the synthetic checkerboard's cell in pixels (default 6 px: fine
            detail that the coarsest grids blur away; 12 px stays visible on every grid).
        batch_size: baseline clips per device ``B``; val/test batches have this size.
        num_frames: baseline frames per clip ``T``.
        crop_size: baseline square crop ``S`` in pixels.
        sampling_rate: baseline frame stride ``tau`` in source frames.
        jitter_scales: ``(min, max)`` training short side in pixels before the baseline crop;
            default ``(256, 320) * crop_size / 224``. Coarser crops scale the minimum. The
            minimum is also the val/test short side.
        num_views: val/test temporal clips per video (uniformly spread).
        num_crops: val/test spatial crops per clip: 1 (centre) or 3.
        slowfast_alpha: return ``[slow, fast]`` pathways, slow taking every ``alpha``-th frame.
        flip: random horizontal flips in training; ``None`` flips except on the synthetic dataset,
            whose labels include left/right motion.
        strict: raise on an undecodable video instead of replacing and counting it.
        metadata_file: precomputed video metadata (``lightning-multigrid check-data
            --write-metadata``) so workers do not probe every video.
        num_workers: DataLoader worker processes per loader.
        pin_memory: pin host memory of batches (for faster GPU copies).
        persistent_workers: keep workers alive between epochs (ignored with ``num_workers=0``).
        drop_last: drop the last, partial training batch of an epoch.
        seed: seed of the training shuffle and of every clip's random draws.
        mean: per-channel RGB mean of ``[0, 1]`` video for normalisation.
        std: per-channel RGB standard deviation for normalisation.
        frame_decode: frame datasets only: ``"workers"`` decodes JPEGs in the DataLoader workers
            (at reduced size where the grid allows); ``"device"`` has workers read only the bytes
            and decodes, resizes, crops and flips each batch on the training device after the
            transfer (nvjpeg on a GPU), with the same clip parameters.
        chunk_batches: with several workers, cut each training batch into chunks of at least
            ``batch_size`` clips, at most one per worker, decoded in parallel and joined in the
            main process (:class:`~lightning_multigrid.data.loader.ChunkedDataLoader`): a coarse
            grid's 8-16x larger batch no longer waits on one worker. Lightning still sees whole
            batches.
        filename_tmpl: frame datasets: the frames' file names, e.g. ``"img_{:05d}.jpg"``
            (mmaction2), ``"{video}_{:06d}.jpg"`` (PySlowFast), ``"{video}-{:06d}.jpg"`` (Charades);
            ``None`` detects each folder's. Other files (optical flow, thumbnails) are never read
            as frames (see ``docs/frame-layouts.md``).
        allow_frame_gaps: frame datasets: read a folder whose frame numbers skip as consecutive
            frames; by default it is a bad video (skipped, counted, reported).
        manifest_kind: ``"video"`` or ``"frames"`` when the manifests' content cannot tell;
            default ``"auto"``.

    Raises:
        ValueError: on out-of-range sizes or conflicting data arguments (naming them).
    """

    def __init__(
        self,
        train_manifest: str | None = None,
        val_manifest: str | None = None,
        test_manifest: str | None = None,
        root_dir: str | None = None,
        class_names: str | None = None,
        synthetic_dir: str | None = None,
        synthetic_size: tuple[int, int] = (240, 60),
        synthetic_texture_cell: int | None = None,
        batch_size: int = 8,
        num_frames: int = 16,
        crop_size: int = 112,
        sampling_rate: int = 4,
        jitter_scales: tuple[int, int] | None = None,
        num_views: int = 1,
        num_crops: int = 1,
        slowfast_alpha: int | None = None,
        flip: bool | None = None,
        strict: bool = False,
        metadata_file: str | None = None,
        num_workers: int = 4,
        pin_memory: bool = False,
        persistent_workers: bool = True,
        drop_last: bool = False,
        seed: int = 0,
        mean: tuple[float, float, float] = DEFAULT_MEAN,
        std: tuple[float, float, float] = DEFAULT_STD,
        frame_decode: Literal["workers", "device"] = "workers",
        chunk_batches: bool = True,
        filename_tmpl: str | None = None,
        allow_frame_gaps: bool = False,
        manifest_kind: ManifestKind = "auto",
    ) -> None:
        super().__init__()
        FrameLayout(filename_tmpl, allow_frame_gaps)  # validates both before any file is read
        check_bool("flip", flip, allow_none=True)
        for name, value in (
            ("strict", strict), ("pin_memory", pin_memory), ("persistent_workers", persistent_workers),
            ("drop_last", drop_last), ("chunk_batches", chunk_batches),
        ):
            check_bool(name, value)
        check_manifest_kind(manifest_kind)
        _check_sizes(
            frame_decode=frame_decode, batch_size=batch_size, num_frames=num_frames, crop_size=crop_size,
            sampling_rate=sampling_rate, num_views=num_views, num_workers=num_workers, num_crops=num_crops,
            slowfast_alpha=slowfast_alpha,
        )
        # Rebinds the local too: save_hyperparameters() below records the int pair.
        jitter_scales = _check_jitter_scales(jitter_scales, crop_size)
        _check_normalization(mean, std)
        if synthetic_dir is not None:
            _check_synthetic(
                synthetic_size, synthetic_texture_cell, train_manifest=train_manifest, val_manifest=val_manifest,
                test_manifest=test_manifest,
                root_dir=root_dir, class_names=class_names,
            )

        self.train_manifest = train_manifest
        self.val_manifest = val_manifest
        self.test_manifest = test_manifest
        self.root_dir = root_dir
        self.class_names = class_names
        self.synthetic_dir = synthetic_dir
        self.synthetic_size = (int(synthetic_size[0]), int(synthetic_size[1]))
        self.synthetic_texture_cell = synthetic_texture_cell
        self.batch_size = batch_size
        self.num_frames = num_frames
        self.crop_size = crop_size
        self._sampling_rate = sampling_rate
        self.jitter_scales = jitter_scales
        self.num_views = num_views
        self.num_crops = num_crops
        self.slowfast_alpha = slowfast_alpha
        self.flip = flip
        self.strict = strict
        self.metadata_file = metadata_file
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers
        self.drop_last = drop_last
        self.seed = seed
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self.frame_decode = frame_decode
        self.chunk_batches = chunk_batches
        self.filename_tmpl = filename_tmpl
        self.allow_frame_gaps = allow_frame_gaps
        self.manifest_kind = manifest_kind
        self.save_hyperparameters()
        if synthetic_dir is not None:  # the built-in dataset's files stand in for the manifests
            self.train_manifest, self.val_manifest, self.class_names = synthetic_files(synthetic_dir)

        self._schedule: MultigridSchedule | None = None
        self._baseline: MultigridSchedule | None = None
        self._train_dataset: TrainVideoDataset | None = None
        self._val_dataset: EvalVideoDataset | None = None
        self._test_dataset: EvalVideoDataset | None = None
        self._train_loader: DataLoader[Any] | None = None
        self._train_loader_key: _LoaderKey | None = None
        self._eval_loaders: dict[tuple[str, int, int], DataLoader[Any]] = {}
        self._precise_bn_loader: tuple[_LoaderKey, DataLoader[Any]] | None = None
        self._skipped: dict[str, None] = {}  # insertion-ordered set of paths

    # ------------------------------------------------------------------ what the callback reads

    @property
    def base_shape(self) -> GridShape:
        """The baseline grid: ``(batch_size, num_frames, crop_size)`` per device."""
        return GridShape(self.batch_size, self.num_frames, self.crop_size)

    @property
    def sampling_rate(self) -> int:
        """Baseline frame stride ``tau`` in source frames."""
        return self._sampling_rate

    @property
    def schedule(self) -> MultigridSchedule | None:
        """The attached multigrid schedule, or ``None`` (baseline: fixed base shape)."""
        return self._schedule

    def attach_schedule(self, schedule: MultigridSchedule | None) -> None:
        """Serve ``schedule``'s grids from the next ``train_dataloader()`` on (``None``: the base shape).

        Raises:
            ValueError: when the schedule was built for another base shape, frame stride or
                jitter range than this DataModule's, or when ``drop_last`` would leave one of its
                epochs without a batch.
        """
        if schedule is not None:
            # The callback builds the schedule from these values; this guards hand-built ones.
            config = schedule.config
            ours = (self.base_shape, self.sampling_rate, self.jitter_scales)
            theirs = (config.base, config.sampling_rate, config.jitter_scales)
            if theirs != ours:
                raise ValueError(
                    f"The schedule was built for another base shape, frame stride or jitter range: "
                    f"(base, sampling_rate, jitter_scales) = {theirs}, the DataModule serves {ours}: "
                    "build it with `MultigridConfig(base=datamodule.base_shape, "
                    "sampling_rate=datamodule.sampling_rate, jitter_scales=datamodule.jitter_scales, ...)`."
                )
            self._check_batches_left(schedule)
        self._schedule = schedule
        self._train_loader = None
        self._train_loader_key = None

    @property
    def skipped_videos(self) -> int:
        """Distinct videos that failed to decode and were replaced, seen by this process so far."""
        return len(self._skipped)

    @property
    def skipped_video_paths(self) -> tuple[str, ...]:
        """Paths of the skipped videos, in the order they were first seen."""
        return tuple(self._skipped)

    @property
    def train_dataset_size(self) -> int:
        """Clips (videos) in the training set; available after ``setup("fit")``.

        Raises:
            RuntimeError: before ``setup("fit")``.
        """
        return len(self._require_train())

    @property
    def num_classes(self) -> int:
        """Classes of the training (else validation) manifest; reads the manifest if not set up."""
        dataset = self._train_dataset or self._val_dataset or self._test_dataset
        if dataset is not None:
            return dataset.num_classes
        self._prepare_synthetic()
        manifest = self.train_manifest or self.val_manifest
        if manifest is None:
            raise ValueError("`num_classes` needs a `train_manifest` or `val_manifest`.")
        return load_manifest(manifest, root=self.root_dir, class_names=self.class_names, kind=self.manifest_kind).num_classes

    def use_datasets(
        self,
        train: TrainVideoDataset | None = None,
        val: EvalVideoDataset | None = None,
        test: EvalVideoDataset | None = None,
    ) -> None:
        """Serve these datasets instead of reading the manifests (e.g. clips cut from frames held in
        memory); ``setup`` keeps a dataset it already has. ``None`` leaves that split as it is."""
        if train is not None:
            self._train_dataset = train
        if val is not None:
            self._val_dataset = val
        if test is not None:
            self._test_dataset = test

    # ------------------------------------------------------------------ Lightning hooks

    @override
    def prepare_data(self) -> None:
        """Generate the synthetic dataset (rank 0 of each node) when ``synthetic_dir`` asks for it."""
        self._prepare_synthetic()

    @override
    def setup(self, stage: str) -> None:
        """Read the manifests of ``stage`` and check the configuration before the first step.

        Raises:
            ValueError: when a manifest the stage needs is not given.
            FileNotFoundError: when a manifest, root directory or class-names file does not exist.
            ManifestError: when a manifest is malformed, or a validation label is not a training
                class (naming file and line).
        """
        self._prepare_synthetic()
        if stage == "fit":
            if self._train_dataset is None:
                path = self._existing("train_manifest", self.train_manifest)
                self._train_dataset = TrainVideoDataset(
                    path,
                    root=self.root_dir,
                    class_names=self.class_names,
                    flip=self._flip(),
                    strict=self.strict,
                    slowfast_alpha=self.slowfast_alpha,
                    metadata_file=self.metadata_file,
                    frame_decode=self.frame_decode,
                    filename_tmpl=self.filename_tmpl,
                    allow_frame_gaps=self.allow_frame_gaps,
                    manifest_kind=self.manifest_kind,
                )
            if self.val_manifest is not None and self._val_dataset is None:
                self._val_dataset = self._eval_dataset("val_manifest", self.val_manifest)
            check_eval_labels(self._train_dataset, self._val_dataset, "val_manifest")
            self._check_batches_left(self._schedule or self._baseline_schedule())
        elif stage == "validate":
            if self._val_dataset is None:
                self._val_dataset = self._eval_dataset("val_manifest", self.val_manifest)
        elif stage == "test":
            if self._test_dataset is None:
                argument = "test_manifest" if self.test_manifest is not None else "val_manifest"
                self._test_dataset = self._eval_dataset(argument, self._test_path())
            if self._train_dataset is not None:
                check_eval_labels(self._train_dataset, self._test_dataset, argument)
        else:
            raise ValueError(f"MultigridVideoDataModule supports fit, validate and test, got stage {stage!r}.")

    @override
    def train_dataloader(self) -> DataLoader[Any]:
        """The training loader, sized for the current epoch's long-cycle shape.

        Epoch ``e`` iteration ``i`` yields ``schedule.short_cycle_at(e, i)``-shaped batches. The
        grid travels in each ``ClipRequest``, so workers serve any shape: on one process, one
        loader object (and its persistent workers) lasts the whole fit, and Lightning reloads it at
        long-cycle shape changes only to read the new epoch length. Under DDP each long-cycle
        shape gets a new loader.
        """
        dataset = self._require_train()
        epoch = self._current_epoch()
        rank, world_size = self._rank_and_world_size()
        schedule = self._schedule or self._baseline_schedule()
        # Under DDP with `use_distributed_sampler` (Lightning's default), Lightning re-creates the
        # loader at every reload from the arguments it was first built with, to insert its
        # DistributedSampler: there each shape gets a loader built at its own epoch.
        shape = schedule.stage_at(epoch).shape if world_size > 1 else None
        start_iteration = self._iterations_done_in_epoch()
        key = _LoaderKey(shape, rank, world_size, (epoch, start_iteration) if start_iteration else None)
        if self._train_loader is not None and self._train_loader_key == key:
            # Lightning sizes the epoch (len) before it calls set_epoch: set it now.
            self._batch_sampler_of(self._train_loader).set_epoch(epoch)
            return self._train_loader
        self._train_loader = None  # let the old loader's workers go before new ones start
        self._train_loader = self._clip_loader(dataset, schedule, epoch, rank, world_size, self.seed, start_iteration)
        self._train_loader_key = key
        return self._train_loader

    @override
    def val_dataloader(self) -> DataLoader[Any] | list[Any]:
        """Baseline-shape views (centre or 3 crops x ``num_views`` clips); ``[]`` without a val manifest."""
        if self._val_dataset is None:
            if self.val_manifest is None:
                return []
            raise RuntimeError("`val_dataloader()` needs `setup('fit')` or `setup('validate')` first.")
        return self._eval_loader("val", self._val_dataset)

    @override
    def test_dataloader(self) -> DataLoader[Any]:
        """Baseline-shape views of the test manifest (default: the validation manifest)."""
        if self._test_dataset is None:
            raise RuntimeError("`test_dataloader()` needs `setup('test')` first.")
        return self._eval_loader("test", self._test_dataset)

    def precise_bn_dataloader(self) -> DataLoader[Any]:
        """Augmented training clips at the base shape, for recomputing BatchNorm statistics.

        Reused between calls (persistent workers survive); each call serves the current epoch.
        """
        dataset = self._require_train()
        epoch = self._current_epoch()
        rank, world_size = self._rank_and_world_size()
        key = _LoaderKey(self.base_shape, rank, world_size)
        if self._precise_bn_loader is not None and self._precise_bn_loader[0] == key:
            loader = self._precise_bn_loader[1]
            self._batch_sampler_of(loader).set_epoch(epoch)
            return loader
        # Another seed, so these clips are not the ones training draws in the same epoch.
        loader = self._clip_loader(dataset, self._baseline_schedule(), epoch, rank, world_size, self.seed + 1)
        self._precise_bn_loader = (key, loader)
        return loader

    @override
    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Count skipped videos and turn ``batch["video"]`` into normalised float on the device.

        JPEG clips (``frame_decode="device"``) are first decoded on the device
        (:meth:`decode_on_device`, which replaces and reports clips that fail to decode). uint8
        video becomes ``(video / 255 - mean) / std`` in float32, for a tensor ``(N, 3, T, H, W)``
        or a ``[slow, fast]`` list, then the Trainer's input dtype (``precision="bf16-true"``:
        bfloat16, ``"16-true"``: float16, ``"64-true"``: float64; mixed precision keeps float32
        for autocast); the ``"skipped"`` paths are added to :attr:`skipped_video_paths` and left
        in the batch.
        """
        if isinstance(batch, dict):
            if isinstance(batch.get("video"), EncodedBatch):
                self.decode_on_device(batch, batch["label"].device)
            self._collect_skipped(batch.get("skipped"))
            if "video" in batch:
                video = normalize_video(batch["video"], self.mean, self.std)
                precision = getattr(self.trainer, "precision_plugin", None)
                if precision is not None:
                    # Lightning converts the batch to the precision's dtype before the transfer
                    # hooks, when the video is still uint8 (left alone): convert the float here.
                    video = precision.convert_input(video)
                batch["video"] = video
        return batch

    def decode_on_device(self, batch: dict[str, Any], device: torch.device) -> None:
        """Decode ``batch["video"]`` (JPEG clips) on ``device`` in place: uint8 ``(N, 3, T, S, S)`` or ``[slow, fast]``.

        A clip that fails to decode is a skip, as in the workers: it is replaced by a good clip of
        the batch, whose label, index (and view) replace its own, and its video is added to
        ``batch["skipped"]`` (with ``strict``, :class:`~lightning_multigrid.data.decoding.errors.VideoDecodeError`).
        """
        decoded = decode_batch(batch["video"], device, strict=self.strict)
        video = decoded.video
        if decoded.skipped:
            sources = torch.tensor(decoded.sources)
            for key in ("label", "index", "view"):
                if isinstance(batch.get(key), torch.Tensor):
                    batch[key] = batch[key][sources.to(batch[key].device)]
            batch["skipped"] = [*batch.get("skipped", ()), *decoded.skipped]
        if self.slowfast_alpha is not None:
            batch["video"] = [video[:, :, :: self.slowfast_alpha], video]  # as slowfast_pathways, batched
        else:
            batch["video"] = video

    @override
    def state_dict(self) -> dict[str, Any]:
        """The skipped-video paths, so a resumed run keeps counting from where it stopped."""
        return {"skipped_video_paths": list(self._skipped)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for path in state_dict.get("skipped_video_paths", ()):
            self._skipped[str(path)] = None

    # ------------------------------------------------------------------ helpers

    def _clip_loader(
        self,
        dataset: TrainVideoDataset,
        schedule: MultigridSchedule,
        epoch: int,
        rank: int,
        world_size: int,
        seed: int,
        start_iteration: int = 0,
    ) -> DataLoader[Any]:
        # Built inside the *_dataloader hook, so Lightning can swap the inner sampler for its
        # DistributedSampler (use_distributed_sampler=True) and keep the batch sampler's settings.
        sampler = EpochShardSampler(len(dataset), num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
        batch_sampler = ShortCycleBatchSampler(
            sampler, schedule, drop_last=self.drop_last, seed=seed, start_epoch=epoch, start_iteration=start_iteration
        )
        if self.chunk_batches and self.num_workers > 1:
            return ChunkedDataLoader(
                dataset,
                batch_sampler=batch_sampler,
                min_chunk_size=self.batch_size,
                num_workers=self.num_workers,
                collate_fn=collate_clips,
                pin_memory=self.pin_memory,
                persistent_workers=self.persistent_workers,
            )
        return DataLoader(
            dataset,
            batch_sampler=batch_sampler,
            num_workers=self.num_workers,
            collate_fn=collate_clips,
            pin_memory=self.pin_memory,
            persistent_workers=self.persistent_workers and self.num_workers > 0,
        )

    def _eval_loader(self, split: str, dataset: EvalVideoDataset) -> DataLoader[Any]:
        rank, world_size = self._rank_and_world_size()
        key = (split, rank, world_size)
        if key not in self._eval_loaders:
            sampler: Sampler[int]
            if world_size > 1:
                # Pads by repeating a few views so every rank runs the same number of steps.
                sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=False)
            else:
                sampler = SequentialSampler(dataset)
            self._eval_loaders[key] = DataLoader(
                dataset,
                batch_size=self.batch_size,
                sampler=sampler,
                num_workers=self.num_workers,
                collate_fn=collate_clips,
                pin_memory=self.pin_memory,
                persistent_workers=self.persistent_workers and self.num_workers > 0,
            )
        return self._eval_loaders[key]

    def _eval_dataset(self, argument: str, path: str | None) -> EvalVideoDataset:
        return EvalVideoDataset(
            self._existing(argument, path),
            num_frames=self.num_frames,
            crop_size=self.crop_size,
            sampling_rate=self.sampling_rate,
            short_side=self.jitter_scales[0] if self.jitter_scales is not None else None,
            num_views=self.num_views,
            num_crops=self.num_crops,
            root=self.root_dir,
            class_names=self.class_names,
            strict=self.strict,
            slowfast_alpha=self.slowfast_alpha,
            metadata_file=self.metadata_file,
            frame_decode=self.frame_decode,
            filename_tmpl=self.filename_tmpl,
            allow_frame_gaps=self.allow_frame_gaps,
            manifest_kind=self.manifest_kind,
        )

    def _check_batches_left(self, schedule: MultigridSchedule) -> None:
        """With ``drop_last``, refuse a schedule with an epoch of 0 batches (it would end the run there)."""
        if not self.drop_last or self._train_dataset is None:
            return
        _, world_size = self._rank_and_world_size()
        check_drop_last(schedule, len(self._train_dataset), world_size)

    def _baseline_schedule(self) -> MultigridSchedule:
        # A one-stage schedule at the base shape; stage_at() clamps later epochs to it.
        if self._baseline is None:
            self._baseline = build_schedule(
                MultigridConfig(
                    base=self.base_shape,
                    max_epochs=1,
                    sampling_rate=self.sampling_rate,
                    long_cycle=False,
                    short_cycle=False,
                    jitter_scales=self.jitter_scales,
                )
            )
        return self._baseline

    def _collect_skipped(self, paths: Any) -> None:
        if isinstance(paths, (list, tuple)):
            for path in paths:
                self._skipped[str(path)] = None

    def _current_epoch(self) -> int:
        return int(self.trainer.current_epoch) if self.trainer is not None else 0

    def _iterations_done_in_epoch(self) -> int:
        """Batches of the current epoch already trained when ``fit`` resumes mid-epoch; else 0.

        Lightning restores the fit loop's progress from the checkpoint and goes on at the next
        batch index, but restarts the loader; the batch sampler skips these batches instead, so
        the data order and the short-cycle phase continue where they stopped.
        """
        fit_loop = getattr(self.trainer, "fit_loop", None)  # None: no Trainer (or a stand-in)
        if fit_loop is None:
            return 0
        epoch = fit_loop.epoch_progress.current
        # `restarting` is set by a checkpoint load and cleared after the first epoch it runs;
        # an epoch started but not processed is the mid-epoch case.
        if not fit_loop.restarting or epoch.started == epoch.processed:
            return 0
        return int(fit_loop.epoch_loop.batch_progress.current.processed)

    def _rank_and_world_size(self) -> tuple[int, int]:
        if self.trainer is None:
            return 0, 1
        return int(self.trainer.global_rank), int(self.trainer.world_size)

    def _require_train(self) -> TrainVideoDataset:
        if self._train_dataset is None:
            raise RuntimeError("The training set is read in `setup('fit')`: call it first.")
        return self._train_dataset

    @staticmethod
    def _batch_sampler_of(loader: DataLoader[Any]) -> ShortCycleBatchSampler:
        batch_sampler = loader.batch_sampler
        assert isinstance(batch_sampler, ShortCycleBatchSampler)
        return batch_sampler

    def _flip(self) -> bool:
        return self.synthetic_dir is None if self.flip is None else self.flip

    def _test_path(self) -> str | None:
        return self.test_manifest if self.test_manifest is not None else self.val_manifest

    def _prepare_synthetic(self) -> None:
        if self.synthetic_dir is not None:
            num_train, num_val = self.synthetic_size
            ensure_synthetic_dataset(
                self.synthetic_dir, num_train=num_train, num_val=num_val, seed=self.seed,
                texture_cell=self.synthetic_texture_cell,
            )

    @staticmethod
    def _existing(argument: str, path: str | None) -> str:
        if path is None:
            raise ValueError(f"`{argument}` is required for this stage: pass the manifest file.")
        if not Path(path).exists():
            raise FileNotFoundError(f"`{argument}` {path} does not exist: check the path.")
        return path


def normalize_video(
    video: torch.Tensor | Sequence[torch.Tensor], mean: Sequence[float], std: Sequence[float]
) -> torch.Tensor | list[torch.Tensor]:
    """``(video / 255 - mean) / std`` as float32 for uint8 video ``(..., C, T, H, W)`` or a pathway list.

    Floating-point video is taken to be in ``[0, 1]`` already and only normalised. Runs on the
    video's device.
    """
    if not isinstance(video, torch.Tensor):
        return [normalize_video(pathway, mean, std) for pathway in video]  # type: ignore[misc]
    if video.is_floating_point():
        out = video.clone()
    else:
        out = video.to(torch.float32).div_(255.0)
    shape = (len(mean),) + (1,) * 3  # (C, 1, 1, 1): broadcasts over (N, C, T, H, W)
    mean_t = torch.as_tensor(mean, dtype=out.dtype, device=out.device).view(shape)
    std_t = torch.as_tensor(std, dtype=out.dtype, device=out.device).view(shape)
    return out.sub_(mean_t).div_(std_t)
