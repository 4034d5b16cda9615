"""``MultigridVideoDataModule``: video clips at the grid of every iteration, or at a fixed shape.

A Lightning shell, hooks plus state: the base grid and the plan served from it, the datasets
(:mod:`.served_datasets`), the loaders (:mod:`.served_loaders`), the skipped videos (docs/data.md).
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader
from typing_extensions import override

from lightning_multigrid._checks import check_bool, check_value, plain_value
from lightning_multigrid._internals import drop_train_loader
from lightning_multigrid._lightning import (
    check_trainer_package,
    pl,
    rank_zero_warn,
    warn_if_the_other_package_is_imported,
)
from lightning_multigrid.data.advice import loading_advice
from lightning_multigrid.data.checks import check_base_batch_settable, check_decode_ahead, check_synthetic_alone
from lightning_multigrid.data.dataset import EvalVideoDataset, TrainVideoDataset
from lightning_multigrid.data.loaders import LoaderSettings
from lightning_multigrid.data.manifests.entries import ManifestKind, check_manifest_kind
from lightning_multigrid.data.reader_settings import ReaderSettings
from lightning_multigrid.data.resume_checks import check_resumed_train_loader, saved_served, served_state
from lightning_multigrid.data.served_datasets import ServedDatasets
from lightning_multigrid.data.served_loaders import ServedLoaders
from lightning_multigrid.data.splits import SplitSources
from lightning_multigrid.data.synthetic import SyntheticData
from lightning_multigrid.data.trainer_facts import trainer_facts
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

    From manifests (video files, frame folders, packed frame stores) or the built-in synthetic dataset, in
    batches of ``"video"`` (uint8 ``(N, 3, T, H, W)``; float after :meth:`on_after_batch_transfer`),
    ``"label"``, ``"index"`` and ``"skipped"`` (+ ``"view"`` in val/test), as docs/data.md details.

    Args:
        train_manifest: training manifest: a file, a folder with one sub-folder per class, or a packed frame store.
        val_manifest: validation manifest; no validation without one.
        test_manifest: test manifest; default the validation manifest.
        root_dir: directory the manifests' paths are relative to; default each manifest's own.
        class_names: class-names file (one name per line, or ``classids.json``), for labels given as names.
        synthetic: the built-in dataset (:class:`~lightning_multigrid.data.synthetic.SyntheticData`) instead of manifests.
        batch_size: baseline clips per device ``B``; val/test batches have this size.
        num_frames: baseline frames per clip ``T``.
        crop_size: baseline square crop ``S`` in pixels.
        sampling_rate: baseline frame stride ``tau`` in source frames.
        jitter_scales: ``(min, max)`` training short side in pixels before the baseline crop (the minimum also
            val/test's); default ``(256, 320) * crop_size / 224``.
        eval_views: val/test views per video (:class:`~lightning_multigrid.grid.EvalViews`); default one centre view.
        slowfast_alpha: return ``[slow, fast]`` pathways, slow taking every ``alpha``-th frame.
        flip: random horizontal flips in training; ``None``: flips except on the synthetic dataset.
        strict: raise on an undecodable video instead of replacing and counting it.
        num_workers: DataLoader worker processes per loader.
        pin_memory: pin host memory of batches (for faster GPU copies).
        persistent_workers: keep workers alive between epochs (ignored with ``num_workers=0``).
        drop_last: drop the last, partial training batch of an epoch.
        seed: seed of the training shuffle and of every clip's random draws.
        mean: per-channel RGB mean of ``[0, 1]`` video for normalisation.
        std: per-channel RGB standard deviation for normalisation.
        reader_settings: how clips are decoded (:class:`~lightning_multigrid.data.reader_settings.ReaderSettings`).
        decode_ahead: JPEG training batches decoded this many (1 or 2) ahead of the step on the device; 0: serially.
        chunk_batches: with several workers, decode each training batch in chunks of at least ``batch_size`` clips.
        manifest_kind: ``"video"`` or ``"frames"`` when the manifests' content cannot tell; default ``"auto"``.

    Raises:
        ValueError: on out-of-range sizes or conflicting data arguments (naming them).
    """

    def __init__(
        self,
        train_manifest: str | None = None, val_manifest: str | None = None, test_manifest: str | None = None,
        root_dir: str | None = None, class_names: str | None = None, synthetic: SyntheticData | None = None,
        batch_size: int = 8, num_frames: int = DEFAULT_NUM_FRAMES, crop_size: int = 112,
        sampling_rate: int = DEFAULT_SAMPLING_RATE, jitter_scales: tuple[int, int] | None = None,
        eval_views: EvalViews | None = None, slowfast_alpha: int | None = None, flip: bool | None = None,
        strict: bool = False, num_workers: int = 4, pin_memory: bool = False, persistent_workers: bool = True,
        drop_last: bool = False, seed: int = 0, mean: tuple[float, float, float] = DEFAULT_MEAN,
        std: tuple[float, float, float] = DEFAULT_STD, reader_settings: ReaderSettings | None = None,
        decode_ahead: int = 1, chunk_batches: bool = True, manifest_kind: ManifestKind = "auto",
    ) -> None:
        super().__init__()
        warn_if_the_other_package_is_imported(self)  # before any Trainer: the fix is in the imports
        # Each value checks its own arguments, naming them; the base batch lives in `_baseline` alone.
        self._baseline = FixedGrid(GridShape(batch_size, num_frames, crop_size), ClipSampling(sampling_rate, jitter_scales))
        eval_views = check_value("eval_views", eval_views, EvalViews, allow_none=True)
        self.eval_views = EvalViews() if eval_views is None else eval_views
        self._transfer = BatchTransfer(mean, std, slowfast_alpha, strict)
        self._loaders = ServedLoaders(LoaderSettings(num_workers, pin_memory, persistent_workers, drop_last, chunk_batches))
        reader_settings = check_value("reader_settings", reader_settings, ReaderSettings, allow_none=True)
        self.reader_settings = ReaderSettings() if reader_settings is None else reader_settings
        check_bool("flip", flip, allow_none=True)
        check_manifest_kind(manifest_kind)
        check_decode_ahead(decode_ahead)
        self._synthetic: SyntheticData | None = check_value("synthetic", synthetic, SyntheticData, allow_none=True)
        check_synthetic_alone(self._synthetic, train_manifest=train_manifest, val_manifest=val_manifest,
                              test_manifest=test_manifest, root_dir=root_dir, class_names=class_names)
        self.train_manifest, self.val_manifest, self.test_manifest = train_manifest, val_manifest, test_manifest
        self.root_dir, self.class_names, self.manifest_kind = root_dir, class_names, manifest_kind
        self.slowfast_alpha, self.strict, self.flip, self.seed, self.decode_ahead = slowfast_alpha, strict, flip, seed, decode_ahead
        jitter_scales = self.clip_sampling.jitter_scales  # save_hyperparameters() records the int pair
        self.save_hyperparameters()
        # Plain values (grouped settings as dicts, paths as strings) for torch's weights-only loader.
        self.hparams.update(plain_value(dict(self.hparams)))
        if self._synthetic is not None:  # the built-in dataset's files stand in for the manifests
            self.train_manifest, self.val_manifest, self.class_names = self._synthetic.manifests(crop_size, jitter_scales)
        self._plan: GridPlan = self._baseline
        self._datasets = ServedDatasets()
        self._skipped: dict[str, None] = {}  # insertion-ordered set of paths
        self._saved_served: dict[str, Any] | None = None  # what a loaded checkpoint's run served

    @property
    def trainer(self) -> pl.Trainer | None:
        """The Trainer this DataModule serves (Lightning sets it when ``fit``, ``validate`` or ``test`` starts)."""
        return self._trainer

    @trainer.setter
    def trainer(self, trainer: pl.Trainer | None) -> None:
        # Attached before any hook runs: a Trainer of the other Lightning package is refused here, naming the fix.
        if trainer is not None:
            check_trainer_package(self, trainer)
        self._trainer = trainer

    @property
    def base_shape(self) -> GridShape:
        """The baseline grid: ``(batch_size, num_frames, crop_size)`` per device."""
        return self._baseline.base_shape

    @property
    def batch_size(self) -> int:
        """Baseline clips per device ``B``, also the val/test batch; Lightning's batch-size finder sets it
        before ``MultigridCallback`` builds its schedule (refused, ``ValueError``, while one is served)."""
        return self.base_shape.batch_size

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        check_base_batch_settable(value, self.batch_size, serving_schedule=self._plan is not self._baseline)
        base = GridShape(value, self.base_shape.num_frames, self.base_shape.crop_size)  # checks the value, naming it
        self._baseline = self._plan = FixedGrid(base, self.clip_sampling)
        self._loaders.forget()
        self.hparams["batch_size"] = value
        if self.trainer is not None:  # the finder sets the first size after the fit loop built its loader
            drop_train_loader(self.trainer)

    @property
    def clip_sampling(self) -> ClipSampling:
        """The baseline frame stride ``sampling_rate`` and the ``jitter_scales``."""
        return self._baseline.clip_sampling

    @property
    def plan(self) -> GridPlan:
        """The plan served: the multigrid schedule during a multigrid fit, else the base shape's ``FixedGrid``."""
        return self._plan

    def serve(self, plan: GridPlan | None) -> None:
        """Serve ``plan``'s grids from the next ``train_dataloader()`` on (``None``: the base shape again);
        ``ValueError`` when ``drop_last`` would leave one of its epochs without a batch."""
        plan = self._baseline if plan is None else plan
        self._loaders.check_batches_left(plan, self._datasets.train, trainer_facts(self.trainer).world_size)
        self._plan = plan
        # Closed, not forgotten: the callback's `on_exception` serves `None` before this DataModule's runs.
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
        """Clips (videos) in the training set; after ``setup("fit")`` (else ``RuntimeError``)."""
        return len(self._datasets.require_train())

    def loading_advice(self) -> str:
        """What would make training loading faster (:func:`~lightning_multigrid.data.advice.loading_advice`)."""
        return loading_advice(self._datasets.require_train().reader, self._loaders.settings, self.decode_ahead)

    @property
    def num_classes(self) -> int:
        """Classes of the training (else validation) manifest; reads the manifest if not set up."""
        return self._datasets.num_classes(self._splits)

    def use_datasets(self, train: TrainVideoDataset | None = None, val: EvalVideoDataset | None = None,
                     test: EvalVideoDataset | None = None) -> None:
        """Serve these datasets instead of reading the manifests (``None``: that split as it is), from the next
        stage on; ``setup`` refuses evaluation datasets whose classes are not the training set's."""
        for split in self._datasets.use(train, val, test):
            self._loaders.close_split(split)

    @override
    def prepare_data(self) -> None:
        """Generate the synthetic dataset (rank 0 of each node) when ``synthetic`` asks for it."""
        self._prepare_synthetic()

    @override
    def setup(self, stage: str) -> None:
        """Read the datasets of ``stage`` and check them before the first step; ``ValueError``,
        ``FileNotFoundError`` or ``ManifestError`` name the argument and file that is missing or wrong."""
        splits = self._splits()
        for warning in self._datasets.read_repacked_again(self._loaders.close_split):
            rank_zero_warn(warning)
        self._datasets.read(stage, splits)
        if stage == "fit":
            self._saved_served = None  # a checkpoint's state, if any, is loaded after setup
            self._loaders.check_batches_left(self._plan, self._datasets.train, trainer_facts(self.trainer).world_size)

    @override
    def train_dataloader(self) -> DataLoader[Any]:
        """The training loader: epoch ``e`` iteration ``i`` yields ``plan.grid_at(e, i)``-shaped batches."""
        at = trainer_facts(self.trainer)  # only a restored position resumes what the checkpoint served
        check_resumed_train_loader(self._saved_served if at.resumed else None, serving_schedule=self._plan is not self._baseline,
                                   base=self.base_shape, start_iteration=at.start_iteration)
        return self._loaders.train(self._datasets.require_train(), self._plan, at, seed=self.seed,
                                   decode_ahead=self.decode_ahead, decode=self._transfer.decode)

    @override
    def val_dataloader(self) -> DataLoader[Any] | list[Any]:
        """Baseline-shape views (centre or 3 crops x ``num_views`` clips); ``[]`` without a val manifest."""
        if self._datasets.val is None and self.val_manifest is None:
            return []
        return self._loaders.evaluation("val", self._datasets.require_eval("val"), self.batch_size, trainer_facts(self.trainer))

    @override
    def test_dataloader(self) -> DataLoader[Any]:
        """Baseline-shape views of the test manifest (default: the validation manifest)."""
        return self._loaders.evaluation("test", self._datasets.require_eval("test"), self.batch_size, trainer_facts(self.trainer))

    def precise_bn_dataloader(self) -> DataLoader[Any]:
        """Augmented training clips at the base shape for precise BatchNorm; one loader, set to the current epoch."""
        return self._loaders.precise_bn(self._datasets.require_train(), self._baseline, trainer_facts(self.trainer), seed=self.seed)

    @override
    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Decode (JPEG bytes), normalise and cast the video on the device; collect the ``"skipped"`` paths."""
        if isinstance(batch, dict):
            # Lightning converts the batch to the precision's dtype while the video is uint8 (left alone).
            precision = getattr(self.trainer, "precision_plugin", None)
            self._transfer(batch, precision.convert_input if precision is not None else None)
            if isinstance(paths := batch.get("skipped"), (list, tuple)):
                self._skipped.update(dict.fromkeys(map(str, paths)))
        return batch

    @override
    def teardown(self, stage: str) -> None:
        """Stop every loader's workers now: the garbage collector may do so inside the next fit's workers, and fail."""
        self._loaders.close()

    @override
    def on_exception(self, exception: BaseException) -> None:
        """Stop every loader's workers and decode-ahead thread: no ``teardown`` follows a stage that raised."""
        self._loaders.close()

    @override
    def state_dict(self) -> dict[str, Any]:
        """The skipped videos, counted on after a resume, and what was served (:mod:`.resume_checks`)."""
        return {"skipped_video_paths": list(self._skipped), **served_state(self._plan is not self._baseline, self.base_shape)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._skipped.update(dict.fromkeys(map(str, state_dict.get("skipped_video_paths", ()))))
        self._saved_served = saved_served(state_dict)

    def _splits(self) -> SplitSources:
        """Where the splits come from, from the arguments as they are now; the synthetic dataset's files first."""
        self._prepare_synthetic()
        return SplitSources(
            train_manifest=self.train_manifest, val_manifest=self.val_manifest, test_manifest=self.test_manifest,
            root_dir=self.root_dir, class_names=self.class_names, manifest_kind=self.manifest_kind,
            reader_settings=self.reader_settings, flip=self._synthetic is None if self.flip is None else self.flip,
            strict=self.strict, slowfast_alpha=self.slowfast_alpha, baseline=self._baseline, views=self.eval_views,
        )

    def _prepare_synthetic(self) -> None:
        if self._synthetic is not None:  # packed frame stores are made for the base crop
            self._synthetic.prepare(self.seed, self.base_shape.crop_size, self.clip_sampling.jitter_scales)
