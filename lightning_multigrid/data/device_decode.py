"""Decode a batch of JPEG clips on the training device: workers read bytes, the GPU does the pixels.

With ``frame_decode="device"`` the DataModule's workers return
:class:`~lightning_multigrid.data.frames.EncodedClip` (the sampled frames' JPEG bytes and the
clip's parameters, drawn from the same seeds as the CPU path); :func:`decode_clips` then decodes
every frame of the batch in one batched call (nvjpeg on CUDA), resizes each clip to its drawn
short side, crops and flips it on the device. On ``device="cpu"`` the same code runs with libjpeg,
which is how it is tested without a GPU.

The decoder is torchcodec's ``decode_jpeg`` when torchcodec is installed and loads with this torch
(``pip install "lightning-multigrid[gpu]"``; on H100/H200 its nvjpeg batch uses the hardware JPEG
engines), else ``torchvision.io.decode_jpeg``, which torchvision 0.29 deprecates in torchcodec's
favour. Both give the same pixels (libjpeg-turbo on CPU; tested). :func:`jpeg_decoder` says which.

The resize is antialiased bilinear on the full decoded frame, so a clip matches the worker-side
path (PIL's DCT-scaled decode and box resize) within JPEG and resampling error.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from lightning_multigrid.data.frames import EncodedClip

__all__ = ["EncodedBatch", "decode_clips", "decode_jpegs", "jpeg_decoder"]

logger = logging.getLogger(__name__)

JpegDecoder = Callable[[list[torch.Tensor], torch.device], list[torch.Tensor]]


class EncodedBatch:
    """The clips of one batch, still JPEG bytes in host memory.

    A plain class on purpose, as :class:`EncodedClip`: Lightning's batch transfer leaves it on the
    host, where the JPEG decoder reads its input.
    """

    __slots__ = ("clips",)

    def __init__(self, clips: Sequence[EncodedClip]) -> None:
        self.clips = list(clips)

    def __len__(self) -> int:
        return len(self.clips)

    def __getstate__(self) -> list[EncodedClip]:
        return self.clips

    def __setstate__(self, state: list[EncodedClip]) -> None:
        self.clips = state


def decode_clips(batch: EncodedBatch | Sequence[EncodedClip], device: torch.device | str) -> torch.Tensor:
    """Decode, resize, crop and flip a batch of clips on ``device``.

    Args:
        batch: the clips; all share ``num_frames`` and ``crop_size`` (one grid per batch).
        device: where to decode (``"cuda"`` uses nvjpeg; ``"cpu"`` libjpeg).

    Returns:
        uint8 tensor ``(N, 3, T, crop_size, crop_size)`` on ``device``.

    Raises:
        ValueError: when the batch is empty or its clips differ in grid.
        RuntimeError: when a frame cannot be decoded (the worker checked headers; damage inside
            the data shows only here, where the clip can no longer be replaced: run
            ``lightning-multigrid check-data`` on the dataset).
    """
    clips = batch.clips if isinstance(batch, EncodedBatch) else list(batch)
    if not clips:
        raise ValueError("`decode_clips` got an empty batch.")
    grids = {(len(c.order), c.params.crop_size) for c in clips}
    if len(grids) != 1:
        raise ValueError(f"Clips of one batch must share a grid (num_frames, crop_size), got {sorted(grids)}.")
    device = torch.device(device)
    data = [torch.frombuffer(jpeg, dtype=torch.uint8) for clip in clips for jpeg in clip.jpegs]
    images = decode_jpegs(data, device)
    out = []
    start = 0
    for clip in clips:
        frames = torch.stack(images[start : start + len(clip.jpegs)])  # (distinct frames, 3, H, W)
        start += len(clip.jpegs)
        out.append(_resize_crop_flip(frames, clip)[list(clip.order)].transpose(0, 1))  # (3, T, S, S)
    return torch.stack(out)


def decode_jpegs(data: list[torch.Tensor], device: torch.device | str) -> list[torch.Tensor]:
    """Decode JPEG files to RGB in one batched call (nvjpeg decodes a list as a batch on CUDA).

    Args:
        data: each file's bytes, a 1-D uint8 tensor in host memory.
        device: where the pixels go (and where they are decoded).

    Returns:
        uint8 tensors ``(3, H, W)`` on ``device``, one per file.
    """
    return _decoder()[1](data, torch.device(device))


def jpeg_decoder() -> str:
    """The library that decodes: ``"torchcodec"`` when it is installed and loads, else ``"torchvision"``."""
    return _decoder()[0]


@functools.cache
def _decoder() -> tuple[str, JpegDecoder]:
    try:
        from torchcodec.decoders import decode_jpeg as torchcodec_decode
    except Exception as error:  # a torchcodec built for another torch fails with OSError or RuntimeError
        if not isinstance(error, ModuleNotFoundError):
            logger.warning("torchcodec is installed but does not load (%s); decoding JPEG with torchvision.", error)
        return "torchvision", _torchvision_decode

    def decode(data: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        return list(torchcodec_decode(data, mode="RGB", device=device))

    return "torchcodec", decode


def _torchvision_decode(data: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    import warnings

    from torchvision.io import ImageReadMode, decode_jpeg

    with warnings.catch_warnings():
        # torchvision 0.29 deprecates its image decoding; this is the fallback without torchcodec.
        warnings.filterwarnings("ignore", message=".*image decoding and encoding capabilities of TorchVision")
        return list(decode_jpeg(data, mode=ImageReadMode.RGB, device=device))


def _resize_crop_flip(frames: torch.Tensor, clip: EncodedClip) -> torch.Tensor:
    """``(K, 3, H, W)`` uint8 frames to ``(K, 3, S, S)`` uint8 with the clip's parameters."""
    params = clip.params
    resized = F.interpolate(
        frames.float(),
        size=(params.resize_height, params.resize_width),
        mode="bilinear",
        align_corners=False,
        antialias=True,  # like PIL's resize: shrinking averages, it does not alias
    )
    x, y, crop = params.crop_x, params.crop_y, params.crop_size
    out = resized[..., y : y + crop, x : x + crop].round_().clamp_(0, 255).to(torch.uint8)
    return out.flip(-1) if params.flip else out
