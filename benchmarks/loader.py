"""Clip loading throughput: our dataset vs pytorchvideo's PyAV path, on the same files.

Writes H.264 test videos (320x240 and 640x480 by default) into a temporary directory, then loads
random training clips through a DataLoader with the same number of workers for both:

- **ours**: ``TrainVideoDataset`` indexed by ``ClipRequest`` (seek, decode to the clip's end,
  convert only the sampled frames, resized inside swscale), uint8 output;
- **pytorchvideo**: ``EncodedVideo.from_path(path, decode_audio=False, decoder="pyav")``,
  ``get_clip`` over the span, then what its Kinetics recipe does in workers (without importing
  ``pytorchvideo.transforms``, which fails with current torchvision): uniform temporal subsample,
  random short-side scale (``F.interpolate``, bilinear), random crop, random flip; float32 output.

Both take the same span (``num_frames * stride`` source frames) at the base grid and at the
coarsest grid of the schedule (the first short-cycle grid of the first long-cycle stage).

Run::

    python benchmarks/loader.py                 # about 3-4 minutes on 2 cores
    python benchmarks/loader.py --clips 32 --sizes 320x240
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from lightning_multigrid.data.dataset import TrainVideoDataset, collate_clips
from lightning_multigrid.data.request import ClipRequest
from lightning_multigrid.data.synthetic import write_video
from lightning_multigrid.schedule import GridShape, MultigridConfig, build_schedule


@dataclass(frozen=True)
class Case:
    size: str
    name: str
    grid: GridShape
    stride: int
    scale_range: tuple[int, int]


def render_camera_video(width: int, height: int, num_frames: int, rng: np.random.Generator) -> np.ndarray:
    """A panning smooth background with moving textured squares: motion everywhere, like real footage."""
    margin = num_frames * 4  # pans at most 1.5 px per frame from the middle
    small = rng.normal(0, 1, ((height + margin) // 8 + 2, (width + margin) // 8 + 2, 3))
    background = np.kron(small, np.ones((8, 8, 1)))
    background = (128 + 50 * background).clip(0, 255).astype(np.uint8)
    vx, vy = rng.uniform(-1.5, 1.5, 2)
    squares = []
    for _ in range(3):
        size = int(rng.integers(height // 8, height // 4))
        yy, xx = np.mgrid[0:size, 0:size]
        pattern = ((yy // 4 + xx // 4) % 2).astype(bool)[..., None]
        patch = np.where(pattern, rng.integers(0, 256, 3), rng.integers(0, 256, 3)).astype(np.uint8)
        squares.append((patch, rng.uniform(0, width - size), rng.uniform(0, height - size), *rng.uniform(-3, 3, 2)))
    frames = np.empty((num_frames, height, width, 3), np.uint8)
    for t in range(num_frames):
        ox, oy = int(margin / 2 + vx * t), int(margin / 2 + vy * t)
        frames[t] = background[oy : oy + height, ox : ox + width]
        for patch, x, y, dx, dy in squares:
            size = patch.shape[0]
            px = int(np.clip(x + dx * t, 0, width - size))
            py = int(np.clip(y + dy * t, 0, height - size))
            frames[t, py : py + size, px : px + size] = patch
    return frames


class PyTorchVideoClips(Dataset[dict[str, Any]]):
    """pytorchvideo's PyAV decoding with its Kinetics training transforms done in torch."""

    def __init__(self, paths: list[str], requests: list[ClipRequest], fps: float) -> None:
        self.paths, self.requests, self.fps = paths, requests, fps

    def __len__(self) -> int:
        return len(self.requests)

    def __getitem__(self, item: int) -> dict[str, Any]:
        from pytorchvideo.data.encoded_video import EncodedVideo

        request = self.requests[item]
        rng = random.Random(request.seed)
        video = EncodedVideo.from_path(self.paths[request.index], decode_audio=False, decoder="pyav")
        stride = request.stride_range[0]
        clip_duration = request.num_frames * stride / self.fps
        start = rng.uniform(0, max(float(video.duration) - clip_duration, 0))
        frames = video.get_clip(start, start + clip_duration)["video"]  # float32 (C, T, H, W)
        video.close()
        # UniformTemporalSubsample
        indices = torch.linspace(0, frames.shape[1] - 1, request.num_frames).clamp(0, frames.shape[1] - 1).long()
        frames = frames.index_select(1, indices)
        # RandomShortSideScale
        short_side = rng.randint(*request.scale_range)
        height, width = frames.shape[-2:]
        if width < height:
            size = (int(math.floor(height * short_side / width)), short_side)
        else:
            size = (short_side, int(math.floor(width * short_side / height)))
        frames = F.interpolate(frames, size=size, mode="bilinear", align_corners=False)
        # RandomCrop, RandomHorizontalFlip
        crop = request.crop_size
        y, x = rng.randint(0, size[0] - crop), rng.randint(0, size[1] - crop)
        frames = frames[..., y : y + crop, x : x + crop]
        if rng.random() < 0.5:
            frames = frames.flip(-1)
        return {"video": frames, "label": 0}


