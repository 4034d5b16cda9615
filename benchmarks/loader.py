"""Clip loading throughput per grid: mp4 (PyAV), frame datasets (JPEG) and the packed frame store, CPU and GPU decode.

Writes H.264 test videos into a temporary directory, extracts them to a frame dataset
(``extract_frames``, JPEG quality 90, full size), then loads training clips through a DataLoader
at each grid of a multigrid schedule (base 8 x 16 x 112, stride 4, 100 epochs): the base grid,
each long-cycle shape, and the coarsest short-cycle shape, each with its batch size, stride range
and jitter range as the batch sampler asks for them. Per row it prints clips/s, and per source
the coarsest/base ratio and frames/mp4 at the base grid.

- ``mp4``: ``TrainVideoDataset`` on the video files (seek, decode through the span, convert only
  the sampled frames, resized inside swscale);
- ``frames``, decode ``cpu``: the same dataset on the frame folders (only the sampled JPEGs,
  decoded at 1/2, 1/4 or 1/8 size where the grid allows);
- ``frames``, decode ``cuda`` (when CUDA is there): workers read the JPEG bytes, the main
  process decodes each batch with nvjpeg and resizes, crops and flips it on the GPU
  (``decode_clips``), synchronised before the clock is read;
- ``store``: the same videos packed once (``pack_frames``, straight from the mp4 files) into a
  frame store whose level 0 is the schedule's largest short side (160 for the 112 crop;
  ``--store-levels`` adds 1/sqrt(2) levels), read by offset, decoded as ``frames`` is (``cpu``:
  in the workers; ``cuda``: bytes to the GPU). Its rows name the levels the grid's clips read.

For every JPEG row decoded in the workers, the decode ceiling: the workers' CPU time per delivered frame
beside a bare decode loop (simplejpeg into one buffer, in this process) of the same frames' bytes at the
same DCT scale, for the same requests, and the ratio; and what each step of the worker's path costs per
delivered frame, measured one by one in this process (draw, read, decode, resize and crop, assemble,
collate, the hand-over to the main process), written under ``"stage_cpu_us_per_frame"``.

With ``store`` and ``frames`` both asked for, the per-frame read cost (CPU microseconds to read, not
decode, one sampled frame's JPEG bytes in one process: ``read_encoded_clip`` from files against an
offset read from the store) is measured too and written as ``"kind": "read"`` rows; the disk size of
mp4, frame folders and store is printed and written under ``"sizes"``.

A row runs until ``--seconds`` have passed and ``3 * --workers`` batches have come after the first
``--workers`` batches (worker start-up and the first prefetch are not timed); every row is measured
``--repeat`` times, round robin, and the best kept, since other load on a shared machine only ever
slows a row down. Beside clips/s it prints clips per CPU-second (main process and workers together,
from ``/proc``), which other load does not move.

Run::

    python benchmarks/loader.py                           # about 2 minutes on 2 cores
    python benchmarks/loader.py --kinetics --json out.json  # + 340x256, 10 s, 30 fps, GOP 250 and 12
    python benchmarks/loader.py --pytorchvideo            # + pytorchvideo's PyAV path, base and coarsest
    python benchmarks/loader.py --chunking --formats mp4  # whole batches vs worker chunks (ChunkedDataLoader)
    python benchmarks/loader.py --formats mp4,frames,store --json out.json   # + the packed frame store
    python benchmarks/loader.py --formats frames,store --store-levels 3      # the decode ceiling, 160/113/80 levels
    python benchmarks/loader.py --smoke --json out.json                      # tiny sizes: the script runs

``--chunking`` times, instead, short epochs of the coarse grids from a fresh loader (worker start-up
included, as at the start of every epoch): the first batch's wait and the epoch's clips/s, with a
plain DataLoader (a batch per worker) and with ``ChunkedDataLoader`` (each batch cut into chunks
of at least 8 clips, one per worker, joined in the main process).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import simplejpeg
import torch
import torch.nn.functional as F
from bench_data import camera_videos
from grids import Grid, benchmark_schedule, requests_for, selected_grids
from harness import consume
from torch.utils.data import DataLoader, Dataset

from lightning_multigrid.data.clip_params import ClipRequest, assemble_clip, distinct_frames, sample_clip_params
from lightning_multigrid.data.dataset import TrainVideoDataset, collate_clips
from lightning_multigrid.data.decoding.frames import open_frame_folder, read_encoded_clip
from lightning_multigrid.data.decoding.jpeg import dct_scale, resize_crop
from lightning_multigrid.data.loaders import ChunkedDataLoader
from lightning_multigrid.data.reader_settings import ReaderSettings
from lightning_multigrid.data.sources import load_manifest
from lightning_multigrid.data.store.reader import PackedFrameReader
from lightning_multigrid.data.tools.extract import extract_frames
from lightning_multigrid.data.tools.pack import pack_frames
from lightning_multigrid.schedule import GridShape


@dataclass(frozen=True)
class Source:
    name: str
    width: int
    height: int
    seconds: float
    fps: float
    gop_size: int | None  # None: x264's default (250)


def clips_per_second(
    loader: DataLoader[Any], warmup_batches: int, seconds: float, device: str | None
) -> tuple[float, float | None, float | None]:
    """Clips/s after ``warmup_batches``, over at least ``seconds`` and ``3 * warmup_batches`` batches.

    Several batches per worker, so the batches already prefetched when the clock starts do not
    inflate the rate of grids with big batches. Also returns clips per CPU-second of the main
    process and the workers together, and of the workers alone (Linux; ``None`` elsewhere):
    unlike clips/s, they do not move with other load on a shared machine.
    """
    batches = iter(loader)
    for _ in range(warmup_batches):
        consume(next(batches), device)
    workers = [w.pid for w in getattr(batches, "_workers", ())]
    cpu_start, worker_start = cpu_seconds([os.getpid(), *workers]), cpu_seconds(workers)
    start = time.perf_counter()
    clips = count = 0
    while True:
        clips += consume(next(batches), device)
        count += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and count >= max(2, 3 * warmup_batches):
            cpu_end, worker_end = cpu_seconds([os.getpid(), *workers]), cpu_seconds(workers)
            per_cpu = clips / (cpu_end - cpu_start) if cpu_start is not None and cpu_end is not None else None
            per_worker_cpu = None
            if workers and worker_start is not None and worker_end is not None and worker_end > worker_start:
                per_worker_cpu = clips / (worker_end - worker_start)
            return clips / elapsed, per_cpu, per_worker_cpu


def cpu_seconds(pids: list[int]) -> float | None:
    """User + system CPU seconds of the processes so far, from ``/proc``; ``None`` without it."""
    total = 0
    try:
        for pid in pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat(5)
    except (OSError, IndexError, ValueError):
        return None
    return total / os.sysconf("SC_CLK_TCK")


class PyTorchVideoClips(Dataset[dict[str, Any]]):
    """pytorchvideo's PyAV decoding with its Kinetics training transforms done in torch.

    ``EncodedVideo.from_path(path, decode_audio=False, decoder="pyav")``, ``get_clip`` over the
    span, then what its Kinetics recipe does in workers (without importing
    ``pytorchvideo.transforms``, which fails with current torchvision): uniform temporal
    subsample, random short-side scale (``F.interpolate``, bilinear), random crop, random flip.
    """

    def __init__(self, paths: list[str], fps: float) -> None:
        self.paths, self.fps = paths, fps

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, request: ClipRequest) -> dict[str, Any]:
        from pytorchvideo.data.encoded_video import EncodedVideo

        rng = random.Random(request.seed)
        video = EncodedVideo.from_path(self.paths[request.index], decode_audio=False, decoder="pyav")
        stride = rng.uniform(*request.sampling_rate_range)
        clip_duration = request.num_frames * stride / self.fps
        start = rng.uniform(0, max(float(video.duration) - clip_duration, 0))
        frames = video.get_clip(start, start + clip_duration)["video"]  # float32 (C, T, H, W)
        video.close()
        indices = torch.linspace(0, frames.shape[1] - 1, request.num_frames).clamp(0, frames.shape[1] - 1).long()
        frames = frames.index_select(1, indices)
        short_side = rng.randint(*request.scale_range)
        height, width = frames.shape[-2:]
        if width < height:
            size = (int(math.floor(height * short_side / width)), short_side)
        else:
            size = (short_side, int(math.floor(width * short_side / height)))
        frames = F.interpolate(frames, size=size, mode="bilinear", align_corners=False)
        crop = request.crop_size
        y, x = rng.randint(0, size[0] - crop), rng.randint(0, size[1] - crop)
        frames = frames[..., y : y + crop, x : x + crop]
        if rng.random() < 0.5:
            frames = frames.flip(-1)
        return {"video": frames, "label": 0, "index": request.index, "skipped": ()}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--videos", type=int, default=6, help="videos per source (6)")
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per row, at least (3)")
    parser.add_argument("--repeat", type=int, default=3, help="measure every row this often, round robin; keep the best (3)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers (2)")
    parser.add_argument("--kinetics", action="store_true",
                        help="add Kinetics-like sources: 340x256, 10 s at 30 fps, GOP 250 and GOP 12")
    parser.add_argument("--small", default="320x240", help="the small source's size, 5 s at 30 fps ('' for none)")
    parser.add_argument("--formats", default="mp4,frames", help="comma-separated: mp4, frames, store (mp4,frames)")
    parser.add_argument("--store-levels", type=int, default=1, help="store: levels, level 0 and 1/sqrt(2) steps (1)")
    parser.add_argument("--read-frames", type=int, default=4096, help="frames read per per-frame read cost (4096)")
    parser.add_argument("--decode", default=None, help="frame decode: cpu, cuda or both (default: cpu, and cuda when available)")
    parser.add_argument("--grids", default=None, help="only these grids, comma-separated: base, coarsest, long (default: all)")
    parser.add_argument("--pytorchvideo", action="store_true", help="also time pytorchvideo's PyAV path on mp4")
    parser.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    parser.add_argument("--chunking", action="store_true", help="compare whole batches with worker chunks instead")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes to check the script runs: 2 videos of 160x120, frames and store, base and coarsest")
    args = parser.parse_args(argv)
    if args.smoke:
        args.videos, args.seconds, args.repeat, args.workers, args.read_frames = 2, 0.1, 1, 1, 64
        args.small, args.formats, args.grids, args.decode = "160x120", "frames,store", "base,coarsest", "cpu"
    return args


def selected_sources(args: argparse.Namespace) -> list[Source]:
    sources = []
    if args.small:
        width, height = map(int, args.small.split("x"))
        sources.append(Source(f"{args.small} 5s gop250", width, height, 5.0, 30.0, None))
    if args.kinetics:
        sources += [Source("340x256 10s gop250", 340, 256, 10.0, 30.0, 250), Source("340x256 10s gop12", 340, 256, 10.0, 30.0, 12)]
    return sources


def source_datasets(
    manifest: Path, source: Source, frames_dir: Path, formats: list[str], decodes: list[str], args: argparse.Namespace
) -> list[tuple[str, str, TrainVideoDataset | PyTorchVideoClips]]:
    """``(format, decode, dataset)`` per row of one source; extracts the frame dataset when asked for."""
    datasets: list[tuple[str, str, TrainVideoDataset | PyTorchVideoClips]] = []
    if "mp4" in formats:
        datasets.append(("mp4", "cpu", TrainVideoDataset(manifest)))
    if args.pytorchvideo:
        paths = [e.path for e in load_manifest(manifest).entries]
        datasets.append(("mp4 pytorchvideo", "cpu", PyTorchVideoClips(paths, source.fps)))
    mp4_bytes = sum(p.stat().st_size for p in manifest.parent.glob("*.mp4"))
    SIZES[source.name] = {"mp4_bytes": mp4_bytes}
    if "frames" in formats:
        started = time.perf_counter()
        report = extract_frames(load_manifest(manifest), frames_dir, workers=args.workers, progress=False)
        jpeg_bytes = sum(p.stat().st_size for p in report.manifest.parent.rglob("*.jpg"))
        SIZES[source.name]["frames_bytes"] = jpeg_bytes
        print(
            f"{source.name}: extracted frames in {time.perf_counter() - started:.1f} s; frames take "
            f"{jpeg_bytes / 2**20:.1f} MiB, the mp4 files {mp4_bytes / 2**20:.1f} MiB ({jpeg_bytes / mp4_bytes:.1f}x)",
            file=sys.stderr,
        )
        datasets += jpeg_datasets("frames", report.manifest, decodes)
    if "store" in formats:
        started = time.perf_counter()
        packed = pack_frames(
            load_manifest(manifest), frames_dir.with_name(frames_dir.name + ".store"), crop_size=BASE.crop_size,
            levels=args.store_levels, workers=args.workers, progress=False,
        )
        store_bytes = sum(p.stat().st_size for p in packed.store.iterdir())
        SIZES[source.name]["store_bytes"] = store_bytes
        SIZES[source.name]["store_levels"] = [f"L{side}" for side in packed.levels]
        print(
            f"{source.name}: packed the store ({', '.join(SIZES[source.name]['store_levels'])}) in "
            f"{time.perf_counter() - started:.1f} s; it takes {store_bytes / 2**20:.1f} MiB ({store_bytes / mp4_bytes:.1f}x the mp4)",
            file=sys.stderr,
        )
        datasets += jpeg_datasets("store", packed.store, decodes)
    return datasets


def jpeg_datasets(fmt: str, source: Path, decodes: list[str]) -> list[tuple[str, str, Any]]:
    """One dataset of JPEG frames (folders or a store) per decode: ``cpu`` in the workers, ``cuda`` on the device."""
    return [(fmt, decode, TrainVideoDataset(source, ReaderSettings(frame_decode="workers" if decode == "cpu" else "device")))
            for decode in decodes]


# The benchmark schedule's base grid (its level 0: the largest short side its grids draw).
BASE = GridShape(8, 16, 112)
SIZES: dict[str, dict[str, Any]] = {}  # source -> bytes on disk per format


def levels_used(dataset: Any, grid: Grid, num_videos: int, seed: int, count: int = 256) -> dict[str, int]:
    """Which store levels the clips of one grid read: ``{"L160": n, ...}`` over ``count`` of its requests."""
    reader = dataset.reader
    used: dict[str, int] = {}
    batches = requests_for(grid, num_videos, seed)
    requests = itertools.islice(itertools.chain.from_iterable(batches), count)
    for r in requests:
        entry = dataset.manifest.entries[r.index]
        level = reader.level_for(r.index, sample_clip_params(r, reader.source(entry)))
        name = reader.store.level_name(level)
        used[name] = used.get(name, 0) + 1
    return dict(sorted(used.items()))


def read_costs(datasets: list[tuple[str, str, Any]], grid: Grid, source: Source, args: argparse.Namespace) -> list[dict[str, Any]]:
    """CPU microseconds to read (not decode) one sampled frame's JPEG bytes, frame files against the store.

    In this process, at one grid's clip parameters, the same requests for both: ``read_encoded_clip`` (open,
    read, header parse, end marker per frame) against ``PackedFrameReader`` with ``frame_decode="device"``
    (an offset slice of the map per frame).
    """
    frame_sets = {fmt: d for fmt, decode, d in datasets if fmt in ("frames", "store") and decode == "cpu"}
    if len(frame_sets) < 2:
        return []
    frames_set, store_set = frame_sets["frames"], frame_sets["store"]
    folders = [open_frame_folder(e) for e in frames_set.manifest.entries]
    store_reader = PackedFrameReader(store_set.reader.store, frame_decode="device")
    requests = list(itertools.islice(itertools.chain.from_iterable(requests_for(grid, args.videos, 7)),
                                     max(1, args.read_frames // grid.shape.num_frames)))
    params = [sample_clip_params(r, folders[r.index]) for r in requests]
    rows = []
    for fmt in ("frames", "store"):
        best = math.inf
        for _ in range(args.repeat):
            frames = 0
            start = time.process_time()
            for r, p in zip(requests, params):
                if fmt == "frames":
                    clip = read_encoded_clip(folders[r.index], p)
                else:
                    clip = store_reader.read(store_set.manifest.entries[r.index], p)  # type: ignore[assignment]
                frames += len(clip.jpegs)
            best = min(best, (time.process_time() - start) / frames * 1e6)
        rows.append({"kind": "read", "source": source.name, "format": fmt, "grid": grid.name,
                     "cpu_us_per_frame": round(best, 2), "frames_read": frames})
        print(f"  {source.name} {fmt}: {best:.1f} CPU-us to read one frame's bytes", file=sys.stderr)
    rows[1]["frames_over_store"] = round(rows[0]["cpu_us_per_frame"] / rows[1]["cpu_us_per_frame"], 2)
    return rows


def measure_cases(
    cases: list[tuple[str, str, Any, Grid]], source: Source, seed: int, args: argparse.Namespace
) -> tuple[dict[int, float], dict[int, float], dict[int, float]]:
    """Best clips/s, best clips per CPU-second and per worker CPU-second of each case, keyed by its index in ``cases``."""
    best: dict[int, float] = {}
    best_cpu: dict[int, float] = {}
    best_worker_cpu: dict[int, float] = {}
    # Round robin, best of --repeat: other load on a shared machine only ever slows a row down.
    for _ in range(args.repeat):
        for k, (fmt, decode, dataset, grid) in enumerate(cases):
            loader = DataLoader(
                dataset, batch_sampler=requests_for(grid, args.videos, seed=seed),
                collate_fn=collate_clips, num_workers=args.workers,
            )
            rate, per_cpu, per_worker_cpu = clips_per_second(
                loader, args.workers, args.seconds, decode if decode != "cpu" else None
            )
            del loader
            best[k] = max(best.get(k, 0.0), rate)
            if per_cpu is not None:
                best_cpu[k] = max(best_cpu.get(k, 0.0), per_cpu)
            if per_worker_cpu is not None:
                best_worker_cpu[k] = max(best_worker_cpu.get(k, 0.0), per_worker_cpu)
            cpu_text = f", {per_cpu:.1f} per CPU-second" if per_cpu is not None else ""
            print(f"  {source.name} {fmt} {decode} {grid.name}: {rate:.1f} clips/s{cpu_text}", file=sys.stderr)
    return best, best_cpu, best_worker_cpu


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    grids = selected_grids(benchmark_schedule(BASE, 4), args.grids.split(",") if args.grids else None)
    sources = selected_sources(args)
    formats = args.formats.split(",")
    decodes = args.decode.split(",") if args.decode else ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(
        f"torch {torch.__version__}, {args.workers} DataLoader workers, >= {args.seconds:g} s per row after "
        f"{args.workers} warm-up batches, {args.videos} videos per source (H.264 x264 veryfast crf 23), "
        f"frames: JPEG quality 90, full size",
        file=sys.stderr,
    )
    rows: list[dict[str, Any]] = []
    reads: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for number, source in enumerate(sources):
            started = time.perf_counter()
            manifest = camera_videos(Path(tmp) / f"videos{number}", args.videos, source.width, source.height,
                                     round(source.seconds * source.fps), source.fps, source.gop_size)
            print(f"{source.name}: wrote {args.videos} videos in {time.perf_counter() - started:.1f} s", file=sys.stderr)
            datasets = source_datasets(manifest, source, Path(tmp) / f"frames{number}", formats, decodes, args)
            # Grid by grid, so the formats compared at one grid are measured close in time.
            cases = [
                (fmt, decode, dataset, grid)
                for grid, (fmt, decode, dataset) in itertools.product(grids, datasets)
                if fmt != "mp4 pytorchvideo" or grid.name in ("base", "coarsest")
            ]
            best, best_cpu, best_worker_cpu = measure_cases(cases, source, number, args)
            if args.chunking:
                compare_chunking(source, datasets, grids, args)
                continue
            reads += read_costs(datasets, grids[-1], source, args)
            source_rows = rows_of(cases, best, best_cpu, source, number, args)
            add_decode_ceiling(source_rows, cases, best_worker_cpu, number, args)
            rows += source_rows

    if args.chunking:
        return
    print_table(rows)
    print_store_summary(rows, reads)
    print_decode_ceiling(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows + reads, "sizes": SIZES}, indent=1))
        print(f"wrote {args.json}", file=sys.stderr)


def rows_of(
    cases: list[tuple[str, str, Any, Grid]], best: dict[int, float], best_cpu: dict[int, float], source: Source,
    seed: int, args: argparse.Namespace,
) -> list[dict[str, Any]]:
    """The JSON rows of one source's cases; a store's rows name its levels and those each grid read."""
    rows = []
    for k, (fmt, decode, dataset, grid) in enumerate(cases):
        shape = grid.shape
        row = {
            "source": source.name, "format": fmt.split()[0], "decode": decode, "grid": grid.name,
            "frames": shape.num_frames, "crop": shape.crop_size, "clips_per_s": round(best[k], 2),
            "batch_size": shape.batch_size, "loader": "pytorchvideo" if "pytorchvideo" in fmt else "ours",
            "clips_per_cpu_s": round(best_cpu[k], 2) if k in best_cpu else None,
        }
        if fmt == "store":
            row["levels"] = SIZES[source.name]["store_levels"]
            row["levels_used"] = levels_used(dataset, grid, args.videos, seed)
        rows.append(row)
    return rows


def print_store_summary(rows: list[dict[str, Any]], reads: list[dict[str, Any]]) -> None:
    for read in reads:
        ratio = f" (frame files / store: {read['frames_over_store']:.1f}x)" if "frames_over_store" in read else ""
        print(f"{read['source']}, {read['format']}: {read['cpu_us_per_frame']:.1f} CPU-us per frame read{ratio}")
    for row in rows:
        if row["format"] == "store":
            print(f"{row['source']}, store decode {row['decode']}, {row['grid']}: levels read {row['levels_used']}")
    for name, sizes in SIZES.items():
        print(f"{name}: bytes on disk {', '.join(f'{k} {v}' for k, v in sizes.items() if k.endswith('bytes'))}")


STAGES = ("params", "read", "decode", "resize_crop", "assemble", "collate", "transfer")


def stage_costs(dataset: Any, grid: Grid, seed: int, args: argparse.Namespace) -> dict[str, float]:
    """CPU microseconds per delivered frame of each step a worker takes, in this process, same requests as the loader.

    ``params``: drawing the clip (``sample_clip_params``); ``read``: the sampled frames' JPEG bytes (offset slices
    of the store's map, or file reads); ``decode``: the bare decode loop, simplejpeg into one clip buffer at the
    DCT scale the reader takes (the ceiling the loader is compared with); ``resize_crop``: the one resize of the
    clip and its crop; ``assemble``: frame order, flip, ``(C, T, H, W)``; ``collate``: ``collate_clips`` per
    batch; ``transfer``: the batch pickled to shared memory and back, as a worker hands it to the main process.
    One torch thread, as in a worker.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a DataLoader worker
    try:
        return _stage_costs(dataset, grid, seed, args)
    finally:
        torch.set_num_threads(threads)


