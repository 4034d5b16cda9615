"""Video datasets: training clips at the grid each request asks for, and multi-view evaluation.

:class:`TrainVideoDataset` is indexed by :class:`~lightning_multigrid.data.clip_params.ClipRequest`
(the batch sampler decides the grid and the seed; the dataset only decodes), and
:class:`EvalVideoDataset` by an integer over ``(video, view)`` pairs at the baseline shape.
Both reach their pixels through a :class:`~lightning_multigrid.data.decoding.readers.ClipReader`:
encoded video files (PyAV), frame datasets (a folder of JPEG frames per video) or a packed frame
store (:mod:`~lightning_multigrid.data.store`), the one the manifest's format asks for, built by
:meth:`ReaderSettings.reader_for <lightning_multigrid.data.reader_settings.ReaderSettings.reader_for>`
(the DataModule builds it from its arguments); or one you pass (e.g. an in-memory one). Every reader
gets the same clip parameters from the same seeds.

Samples are dicts of uint8 video and labels; conversion to float and normalisation belong on the
device after the transfer (4x fewer bytes through worker queues and the host-to-device copy)::

    {"video": uint8 (C, T, H, W) | [slow, fast], "label": int | float multi-hot (num_classes,),
     "index": int, "skipped": tuple[str, ...]}           # + "view": int for evaluation

**Bad videos.** Real datasets hold missing, empty, truncated and non-video files (and, as frame
folders, missing or empty folders, gaps in the frame numbers, and missing, damaged or non-JPEG
frames; any ``OSError`` on a file, such as a permission error, counts as undecodable). With
``strict=False`` (the default) a clip that cannot be decoded is replaced by a clip of another
video, chosen deterministically from the request's seed (distinct videos, at most
``max_replacements``); the video (:attr:`VideoEntry.name`: its path, plus its id in a frame-list
CSV) and reason are logged once per process (logger ``lightning_multigrid.data``) and the name
travels with the sample in ``"skipped"`` so the main process can count distinct skipped videos.
All bookkeeping is per video, never per folder. With ``strict=True`` the
:class:`~lightning_multigrid.data.decoding.errors.VideoDecodeError` (path and reason) is raised.
Configuration mistakes (missing or empty manifest, bad root) raise at construction.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset

from lightning_multigrid._checks import check_bool, check_instance, check_positive_int
from lightning_multigrid.data.batch_slots import ChunkTask, FetchedChunk
from lightning_multigrid.data.clip_params import (
    ClipParams,
    ClipRequest,
    ClipSource,
    eval_clip_params,
    eval_short_side,
    sample_clip_params,
)
from lightning_multigrid.data.decoding.device import EncodedBatch
from lightning_multigrid.data.decoding.errors import VideoDecodeError, unreadable
from lightning_multigrid.data.decoding.frames import EncodedClip
from lightning_multigrid.data.decoding.readers import ClipReader
from lightning_multigrid.data.manifests.entries import Manifest, ManifestKind
from lightning_multigrid.data.reader_settings import ReaderSettings
from lightning_multigrid.data.skips import report_skip
from lightning_multigrid.data.sources import load_manifest
from lightning_multigrid.grid import ClipSampling, EvalViews, GridShape
from lightning_multigrid.models.pathways import slowfast_pathways

__all__ = ["EvalVideoDataset", "TrainVideoDataset", "collate_clips"]

Sample = dict[str, Any]
_DEFAULT_SETTINGS = ReaderSettings()
_STRIDE_1, _ONE_VIEW = ClipSampling(), EvalViews()


class _VideoDataset:
    """What training and evaluation share: manifest, labels, the reader, bad-video handling."""

    def __init__(
        self,
        manifest: Manifest,
        reader: ClipReader | ReaderSettings | None,
        *,
        strict: bool,
        slowfast_alpha: int | None,
        max_replacements: int,
    ) -> None:
        check_positive_int("slowfast_alpha", slowfast_alpha, allow_none=True)
        check_bool("strict", strict)
        if max_replacements < 1:
            raise ValueError(f"`max_replacements` must be >= 1, got {max_replacements!r}.")
        self.manifest = manifest
        self.strict = strict
        self.slowfast_alpha = slowfast_alpha
        self.max_replacements = max_replacements
        if reader is None or isinstance(reader, ReaderSettings):
            reader = (reader or _DEFAULT_SETTINGS).reader_for(manifest)
        # Per process: each DataLoader worker gets (and fills) its own copy of the reader's caches.
        self.reader: ClipReader = reader
        self._failed: dict[int, str] = {}

    @property
    def num_videos(self) -> int:
        return len(self.manifest.entries)

    @property
    def num_classes(self) -> int:
        return self.manifest.num_classes

    @property
    def multi_label(self) -> bool:
        return self.manifest.multi_label

    @property
    def class_names(self) -> tuple[str, ...] | None:
        return self.manifest.class_names

    def target(self, video_index: int) -> int | torch.Tensor:
        """The label of a video: an int, or a float multi-hot ``(num_classes,)`` when multi-label."""
        labels = self.manifest.entries[video_index].labels
        if not self.manifest.multi_label:
            return labels[0]
        target = torch.zeros(self.manifest.num_classes, dtype=torch.float32)
        target[list(labels)] = 1.0
        return target

    def _load(
        self, video_index: int, draw: Callable[[ClipSource, int], ClipParams], attempt: int
    ) -> torch.Tensor | EncodedClip:
        """Decode the clip ``draw(source, attempt)`` of one video through the reader; raises VideoDecodeError."""
        entry = self.manifest.entries[video_index]
        if video_index in self._failed:
            raise VideoDecodeError(entry.name, self._failed[video_index])
        return self.reader.read(entry, draw(self.reader.source(entry), attempt))

    def _load_or_replace(
        self, video_index: int, seed: int, draw: Callable[[ClipSource, int], ClipParams]
    ) -> tuple[int, torch.Tensor | EncodedClip, tuple[str, ...]]:
        """The clip of ``video_index``, or of the first decodable replacement; and the skipped paths.

        Replacements are distinct videos drawn by ``random.Random(seed).sample``: the same in every
        process, so a run stays reproducible whatever the number of workers. Each attempt draws its
        own clip (``draw(source, attempt)``): a replacement never repeats the draw that failed.
        A video is marked bad for the process once a clip of it fails, which the readers report
        only when the video is unreadable there (the video reader retries a failed seek from
        earlier keyframes and from the start first).
        """
        skipped: list[str] = []
        for attempt, index in enumerate(self._candidates(video_index, seed)):
            try:
                return index, self._load(index, draw, attempt), tuple(skipped)
            except (VideoDecodeError, OSError) as error:
                # Any OSError on a user's file (permissions, a file gone meanwhile) is a skip too.
                name = self.manifest.entries[index].name
                reason = error.reason if isinstance(error, VideoDecodeError) else unreadable(error)
                if self.strict:
                    raise VideoDecodeError(name, reason) from None
                self._failed[index] = reason
                report_skip(name, reason)
                skipped.append(name)
        raise RuntimeError(
            f"{len(skipped)} videos in a row could not be decoded, last {skipped[-3:]}: most of the dataset "
            f"({self.manifest.source}) is unreadable. Run `lightning-multigrid check-data "
            f"{self.manifest.source}` to list the bad files."
        )

    def _candidates(self, video_index: int, seed: int) -> Iterator[int]:
        """``video_index``, then its replacements: distinct videos drawn by ``random.Random(seed).sample``.

        The replacements are drawn only when the video fails: a draw per clip cost about a tenth
        of a small clip's whole time in the worker (the common case needs none).
        """
        yield video_index
        count = min(self.num_videos, self.max_replacements + 1)
        others = [i for i in random.Random(seed).sample(range(self.num_videos), count) if i != video_index]
        yield from others[: self.max_replacements]

    def __getitems__(self, items: Sequence[Any]) -> list[Sample] | FetchedChunk:
        """The samples of a batch (what a DataLoader's fetch calls); a chunk's comes with its
        :class:`~lightning_multigrid.data.batch_slots.ChunkTask`, so the worker's collate function
        can stack the clips straight into the batch's shared-memory slot."""
        samples = [self[item] for item in items]
        return FetchedChunk(samples, items) if isinstance(items, ChunkTask) else samples

    def __getitem__(self, item: Any) -> Sample:
        raise NotImplementedError

    def _sample(self, index: int, video: torch.Tensor | EncodedClip, skipped: tuple[str, ...]) -> Sample:
        clip: torch.Tensor | list[torch.Tensor] | EncodedClip = video
        # Encoded clips get their pathways after decoding, on the device.
        if self.slowfast_alpha is not None and isinstance(video, torch.Tensor):
            clip = slowfast_pathways(video, self.slowfast_alpha)
        return {"video": clip, "label": self.target(index), "index": index, "skipped": skipped}


class TrainVideoDataset(_VideoDataset, Dataset[Sample]):
    """Training clips decoded straight to the grid of each :class:`ClipRequest`.

    Args:
        manifest: a manifest file (``path label`` lines), a folder with one sub-folder per
            class, a packed frame store's folder (``lightning-multigrid pack-frames``), or a
            :class:`~lightning_multigrid.data.manifests.videos.Manifest`.
        reader: where clips come from: a :class:`~lightning_multigrid.data.decoding.readers.ClipReader`
            (e.g. an :class:`~lightning_multigrid.data.decoding.readers.InMemoryReader`, or the one
            :meth:`ReaderSettings.reader_for <lightning_multigrid.data.reader_settings.ReaderSettings.reader_for>`
            builds), or the :class:`~lightning_multigrid.data.reader_settings.ReaderSettings` to
            build the manifest's reader with (video files, frame folders or a packed store); default
            that reader with the default settings.
        root: directory the manifest's paths are relative to (default: the manifest's).
        class_names: class-names file or names, for labels written as names.
        flip: random horizontal flips; turn off when labels depend on direction.
        strict: raise on an undecodable video instead of replacing it.
        slowfast_alpha: return ``[slow, fast]`` pathways, slow taking every ``alpha``-th frame.
        max_replacements: replacements to try before giving up on a sample.
        manifest_kind: ``"video"`` or ``"frames"``; default ``"auto"`` tells from the content.

    Raises:
        FileNotFoundError: when the manifest, root or metadata file does not exist.
        ManifestError: when the manifest is malformed or empty.
        ValueError: when the reader settings do not fit the manifest (frame settings for video files).

    Example::

        dataset = TrainVideoDataset("data/train.csv", flip=False)
        request = ClipRequest(index=0, num_frames=8, crop_size=112, sampling_rate_range=(2.0, 4.0),
                              scale_range=(128, 160), seed=1234)
        dataset[request]["video"].shape      # torch.Size([3, 8, 112, 112]), uint8
        frames = TrainVideoDataset("frames/train.txt", ReaderSettings(frame_decode="device"))
    """

    def __init__(
        self,
        manifest: str | os.PathLike[str] | Manifest,
        reader: ClipReader | ReaderSettings | None = None,
        *,
        root: str | os.PathLike[str] | None = None,
        class_names: str | os.PathLike[str] | Sequence[str] | None = None,
        flip: bool = True,
        strict: bool = False,
        slowfast_alpha: int | None = None,
        max_replacements: int = 20,
        manifest_kind: ManifestKind = "auto",
    ) -> None:
        super().__init__(
            load_manifest(manifest, root=root, class_names=class_names, kind=manifest_kind), reader, strict=strict,
            slowfast_alpha=slowfast_alpha, max_replacements=max_replacements,
        )
        self.flip = check_bool("flip", flip)

    def __len__(self) -> int:
        return self.num_videos

    def __getitem__(self, request: ClipRequest) -> Sample:
        """The clip of ``request`` (or of a replacement video when it cannot be decoded).

        Returns:
            ``{"video": uint8 (C, num_frames, crop_size, crop_size) or [slow, fast],
            "label": int or float multi-hot, "index": video index actually used,
            "skipped": paths replaced on the way, usually empty}``.

        Raises:
            TypeError: when indexed by something other than a ``ClipRequest``.
            VideoDecodeError: with ``strict=True``, when the video cannot be decoded.
        """
        if not isinstance(request, ClipRequest):
            raise TypeError(
                f"TrainVideoDataset is indexed by `ClipRequest`, got {type(request).__name__}: "
                "use it with `ShortCycleBatchSampler` (or build requests yourself)."
            )
        if not 0 <= request.index < self.num_videos:
            raise IndexError(f"`ClipRequest.index` {request.index} is out of range for {self.num_videos} videos.")

        def draw(source: ClipSource, attempt: int) -> ClipParams:
            seed = request.seed if attempt == 0 else replacement_seed(request.seed, attempt)
            return sample_clip_params(request._replace(seed=seed), source, flip=self.flip)

        index, video, skipped = self._load_or_replace(request.index, request.seed, draw)
        return self._sample(index, video, skipped)


class EvalVideoDataset(_VideoDataset, Dataset[Sample]):
    """Validation / test views at the base shape: ``num_views x num_crops`` clips per video.

    Item ``i`` is view ``i % clips_per_video`` of video ``i // clips_per_video``; view ``v`` is
    temporal clip ``v // num_crops``, spatial crop ``v % num_crops``
    (:func:`~lightning_multigrid.data.clip_params.eval_clip_params`). Samples carry ``"index"``
    (video) and ``"view"`` so predictions can be averaged per video. An undecodable video is
    replaced by another video's same view (tagged with that video's index), so it gets no
    predictions and the replacement's one view counts twice.

    Args:
        manifest: as :class:`TrainVideoDataset`.
        reader: as :class:`TrainVideoDataset`.
        base_shape: the base shape: frames per clip ``T`` and square crop ``S`` in pixels (its
            ``batch_size`` is the loader's business).
        clip_sampling: the base frame stride ``tau``; the short side before the crop is the minimum
            of its jitter scales at the base crop (the minimum training short side; default
            ``round(crop_size * 256 / 224)``).
        views: temporal clips (uniformly spread) and spatial crops (1: centre; 3: both ends and
            centre of the long side) per video.
        root: as :class:`TrainVideoDataset`.
        class_names: as :class:`TrainVideoDataset`.
        strict: as :class:`TrainVideoDataset`.
        slowfast_alpha: as :class:`TrainVideoDataset`.
        max_replacements: as :class:`TrainVideoDataset`.
        manifest_kind: as :class:`TrainVideoDataset`.

    Raises:
        TypeError: when ``base_shape``, ``clip_sampling`` or ``views`` is not a grid value.
        ValueError: when the short side is smaller than the crop.

    Example::

        views = EvalVideoDataset("data/val.csv", base_shape=GridShape(8, 16, 112),
                                 clip_sampling=ClipSampling(sampling_rate=4), views=EvalViews(num_views=3))
    """

    def __init__(
        self,
        manifest: str | os.PathLike[str] | Manifest,
        reader: ClipReader | ReaderSettings | None = None,
        *,
        base_shape: GridShape,
        clip_sampling: ClipSampling = _STRIDE_1,
        views: EvalViews = _ONE_VIEW,
        root: str | os.PathLike[str] | None = None,
        class_names: str | os.PathLike[str] | Sequence[str] | None = None,
        strict: bool = False,
        slowfast_alpha: int | None = None,
        max_replacements: int = 20,
        manifest_kind: ManifestKind = "auto",
    ) -> None:
        check_instance("base_shape", base_shape, GridShape)
        check_instance("clip_sampling", clip_sampling, ClipSampling)
        check_instance("views", views, EvalViews)
        clip_sampling.check_fits(base_shape.crop_size)  # the evaluation short side is the jitter minimum
        super().__init__(
            load_manifest(manifest, root=root, class_names=class_names, kind=manifest_kind), reader, strict=strict,
            slowfast_alpha=slowfast_alpha, max_replacements=max_replacements,
        )
        self.base_shape = base_shape
        self.clip_sampling = clip_sampling
        self.views = views

    @property
    def short_side(self) -> int:
        """The short side in pixels before the crop (:func:`~lightning_multigrid.data.clip_params.eval_short_side`)."""
        return eval_short_side(self.base_shape, self.clip_sampling)

    @property
    def clips_per_video(self) -> int:
        """Evaluation clips of one video: ``num_views * num_crops``."""
        return self.views.num_views * self.views.num_crops

    def __len__(self) -> int:
        return self.num_videos * self.clips_per_video

    def __getitem__(self, item: int) -> Sample:
        """View ``item % clips_per_video`` of video ``item // clips_per_video``; keys as training plus ``"view"``."""
        if not 0 <= item < len(self):
            raise IndexError(f"Item {item} is out of range for {len(self)} views.")
        video_index, view = divmod(item, self.clips_per_video)
        temporal, spatial = divmod(view, self.views.num_crops)

        def draw(source: ClipSource, attempt: int) -> ClipParams:
            # A replacement is another video's same view: evaluation views are fixed, not drawn.
            return eval_clip_params(source, self.base_shape, self.clip_sampling, self.views, temporal, spatial)

        index, video, skipped = self._load_or_replace(video_index, item, draw)
        sample = self._sample(index, video, skipped)
        sample["view"] = view
        return sample


def replacement_seed(seed: int, attempt: int) -> int:
    """The seed of replacement ``attempt`` (>= 1) for a request seeded ``seed``: the same in every process."""
    return random.Random(f"{seed}/{attempt}").getrandbits(63)


def collate_clips(samples: Sequence[Sample], video: Any = None) -> dict[str, Any]:
    """Stack samples into a batch.

    Args:
        samples: the samples (dicts as the datasets return them).
        video: the batch's ``"video"`` when the caller has already put the clips elsewhere (a
            worker, into a batch slot: :mod:`~lightning_multigrid.data.batch_slots`); ``None``:
            the clips are stacked here.

    Returns:
        ``{"video": uint8 (N, C, T, H, W) or [slow, fast] (or an
        :class:`~lightning_multigrid.data.decoding.device.EncodedBatch` of JPEG clips), "label": int64 (N,) or float (N, K),
        "index": int64 (N,), "skipped": list of paths (concatenated, possibly repeated)}``,
        plus ``"view": int64 (N,)`` for evaluation samples.

    Raises:
        ValueError: when the batch is empty or its clips have different shapes.
    """
    if not samples:
        raise ValueError("`collate_clips` got an empty batch.")
    batch: dict[str, Any] = {"video": _stack_videos(samples) if video is None else video}
    labels = [s["label"] for s in samples]
    label = torch.stack(labels) if isinstance(labels[0], torch.Tensor) else torch.tensor(labels, dtype=torch.int64)
    batch["label"] = label
    batch["index"] = torch.tensor([s["index"] for s in samples], dtype=torch.int64)
    batch["skipped"] = [path for s in samples for path in s["skipped"]]
    if "view" in samples[0]:
        batch["view"] = torch.tensor([s["view"] for s in samples], dtype=torch.int64)
    return batch


def _stack_videos(samples: Sequence[Sample]) -> torch.Tensor | list[torch.Tensor] | EncodedBatch:
    first = samples[0]["video"]
    try:
        if isinstance(first, EncodedClip):
            return EncodedBatch([s["video"] for s in samples])
        if isinstance(first, torch.Tensor):
            return torch.stack([s["video"] for s in samples])
        return [torch.stack([s["video"][p] for s in samples]) for p in range(len(first))]
    except RuntimeError as error:
        shapes = sorted({str(tuple(s["video"].shape)) for s in samples if isinstance(s["video"], torch.Tensor)})
        raise ValueError(f"Clips of one batch must share a shape, got {shapes or error}.") from None
