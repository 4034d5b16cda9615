"""The device decode's crop-resize-flip: the batched one against the per-clip reference, side by side.

Times :func:`~lightning_multigrid.data.decoding.device.crop_resize_flip` (the resize weights built once
per clip for the whole batch, on the frames' device, then one batched product pair per frame size)
against :func:`~lightning_multigrid.data.decoding.device.crop_resize_flip_per_clip` (``F.interpolate``
clip by clip, the reference the tests compare pixels with) on the same decoded frames, in one process,
alternating the two so a shared machine's load falls on both alike. Frames are random uint8 textures
of a store level's size (the resize's cost does not depend on the pixels); each clip's short side,
crop corner and flip are drawn as training draws them (short side uniform in the grid's jitter range).

Grids: the coarsest of the default multigrid schedule (128 clips x 4 frames at crop 56, short side
64-160) and the base (8 x 16 x 112, short side 128-160), from the schedule itself; frame sizes: 106x80
(a store level of 80 px) and 212x160 (level 0 of the store ``benchmarks/gpu.py`` packs for crop 112,
340x256 videos). A level serves the draws up to its short side (the reader takes the smallest level at
least the drawn size): from 106x80, the coarsest grid's 64-80; the base grid never reads it.

    python benchmarks/device_resize.py                 # CPU, one thread (the issue's measurement)
    python benchmarks/device_resize.py --device cuda --threads 16

Prints, per grid and frame size, the milliseconds per batch (wall-clock and CPU) of both and the ratios
batched / per-clip of each (below 1: the batched one is faster; on a shared machine read the CPU one).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from grids import benchmark_schedule, selected_grids

from lightning_multigrid.data.clip_params import ClipRequest, sample_clip_params
from lightning_multigrid.data.decoding.device import crop_resize_flip, crop_resize_flip_per_clip
from lightning_multigrid.data.decoding.frames import EncodedClip
from lightning_multigrid.schedule import GridShape

FRAME_SIZES = ((106, 80), (212, 160))  # (width, height) of a store level


def default_grids() -> list[tuple[str, int, int, int, tuple[int, int]]]:
    """(name, clips, frames, crop, short-side range) of the coarsest grid and the base of gpu.py's schedule."""
    chosen = selected_grids(benchmark_schedule(GridShape(8, 16, 112), 4), ("coarsest", "base"))
    return [(f"{g.name} {g.shape.batch_size}x{g.shape.num_frames}x{g.shape.crop_size}", g.shape.batch_size,
             g.shape.num_frames, g.shape.crop_size, g.scale_range) for g in chosen]


class Level(NamedTuple):
    """A store level's frames, as the draws read a video."""

    width: int
    height: int
    num_frames: int


def batch(
    clips: int, frames: int, crop: int, scales: tuple[int, int], size: tuple[int, int], device: torch.device, seed: int = 0
) -> tuple[list[torch.Tensor], list[EncodedClip]]:
    """Decoded frames and their clips, as :func:`crop_resize_flip` gets them after the JPEG decode."""
    generator = torch.Generator().manual_seed(seed)
    width, height = size
    level = Level(width, height, frames)
    images, encoded = [], []
    for k in range(clips):  # drawn as training draws them: short side, crop corner, flip
        params = sample_clip_params(ClipRequest(k, frames, crop, (1.0, 1.0), scales, seed=seed * clips + k), level)
        images.extend(
            torch.randint(0, 256, (3, height, width), dtype=torch.uint8, generator=generator).to(device) for _ in range(frames)
        )
        encoded.append(EncodedClip([bytearray() for _ in range(frames)], tuple(range(frames)), params))
    return images, encoded


def time_pair(functions: dict[str, Callable[[], object]], repeats: int, device: torch.device) -> dict[str, tuple[float, float]]:
    """Median wall-clock and CPU milliseconds of each function, run alternately ``repeats`` times after one warm-up."""
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in functions}
    for k in range(repeats + 1):
        for name, function in functions.items():
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            wall, cpu = time.perf_counter(), time.process_time()
            function()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if k:  # the first round warms up (allocator, BLAS buffers)
                samples[name].append(((time.perf_counter() - wall) * 1e3, (time.process_time() - cpu) * 1e3))
    return {name: (statistics.median(s[0] for s in runs), statistics.median(s[1] for s in runs)) for name, runs in samples.items()}


def measure(
    device: torch.device, repeats: int, grids: Sequence[tuple[str, int, int, int, tuple[int, int]]] | None = None
) -> list[dict[str, object]]:
    """Per grid and frame size a level serves it from: both methods' ms per batch (wall, CPU) and the batched /
    per-clip ratios."""
    rows = []
    for name, clips, frames, crop, (low, high) in grids or default_grids():
        for size in FRAME_SIZES:
            if low > size[1]:
                continue  # every draw is larger than this level: the reader takes a larger one
            images, encoded = batch(clips, frames, crop, (low, min(high, size[1])), size, device)
            times = time_pair(
                {"batched": lambda: crop_resize_flip(images, encoded),  # noqa: B023 (timed at once)
                 "per_clip": lambda: crop_resize_flip_per_clip(images, encoded)},  # noqa: B023
                repeats, device,
            )
            rows.append({"grid": name, "frames": f"{size[0]}x{size[1]}", **times,
                         "ratio": times["batched"][0] / times["per_clip"][0],
                         "cpu_ratio": times["batched"][1] / times["per_clip"][1]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as the issue measured)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"device {device}, {torch.get_num_threads()} torch thread(s), median of {args.repeats}; ms per batch: wall / CPU")
    for row in measure(device, args.repeats):
        (bw, bc), (pw, pc) = row["batched"], row["per_clip"]  # type: ignore[misc]
        print(f"{row['grid']:>18} from {row['frames']:>7}: batched {bw:7.1f} / {bc:7.1f}   per-clip {pw:7.1f} / {pc:7.1f}"
              f"   batched/per-clip: wall {row['ratio']:.2f}, CPU {row['cpu_ratio']:.2f}")


if __name__ == "__main__":
    main()