def _stage_costs(dataset: Any, grid: Grid, seed: int, args: argparse.Namespace) -> dict[str, float]:
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401 -- registers the reductions that put tensors in shared memory

    reader, entries = dataset.reader, dataset.manifest.entries
    count = max(grid.shape.batch_size, args.read_frames // grid.shape.num_frames)
    requests = list(itertools.islice(itertools.chain.from_iterable(requests_for(grid, args.videos, seed)), count))
    best = dict.fromkeys(STAGES, math.inf)
    for _ in range(max(2, args.repeat)):  # the first pass also warms the page cache and the maps
        spent = dict.fromkeys(STAGES, 0.0)
        samples = []
        for r in requests:
            entry = entries[r.index]
            started = time.process_time()
            params = sample_clip_params(r, reader.source(entry))
            wanted, order = distinct_frames(params)
            tick = time.process_time()
            spent["params"] += tick - started
            if isinstance(reader, PackedFrameReader):
                level = reader.level_for(r.index, params)
                jpegs: list[Any] = reader.store.frame_bytes(r.index, level, wanted)
                width, height = (int(side) for side in reader.store.level_size[r.index, level])
            else:
                folder = reader.source(entry)
                jpegs = []
                for index in wanted:
                    with open(folder.frame_path(index), "rb") as file:
                        jpegs.append(file.read())
                width, height = folder.width, folder.height
            tock = time.process_time()
            spent["read"] += tock - tick
            scale = dct_scale(width, height, params.resize_width, params.resize_height)
            frames = np.empty((len(jpegs), -(-height // scale), -(-width // scale), 3), np.uint8)
            for k, jpeg in enumerate(jpegs):
                simplejpeg.decode_jpeg(jpeg, "RGB", min_height=frames.shape[1], min_width=frames.shape[2], buffer=frames[k])
            tick = time.process_time()
            spent["decode"] += tick - tock
            crops = resize_crop(frames, params)
            tock = time.process_time()
            spent["resize_crop"] += tock - tick
            clip = torch.from_numpy(assemble_clip(crops, order, params.flip))
            spent["assemble"] += time.process_time() - tock
            samples.append({"video": clip, "label": 0, "index": r.index, "skipped": ()})
        for start in range(0, len(samples) - grid.shape.batch_size + 1, grid.shape.batch_size):
            tick = time.process_time()
            batch = collate_clips(samples[start : start + grid.shape.batch_size])
            tock = time.process_time()
            ForkingPickler.loads(bytes(ForkingPickler.dumps(batch)))
            spent["transfer"] += time.process_time() - tock
            spent["collate"] += tock - tick
        delivered = len(requests) * grid.shape.num_frames
        collated = (len(samples) // grid.shape.batch_size) * grid.shape.batch_size * grid.shape.num_frames
        for stage in STAGES:
            per = collated if stage in ("collate", "transfer") else delivered
            best[stage] = min(best[stage], spent[stage] / max(per, 1) * 1e6)
    return best


def add_decode_ceiling(
    rows: list[dict[str, Any]], cases: list[tuple[str, str, Any, Grid]], best_worker_cpu: dict[int, float], seed: int,
    args: argparse.Namespace,
) -> None:
    """Beside each JPEG row decoded in the workers: the workers' CPU per delivered frame, each step's cost and the
    bare decode loop of the same bytes at the same scale (``stage_costs``), and their ratio."""
    for k, (fmt, decode, dataset, grid) in enumerate(cases):
        if fmt not in ("frames", "store") or decode != "cpu" or k not in best_worker_cpu:
            continue
        stages = stage_costs(dataset, grid, seed, args)
        worker_us = 1e6 / (best_worker_cpu[k] * grid.shape.num_frames)
        rows[k]["worker_cpu_us_per_frame"] = round(worker_us, 1)
        rows[k]["stage_cpu_us_per_frame"] = {name: round(value, 2) for name, value in stages.items()}
        rows[k]["bare_decode_cpu_us_per_frame"] = round(stages["decode"], 1)
        rows[k]["worker_over_bare_decode"] = round(worker_us / stages["decode"], 2)


def print_decode_ceiling(rows: list[dict[str, Any]]) -> None:
    ceiling = [r for r in rows if "worker_over_bare_decode" in r]
    if not ceiling:
        return
    print()
    print("Worker CPU per delivered frame against a bare decode loop of the same bytes at the same scale "
          "(simplejpeg into one buffer), CPU-us; the steps measured one by one in one process:")
    print()
    print("| source | format | grid | worker CPU | bare decode | worker / bare | " + " | ".join(STAGES) + " |")
    print("|---|---|---|---|---|---|" + "---|" * len(STAGES))
    for r in ceiling:
        stages = " | ".join(f"{r['stage_cpu_us_per_frame'][name]:.1f}" for name in STAGES)
        print(f"| {r['source']} | {r['format']} | {r['grid']} | {r['worker_cpu_us_per_frame']:.1f} | "
              f"{r['bare_decode_cpu_us_per_frame']:.1f} | {r['worker_over_bare_decode']:.2f}x | {stages} |")


def compare_chunking(source: Source, datasets: list[Any], grids: list[Grid], args: argparse.Namespace) -> None:
    """First-batch wait and clips/s of a short epoch from a fresh loader, whole batches vs chunks."""
    for (fmt, decode, dataset), grid in itertools.product(datasets, grids):
        if grid.shape.batch_size < 4 * 8 or decode != "cpu":
            continue  # chunks of at least 8 clips: only the coarse grids' big batches are cut
        batches = list(itertools.islice(requests_for(grid, args.videos, seed=0), 2 * args.workers + 1))
        for _ in range(args.repeat):
            for kind in ("whole", "chunks"):
                if kind == "whole":
                    loader: DataLoader[Any] = DataLoader(dataset, batch_sampler=batches, collate_fn=collate_clips,
                                                         num_workers=args.workers)
                else:
                    loader = ChunkedDataLoader(dataset, batch_sampler=batches, min_chunk_size=8,
                                               num_workers=args.workers, collate_fn=collate_clips)
                start = time.perf_counter()
                first = clips = 0.0
                for batch in loader:
                    clips += consume(batch, None)
                    first = first or time.perf_counter() - start
                elapsed = time.perf_counter() - start
                print(
                    f"{source.name} {fmt} {grid.name} ({len(batches)} batches of {grid.shape.batch_size}, "
                    f"{args.workers} workers), {kind}: first batch {first:.2f} s, epoch {elapsed:.2f} s, "
                    f"{clips / elapsed:.0f} clips/s"
                )


def print_table(rows: list[dict[str, Any]]) -> None:
    print()
    print("| source | format | decode | grid | batch x frames x crop | clips/s | clips per CPU-second |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        name = row["format"] + (" (pytorchvideo)" if row["loader"] == "pytorchvideo" else "")
        per_cpu = "-" if row["clips_per_cpu_s"] is None else f"{row['clips_per_cpu_s']:.1f}"
        print(
            f"| {row['source']} | {name} | {row['decode']} | {row['grid']} | "
            f"{row['batch_size']} x {row['frames']} x {row['crop']} | {row['clips_per_s']:.1f} | {per_cpu} |"
        )
    print()
    for metric, unit in (("clips_per_s", "clips/s"), ("clips_per_cpu_s", "clips per CPU-second")):
        keyed = {(r["source"], r["format"], r["decode"], r["loader"], r["grid"]): r[metric] for r in rows}
        for source, fmt, decode, loader in dict.fromkeys(k[:4] for k in keyed):
            base = keyed.get((source, fmt, decode, loader, "base"))
            coarsest = keyed.get((source, fmt, decode, loader, "coarsest"))
            if base and coarsest:
                label = fmt + (" (pytorchvideo)" if loader == "pytorchvideo" else "")
                print(f"{source}, {label}, decode {decode}: coarsest/base {coarsest / base:.2f}x ({unit})")
            mp4 = keyed.get((source, "mp4", "cpu", "ours", "base"))
            if fmt in ("frames", "store") and base and mp4:
                print(f"{source}, {fmt} decode {decode} / mp4 at the base grid: {base / mp4:.2f}x ({unit})")
            frames = keyed.get((source, "frames", decode, loader, "base"))
            if fmt == "store" and base and frames:
                print(f"{source}, store / frames decode {decode} at the base grid: {base / frames:.2f}x ({unit})")


if __name__ == "__main__":
    main()
