"""The data ``benchmarks/gpu.py`` makes before it measures: camera-like videos packed into a store for the
loader sections, and the built-in synthetic classes packed into stores for the end-to-end runs; frame
folders and GOP-12 videos on first use.

A sibling module of the benchmark scripts (``import bench_data``; no path manipulation).
"""

from __future__ import annotations

import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from harness import Setup
from loader import render_camera_video

from lightning_multigrid.data.manifests.load import load_manifest
from lightning_multigrid.data.synthetic import generate_synthetic_dataset, write_video
from lightning_multigrid.data.tools.extract import extract_frames
from lightning_multigrid.data.tools.pack import pack_frames


def _camera_video(path: Path, width: int, height: int, num_frames: int, fps: float, gop: int, seed: int) -> None:
    frames = render_camera_video(width, height, num_frames, np.random.default_rng(seed))
    write_video(path, frames, fps=fps, crf=23, preset="veryfast", gop_size=gop)


def camera_videos(setup: Setup, folder: Path, gop: int) -> Path:
    """``loader_videos`` camera-like videos at ``gop`` in ``folder``; returns their manifest."""
    width, height = setup.video_size
    num_frames = round(setup.video_seconds * setup.fps)
    folder.mkdir(parents=True)
    with ProcessPoolExecutor() as pool:
        jobs = [pool.submit(_camera_video, folder / f"{i:03d}.mp4", width, height, num_frames, setup.fps, gop, i)
                for i in range(setup.loader_videos)]
        for job in jobs:
            job.result()
    (folder / "train.csv").write_text("".join(f"{i:03d}.mp4 0\n" for i in range(setup.loader_videos)))
    return folder / "train.csv"


def make_data(setup: Setup, root: Path, sections: set[str]) -> dict[str, Any]:
    """The loader's videos (GOP 250) packed into a store, and, when a training section is selected, the
    training videos packed into stores (straight from the mp4 files). Frame folders and GOP-12 videos
    are made later, by the sections that read them (:func:`ensure`)."""
    width, height = setup.video_size
    num_frames = round(setup.video_seconds * setup.fps)
    data: dict[str, Any] = {"description": f"{width}x{height}, {setup.video_seconds:g} s at {setup.fps:g} fps",
                            "seconds": {}, "root": str(root), "train_dir": str(root / "train")}
    started = time.perf_counter()
    manifests = {"mp4 gop250": camera_videos(setup, root / "gop250", 250)}
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
        manifests[what] = str(camera_videos(setup, root / "gop12", 12))
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
