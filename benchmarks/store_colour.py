"""Colour of packed-store clips against frame-folder clips, and what each store encoding costs.

Issue 41, item 8: the store re-encodes frames resized to its level (JPEG quality 90, 4:2:0 chroma by
default before this measurement), so its clips differ in colour from the same clips read from the
frame folders. This packs one set of textured colour JPEG frame folders with each encoding, then in
one process, for each: the store's bytes; the mean and maximum absolute difference (grey levels,
0-255) between the same training clips (same ``ClipRequest``, same seed) read from the store and
from the frame folders; and the CPU seconds to decode those clips from the store (the workers' path),
as the median of ``--repeats`` rounds run side by side (variants interleaved).

    python benchmarks/store_colour.py [--content textured|smooth] [--videos 12] [--repeats 5] [--passes 4]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from lightning_multigrid.data.clip_params import ClipRequest
from lightning_multigrid.data.dataset import TrainVideoDataset
from lightning_multigrid.data.sources import load_manifest
from lightning_multigrid.data.tools.pack import pack_frames

VARIANTS = [(90, "4:2:0"), (90, "4:4:4"), (95, "4:2:0"), (95, "4:4:4"), (100, "4:4:4")]
CROP = 112  # level 0 at 160 px short side; the sources are 320 x 240, so every frame is resized and re-encoded


def textured_frames(num_frames: int, seed: int, width: int = 320, height: int = 240) -> list[np.ndarray]:
    """Saturated colour cells (6 px) over colour gradients, moving a pixel a frame: colour edges everywhere."""
    rng = np.random.default_rng(seed)
    palette = rng.integers(0, 256, (16, 3))
    cells = rng.integers(0, 16, (height // 6 + 2, width // 6 + 2))
    yy, xx = np.mgrid[0:height, 0:width]
    frames = []
    for t in range(num_frames):
        texture = palette[cells[(yy // 6) % cells.shape[0], ((xx + t) // 6) % cells.shape[1]]]
        gradient = np.stack([xx / width * 255, yy / height * 255, np.full_like(xx, 128 + 4 * t)], -1)
        frames.append((0.6 * texture + 0.4 * gradient).clip(0, 255).astype(np.uint8))
    return frames


def smooth_frames(num_frames: int, seed: int, width: int = 320, height: int = 240) -> list[np.ndarray]:
    """Colour gradients with soft moving blobs: little fine colour detail, as much natural video."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    centres = rng.uniform(0, 1, (3, 2)) * (width, height)
    frames = []
    for t in range(num_frames):
        image = np.stack([xx / width * 180, yy / height * 180, (xx + yy) / (width + height) * 120 + 2 * t], -1)
        for k, (cx, cy) in enumerate(centres):
            image[..., k] += 70 * np.exp(-(((xx - cx - 2 * t) ** 2 + (yy - cy) ** 2) / (2 * (width / 8) ** 2)))
        frames.append(image.clip(0, 255).astype(np.uint8))
    return frames


def write_dataset(root: Path, videos: int, content: str, num_frames: int = 16) -> Path:
    make = textured_frames if content == "textured" else smooth_frames
    for v in range(videos):
        folder = root / f"v{v}"
        folder.mkdir(parents=True)
        for i, frame in enumerate(make(num_frames, v)):
            Image.fromarray(frame).save(folder / f"img_{i + 1:05d}.jpg", quality=95)
    manifest = root / "frames.txt"
    manifest.write_text("".join(f"v{v} {v % 4}\n" for v in range(videos)))
    return manifest


def requests(videos: int) -> list[ClipRequest]:
    # Base-grid clips (8 frames, 112 crop) at the jitter range for 112 (128-160 px short side) and coarse ones.
    return [ClipRequest(v, 8, CROP, (1.0, 2.0), (128, 160), seed=100 + v) for v in range(videos)] + [
        ClipRequest(v, 4, 56, (1.0, 4.0), (64, 80), seed=200 + v) for v in range(videos)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--videos", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--content", choices=("textured", "smooth"), default="textured")
    parser.add_argument("--passes", type=int, default=4, help="decodes of every clip per timed round")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        manifest = write_dataset(root / "frames", args.videos, args.content)
        clips = requests(args.videos)
        frames = TrainVideoDataset(load_manifest(manifest), flip=False)
        reference = [frames[r]["video"].float() for r in clips]
        stores = {}
        for quality, subsampling in VARIANTS:
            report = pack_frames(load_manifest(manifest), root / f"q{quality}-{subsampling.replace(':', '')}.store",
                                 crop_size=CROP, quality=quality, subsampling=subsampling, workers=0, progress=False)
            stores[(quality, subsampling)] = (TrainVideoDataset(report.store, flip=False), report.level_bytes[0])
        cpu: dict[tuple[int, str], list[float]] = {key: [] for key in stores}
        for _ in range(args.repeats):
            for key, (dataset, _) in stores.items():  # interleaved: the machine's load falls on every variant alike
                started = time.process_time()
                for _ in range(args.passes):
                    for r in clips:
                        dataset[r]
                cpu[key].append(time.process_time() - started)
        base = statistics.median(cpu[VARIANTS[0]])
        print(f"{args.videos} videos x 16 {args.content} colour frames 320x240 (JPEG q95 4:4:4), level 0 at 160 px; "
              f"{len(clips)} clips ({args.videos} at 8x112, {args.videos} at 4x56) decoded {args.passes} times a round; "
              f"CPU s: median of {args.repeats} rounds")
        print(f"{'encoding':<14}{'store MiB':>10}{'size':>7}{'mean diff':>11}{'max diff':>10}"
              f"{'decode CPU s':>14}{'cost':>7}")
        base_bytes = stores[VARIANTS[0]][1]
        for key, (dataset, size) in stores.items():
            diffs = [(dataset[r]["video"].float() - ref).abs() for r, ref in zip(clips, reference)]
            mean = float(torch.cat([d.flatten() for d in diffs]).mean())
            worst = float(max(d.max() for d in diffs))
            seconds = statistics.median(cpu[key])
            print(f"q{key[0]} {key[1]:<10}{size / 2**20:>10.2f}{size / base_bytes:>6.2f}x{mean:>11.2f}{worst:>10.0f}"
                  f"{seconds:>14.3f}{seconds / base:>6.2f}x")


if __name__ == "__main__":
    main()
