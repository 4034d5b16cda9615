"""The data the benchmarks make before they measure: camera-like videos (``loader.py``'s sources; packed
into a store for ``gpu.py``'s loader sections), and the built-in synthetic classes packed into stores for
``gpu.py``'s end-to-end runs; frame folders and GOP-12 videos on first use.

A sibling module of the benchmark scripts (``import bench_data``; no path manipulation).
"""

from __future__ import annotations

import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from harness import Setup

from lightning_multigrid.data.sources import load_manifest
from lightning_multigrid.data.synthetic import generate_synthetic_dataset, write_video
from lightning_multigrid.data.tools.extract import extract_frames
from lightning_multigrid.data.tools.pack import pack_frames


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


def _camera_video(path: Path, width: int, height: int, num_frames: int, fps: float, gop: int | None, seed: int) -> None:
    frames = render_camera_video(width, height, num_frames, np.random.default_rng(seed))
    write_video(path, frames, fps=fps, crf=23, preset="veryfast", gop_size=gop)


def camera_videos(folder: Path, count: int, width: int, height: int, num_frames: int, fps: float, gop: int | None) -> Path:
    """``count`` camera-like videos (x264 veryfast, crf 23; video ``i`` seeded ``i``) at GOP ``gop`` (None: x264's
    default, 250) in ``folder``, written in parallel; returns their manifest."""
    folder.mkdir(parents=True)
    with ProcessPoolExecutor() as pool:
        jobs = [pool.submit(_camera_video, folder / f"{i:03d}.mp4", width, height, num_frames, fps, gop, i)
                for i in range(count)]
        for job in jobs:
            job.result()
    (folder / "train.csv").write_text("".join(f"{i:03d}.mp4 0\n" for i in range(count)))
    return folder / "train.csv"


def loader_videos(setup: Setup, folder: Path, gop: int) -> Path:
    """``setup``'s ``loader_videos`` camera-like videos at ``gop`` in ``folder``; returns their manifest."""
    width, height = setup.video_size
    return camera_videos(folder, setup.loader_videos, width, height, round(setup.video_seconds * setup.fps), setup.fps, gop)


def make_data(setup: Setup, root: Path, sections: set[str]) -> dict[str, Any]:
    """The loader's videos (GOP 250) packed into a store, and, when a training section is selected, the
    training videos packed into stores (straight from the mp4 files). Frame folders and GOP-12 videos
    are made later, by the sections that read them (:func:`ensure`)."""
    width, height = setup.video_size
    num_frames = round(setup.video_seconds * setup.fps)
    data: dict[str, Any] = {"description": f"{width}x{height}, {setup.video_seconds:g} s at {setup.fps:g} fps",
                            "seconds": {}, "root": str(root), "train_dir": str(root / "train")}
    started = time.perf_counter()
    manifests = {"mp4 gop250": loader_videos(setup, root / "gop250", 250)}
    # Level 0 at the grids' largest short side (160 for a 112 crop), as training packs it.
    manifests["store"] = pack_frames(load_manifest(manifests["mp4 gop250"]), root / "gop250.store",
                                     crop_size=setup.base.crop_size, progress=False).store
    data["loader_manifests"] = {k: str(v) for k, v in manifests.items()}
    data["seconds"]["loader_data"] = time.perf_counter() - started
    if any(name.startswith(("end_to_end", "transformer:end_to_end")) for name in sections):
        started = time.perf_counter()
        train = root / "train"
        generate_synthetic_dataset(
            train, num_train=setup.num_train, num_val=setup.num_val, seed=0, texture_cell=12,
            width=width, height=height, num_frames=num_frames, fps=setup.fps,
        )
        data["seconds"]["train_videos"] = time.perf_counter() - started
        data["train_stores"] = tuple(
            str(pack_frames(load_manifest(train / f"{split}.csv"), train / f"{split}.store",
                            crop_size=setup.base.crop_size, progress=False).store)
            for split in ("train", "val")
        )
        data["seconds"]["train_data"] = time.perf_counter() - started
        data["train_disk_mib"] = {
            "mp4": sum(p.stat().st_size for p in train.glob("**/*.mp4")) / 2**20,
            "store": sum(p.stat().st_size for p in train.glob("*.store/**/*") if p.is_file()) / 2**20,
        }
    return data


def ensure(setup: Setup, data: dict[str, Any], what: str) -> Any:
    """Data only some sections read, made on first use (its time counts in that section):
    ``"mp4 gop12"``, ``"frames"`` (the GOP-250 videos extracted) or ``"train_frame_manifests"``."""
    root = Path(data["root"])
    manifests = data["loader_manifests"]
    if what == "mp4 gop12" and what not in manifests:
        manifests[what] = str(loader_videos(setup, root / "gop12", 12))
    elif what == "frames" and what not in manifests:
        manifests[what] = str(extract_frames(load_manifest(Path(manifests["mp4 gop250"])), root / "frames250",
                                             progress=False).manifest)
    elif what == "train_frame_manifests" and what not in data:
        train = Path(data["train_dir"])
        data[what] = tuple(
            str(extract_frames(load_manifest(train / f"{split}.csv"), train / "frames", progress=False).manifest)
            for split in ("train", "val")
        )
    return data[what] if what in data else manifests[what]


def store_manifest(data: dict[str, Any]) -> Path:
    """The loader sections' store (the GOP-250 camera videos packed)."""
    return Path(data["loader_manifests"]["store"])
