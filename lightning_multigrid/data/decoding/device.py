"""Decode a batch of JPEG clips on the training device: workers read bytes, the GPU does the pixels.

With ``frame_decode="device"`` the DataModule's workers return
:class:`~lightning_multigrid.data.decoding.frames.EncodedClip` (the sampled frames' JPEG bytes and the
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

A frame damaged inside its compressed data passes the workers' header check and fails only here:
:func:`decode_batch` then finds the failing clips, names video and frame, and replaces them with
good clips of the same batch (counted and logged as the workers count and log a skip); with
``strict`` it raises :class:`~lightning_multigrid.data.decoding.errors.VideoDecodeError`.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import torch
import torch.nn.functional as F

from lightning_multigrid.data.decoding.errors import VideoDecodeError
from lightning_multigrid.data.decoding.frames import EncodedClip
from lightning_multigrid.data.skips import report_skip

__all__ = [
    "DeviceDecode",
    "EncodedBatch",
    "crop_resize_flip",
    "crop_resize_flip_per_clip",
    "decode_batch",
    "decode_clips",
    "decode_jpegs",
    "jpeg_decoder",
    "resize_crop_flip_per_clip",
]

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


class DeviceDecode(NamedTuple):
    """A batch decoded on the device, with the clips that could not be decoded replaced.

    Attributes:
        video: uint8 ``(N, 3, T, crop_size, crop_size)`` on the device.
        sources: for each clip of the batch, the clip whose pixels it now holds: itself, or a good
            clip of the same batch when its own failed (its label and index go with it).
        skipped: the videos (:attr:`EncodedClip.video`) replaced, in batch order.
    """

    video: torch.Tensor
    sources: tuple[int, ...]
    skipped: tuple[str, ...]


def decode_clips(batch: EncodedBatch | Sequence[EncodedClip], device: torch.device | str) -> torch.Tensor:
    """Decode, resize, crop and flip a batch of clips on ``device``; a frame that fails raises.

    Args:
        batch: the clips; all share ``num_frames`` and ``crop_size`` (one grid per batch).
        device: where to decode (``"cuda"`` uses nvjpeg; ``"cpu"`` libjpeg).

    Returns:
        uint8 tensor ``(N, 3, T, crop_size, crop_size)`` on ``device``.

    Raises:
        ValueError: when the batch is empty or its clips differ in grid.
        VideoDecodeError: naming the video and the frame that cannot be decoded (the worker
            checked headers; damage inside the compressed data shows only here).
            :func:`decode_batch` replaces such clips instead.
    """
    return decode_batch(batch, device, strict=True).video


def decode_batch(
    batch: EncodedBatch | Sequence[EncodedClip], device: torch.device | str, strict: bool = False
) -> DeviceDecode:
    """Decode a batch on ``device`` in one call; when it fails, find, name and replace the bad clips.

    A failed batched call is retried clip by clip to find the clips that fail (and in them, the
    frame). Without ``strict`` each is replaced by a good clip of the same batch (the batch keeps
    its size and grid), logged once per process as the workers log a skip, and returned in
    ``skipped`` for counting. A batch whose every clip decodes alone re-raises the batched call's
    error: that is no fault of the data.

    Raises:
        ValueError: when the batch is empty or its clips differ in grid.
        VideoDecodeError: with ``strict``, naming the first bad clip's video and frame.
        RuntimeError: when no clip of the batch decodes.
    """
    clips = _clips_of(batch)
    device = torch.device(device)
    try:
        return DeviceDecode(_decode(clips, device), tuple(range(len(clips))), ())
    except RuntimeError:
        failures = {i: reason for i, clip in enumerate(clips) if (reason := _failure_of(clip, device))}
        if not failures:
            raise
    first = min(failures)
    if strict:
        raise VideoDecodeError(clips[first].video, failures[first]) from None
    good = [i for i in range(len(clips)) if i not in failures]
    if not good:
        raise RuntimeError(
            f"No clip of a batch of {len(clips)} decodes on {device}, e.g. {clips[first].video}: {failures[first]}. "
            "Run `lightning-multigrid check-data` on the dataset to list the bad frames."
        )
    for i, reason in failures.items():
        report_skip(clips[i].video, reason)
    # Replacements cycle over the good clips, in batch order: deterministic, and spread.
    replacement = {i: good[k % len(good)] for k, i in enumerate(sorted(failures))}
    sources = tuple(replacement.get(i, i) for i in range(len(clips)))
    decoded = _decode([clips[i] for i in good], device)
    position = {i: k for k, i in enumerate(good)}
    video = decoded[[position[source] for source in sources]]
    return DeviceDecode(video, sources, tuple(clips[i].video for i in sorted(failures)))


def _clips_of(batch: EncodedBatch | Sequence[EncodedClip]) -> list[EncodedClip]:
    clips = batch.clips if isinstance(batch, EncodedBatch) else list(batch)
    if not clips:
        raise ValueError("`decode_clips` got an empty batch.")
    grids = {(len(c.order), c.params.crop_size) for c in clips}
    if len(grids) != 1:
        raise ValueError(f"Clips of one batch must share a grid (num_frames, crop_size), got {sorted(grids)}.")
    return clips


def _decode(clips: list[EncodedClip], device: torch.device) -> torch.Tensor:
    """The clips decoded in one batched call and assembled: ``(N, 3, T, S, S)``."""
    data = [torch.frombuffer(jpeg, dtype=torch.uint8) for clip in clips for jpeg in clip.jpegs]
    return crop_resize_flip(decode_jpegs(data, device), clips)


def crop_resize_flip(images: Sequence[torch.Tensor], clips: Sequence[EncodedClip]) -> torch.Tensor:
    """Resize, crop and flip every decoded frame of a batch at once, and put the frames in clip order.

    The resize is :func:`resize_crop_flip_per_clip`'s, antialiased bilinear (torch's weights), written
    as two matrix products per clip: ``rows @ frames @ columns.T``, where ``rows`` (``S x H``) and
    ``columns`` (``S x W``) hold the resize weights of the crop's output rows and columns only (a
    flip is the columns in reverse order). A clip's frames share one size and one geometry, so the
    weights are built once per clip, for the whole batch at once on the frames' device, in a fixed
    number of tensor operations (:func:`band_resize_weights`). Each output reads a few inputs only, so
    the weights are kept as bands: the outputs in blocks of :data:`BLOCK`, each block with the inputs
    it reads (``L``, a few more than ``BLOCK`` times the scale); the product then costs about ``L / H``
    of a dense one. Per distinct frame size (one for a dataset of one aspect ratio): one gather of
    the bands and one batched product per axis (on CPU in chunks of clips that stay in the caches,
    :data:`CPU_CHUNK_BYTES`). Host work per batch: the clips' geometry as one small tensor and the
    list of frames to stack; on a GPU no tensor operation per clip or per frame. The pixels are
    the reference's up to float rounding (at most 1 grey level apart; ``tests/test_data_device_decode.py``
    checks small and large crops and mixed frame sizes).

    Args:
        images: uint8 ``(3, H, W)`` frames on one device, clip after clip, each clip's distinct
            frames (:attr:`EncodedClip.jpegs`) in order; the frames of one clip share a size.
        clips: the clips the frames belong to; all share ``num_frames`` and ``crop_size``.

    Returns:
        uint8 ``(N, 3, T, crop_size, crop_size)`` on the frames' device.
    """
    crop, num_frames = clips[0].params.crop_size, len(clips[0].order)
    device = images[0].device
    starts = list(itertools.accumulate((len(clip.jpegs) for clip in clips), initial=0))
    groups: dict[tuple[int, int], list[int]] = {}  # frame size -> its clips, in batch order
    for i, start in enumerate(starts[:-1]):
        groups.setdefault((images[start].shape[-2], images[start].shape[-1]), []).append(i)
    grouped = [i for members in groups.values() for i in members]  # the clips, grouped by frame size
    table = [(*_geometry(clips[i], images[starts[i]]), i) for i in grouped]
    geometry = torch.tensor(table, dtype=torch.float64, device=device)
    rows = band_resize_weights(geometry[:, 0], geometry[:, 2], geometry[:, 4], crop, _band(table, 0, 2))
    columns = band_resize_weights(geometry[:, 1], geometry[:, 3], geometry[:, 5], crop, _band(table, 1, 3), geometry[:, 6] > 0)
    video = torch.empty((len(clips), 3, num_frames, crop, crop), dtype=torch.uint8, device=device)
    first = 0
    for (h, w), members in groups.items():
        size = _chunk_size(len(members), rows.inputs.shape[1:], num_frames * 3 * w, device)
        for chunk in range(0, len(members), size):
            part = members[chunk : chunk + size]
            rows_part = BandWeights(*(t[first : first + len(part)] for t in rows))
            columns_part = BandWeights(*(t[first : first + len(part)] for t in columns))
            # Frames in output order (a frame a clip repeats is stacked twice): (n, T, 3, h, w).
            frames = torch.stack([images[starts[i] + k] for i in part for k in clips[i].order])
            resized = _resize_clips(frames.view(len(part), num_frames, 3, h, w), rows_part, columns_part, crop)
            if part[-1] - part[0] == len(part) - 1:  # consecutive clips of the batch (one frame size: all)
                video[part[0] : part[-1] + 1].copy_(resized)  # the float is rounded: the copy truncates exactly
            else:  # by the table's own column of clip numbers: no second copy from the host
                video.index_copy_(0, geometry[first : first + len(part), 7].long(), resized.to(torch.uint8))
            first += len(part)
    return video


# Outputs per band of resize weights: larger blocks read fewer inputs twice (the band's overlap with
# the next, about twice the filter's support) but multiply more zeros (a block of B outputs reads about
# B x scale inputs, each output only 2 x support of them). 8 is best on CPU at the coarsest grid.
BLOCK = 8


class BandWeights(NamedTuple):
    """Resize weights as bands: ``weights`` ``(N, blocks, BLOCK, L)`` float32 apply to the inputs
    ``inputs`` ``(N, blocks, L)`` (int64, each inside its frame) of each block of outputs."""

    weights: torch.Tensor
    inputs: torch.Tensor


def _geometry(clip: EncodedClip, frame: torch.Tensor) -> tuple[int, int, int, int, int, int, int]:
    """One clip's row of :func:`crop_resize_flip`'s table (before its number in the batch): frame
    size, resized size, crop corner, flip."""
    p = clip.params
    return frame.shape[-2], frame.shape[-1], p.resize_height, p.resize_width, p.crop_y, p.crop_x, int(p.flip)


def _band(table: Sequence[tuple[int, ...]], in_column: int, out_column: int) -> int:
    """Inputs a block of :data:`BLOCK` outputs reads at most, over the batch (host arithmetic on the table)."""
    scale = max(row[in_column] / row[out_column] for row in table)
    # Centers span (BLOCK - 1) x scale; each window reaches support (>= 1) to both sides, +1 for the
    # floors, +1 for float rounding.
    return min(int((BLOCK - 1) * scale + 2 * max(scale, 1.0)) + 2, max(row[in_column] for row in table))


def band_resize_weights(
    in_size: torch.Tensor, out_size: torch.Tensor, start: torch.Tensor, count: int, band: int, reverse: torch.Tensor | None = None
) -> BandWeights:
    """The weights of torch's antialiased bilinear resizes ``in_size -> out_size``, outputs ``start .. start+count-1``, as bands.

    ``F.interpolate(mode="bilinear", antialias=True, align_corners=False)`` along one axis: output
    ``i`` is centred on input ``scale * (i + 0.5)`` and averages the inputs within ``support`` of it with
    a triangle filter stretched by ``scale`` when shrinking (the antialiasing), normalised to sum 1.
    A batch of such resizes (one per clip) at once, on the tensors' device, in a fixed number of
    tensor operations whatever ``N``; outputs in blocks of :data:`BLOCK`, each block's weights over
    the ``band`` inputs from its first.

    Args:
        in_size: ``(N,)`` float64 input sizes (pixels along the axis).
        out_size: ``(N,)`` sizes after the resize.
        start: ``(N,)`` the first output kept (the crop's edge).
        count: outputs kept from each (the crop's side); the last block's outputs past it repeat the
            last one (computed, then dropped).
        band: inputs per block (:func:`_band`: enough for the batch's largest scale).
        reverse: ``(N,)`` bools: the kept outputs in reverse order (a horizontal flip).

    Returns:
        :class:`BandWeights`, each block's rows summing to 1.
    """
    scale = in_size / out_size
    support = torch.where(scale >= 1, scale, 1.0)[:, None, None]  # (N, 1, 1)
    stretch = torch.where(scale >= 1, 1 / scale, 1.0)[:, None, None, None]  # (N, 1, 1, 1)
    blocks = -(-count // BLOCK)
    outputs = torch.arange(blocks * BLOCK, dtype=scale.dtype, device=scale.device).clamp_(max=count - 1).view(blocks, BLOCK)
    if reverse is not None:
        outputs = torch.where(reverse[:, None, None], count - 1 - outputs, outputs)  # (N or 1, blocks, BLOCK)
    centers = scale[:, None, None] * (start[:, None, None] + outputs + 0.5)  # (N, blocks, BLOCK)
    # torch's window: inputs int(center - support + 0.5) .. int(center + support + 0.5) - 1, inside the frame
    low = (centers - support + 0.5).floor().clamp_(min=0)
    high = torch.minimum((centers + support + 0.5).floor(), in_size[:, None, None])
    first = torch.minimum(low.amin(-1), (in_size[:, None] - band).clamp_(min=0))  # (N, blocks): the band's first input
    inputs = first[..., None] + torch.arange(band, dtype=scale.dtype, device=scale.device)  # (N, blocks, band)
    distance = inputs[:, :, None, :] - centers[..., None] + 0.5  # (N, blocks, BLOCK, band)
    weights = (1 - (distance * stretch).abs()).clamp_(min=0)
    weights *= (inputs[:, :, None, :] >= low[..., None]) & (inputs[:, :, None, :] < high[..., None])
    weights /= weights.sum(-1, keepdim=True)
    inside = torch.minimum(inputs, in_size[:, None, None] - 1).long()  # past a short frame's end: weight 0, read its last input
    return BandWeights(weights.float(), inside)


# On CPU, clips are resized in chunks whose gathered rows take about this many bytes (float32): a
# whole coarsest batch's (100-200 MB) leaves the caches, and each such allocation is fresh memory
# from the OS (page faults), which made the batch 2-3x slower than the per-clip resize.
CPU_CHUNK_BYTES = 2 << 20


def _chunk_size(clips: int, band_shape: torch.Size, row_length: int, device: torch.device) -> int:
    """Clips resized together: all of them on an accelerator; on CPU as many as fit :data:`CPU_CHUNK_BYTES`."""
    if device.type != "cpu":
        return clips
    blocks, band = band_shape
    return max(1, min(clips, CPU_CHUNK_BYTES // (blocks * band * row_length * 4)))


def _resize_clips(frames: torch.Tensor, rows: BandWeights, columns: BandWeights, crop: int) -> torch.Tensor:
    """uint8 ``(n, T, 3, h, w)`` clips resized, cropped and flipped: float ``(n, 3, T, S, S)`` (a view),
    rounded and clamped to 0-255."""
    n, num_frames, _, h, w = frames.shape
    blocks, band = rows.inputs.shape[1:]  # the columns' band may be longer or shorter: read below
    # Rows: every (clip, block, band input, frame, channel) row of w pixels gathered at once, uint8.
    planes = torch.arange(n * num_frames * 3, device=frames.device).view(n, 1, 1, num_frames * 3) * h
    index = (planes + rows.inputs[..., None]).view(-1)  # (n * blocks * band * T * 3,)
    gathered = frames.view(-1, w).index_select(0, index).view(n * blocks, band, -1).float()
    resized = torch.bmm(rows.weights.view(n * blocks, BLOCK, band), gathered)  # (n * blocks, BLOCK, T * 3 * w)
    resized = resized.view(n, blocks * BLOCK, num_frames * 3, w)[:, :crop]  # (n, S_y, T * 3, w)
    # Columns: the same along x, on the rows' result turned x-first.
    turned = resized.permute(0, 3, 1, 2).reshape(n * w, -1)  # (n * w, S_y * T * 3)
    index = (torch.arange(n, device=frames.device).view(n, 1, 1) * w + columns.inputs).view(-1)
    band = columns.inputs.shape[2]
    gathered = turned.index_select(0, index).view(n * blocks, band, -1)
    resized = torch.bmm(columns.weights.view(n * blocks, BLOCK, band), gathered)  # (n * blocks, BLOCK, S_y * T * 3)
    resized = resized.view(n, blocks * BLOCK, crop, num_frames, 3)[:, :crop].permute(0, 4, 3, 2, 1)  # (n, 3, T, S_y, S_x)
    return resized.round_().clamp_(0, 255)


def _failure_of(clip: EncodedClip, device: torch.device) -> str | None:
    """Why ``clip`` does not decode (naming its frame), or ``None`` when it does."""
    try:
        _decode([clip], device)
        return None
    except RuntimeError as error:
        clip_error = error
    for k, jpeg in enumerate(clip.jpegs):
        try:
            decode_jpegs([torch.frombuffer(jpeg, dtype=torch.uint8)], device)
        except RuntimeError as error:
            frame = clip.frame_paths[k] if k < len(clip.frame_paths) else f"#{k} of the clip"
            return f"frame {frame} cannot be decoded on {device} ({_decoder_message(error)})"
    return f"the clip cannot be decoded on {device} ({_decoder_message(clip_error)})"


def _decoder_message(error: BaseException) -> str:
    """The decoder's own words, without the C++ source location it prefixes them with."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    match = re.search(r"\.(?:cpp|cu|h):\d+,\s*(.+)$", text)
    return f"{type(error).__name__}: {match.group(1) if match else text}"


def decode_jpegs(data: list[torch.Tensor], device: torch.device | str) -> list[torch.Tensor]:
    """Decode JPEG files to RGB in one batched call (nvjpeg decodes a list as a batch on CUDA).

    Args:
        data: each file's bytes, a 1-D uint8 tensor in host memory.
        device: where the pixels go (and where they are decoded).

    Returns:
        uint8 tensors ``(3, H, W)`` on ``device``, one per file, turned upright by the file's EXIF
        orientation tag where it has one (with torchcodec and with torchvision alike).
    """
    device = torch.device(device)
    decode = _decoder()[1]
    threads = min(CPU_DECODE_THREADS, len(data) // MIN_FILES_PER_THREAD) if device.type == "cpu" else 1
    if threads <= 1:
        return decode(data, device)
    # On a CPU the decoder loops over the files in one thread; its call releases the GIL, so the
    # files are split over threads (in this mode the workers only read bytes: the cores are free).
    size = -(-len(data) // threads)
    pool = _cpu_pool(os.getpid(), CPU_DECODE_THREADS)
    parts = pool.map(lambda start: decode(data[start : start + size], device), range(0, len(data), size))
    return [image for part in parts for image in part]


# Threads that decode one batch's JPEG files on a CPU, and the fewest files worth a thread.
CPU_DECODE_THREADS = min(4, os.cpu_count() or 1)
MIN_FILES_PER_THREAD = 32


@functools.cache
def _cpu_pool(pid: int, threads: int) -> ThreadPoolExecutor:
    """The process's decode threads (per process id: a forked child gets its own, not its parent's dead ones)."""
    return ThreadPoolExecutor(threads, thread_name_prefix="multigrid-jpeg")


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

    if device.type == "cuda":
        # torchvision's nvjpeg writes the frames on a stream of its own into memory the caching
        # allocator hands out for the current stream, where kernels still queued may read it (the
        # last batch's crop-resize, its blocks freed when it returned): wait for them first.
        # (torchcodec decodes on the current stream itself.)
        torch.cuda.current_stream(device).synchronize()

    with warnings.catch_warnings():
        # torchvision 0.29 deprecates its image decoding; this is the fallback without torchcodec.
        warnings.filterwarnings("ignore", message=".*image decoding and encoding capabilities of TorchVision")
        # Rotated by an EXIF orientation tag, as torchcodec's decoder does: the same pixels either way.
        return list(decode_jpeg(data, mode=ImageReadMode.RGB, device=device, apply_exif_orientation=True))


def resize_crop_flip_per_clip(frames: torch.Tensor, clip: EncodedClip) -> torch.Tensor:
    """One clip's ``(K, 3, H, W)`` uint8 frames to ``(K, 3, S, S)`` uint8: the exact antialiased resize, then crop and flip.

    The reference that :func:`crop_resize_flip` is tested against and ``benchmarks/gpu.py``
    times beside it (about ten kernels per clip); decoding uses :func:`crop_resize_flip`, which
    computes the same resize for the whole batch at once.
    """
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


def crop_resize_flip_per_clip(images: Sequence[torch.Tensor], clips: Sequence[EncodedClip]) -> torch.Tensor:
    """:func:`crop_resize_flip`'s result, clip by clip with :func:`resize_crop_flip_per_clip` (the reference)."""
    out, start = [], 0
    for clip in clips:
        frames = torch.stack(list(images[start : start + len(clip.jpegs)]))  # (distinct frames, 3, H, W)
        start += len(clip.jpegs)
        out.append(resize_crop_flip_per_clip(frames, clip)[list(clip.order)].transpose(0, 1))  # (3, T, S, S)
    return torch.stack(out)