def make_videos(directory: Path, width: int, height: int, count: int, seconds: float, fps: float) -> list[str]:
    paths = []
    for i in range(count):
        path = directory / f"{width}x{height}_{i}.mp4"
        frames = render_camera_video(width, height, round(seconds * fps), np.random.default_rng(i))
        write_video(path, frames, fps=fps, crf=23, preset="veryfast")
        paths.append(str(path))
    return paths


def clips_per_second(loader: DataLoader[Any], clips: int) -> float:
    start = time.perf_counter()
    seen = 0
    for batch in loader:
        video = batch["video"]
        seen += (video[0] if isinstance(video, list) else video).shape[0]
    elapsed = time.perf_counter() - start
    if seen != clips:
        raise RuntimeError(f"loaded {seen} clips, expected {clips}")
    return clips / elapsed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="320x240,640x480", help="source resolutions, comma-separated")
    parser.add_argument("--videos", type=int, default=6, help="videos per resolution (6)")
    parser.add_argument("--seconds", type=float, default=5.0, help="video length in seconds (5)")
    parser.add_argument("--fps", type=float, default=30.0, help="source frame rate (30)")
    parser.add_argument("--clips", type=int, default=48, help="clips per measurement (48)")
    parser.add_argument("--batch-size", type=int, default=8, help="clips per batch for both loaders (8)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers for both (2)")
    parser.add_argument("--num-frames", type=int, default=16, help="baseline frames T (16)")
    parser.add_argument("--crop-size", type=int, default=112, help="baseline crop S (112)")
    parser.add_argument("--stride", type=int, default=4, help="baseline stride tau (4)")
    args = parser.parse_args(argv)

    schedule = build_schedule(
        MultigridConfig(
            batch_size=8, num_frames=args.num_frames, crop_size=args.crop_size, sampling_rate=args.stride,
            max_epochs=100, milestones=(50, 80),
        )
    )
    base = schedule.base_shape
    coarsest = schedule.stages[0].short_cycle[0]
    coarse_stride = round(schedule.stages[0].sampling_rate[1])  # same span as the base grid
    cases = []
    for size in args.sizes.split(","):
        cases.append(Case(size, "base", base, args.stride, schedule.jitter_scales_for(base.crop_size)))
        cases.append(Case(size, "coarsest", coarsest, coarse_stride, schedule.jitter_scales_for(coarsest.crop_size)))

    print(
        f"torch {torch.__version__}, {args.workers} DataLoader workers, batch {args.batch_size}, {args.clips} clips "
        f"per measurement, {args.videos} videos of {args.seconds:g} s at {args.fps:g} fps per size (H.264, x264 "
        "veryfast crf 23, default GOP 250)",
        file=sys.stderr,
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            width, height = map(int, size.split("x"))
            t = time.perf_counter()
            paths = make_videos(Path(tmp), width, height, args.videos, args.seconds, args.fps)
            print(f"wrote {len(paths)} {size} videos in {time.perf_counter() - t:.1f} s", file=sys.stderr)
            manifest = Path(tmp) / f"{size}.csv"
            manifest.write_text("".join(f"{Path(p).name} 0\n" for p in paths))
            for case in (c for c in cases if c.size == size):
                requests = [
                    ClipRequest(
                        index=i % len(paths),
                        num_frames=case.grid.num_frames,
                        crop_size=case.grid.crop_size,
                        stride_range=(float(case.stride), float(case.stride)),
                        scale_range=case.scale_range,
                        seed=i,
                    )
                    for i in range(args.clips)
                ]
                batches = [requests[i : i + args.batch_size] for i in range(0, len(requests), args.batch_size)]
                ours = DataLoader(
                    TrainVideoDataset(manifest), batch_sampler=batches, collate_fn=collate_clips,
                    num_workers=args.workers,
                )
                theirs = DataLoader(
                    PyTorchVideoClips(paths, requests, args.fps), batch_size=args.batch_size,
                    num_workers=args.workers,
                )
                ours_rate = clips_per_second(ours, args.clips)
                theirs_rate = clips_per_second(theirs, args.clips)
                rows.append((case, ours_rate, theirs_rate))
                print(f"  {size} {case.name}: ours {ours_rate:.1f} clips/s, pytorchvideo {theirs_rate:.1f}", file=sys.stderr)

    print()
    print(f"{'source':<9} {'grid':<9} {'frames x crop':<14} {'stride':>6} {'ours clips/s':>13} {'pytorchvideo':>13} {'ratio':>7}")
    for case, ours_rate, theirs_rate in rows:
        shape = f"{case.grid.num_frames} x {case.grid.crop_size}"
        print(
            f"{case.size:<9} {case.name:<9} {shape:<14} {case.stride:>6} {ours_rate:>13.1f} {theirs_rate:>13.1f} "
            f"{ours_rate / theirs_rate:>6.1f}x"
        )


if __name__ == "__main__":
    main()
