"""After the host-to-device copy: decode JPEG clips on the device, split pathways, normalise, cast.

Clips leave the workers as uint8 ``(N, C, T, H, W)`` (or JPEG bytes with ``frame_decode="device"``),
so large coarse-grid batches cost 4x fewer bytes through worker queues and the copy than float;
:class:`BatchTransfer` turns them into normalised float on the device. No Lightning here: the
DataModule passes the precision's input conversion in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lightning_multigrid._checks import check_bool, check_positive_int
from lightning_multigrid.data.decoding.device import EncodedBatch, decode_batch
from lightning_multigrid.models.pathways import slowfast_pathways

__all__ = ["DEFAULT_MEAN", "DEFAULT_STD", "BatchTransfer", "is_encoded", "normalize_video"]

# Kinetics statistics as used by PySlowFast and pytorchvideo, on [0, 1] RGB.
DEFAULT_MEAN: tuple[float, float, float] = (0.45, 0.45, 0.45)
DEFAULT_STD: tuple[float, float, float] = (0.225, 0.225, 0.225)


@dataclass(frozen=True, slots=True)
class BatchTransfer:
    """What happens to a batch on the device.

    Args:
        mean: per-channel RGB mean of ``[0, 1]`` video.
        std: per-channel RGB standard deviation, each > 0.
        slowfast_alpha: split device-decoded clips into ``[slow, fast]``, slow taking every
            ``alpha``-th frame (workers split the clips they decode themselves); ``None``: one pathway.
        strict: raise on a clip that fails to decode instead of replacing it.

    Raises:
        ValueError: on statistics that are not 3 values, a ``std`` that is not positive, an
            ``alpha`` that is not a positive integer, or a ``strict`` that is not a bool.
    """

    mean: tuple[float, float, float] = DEFAULT_MEAN
    std: tuple[float, float, float] = DEFAULT_STD
    slowfast_alpha: int | None = None
    strict: bool = False

    def __post_init__(self) -> None:
        for name, stats in (("mean", self.mean), ("std", self.std)):
            if len(stats) != 3:
                raise ValueError(f"`{name}` must have 3 values (R, G, B), got {stats!r}.")
            object.__setattr__(self, name, tuple(float(v) for v in stats))
        if not all(s > 0 for s in self.std):
            raise ValueError(f"`std` must be > 0, got {self.std!r}.")
        check_bool("strict", self.strict)
        check_positive_int("slowfast_alpha", self.slowfast_alpha, allow_none=True)

    def __call__(self, batch: dict[str, Any], convert: Callable[[Any], Any] | None = None) -> None:
        """Finish ``batch`` in place on the device its ``"label"`` is on.

        JPEG clips are decoded first (:meth:`decode`); then uint8 video becomes
        ``(video / 255 - mean) / std`` in float32, for a tensor ``(N, 3, T, H, W)`` or a
        ``[slow, fast]`` list, and goes through ``convert`` (the Trainer precision's input
        conversion: bfloat16 for ``"bf16-true"``, float32 kept under mixed precision).
        """
        if is_encoded(batch):
            self.decode(batch, batch["label"].device)
        if "video" in batch:
            video = normalize_video(batch["video"], self.mean, self.std)
            batch["video"] = convert(video) if convert is not None else video

    def decode(self, batch: dict[str, Any], device: torch.device) -> None:
        """Decode ``batch["video"]`` (JPEG clips) on ``device`` in place: uint8 ``(N, 3, T, S, S)`` or ``[slow, fast]``.

        A clip that fails to decode is a skip, as in the workers: it is replaced by a good clip of
        the batch, whose label, index (and view) replace its own, and its video is added to
        ``batch["skipped"]`` (with ``strict``, :class:`~lightning_multigrid.data.decoding.errors.VideoDecodeError`).
        """
        decoded = decode_batch(batch["video"], device, strict=self.strict)
        if decoded.skipped:
            sources = torch.tensor(decoded.sources)
            for key in ("label", "index", "view"):
                if isinstance(batch.get(key), torch.Tensor):
                    batch[key] = batch[key][sources.to(batch[key].device)]
            batch["skipped"] = [*batch.get("skipped", ()), *decoded.skipped]
        alpha = self.slowfast_alpha
        batch["video"] = decoded.video if alpha is None else slowfast_pathways(decoded.video, alpha)


def is_encoded(batch: Any) -> bool:
    """Whether ``batch`` is a dict whose ``"video"`` is still JPEG clips (:class:`EncodedBatch`), to decode on the device.

    The batch carries its reader's answer (:attr:`ClipReader.encoded
    <lightning_multigrid.data.decoding.readers.ClipReader.encoded>`: such a reader's clips collate into an
    ``EncodedBatch``), and is asked here because the reader cannot tell this batch's state: it may come
    from any split's loader, or have been decoded ahead of the step already.
    """
    return isinstance(batch, dict) and isinstance(batch.get("video"), EncodedBatch)


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
