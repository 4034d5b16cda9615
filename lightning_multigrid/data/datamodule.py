"""``MultigridVideoDataModule``: video clips at the grid of every iteration, or at a fixed shape.

A Lightning shell, hooks plus state. It owns the base grid (:attr:`base_shape`, :attr:`clip_sampling`)
and always serves a plan (:class:`~lightning_multigrid.grid.GridPlan`): the baseline's
:class:`~lightning_multigrid.grid.FixedGrid`, or the multigrid schedule that ``MultigridCallback``
builds from that base grid and hands over with :meth:`serve`. The datasets are read from the
manifests by :mod:`~lightning_multigrid.data.splits`, each on a reader built once from the decoder
settings (:class:`~lightning_multigrid.data.decoding.settings.ReaderSettings`, :attr:`reader_settings`).
Loaders are built by :mod:`~lightning_multigrid.data.loaders` and kept by
:mod:`~lightning_multigrid.data.served_loaders`: on one process one train loader serves every grid, so
its persistent workers live through the whole fit; under DDP a loader lasts one cycle of grids.
Clips leave the workers as uint8 ``(N, C, T, H, W)`` (or JPEG bytes, decoded on the device ahead of
the step by :mod:`~lightning_multigrid.data.prefetch`); :meth:`on_after_batch_transfer` turns them
into normalised float on the device (:mod:`~lightning_multigrid.data.transfer`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch.utils.data import DataLoader
from typing_extensions import override

from lightning_multigrid._checks import check_bool, check_int, check_value, plain_value
from lightning_multigrid._internals import drop_train_loader, iterations_done_in_epoch
from lightning_multigrid._lightning import (
    check_trainer_package,
    pl,
    rank_zero_warn,
    warn_if_the_other_package_is_imported,
)
from lightning_multigrid.data.checks import (
    check_drop_last,
    check_store_fits,
    check_synthetic_alone,
)
from lightning_multigrid.data.dataset import EvalVideoDataset, TrainVideoDataset
from lightning_multigrid.data.decoding.settings import ReaderSettings
from lightning_multigrid.data.loaders import LoaderKey, LoaderSettings
from lightning_multigrid.data.manifests.entries import ManifestKind, check_manifest_kind
from lightning_multigrid.data.prefetch import DecodeAhead
from lightning_multigrid.data.resume_checks import check_resumed_train_loader, served_state
from lightning_multigrid.data.served_loaders import ServedLoaders
from lightning_multigrid.data.splits import SplitBuilder
from lightning_multigrid.data.store.reader import release_store, repacked_store
from lightning_multigrid.data.synthetic import SyntheticData
from lightning_multigrid.data.transfer import DEFAULT_MEAN, DEFAULT_STD, BatchTransfer
from lightning_multigrid.grid import (
    DEFAULT_NUM_FRAMES,
    DEFAULT_SAMPLING_RATE,
    ClipSampling,
    EvalViews,
    FixedGrid,
    GridPlan,
    GridShape,
)

__all__ = ["MultigridVideoDataModule"]


class MultigridVideoDataModule(pl.LightningDataModule):
    """Video classification data for multigrid (or baseline) training.

    Data comes from ``path label`` manifests (Kinetics / PySlowFast format), from frame datasets
    (a folder of JPEG frames per video, ``folder label [num_frames]`` lines or PySlowFast's
    frame-list CSV, recognised by their content), or from the built-in synthetic dataset
    generated into ``synthetic.path``. Batches are dicts::

        {"video": uint8 (N, 3, T, H, W) or [slow, fast], "label": int64 (N,) or float (N, K),
         "index": int64 (N,), "skipped": list of paths}        # + "view": int64 (N,) in val/test

    and float, normalised ``"video"`` after :meth:`on_after_batch_transfer`.

    Args:
        train_manifest: training manifest file (or a folder with one sub-folder per class, or a packed
            frame store's folder from ``lightning-multigrid pack-frames``; refused when its level 0 is
            smaller than the ``jitter_scales`` maximum).
        val_manifest: validation manifest; no validation without one.
        test_manifest: test manifest; default the validation manifest.
        root_dir: directory the manifests' video paths are relative to; default each manifest's
            own directory.
        class_names: class-names file (one name per line, or PySlowFast ``classids.json``), needed
            when manifests give labels as names.
        synthetic: the built-in synthetic dataset (:class:`~lightning_multigrid.data.synthetic.SyntheticData`:
            ``path``, ``size``, ``texture_cell``, ``format``), generated into ``path`` on first use
            and used instead of manifests (it excludes the manifest arguments).
        batch_size: baseline clips per device ``B``; val/test batches have this size.
        num_frames: baseline frames per clip ``T``.
        crop_size: baseline square crop ``S`` in pixels.
        sampling_rate: baseline frame stride ``tau`` in source frames.
        jitter_scales: ``(min, max)`` training short side in pixels before the baseline crop;
            default ``(256, 320) * crop_size / 224``. Coarser crops scale the minimum. The
            minimum is also the val/test short side.
        eval_views: val/test views per video (:class:`~lightning_multigrid.grid.EvalViews`:
            ``num_views`` temporal clips, uniformly spread, x ``num_crops`` spatial crops, 1 (centre)
            or 3); default one centre view.
        slowfast_alpha: return ``[slow, fast]`` pathways, slow taking every ``alpha``-th frame.
        flip: random horizontal flips in training; ``None`` flips except on the synthetic dataset,
            whose labels include left/right motion.
        strict: raise on an undecodable video instead of replacing and counting it.
        num_workers: DataLoader worker processes per loader.
        pin_memory: pin host memory of batches (for faster GPU copies).
        persistent_workers: keep workers alive between epochs (ignored with ``num_workers=0``).
        drop_last: drop the last, partial training batch of an epoch.
        seed: seed of the training shuffle and of every clip's random draws.
        mean: per-channel RGB mean of ``[0, 1]`` video for normalisation.
        std: per-channel RGB standard deviation for normalisation.
        reader_settings: how clips are decoded
            (:class:`~lightning_multigrid.data.decoding.settings.ReaderSettings`): ``metadata_file``
            (``check-data --write-metadata``, so workers do not probe every video),
            ``interpolation``, ``frame_decode`` (frame datasets and stores: ``"workers"`` decodes JPEGs
            in the DataLoader workers at reduced size where the grid allows; ``"device"`` has workers
            read only the bytes and decodes, resizes, crops and flips each batch on the training
            device, nvjpeg on a GPU, with the same clip parameters), ``filename_tmpl`` (frame
            datasets: e.g. ``"img_{:05d}.jpg"``, ``"{video}_{:06d}.jpg"``; ``None`` detects each
            folder's, docs/frame-layouts.md) and ``allow_frame_gaps``; default ``ReaderSettings()``.
        decode_ahead: with ``frame_decode="device"``, training batches decoded this many (1 or 2)
            batches ahead of the step, in a background thread on its own CUDA stream, so the decode
            runs while the model trains (:mod:`~lightning_multigrid.data.prefetch`); 0 decodes
            each batch between two steps, in the training thread (the serial path).
        chunk_batches: with several workers, cut each training batch into chunks of at least
            ``batch_size`` clips, decoded in parallel and joined in the main process
            (:class:`~lightning_multigrid.data.loaders.ChunkedDataLoader`), so a coarse grid's 8-16x
            larger batch does not wait on one worker. Lightning still sees whole batches.
        manifest_kind: ``"video"`` or ``"frames"`` when the manifests' content cannot tell;
            default ``"auto"``.

    Checkpoints hold the arguments as plain values (the grouped settings as dicts, paths as
    strings), which torch's weights-only loader reads; ``load_from_checkpoint`` passes them back, and
    ``reader_settings``, ``eval_views`` and ``synthetic`` take such a dict of their fields too.

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
        synthetic: SyntheticData | None = None,
        batch_size: int = 8,
        num_frames: int = DEFAULT_NUM_FRAMES,
        crop_size: int = 112,
        sampling_rate: int = DEFAULT_SAMPLING_RATE,
        jitter_scales: tuple[int, int] | None = None,
        eval_views: EvalViews | None = None,
        slowfast_alpha: int | None = None,
        flip: bool | None = None,
        strict: bool = False,
        num_workers: int = 4,
        pin_memory: bool = False,
        persistent_workers: bool = True,
        drop_last: bool = False,
        seed: int = 0,
        mean: tuple[float, float, float] = DEFAULT_MEAN,
        std: tuple[float, float, float] = DEFAULT_STD,
        reader_settings: ReaderSettings | None = None,
        decode_ahead: int = 1,
        chunk_batches: bool = True,
        manifest_kind: ManifestKind = "auto",
    ) -> None:
        super().__init__()
        warn_if_the_other_package_is_imported(self)  # before any Trainer: the fix is in the imports
        # Each value checks its own arguments, naming them.
        self._baseline = FixedGrid(GridShape(batch_size, num_frames, crop_size), ClipSampling(sampling_rate, jitter_scales))
        eval_views = check_value("eval_views", eval_views, EvalViews, allow_none=True)
        self.eval_views = EvalViews() if eval_views is None else eval_views
        self._transfer = BatchTransfer(mean, std, slowfast_alpha, strict)
        self._loaders = ServedLoaders(
            LoaderSettings(batch_size, num_workers, pin_memory, persistent_workers, drop_last, chunk_batches)
        )
        # The decoder settings, whole; the readers are built from them in `setup`.
        reader_settings = check_value("reader_settings", reader_settings, ReaderSettings, allow_none=True)
        self.reader_settings = ReaderSettings() if reader_settings is None else reader_settings
        check_bool("flip", flip, allow_none=True)
        check_manifest_kind(manifest_kind)
        check_int("decode_ahead", decode_ahead, 0)
        if decode_ahead > 2:
            raise ValueError(f"`decode_ahead` must be 0, 1 or 2 batches, got {decode_ahead!r}: more only holds device memory.")
        self._synthetic: SyntheticData | None = check_value("synthetic", synthetic, SyntheticData, allow_none=True)
        if self._synthetic is not None:
            check_synthetic_alone(
                train_manifest=train_manifest, val_manifest=val_manifest, test_manifest=test_manifest,
                root_dir=root_dir, class_names=class_names,
            )
        jitter_scales = self.clip_sampling.jitter_scales  # save_hyperparameters() records the int pair
        self.train_manifest, self.val_manifest, self.test_manifest = train_manifest, val_manifest, test_manifest
        self.root_dir, self.class_names = root_dir, class_names
        self.flip, self.seed, self.decode_ahead, self.manifest_kind = flip, seed, decode_ahead, manifest_kind
        self.save_hyperparameters()
        # Plain values (the grouped settings as dicts, paths as strings), which torch's weights-only
        # loader reads, also without this package imported; `load_from_checkpoint` passes them back.
        self.hparams.update(plain_value(dict(self.hparams)))
        if self._synthetic is not None:  # the built-in dataset's files stand in for the manifests
            self.train_manifest, self.val_manifest, self.class_names = self._synthetic.manifests(crop_size, jitter_scales)

        self._plan: GridPlan = self._baseline
        self._train_dataset: TrainVideoDataset | None = None
        self._val_dataset: EvalVideoDataset | None = None
        self._test_dataset: EvalVideoDataset | None = None
        self._given: set[str] = set()  # the splits whose dataset came from `use_datasets`
        self._skipped: dict[str, None] = {}  # insertion-ordered set of paths
        self._saved_served: dict[str, Any] | None = None  # what a loaded checkpoint's run served

    # ------------------------------------------------------------------ what the callback reads

    @property
    def trainer(self) -> pl.Trainer | None:
        """The Trainer this DataModule serves (Lightning sets it when ``fit``, ``validate`` or ``test`` starts)."""
        return self._trainer

    @trainer.setter
    def trainer(self, trainer: pl.Trainer | None) -> None:
        # Lightning attaches the DataModule before any hook runs: a Trainer of the other Lightning
        # package is refused here, naming the fix, rather than failing inside Lightning.
        if trainer is not None:
            check_trainer_package(self, trainer)
        self._trainer = trainer

    @property
    def base_shape(self) -> GridShape:
        """The baseline grid: ``(batch_size, num_frames, crop_size)`` per device."""
        return self._baseline.base_shape

    @property
    def batch_size(self) -> int:
        """Baseline clips per device ``B`` (``base_shape.batch_size``), also the val/test batch.

        Setting it changes the base shape, as Lightning's batch-size finder (``Tuner.scale_batch_size``)
        does between its trials: they train base-shape batches of the size tried, and the size found
        is the base batch of the next fit (multigrid's grids keep about its memory per step).

        Raises:
            ValueError: when set while a multigrid schedule is served (during a multigrid fit).
        """
        return self.base_shape.batch_size

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        if self._plan is not self._baseline:
            raise ValueError(
                f"MultigridVideoDataModule: cannot set `batch_size={value!r}` while a multigrid schedule built from "
                f"base batch {self.base_shape.batch_size} is served. Set it before `fit` (Lightning's batch-size "
                "finder does so before MultigridCallback builds its schedule)."
            )
        base = dataclasses.replace(self.base_shape, batch_size=value)  # checks the value, naming it
        self._baseline = self._plan = FixedGrid(base, self.clip_sampling)
        self._loaders.reset(dataclasses.replace(self._loaders.settings, batch_size=value))
        self.hparams["batch_size"] = value
        if self.trainer is not None:
            # The finder sets the first size after the fit loop built its loader: build it again.
            drop_train_loader(self.trainer)

    @property
    def clip_sampling(self) -> ClipSampling:
        """The baseline frame stride ``sampling_rate`` and the ``jitter_scales``."""
        return self._baseline.clip_sampling

    @property
    def slowfast_alpha(self) -> int | None:
        """The ``[slow, fast]`` split of the clips served (``None``: one pathway)."""
        return self._transfer.slowfast_alpha

    @property
    def plan(self) -> GridPlan:
        """The plan served: the multigrid schedule during a multigrid fit, else the base shape's ``FixedGrid``."""
        return self._plan

    def serve(self, plan: GridPlan | None) -> None:
        """Serve ``plan``'s grids from the next ``train_dataloader()`` on (``None``: the base shape again).

        Raises:
            ValueError: when ``drop_last`` would leave one of the plan's epochs without a batch.
        """
        plan = self._baseline if plan is None else plan
        self._check_batches_left(plan)
        self._plan = plan
        # Closed, not just forgotten: the callback serves `None` from its `on_exception`, which
        # Lightning calls before this DataModule's; a loader dropped there with its decode-ahead
        # thread running would leave nothing for `on_exception` to close.
        self._loaders.close_train()

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

    def loading_advice(self) -> str:
        """What would make this DataModule's training loading faster, for the data-wait summary
        (:func:`~lightning_multigrid.data.advice.loading_advice`); after ``setup("fit")``."""
        from lightning_multigrid.data.advice import loading_advice

        return loading_advice(self._require_train().reader, self._loaders.settings, self.decode_ahead)

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
        return self._splits().manifest(manifest).num_classes

    def use_datasets(
        self,
        train: TrainVideoDataset | None = None,
        val: EvalVideoDataset | None = None,
        test: EvalVideoDataset | None = None,
    ) -> None:
        """Serve these datasets instead of reading the manifests (``None``: that split as it is); ``setup`` keeps them.

        Loaders built on the datasets they replace are dropped: the next fit, validation or test
        serves these. ``setup`` refuses evaluation datasets whose classes are not the training set's.
        """
        if train is not None:
            self._train_dataset = train
            self._loaders.close_train()
        if val is not None:
            self._val_dataset = val
            self._loaders.close_eval("val")
        if test is not None:
            self._test_dataset = test
            self._loaders.close_eval("test")
        self._given |= {split for split, dataset in (("train", train), ("val", val), ("test", test)) if dataset is not None}

    # ------------------------------------------------------------------ Lightning hooks

    @override
    def prepare_data(self) -> None:
        """Generate the synthetic dataset (rank 0 of each node) when ``synthetic`` asks for it."""
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
        self._read_repacked_stores_again()
        splits = self._splits()
        if stage == "fit":
            self._saved_served = None  # a checkpoint's state, if any, is loaded after setup
            if self._train_dataset is None:
                self._train_dataset = splits.train(self._synthetic is None if self.flip is None else self.flip)
            largest = self.clip_sampling.scales_for_base(self.base_shape.crop_size)[1]
            check_store_fits(self._train_dataset.reader, "train_manifest", largest, "the `jitter_scales` maximum")
            if self._val_dataset is not None or self.val_manifest is not None:  # else no validation
                self._val_dataset = splits.evaluation(self._val_dataset, "val", self._train_dataset)
            self._check_batches_left(self._plan)
        elif stage == "validate":
            self._val_dataset = splits.evaluation(self._val_dataset, "val", self._train_dataset)
        elif stage == "test":
            self._test_dataset = splits.evaluation(self._test_dataset, "test", self._train_dataset)
        else:
            raise ValueError(f"MultigridVideoDataModule supports fit, validate and test, got stage {stage!r}.")

    @override
    def train_dataloader(self) -> DataLoader[Any]:
        """The training loader: epoch ``e`` iteration ``i`` yields ``plan.grid_at(e, i)``-shaped batches.

        The grid travels in each ``ClipRequest``, so on one process one loader (and its persistent
        workers) lasts the whole fit; Lightning reloads it where the grids change only to read the
        new epoch length. Under DDP each cycle of grids gets a new loader.
        """
        epoch = self._current_epoch()
        rank, world_size = self._rank_and_world_size()
        # Under DDP with `use_distributed_sampler` (Lightning's default), Lightning re-creates the
        # loader at every reload from the arguments it was first built with, to insert its
        # DistributedSampler: there each cycle gets a loader built at its own epoch.
        cycle = self._plan.cycle_at(epoch) if world_size > 1 else None
        start = iterations_done_in_epoch(self.trainer)
        if self._saved_served and self._resumed():
            check_resumed_train_loader(
                self._saved_served, serving_schedule=self._plan is not self._baseline, base=self.base_shape,
                start_iteration=start,
            )
        key = LoaderKey(cycle, rank, world_size, (epoch, start) if start else None)
        return self._loaders.train(
            self._require_train(), self._plan, key, epoch=epoch, seed=self.seed, start_iteration=start,
            decode_ahead=self._decode_ahead(),
        )

    @override
    def val_dataloader(self) -> DataLoader[Any] | list[Any]:
        """Baseline-shape views (centre or 3 crops x ``num_views`` clips); ``[]`` without a val manifest."""
        if self._val_dataset is None:
            if self.val_manifest is None:
                return []
            raise RuntimeError("`val_dataloader()` needs `setup('fit')` or `setup('validate')` first.")
        return self._loaders.evaluation("val", self._val_dataset, *self._rank_and_world_size())

    @override
    def test_dataloader(self) -> DataLoader[Any]:
        """Baseline-shape views of the test manifest (default: the validation manifest)."""
        if self._test_dataset is None:
            raise RuntimeError("`test_dataloader()` needs `setup('test')` first.")
        return self._loaders.evaluation("test", self._test_dataset, *self._rank_and_world_size())

    def precise_bn_dataloader(self) -> DataLoader[Any]:
        """Augmented training clips at the base shape for precise BatchNorm; one loader, set to the current epoch."""
        rank, world_size = self._rank_and_world_size()
        # Another seed, so these clips are not the ones training draws in the same epoch.
        return self._loaders.precise_bn(
            self._require_train(), self._baseline, LoaderKey(None, rank, world_size), epoch=self._current_epoch(),
            seed=self.seed + 1,
        )

    @override
    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Decode (``frame_decode="device"``), normalise and cast ``batch["video"]`` on the device
        (:class:`~lightning_multigrid.data.transfer.BatchTransfer`, with the Trainer's input dtype),
        and add the ``"skipped"`` paths to :attr:`skipped_video_paths` (they stay in the batch)."""
        if isinstance(batch, dict):
            # Lightning converts the batch to the precision's dtype before the transfer hooks,
            # when the video is still uint8 (left alone): the float video is converted here.
            precision = getattr(self.trainer, "precision_plugin", None)
            self._transfer(batch, precision.convert_input if precision is not None else None)
            self._collect_skipped(batch.get("skipped"))
        return batch

    @override
    def teardown(self, stage: str) -> None:
        """Stop every loader's workers (and the decode-ahead thread) now, not when garbage-collected.

        Left to the garbage collector, a loader's persistent workers may be shut down from inside a
        worker of the next fit (``compare`` runs two), where torch fails with a traceback.
        """
        self._loaders.close()

    @override
    def on_exception(self, exception: BaseException) -> None:
        """Stop every loader's workers and the decode-ahead thread when ``fit``, ``validate`` or ``test``
        raises or is interrupted: Lightning calls no ``teardown`` then, and the thread would hold
        decoded batches as long as the Trainer lives (a notebook)."""
        self._loaders.close()

    @override
    def state_dict(self) -> dict[str, Any]:
        """The skipped-video paths, so a resumed run keeps counting from where it stopped, and what
        was served (a multigrid schedule or not, the base shape), so a resume that cannot go on
        exactly is refused."""
        return {"skipped_video_paths": list(self._skipped), **served_state(self._plan is not self._baseline, self.base_shape)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for path in state_dict.get("skipped_video_paths", ()):
            self._skipped[str(path)] = None
        self._saved_served = {key: state_dict[key] for key in ("multigrid", "base_shape") if key in state_dict}

    # ------------------------------------------------------------------ helpers

    def _read_repacked_stores_again(self) -> None:
        """A split read from a packed store that was packed again since (this DataModule kept between fits) is
        read again, from the new packing, and the old packing is let go (its lock released, its files removed
        where no other run reads them). A dataset given with ``use_datasets`` is kept, with a warning."""
        for split in ("train", "val", "test"):
            store = repacked_store(getattr(self, f"_{split}_dataset"))
            if store is None:
                continue
            if split in self._given:
                rank_zero_warn(
                    f"The {split} dataset given with `use_datasets` reads the frame store {store.path} as it was when "
                    "opened; the store was packed again since, and this run keeps the old packing. To train on the "
                    "new one, pass a dataset opened on the store again (`use_datasets`)."
                )
                continue
            if split == "train":
                self._loaders.close_train()
            else:
                self._loaders.close_eval(split)
            setattr(self, f"_{split}_dataset", None)
            release_store(store)

    def _decode_ahead(self) -> DecodeAhead | None:
        """The training loader's decode-ahead thread, on the strategy's device; ``None`` when decoding is serial
        (``decode_ahead=0``), done by the workers, or there is no Trainer (then ``on_after_batch_transfer`` decodes)."""
        strategy = getattr(self.trainer, "strategy", None)
        if self.reader_settings.frame_decode != "device" or not self.decode_ahead or strategy is None:
            return None
        return DecodeAhead(self._transfer.decode, strategy.root_device, self.decode_ahead)

    def _splits(self) -> SplitBuilder:
        """How the splits are read, from the arguments as they are now (``synthetic`` sets the manifests)."""
        manifests = {"train_manifest": self.train_manifest, "val_manifest": self.val_manifest,
                     "test_manifest": self.test_manifest}
        return SplitBuilder(
            manifests, self.root_dir, self.class_names, self.manifest_kind, self.reader_settings, self._transfer.strict,
            self.slowfast_alpha, self._baseline, self.eval_views,
        )

    def _check_batches_left(self, plan: GridPlan) -> None:
        """With ``drop_last``, refuse a plan with an epoch of 0 batches (it would end the run there)."""
        if not self._loaders.settings.drop_last or self._train_dataset is None:
            return
        _, world_size = self._rank_and_world_size()
        check_drop_last(plan, len(self._train_dataset), world_size)

    def _collect_skipped(self, paths: Any) -> None:
        if isinstance(paths, (list, tuple)):
            for path in paths:
                self._skipped[str(path)] = None

    def _current_epoch(self) -> int:
        return int(self.trainer.current_epoch) if self.trainer is not None else 0

    def _resumed(self) -> bool:
        # The loops are restored after `on_fit_start` (where the callback may build a loader
        # before it serves its schedule): only a restored position counts as resuming.
        trainer = self.trainer
        return trainer is not None and (getattr(trainer, "global_step", 0) > 0 or self._current_epoch() > 0)

    def _rank_and_world_size(self) -> tuple[int, int]:
        if self.trainer is None:
            return 0, 1
        return int(self.trainer.global_rank), int(self.trainer.world_size)

    def _require_train(self) -> TrainVideoDataset:
        if self._train_dataset is None:
            raise RuntimeError("The training set is read in `setup('fit')`: call it first.")
        return self._train_dataset

    def _prepare_synthetic(self) -> None:
        if self._synthetic is not None:  # packed frame stores are made for the base crop
            self._synthetic.prepare(self.seed, self.base_shape.crop_size, self.clip_sampling.jitter_scales)
