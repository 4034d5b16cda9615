"""The GPU story in one command: does the pipeline keep the model's pace at every grid, and does multigrid pay?

Issues 32 and 39's measurements, sized to end within 8 minutes (``--budget-s``, default 480, counted from
the process start) on a 16-core single-GPU machine. It makes its own data, then measures, for r3d_18 at
base 8 x 16 x 112 (stride 4; ``--base 8x8x224`` for the paper's resolution), bf16-mixed, 14 workers,
from the packed frame store, in this order (the sections, each a ``--sections`` name):

1. ``env``: the machine, the date and the versions (Python, torch, CUDA, torchvision, Lightning and
   which package, torchcodec, simplejpeg, PyAV); which library decodes JPEG on the device; whether
   torchcodec decodes mp4 with NVDEC.
2. ``model``: clips/s the model consumes at every grid the schedule draws (all eight at the default
   base: training steps on batches already on the GPU, MultigridBatchNorm split as multigrid splits
   it), contiguous and ``channels_last_3d``, the faster kept.
3. ``end_to_end:store`` and ``end_to_end:store-device``: baseline against multigrid
   (``benchmarks/train.py``'s runs: same data, seed, SGD and step LR schedule; validation once after
   training, not timed), r3d_18 from scratch from the store, the JPEGs decoded in the workers, then
   on the device one batch ahead: training wall-clock, iterations, top-1, the share of the loop's time
   spent waiting for data, the multigrid callback's data-wait meter per grid, and each run's
   model-only time (per grid the run draws, its clips over section 2's clips/s in the layout the runs
   use, contiguous; also in the faster layout per grid) and pipeline efficiency (model-only over
   training time), and the speed-up's share of the model-only ratio.
4. ``overlap``: per grid (coarsest, base), ms per iteration of the training step alone, decode then
   step, and the decode of the next batch on the side stream while the step runs; the overlapped
   step's inflation over the step alone.
5. ``transformer:model``, ``transformer:end_to_end``: sections 2 and 3 (workers decode) for
   ``swin3d_t`` (bf16), its end-to-end pair sized to fit: 12 baseline epochs instead of 24 (the
   result says so); skip both with ``--skip transformer``.
6. ``batch_sizing``: per grid, the step time per iteration with batches sized by the measured time
   (``batch_sizing="time"``) and by Equation 1, against the base iteration, for r3d_18 and swin3d_t
   (issue 34's figure; ``benchmarks/step.py``'s ``sizing_rows``).
7. ``compile``: ``torch.compile`` with one static graph per grid, first steps (compile included) and
   steady steps against eager, for the grids the budget allows.
8. ``loader``: clips/s the loader delivers from the store at each grid, through a ``ChunkedDataLoader``
   as training builds it: (a) ``store (workers)``, the JPEGs decoded in the workers (libjpeg-turbo
   through simplejpeg), batches moved to the GPU; (b) ``store (device decode)``, the workers read the
   bytes and ``DecodeAhead`` decodes each batch on a side stream while the next is read.
9. ``stages``: per grid, each stage of both paths alone, as clips/s: read, decode, crop-resize,
   transfer. Workers path: one worker's CPU time per frame of each stage (``loader.py``'s
   ``stage_costs``, one torch thread) times the workers, and the pinned host-to-device copy.
   Device path: the workers reading the bytes (measured through the loader), nvjpeg decoding batches
   already read, the batched crop-resize-flip alone, and the bytes' copy to the GPU. Where a path
   delivers less than the model consumes, the stage that falls short is named.
10. ``nvjpeg``: the device JPEG decode in Gpx/s, batched, at 340x256 and 1280x720 and at the store's
    frames per grid, beside the best public figure (about 2.9 Gpx/s batched on one A100).

Then, while the budget lasts, what earlier runs measured: ``decode`` (per-clip resize loop against the
batched crop-resize), ``read`` (frame folders against the store), ``precision`` (16-mixed,
channels_last_3d), ``loader:other`` (mp4 at GOP 250 and 12, frame folders, NVDEC),
``end_to_end:frames``, ``end_to_end:frames-serial``, ``end_to_end:mp4`` and ``fsdp``.

Every section past the budget is skipped and says so: a section starts only when the time used plus
its estimated cost (``COST_S``, for the full sizes) stays within ``--budget-s``. The data is made
first and always.

Data: Kinetics-like synthetic videos (340x256, 10 s at 30 fps, x264 veryfast; with a larger base the
short side is at least the store's level 0, e.g. 426x320 for a 224 crop): for the loader,
camera-like footage (``loader.py``'s) at GOP 250 packed into a store (level 0 at the grids' largest
short side); for training, the built-in synthetic classes (motion x texture, texture cell 12 px,
visible on every grid, so both runs can learn) packed into stores. Frame folders and GOP-12 videos
are made only when a section that reads them runs.

Results go to ``--out/gpu.json`` after every section (a run cut short still reports) and to
``--out/gpu.md`` at the end.

    python benchmarks/gpu.py --out gpu-results            # on the GPU machine, <= 8 minutes
    python benchmarks/gpu.py --out gpu-224 --base 8x8x224 --sampling-rate 8   # the paper's resolution
    python benchmarks/gpu.py --smoke --out /tmp/smoke      # the same code on CPU, tiny sizes, < 1 minute

On a lent machine without a package registry, ``benchmarks/gpu_carry.sh`` fetches the wheels it lacks
and prints the one command to run there. The harness (sizes, budget, report, environment, Markdown
parts) is ``harness.py``, the data ``bench_data.py``: sibling modules, imported as the script runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F

# Sibling modules: `python benchmarks/gpu.py` has benchmarks/ first on sys.path.
from bench_data import ensure, make_data, store_manifest
from harness import Report, Setup, environment, grid_rows, markdown_head, markdown_json, markdown_tail
from loader import Grid, consume, render_camera_video, requests_for, schedule_grids, stage_costs
from train import run as train_run

from lightning_multigrid.data.dataset import TrainVideoDataset, collate_clips
from lightning_multigrid.data.decoding.device import (
    crop_resize_flip,
    crop_resize_flip_per_clip,
    decode_jpegs,
    jpeg_decoder,
)
from lightning_multigrid.data.decoding.settings import ReaderSettings
from lightning_multigrid.data.loaders import ChunkedDataLoader
from lightning_multigrid.data.manifests.load import load_manifest
from lightning_multigrid.data.prefetch import DecodeAhead
from lightning_multigrid.data.synthetic import generate_synthetic_dataset
from lightning_multigrid.data.transfer import BatchTransfer, normalize_video
from lightning_multigrid.module import VideoClassifier
from lightning_multigrid.norm import apply_bn_plan, convert_batchnorm
from lightning_multigrid.schedule import (
    BNPlan,
    GridShape,
    MultigridConfig,
    MultigridSchedule,
    build_schedule,
    grid_counts,
)

# The best public batched nvjpeg figure the issue compares with (one A100).
PUBLIC_NVJPEG_GPX_S = 2.9


FULL = Setup(
    device="cuda", backbone="r3d_18", transformer="swin3d_t", precision="bf16-mixed", base=GridShape(8, 16, 112),
    sampling_rate=4, workers=14, video_size=(340, 256), video_seconds=10.0, fps=30.0, loader_videos=16,
    loader_seconds=1.5, repeat_seconds=0.5, stage_frames=1024, nvjpeg_sizes=((340, 256), (1280, 720)),
    nvjpeg_batch=128, num_train=480, num_val=96, epochs=24, milestones=(18, 21), transformer_epochs=12,
    transformer_milestones=(9, 11), lr=0.0125, grids=None, model_steps=20, sizing_repeats=10, cost_scale=1.0,
)
SMOKE = Setup(
    device="cpu", backbone="tiny", transformer="tiny_swin3d", precision="32-true", base=GridShape(4, 8, 32),
    sampling_rate=2, workers=2, video_size=(64, 48), video_seconds=2.0, fps=12.0, loader_videos=3,
    loader_seconds=0.2, repeat_seconds=0.05, stage_frames=16, nvjpeg_sizes=((64, 48),), nvjpeg_batch=4,
    num_train=16, num_val=8, epochs=3, milestones=(2,), transformer_epochs=3, transformer_milestones=(2,), lr=0.0125,
    grids=("coarsest", "base"), model_steps=2, sizing_repeats=1, cost_scale=0.0,
)

# Estimated seconds of each section at the full sizes on a 16-core H100/H200 machine (the data is made
# first and always). A section starts only when the time used plus its estimate fits the budget. The
# order is the run's: the end-to-end pairs (and what their efficiency needs: the model's rates) first.
COST_S = {
    "env": 5, "model": 20, "end_to_end:store": 60, "end_to_end:store-device": 80, "overlap": 30,
    "transformer:model": 15, "transformer:end_to_end": 70, "batch_sizing": 45, "compile": 90,
    "loader": 25, "stages": 30, "nvjpeg": 5, "decode": 15, "read": 30, "precision": 10,
    "loader:other": 90, "end_to_end:frames": 130, "end_to_end:frames-serial": 100, "end_to_end:mp4": 100, "fsdp": 40,
}
SECTIONS = tuple(COST_S)
# An end-to-end section: (source, how the frames are decoded, batches decoded ahead).
END_TO_END = {
    "end_to_end:store": ("store", "workers", 1), "end_to_end:store-device": ("store", "device", 1),
    "end_to_end:frames": ("frames", "device", 1), "end_to_end:frames-serial": ("frames", "device", 0),
    "end_to_end:mp4": ("mp4", "workers", 1),
}


# ---------------------------------------------------------------------------- grids and the model


def benchmark_schedule(setup: Setup) -> MultigridSchedule:
    return build_schedule(
        MultigridConfig(base=setup.base, sampling_rate=setup.sampling_rate, max_epochs=100, milestones=(50, 80))
    )


def selected_grids(setup: Setup, schedule: MultigridSchedule) -> list[Grid]:
    """The loader and stage sections' grids: the coarsest, each long-cycle shape and the base (``setup.grids``)."""
    grids = schedule_grids(schedule)
    return [g for g in grids if setup.grids is None or g.name.split()[0] in setup.grids]


def drawn_grids(schedule: MultigridSchedule) -> list[Grid]:
    """Every grid the schedule draws (long- and short-cycle shapes; 8 at the default base), cheapest first:
    :func:`selected_grids`' names, ``short BxTxS`` for the short-cycle grids they do not name."""
    grids = {g.shape: g for g in schedule_grids(schedule)}
    for stage in schedule.stages:
        rate = (float(stage.sampling_rate[0]), float(stage.sampling_rate[1]))
        for shape in stage.short_cycle:
            if shape not in grids:
                name = f"short {shape.batch_size}x{shape.num_frames}x{shape.crop_size}"
                grids[shape] = Grid(name, shape, rate, schedule.jitter_scales_for(shape.crop_size))
    return sorted(grids.values(), key=lambda g: (g.shape.num_frames * g.shape.crop_size**2, -g.shape.batch_size))


def bn_plan(schedule: MultigridSchedule, shape: GridShape) -> BNPlan:
    """Multigrid's BatchNorm grouping at a grid: the plan of the stage that serves it."""
    for stage in schedule.stages:
        if shape == stage.shape or shape in stage.short_cycle:
            return stage.bn
    return BNPlan()


def build_model(setup: Setup, channels_last: bool = False, backbone: str | None = None) -> torch.nn.Module:
    model = VideoClassifier(num_classes=4, backbone=backbone or setup.backbone, tiny_width=8, dropout_rate=0.0)
    converted = convert_batchnorm(model).to(setup.device)
    return converted.to(memory_format=torch.channels_last_3d) if channels_last else converted


def step_rate(
    model: torch.nn.Module, setup: Setup, shape: GridShape, plan: BNPlan, precision: str, steps: int,
    channels_last: bool = False,
) -> float:
    """Clips/s of training steps (forward, backward, SGD) on one batch already on the device."""
    video = torch.randn(shape.batch_size, 3, shape.num_frames, shape.crop_size, shape.crop_size, device=setup.device)
    if channels_last:
        video = video.contiguous(memory_format=torch.channels_last_3d)
    labels = torch.randint(0, 4, (shape.batch_size,), device=setup.device)
    step = training_step(model, setup, plan, precision)
    for _ in range(3):
        step(video, labels)
    synchronize(setup)
    start = time.perf_counter()
    for _ in range(steps):
        step(video, labels)
    synchronize(setup)
    return steps * shape.batch_size / (time.perf_counter() - start)


def training_step(model: torch.nn.Module, setup: Setup, plan: BNPlan, precision: str) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """One training step (forward, backward, SGD) of ``model`` with multigrid's BatchNorm ``plan``."""
    apply_bn_plan(model, plan)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler(setup.device, enabled=precision == "16-mixed")

    def step(video: torch.Tensor, labels: torch.Tensor) -> None:
        with torch.autocast(setup.device, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = F.cross_entropy(model(video), labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    return step


def synchronize(setup: Setup) -> None:
    if setup.device == "cuda":
        torch.cuda.synchronize()


def model_table(
    setup: Setup, schedule: MultigridSchedule, backbone: str, layouts: tuple[bool, ...] = (False, True)
) -> list[dict[str, Any]]:
    """Per grid the schedule draws (all of them: the end-to-end runs' model-only times need each), clips/s of
    ``backbone``'s training steps in each memory layout of ``layouts`` (``True``: ``channels_last_3d``, model
    and input), the faster kept as ``model_clips_per_s``."""
    models = {channels_last: build_model(setup, channels_last, backbone) for channels_last in layouts}
    rows = []
    for grid in drawn_grids(schedule):
        plan = bn_plan(schedule, grid.shape)
        rates = {cl: step_rate(model, setup, grid.shape, plan, setup.precision, setup.model_steps, cl)
                 for cl, model in models.items()}
        best = max(rates, key=lambda cl: rates[cl])
        rows.append({"grid": grid.name, "backbone": backbone, "shape": list(asdict(grid.shape).values()),
                     "bn": plan.to_dict(), "model_clips_per_s": rates[best], "channels_last_3d": best,
                     **{("channels_last" if cl else "contiguous") + "_clips_per_s": r for cl, r in rates.items()}})
        print(f"  model {backbone} {grid.name}: {rates[best]:.0f} clips/s (channels_last_3d {best})", flush=True)
    return rows


# ---------------------------------------------------------------------------- the loader


def loader_rate(dataset: Any, grid: Grid, setup: Setup, mode: str = "consume") -> float:
    """Clips/s delivered after two warm-up batches, over at least ``loader_seconds`` and 3 batches.

    ``mode``: ``"consume"``, each batch on the device (decoded there when encoded, between batches);
    ``"ahead"``, encoded batches decoded by ``DecodeAhead`` on a side stream while the next is read
    (the training path); ``"bytes"``, as the workers hand them over, encoded clips left encoded.
    """
    loader = ChunkedDataLoader(
        dataset, batch_sampler=requests_for(grid, setup.loader_videos, seed=0), min_chunk_size=setup.base.batch_size,
        num_workers=setup.workers, collate_fn=collate_clips, pin_memory=setup.device == "cuda",
    )
    device = torch.device(setup.device)
    batches: Iterator[dict[str, Any]] = iter(loader)
    if mode == "ahead":
        batches = DecodeAhead(BatchTransfer().decode, device).iterate(batches)

    def take() -> int:
        batch = next(batches)
        if mode == "consume":
            return consume(batch, setup.device)
        if mode == "ahead" and device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()  # this batch decoded; the next one's decode runs on
        return len(batch["label"])

    try:
        for _ in range(2):
            take()
        start, clips, count = time.perf_counter(), 0, 0
        while True:
            clips += take()
            count += 1
            elapsed = time.perf_counter() - start
            if elapsed >= setup.loader_seconds and count >= 3:
                return clips / elapsed
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()  # ends DecodeAhead's thread


def loader_table(setup: Setup, schedule: MultigridSchedule, data: dict[str, Any]) -> list[dict[str, Any]]:
    """Per grid, clips/s the store delivers (a) decoded in the workers, (b) decoded on the device ahead of use."""
    sources = {
        "store (workers)": (TrainVideoDataset(store_manifest(data)), "consume"),
        # Decoded on `setup.device`: the GPU, or the CPU in --smoke.
        "store (device decode)": (TrainVideoDataset(store_manifest(data), ReaderSettings(frame_decode="device")), "ahead"),
    }
    rows = []
    for grid, (name, (dataset, mode)) in itertools.product(selected_grids(setup, schedule), sources.items()):
        rate = loader_rate(dataset, grid, setup, mode)
        rows.append({"grid": grid.name, "source": name, "loader_clips_per_s": rate})
        print(f"  loader {grid.name} {name}: {rate:.0f} clips/s", flush=True)
    return rows


# ---------------------------------------------------------------------------- stages of both store paths


def _repeat_rate(work: Callable[[Any], int], items: list[Any], setup: Setup) -> float:
    """Clips/s of ``work`` over ``items`` cycled for ``repeat_seconds`` after one warm-up pass, the
    device synchronised before the clock is read."""
    for item in items:
        work(item)
    synchronize(setup)
    start, clips = time.perf_counter(), 0
    for item in itertools.cycle(items):
        clips += work(item)
        if time.perf_counter() - start >= setup.repeat_seconds:
            synchronize(setup)
            return clips / (time.perf_counter() - start)
    raise AssertionError("itertools.cycle is endless")


def host_batches(dataset: TrainVideoDataset, grid: Grid, setup: Setup, count: int = 3) -> list[dict[str, Any]]:
    """``count`` batches of ``grid`` as the workers hand them over, read in this process."""
    return [collate_clips([dataset[r] for r in requests])
            for requests in itertools.islice(requests_for(grid, setup.loader_videos, seed=1), count)]


def jpeg_tensors(clips: list[Any]) -> list[torch.Tensor]:
    return [torch.frombuffer(jpeg, dtype=torch.uint8) for clip in clips for jpeg in clip.jpegs]


def pinned_copy_rate(grid: Grid, setup: Setup) -> float:
    """Clips/s of the host-to-device copy of a decoded batch (uint8, pinned), as the workers path moves it."""
    shape = grid.shape
    host = torch.zeros(shape.batch_size, 3, shape.num_frames, shape.crop_size, shape.crop_size, dtype=torch.uint8)
    host = host.pin_memory() if setup.device == "cuda" else host
    return _repeat_rate(lambda h: int(h.to(setup.device, non_blocking=True).shape[0]), [host], setup)


def workers_stages(dataset: TrainVideoDataset, grid: Grid, setup: Setup) -> dict[str, Any]:
    """The workers path's stages as clips/s: one worker's CPU time per frame (``stage_costs``, one torch
    thread) times the workers; transfer is the slower of the workers' collate + hand-over and the pinned copy."""
    us = stage_costs(dataset, grid, 1, argparse.Namespace(read_frames=setup.stage_frames, videos=setup.loader_videos, repeat=2))

    def capacity(*names: str) -> float:
        seconds_per_clip = sum(us[n] for n in names) * grid.shape.num_frames / 1e6
        return setup.workers / seconds_per_clip if seconds_per_clip > 0 else float("inf")

    copy = pinned_copy_rate(grid, setup)
    return {"read": capacity("params", "read"), "decode": capacity("decode"),
            "crop_resize": capacity("resize_crop", "assemble"),
            "transfer": min(capacity("collate", "transfer"), copy), "pinned_copy": copy,
            "cpu_us_per_frame": us}


def device_stages(dataset: TrainVideoDataset, grid: Grid, setup: Setup) -> dict[str, Any]:
    """The device path's stages as clips/s: the workers reading the bytes (through the loader), nvjpeg
    on batches already read, the batched crop-resize-flip alone, the bytes' copy to the device; and the
    decode's rate in Gpx/s."""
    device = torch.device(setup.device)
    clips = [b["video"].clips for b in host_batches(dataset, grid, setup)]
    images = [decode_jpegs(jpeg_tensors(c), device) for c in clips]
    pixels_per_clip = sum(int(i.shape[-1] * i.shape[-2]) for batch in images for i in batch) / sum(len(c) for c in clips)

    def decode_batch(batch: list[Any]) -> int:
        decode_jpegs(jpeg_tensors(batch), device)
        return len(batch)

    def copy_bytes(batch: list[Any]) -> int:  # pageable, as the decoder is handed them
        torch.cat(jpeg_tensors(batch)).to(device)
        return len(batch)

    decode = _repeat_rate(decode_batch, clips, setup)
    resize = _repeat_rate(lambda k: int(crop_resize_flip(images[k], clips[k]).shape[0]), list(range(len(clips))), setup)
    copy = _repeat_rate(copy_bytes, clips, setup)
    return {"read": loader_rate(dataset, grid, setup, "bytes"), "decode": decode, "crop_resize": resize, "transfer": copy,
            "decode_then_crop_resize": 1 / (1 / decode + 1 / resize),
            "nvjpeg_gpx_per_s": decode * pixels_per_clip / 1e9, "decoded_pixels_per_frame": pixels_per_clip / grid.shape.num_frames}


def short_stage(model_rate: float | None, delivered: float | None, stages: dict[str, Any], combined: str | None = None) -> str:
    """What keeps a path below the model: ``"none"`` when it delivers what the model consumes, else the
    slowest stage when it is below the model, else ``combined`` (stages that run in sequence) when that
    is, else the stages together (hand-overs between them)."""
    if model_rate is None or delivered is None:
        return "not judged (model or loader not measured)"
    if delivered >= model_rate:
        return "none"
    slowest = min(("read", "decode", "crop_resize", "transfer"), key=lambda s: stages[s])
    if stages[slowest] < model_rate:
        return slowest.replace("_", "-")
    if combined and stages[combined] < model_rate:
        return combined.replace("_", " ")
    return f"no single stage (slowest: {slowest.replace('_', '-')}); the hand-overs between them"


def stage_table(setup: Setup, schedule: MultigridSchedule, data: dict[str, Any], report: Report) -> list[dict[str, Any]]:
    """Per grid, each stage of both store paths alone (clips/s), beside what the model consumes and each path
    delivers (``model`` and ``loader``), with the stage that falls short named."""
    workers = TrainVideoDataset(store_manifest(data))
    encoded = TrainVideoDataset(store_manifest(data), ReaderSettings(frame_decode="device"))
    model = {r["grid"]: r["model_clips_per_s"] for r in report.rows("model")}
    delivered = {(r["grid"], r["source"]): r["loader_clips_per_s"] for r in report.rows("loader")}
    rows = []
    for grid in selected_grids(setup, schedule):
        paths = {"workers": workers_stages(workers, grid, setup), "device": device_stages(encoded, grid, setup)}
        row: dict[str, Any] = {"grid": grid.name, "model_clips_per_s": model.get(grid.name)}
        for path, stages in paths.items():
            got = delivered.get((grid.name, f"store ({'workers' if path == 'workers' else 'device decode'})"))
            combined = "decode_then_crop_resize" if path == "device" else None
            row[path] = {**stages, "delivered": got, "short": short_stage(model.get(grid.name), got, stages, combined)}
        rows.append(row)
        print(f"  stages {grid.name}: workers short {row['workers']['short']}, device short {row['device']['short']}", flush=True)
    return rows


# ---------------------------------------------------------------------------- nvjpeg in Gpx/s


def nvjpeg_table(setup: Setup, report: Report) -> dict[str, Any]:
    """Batched device JPEG decode of ``nvjpeg_batch`` camera-like frames (quality 90) at each size, in Gpx/s,
    beside the per-grid rates of ``stages`` (the store's frames) and the public figure."""
    import simplejpeg

    device = torch.device(setup.device)
    rows = []
    for width, height in setup.nvjpeg_sizes:
        frames = render_camera_video(width, height, 8, np.random.default_rng(0))
        jpegs = [torch.frombuffer(bytearray(simplejpeg.encode_jpeg(np.ascontiguousarray(f), quality=90)), dtype=torch.uint8)
                 for f in frames]
        batch = [jpegs[k % len(jpegs)] for k in range(setup.nvjpeg_batch)]
        images_per_s = _repeat_rate(lambda b: len(decode_jpegs(b, device)), [batch], setup)
        rows.append({"size": f"{width}x{height}", "batch": setup.nvjpeg_batch, "images_per_s": images_per_s,
                     "gpx_per_s": images_per_s * width * height / 1e9})
        print(f"  nvjpeg {width}x{height}: {rows[-1]['gpx_per_s']:.2f} Gpx/s", flush=True)
    per_grid = [{"grid": r["grid"], "gpx_per_s": r["device"]["nvjpeg_gpx_per_s"],
                 "pixels_per_frame": r["device"]["decoded_pixels_per_frame"]} for r in report.rows("stages")]
    best = max([r["gpx_per_s"] for r in rows + per_grid], default=0.0)
    return {"decoder": jpeg_decoder(), "batched": rows, "store_per_grid": per_grid, "best_gpx_per_s": best,
            "public_gpx_per_s": PUBLIC_NVJPEG_GPX_S, "public": "about 2.9 Gpx/s batched on one A100 (issue 32)",
            "best_over_public": best / PUBLIC_NVJPEG_GPX_S}


# ---------------------------------------------------------------------------- overlap


def overlap_table(setup: Setup, schedule: MultigridSchedule, dataset: TrainVideoDataset, source: str) -> list[dict[str, Any]]:
    """Per grid (coarsest and base): ms per iteration of the training step alone on a decoded batch, of the
    decode then the step in one thread, and of the decode one batch ahead in ``DecodeAhead``'s thread (its
    own stream) while the step runs; ``inflation`` is overlapped over alone."""
    rows = []
    for grid in [g for g in selected_grids(setup, schedule) if g.name in ("coarsest", "base")]:
        step = training_step(build_model(setup), setup, bn_plan(schedule, grid.shape), setup.precision)
        rows.append({"source": source, "grid": grid.name, **overlap_times(setup, step, host_batches(dataset, grid, setup))})
        print(f"  overlap {grid.name}: {rows[-1]}", flush=True)
    return rows


def overlap_times(setup: Setup, step: Callable[[torch.Tensor, torch.Tensor], None], batches: list[dict[str, Any]]) -> dict[str, float]:
    transfer, device = BatchTransfer(), torch.device(setup.device)
    steps = max(3, setup.model_steps)
    decoded = [{**b} for b in batches]  # decoding replaces a batch's video: decode copies
    for batch in decoded:
        transfer.decode(batch, device)

    def train(batch: dict[str, Any]) -> int:  # what on_after_batch_transfer and the step do
        step(cast(torch.Tensor, normalize_video(batch["video"], transfer.mean, transfer.std)), batch["label"].to(device))
        return 1

    def fresh() -> Iterator[dict[str, Any]]:
        return ({**batches[k % len(batches)]} for k in range(steps))

    def alone() -> int:
        return sum(train(decoded[k % len(decoded)]) for k in range(steps))

    def serial() -> int:
        trained = 0
        for batch in fresh():
            transfer.decode(batch, device)
            trained += train(batch)
        return trained

    def overlapped() -> int:
        return sum(train(batch) for batch in DecodeAhead(transfer.decode, device).iterate(fresh()))

    modes = {"step_alone": alone, "decode_then_step": serial, "overlapped": overlapped}
    times = {f"{mode}_ms": _seconds_of(work, setup, steps) / steps * 1000 for mode, work in modes.items()}
    times["inflation"] = times["overlapped_ms"] / times["step_alone_ms"]
    return times


def _seconds_of(work: Callable[[], int], setup: Setup, steps: int) -> float:
    """Seconds of ``work`` (``steps`` training steps) run once more after a warm-up run, the device
    synchronised around it."""
    work()
    synchronize(setup)
    start = time.perf_counter()
    trained = work()
    synchronize(setup)
    if trained != steps:
        raise RuntimeError(f"{trained} training steps where {steps} were asked: batches were lost")
    return time.perf_counter() - start


# ---------------------------------------------------------------------------- end to end


def end_to_end(setup: Setup, data: dict[str, Any], section: str, report: Report, backbone: str | None = None,
               epochs: tuple[int, tuple[int, ...]] | None = None) -> dict[str, Any]:
    """Baseline and multigrid on the same data through ``benchmarks/train.py``'s ``run``, from the section's
    source decoded as :data:`END_TO_END` says (on the device: ``decode_ahead`` batches ahead of the step, 0
    between steps); ``epochs``: (baseline epochs, LR milestones), default the setup's. Each run's model-only
    time (:func:`model_only`) and pipeline efficiency (model-only over its training time) beside it."""
    source, decode, decode_ahead = END_TO_END[section]
    backbone = backbone or setup.backbone
    num_epochs, milestones = epochs or (setup.epochs, setup.milestones)
    args = argparse.Namespace(
        batch_size=setup.base.batch_size, num_frames=setup.base.num_frames, crop_size=setup.base.crop_size,
        sampling_rate=setup.sampling_rate, workers=setup.workers, num_views=1, width=8, lr=setup.lr,
        milestones=list(milestones), warmup_epochs=min(3, milestones[0] - 1), epochs=num_epochs,
        accelerator="gpu" if setup.device == "cuda" else "cpu", precision=setup.precision,
    )
    encoded = {"frames": "train_frame_manifests", "store": "train_stores"}
    if source == "frames":
        ensure(setup, data, "train_frame_manifests")
    manifests = tuple(Path(p) for p in data[encoded[source]]) if source in encoded else None
    results: dict[str, Any] = {"backbone": backbone, "source": source, "decode": decode, "decode_ahead": decode_ahead,
                               "epochs": num_epochs, "milestones": list(milestones), "num_train": setup.num_train}
    for name, multigrid in (("baseline", False), ("multigrid", True)):
        result = train_run(args, Path(data["train_dir"]), multigrid, None, backbone, manifests, decode, decode_ahead)  # type: ignore[arg-type]
        result["grid_rates"] = {f"{t}x{c}": r for (t, c), r in result["grid_rates"].items()}
        results[name] = result
        print(f"  {backbone} {source} ({decode} decode) {name}: {result['seconds']:.1f} s, {result['iterations']} "
              f"iterations, top-1 {result['top1']:.3f}, data wait {result['data_wait_share']:.0%}", flush=True)
    results["speedup"] = results["baseline"]["seconds"] / results["multigrid"]["seconds"]
    results["iteration_saving"] = results["baseline"]["iterations"] / max(results["multigrid"]["iterations"], 1)
    model_key = "model" if backbone == setup.backbone else "transformer:model"
    results["model_only"] = model_only(setup, report.rows(model_key), num_epochs, milestones)
    add_efficiency(results)
    return results


def model_only(setup: Setup, model_rows: list[dict[str, Any]], epochs: int, milestones: tuple[int, ...]) -> dict[str, Any]:
    """Seconds the model alone needs for each run's clips: per grid, the clips the run draws (``grid_counts``
    of the schedule the callback builds, the baseline's epochs x videos at the base) over the model's clips/s
    at that grid (section ``model``), in the layout the runs train in (contiguous: ``train.py`` does not
    convert) and in the faster layout per grid. ``missing`` names grids the model section did not measure."""
    schedule = build_schedule(MultigridConfig(base=setup.base, sampling_rate=setup.sampling_rate, max_epochs=epochs,
                                              milestones=milestones))
    rates = {tuple(r["shape"]): r for r in model_rows}
    runs = {"baseline": [(setup.base, epochs * setup.num_train)],
            "multigrid": [(c.grid, c.clips) for c in grid_counts(schedule, setup.num_train)]}
    out: dict[str, Any] = {"layout": "contiguous", "grids": [], "missing": []}
    for run, counts in runs.items():
        seconds = {"contiguous": 0.0, "fastest": 0.0}
        for shape, clips in counts:
            row = rates.get((shape.batch_size, shape.num_frames, shape.crop_size))
            if row is None:
                out["missing"].append(f"{run} {shape.batch_size}x{shape.num_frames}x{shape.crop_size}")
                continue
            contiguous = row.get("contiguous_clips_per_s", row["model_clips_per_s"])
            seconds["contiguous"] += clips / contiguous
            seconds["fastest"] += clips / row["model_clips_per_s"]
            out["grids"].append({"run": run, "grid": row["grid"], "clips": clips, "contiguous_clips_per_s": contiguous,
                                 "seconds": clips / contiguous})
        out[f"{run}_s"], out[f"{run}_fastest_layout_s"] = seconds["contiguous"], seconds["fastest"]
    if not out["missing"]:
        out["ratio"] = out["baseline_s"] / out["multigrid_s"]
        out["fastest_layout_ratio"] = out["baseline_fastest_layout_s"] / out["multigrid_fastest_layout_s"]
    return out


def add_efficiency(results: dict[str, Any]) -> None:
    """Each run's pipeline efficiency (model-only seconds over training seconds; 1 = the model's pace) and
    the speed-up's share of the model-only ratio, where the model's rates cover every grid."""
    only = results["model_only"]
    if only["missing"]:
        return
    for run in ("baseline", "multigrid"):
        results[run]["model_only_s"] = only[f"{run}_s"]
        results[run]["pipeline_efficiency"] = only[f"{run}_s"] / results[run]["seconds"]
    results["speedup_of_model_ratio"] = results["speedup"] / only["ratio"]


# ---------------------------------------------------------------------------- batches sized by measured time


def batch_sizing_table(setup: Setup) -> list[dict[str, Any]]:
    """Issue 34's figure on this device: per grid, the step time per iteration at Equation 1's batch and at
    the batch sized by the measured time (``batch_sizing="time"``), against the base iteration, for the CNN
    and the transformer (``benchmarks/step.py``'s ``sizing_rows``: fp32 steps, the fastest of
    ``sizing_repeats``). ``--smoke`` sizes by FLOPs: timed costs of its tiny grids are noise."""
    from step import sizing_rows

    args = argparse.Namespace(epochs=setup.epochs, milestones=list(setup.milestones), no_long_cycle=False,
                              no_short_cycle=False, width=8, repeats=setup.sizing_repeats,
                              warmup=2 if setup.sizing_repeats > 1 else 0)
    method = "time" if setup.device == "cuda" else "flops"
    rows = []
    for backbone in (setup.backbone, setup.transformer):
        entry = sizing_rows(args, setup.base, backbone, method, torch.device(setup.device))
        rows.append(entry)
        print(f"  batch sizing {backbone} by {method}: largest deviation from the base iteration, Equation 1 "
              f"{entry['equation1_max_deviation']:.0%}, sized {entry['sized_max_deviation']:.0%}", flush=True)
    return rows


# ---------------------------------------------------------------------------- what earlier runs measured


def encoded_sources(setup: Setup, data: dict[str, Any]) -> dict[str, TrainVideoDataset]:
    """The JPEG sources of ``read`` and ``decode``: datasets whose workers return bytes
    (``frame_decode="device"``), same videos: the store and the frame folders."""
    device = ReaderSettings(frame_decode="device")
    return {
        "store": TrainVideoDataset(store_manifest(data), device),
        "frames": TrainVideoDataset(Path(ensure(setup, data, "frames")), device),
    }


def read_table(setup: Setup, schedule: MultigridSchedule, data: dict[str, Any]) -> list[dict[str, Any]]:
    """Per source and grid: clips/s and frames/s the workers read (JPEG bytes, nothing decoded)."""
    rows = []
    for (name, dataset), grid in itertools.product(encoded_sources(setup, data).items(), selected_grids(setup, schedule)):
        rate = loader_rate(dataset, grid, setup, "bytes")
        rows.append({"source": name, "grid": grid.name, "read_clips_per_s": rate,
                     "read_frames_per_s": rate * grid.shape.num_frames})
        print(f"  read {name} {grid.name}: {rate:.0f} clips/s", flush=True)
    return rows


def decode_table(setup: Setup, schedule: MultigridSchedule, data: dict[str, Any]) -> list[dict[str, Any]]:
    """Per grid, store batches already read: clips/s of the whole device decode (JPEG + crop-resize) and of
    the crop-resize alone, with the per-clip resize loop and with the one batched crop-resize."""
    dataset = TrainVideoDataset(store_manifest(data), ReaderSettings(frame_decode="device"))
    rows = []
    for grid in selected_grids(setup, schedule):
        rows.append({"source": "store", "grid": grid.name, **decode_rates(setup, host_batches(dataset, grid, setup))})
        print(f"  decode store {grid.name}: {rows[-1]}", flush=True)
    return rows


def decode_rates(setup: Setup, batches: list[dict[str, Any]]) -> dict[str, float]:
    clips = [b["video"].clips for b in batches]
    images = [decode_jpegs(jpeg_tensors(c), setup.device) for c in clips]
    rates = {}
    for method, resize in (("per_clip", crop_resize_flip_per_clip), ("batched", crop_resize_flip)):
        rates[f"decode_{method}_clips_per_s"] = _repeat_rate(
            lambda c, resize=resize: int(resize(decode_jpegs(jpeg_tensors(c), setup.device), c).shape[0]), clips, setup
        )
        rates[f"resize_{method}_clips_per_s"] = _repeat_rate(
            lambda k, resize=resize: int(resize(images[k], clips[k]).shape[0]), list(range(len(clips))), setup
        )
    return rates


class NvdecClips:
    """mp4 decoded with torchcodec on the GPU in the main process: only the sampled frames, then
    resize, crop and flip there (the workers have nothing to do)."""

    def __init__(self, manifest: Path) -> None:
        self.paths = [e.path for e in load_manifest(manifest).entries]

    def batch_rate(self, grid: Grid, seconds: float) -> float:
        from torchcodec.decoders import VideoDecoder

        from lightning_multigrid.data.clip_params import sample_clip_params
        from lightning_multigrid.data.decoding.video import probe_video

        metadata = {p: probe_video(p) for p in sorted(set(self.paths))}
        start, clips = time.perf_counter(), 0
        for requests in requests_for(grid, len(self.paths), seed=0):
            for request in requests:
                path = self.paths[request.index]
                params = sample_clip_params(request, metadata[path], flip=True)
                frames = VideoDecoder(path, device="cuda").get_frames_at(list(params.frame_indices)).data
                resized = F.interpolate(frames.float(), size=(params.resize_height, params.resize_width),
                                        mode="bilinear", antialias=True)
                clip = resized[..., params.crop_y : params.crop_y + params.crop_size,
                               params.crop_x : params.crop_x + params.crop_size]
                (clip.flip(-1) if params.flip else clip).to(torch.uint8)
                clips += 1
            torch.cuda.synchronize()
            if time.perf_counter() - start >= seconds:
                return clips / (time.perf_counter() - start)
        raise AssertionError("requests_for is endless")


def other_loader_table(setup: Setup, schedule: MultigridSchedule, data: dict[str, Any], nvdec: bool) -> list[dict[str, Any]]:
    """The sources earlier runs measured: mp4 at GOP 250 and 12 and frame folders decoded in the workers,
    frame folders decoded on the device between batches, and mp4 with NVDEC where torchcodec can."""
    manifests = {name: Path(ensure(setup, data, name)) for name in ("mp4 gop12", "frames")}
    sources: dict[str, Any] = {
        "mp4 gop250 (workers)": TrainVideoDataset(Path(data["loader_manifests"]["mp4 gop250"])),
        "mp4 gop12 (workers)": TrainVideoDataset(manifests["mp4 gop12"]),
        "frames (workers)": TrainVideoDataset(manifests["frames"]),
        "frames (device decode)": TrainVideoDataset(manifests["frames"], ReaderSettings(frame_decode="device")),
    }
    if nvdec:
        sources["mp4 gop12 (NVDEC, main process)"] = NvdecClips(manifests["mp4 gop12"])
    rows = []
    for grid, (name, dataset) in itertools.product(selected_grids(setup, schedule), sources.items()):
        rate = dataset.batch_rate(grid, setup.loader_seconds) if isinstance(dataset, NvdecClips) else loader_rate(dataset, grid, setup)
        rows.append({"grid": grid.name, "source": name, "loader_clips_per_s": rate})
        print(f"  loader {grid.name} {name}: {rate:.0f} clips/s", flush=True)
    return rows


def precision_and_layout(setup: Setup, schedule: MultigridSchedule) -> list[dict[str, Any]]:
    """16-mixed and channels_last_3d beside the main precision, at the coarsest and the base grid."""
    rows = []
    grids = [g for g in selected_grids(setup, schedule) if g.name in ("coarsest", "base")]
    for grid, (precision, channels_last) in itertools.product(
        grids, [(setup.precision, False), ("16-mixed", False), (setup.precision, True)]
    ):
        if precision == "16-mixed" and setup.device != "cuda":
            continue  # float16 autocast with GradScaler is a CUDA path
        model = build_model(setup, channels_last)
        rate = step_rate(model, setup, grid.shape, bn_plan(schedule, grid.shape), precision, setup.model_steps,
                         channels_last)
        rows.append({"grid": grid.name, "precision": precision, "channels_last_3d": channels_last, "clips_per_s": rate})
    return rows


def fsdp_fit(setup: Setup, data: dict[str, Any]) -> dict[str, Any]:
    """A short multigrid fit under Lightning's FSDP on one device: MultigridBatchNorm inside FSDP."""
    if setup.device != "cuda":
        return {"skipped": "Lightning refuses FSDP without CUDA"}
    from lightning_multigrid._lightning import pl
    from lightning_multigrid.callback import MultigridCallback
    from lightning_multigrid.data.datamodule import MultigridVideoDataModule

    train_dir = Path(data["train_dir"]).parent / "fsdp"
    generate_synthetic_dataset(train_dir, num_train=96, num_val=16, seed=0, texture_cell=12)
    datamodule = MultigridVideoDataModule(
        train_manifest=str(train_dir / "train.csv"), val_manifest=str(train_dir / "val.csv"), batch_size=8,
        num_frames=8, crop_size=64, sampling_rate=2, num_workers=setup.workers, seed=0,
    )
    model = VideoClassifier(num_classes=datamodule.num_classes, backbone="tiny", tiny_width=8, lr=0.01, milestones=[2])
    trainer = pl.Trainer(
        max_epochs=3, accelerator="gpu", devices=1, strategy="fsdp", precision=setup.precision,
        callbacks=[MultigridCallback(precise_bn_batches=2)], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=2, num_sanity_val_steps=0,
    )
    trainer.fit(model, datamodule=datamodule)
    return {"ok": True, "iterations": trainer.global_step, "epochs": trainer.current_epoch,
            "val_top1": float(trainer.callback_metrics.get("val/top1", float("nan")))}


def compile_table(setup: Setup, schedule: MultigridSchedule, deadline: float) -> list[dict[str, Any]]:
    """``torch.compile`` with one static graph per grid (``dynamic=False``: each new grid compiles its own,
    as a multigrid run would with the recompile limit raised): per grid the schedule draws, the first
    steps (compile time included) and steady steps, against eager; grids that would start after
    ``deadline`` (``time.perf_counter()``) are left out and say so."""
    if setup.device != "cuda":
        return [{"skipped": "compiling on CPU takes minutes; the GPU run measures it"}]
    import torch._dynamo

    for name in ("recompile_limit", "cache_size_limit"):  # the name changed across torch versions
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)  # about 12 shapes per multigrid run
    started = time.perf_counter()
    eager = build_model(setup)
    compiled = cast(torch.nn.Module, torch.compile(build_model(setup), dynamic=False))
    print(f"  compile: models built in {time.perf_counter() - started:.1f} s", flush=True)
    rows: list[dict[str, Any]] = []
    for grid in drawn_grids(schedule):
        if time.perf_counter() > deadline:
            rows.append({"grid": grid.name, "skipped": "time budget"})
            continue
        plan = bn_plan(schedule, grid.shape)
        started = time.perf_counter()
        step_rate(compiled, setup, grid.shape, plan, setup.precision, 1)  # 3 warm-up steps compile it
        first = time.perf_counter() - started
        rows.append({
            "grid": grid.name, "first_steps_s": first,
            "compiled_clips_per_s": step_rate(compiled, setup, grid.shape, plan, setup.precision, setup.model_steps),
            "eager_clips_per_s": step_rate(eager, setup, grid.shape, plan, setup.precision, setup.model_steps),
        })
        print(f"  compile {grid.name}: {rows[-1]}", flush=True)
    return rows


# ---------------------------------------------------------------------------- report


def markdown(report: dict[str, Any]) -> str:
    lines = markdown_head(report, "benchmarks/gpu.py")
    lines += _end_to_end_tables(report)
    lines += _pace_table(report)
    lines += _overlap_table(report, "overlap")
    lines += _sizing_tables(report)
    lines += _stage_tables(report)
    lines += _nvjpeg_table(report)
    lines += _legacy_tables(report)
    lines += markdown_json(report, ("precision", "fsdp", "compile"))
    return "\n".join(lines + markdown_tail(report)) + "\n"


_rows = grid_rows


def _pace_table(report: dict[str, Any]) -> list[str]:
    """Per grid: what each model consumes beside what each store path delivers, and what sets the pace."""
    models = {key: {r["grid"]: r for r in _rows(report, key)} for key in ("model", "transformer:model")}
    if not models["model"]:
        return []
    loader = {(r["grid"], r["source"]): r["loader_clips_per_s"] for r in _rows(report, "loader")}
    stages = {r["grid"]: r for r in _rows(report, "stages")}
    names = [next(iter(rows.values()))["backbone"] for rows in models.values() if rows]
    lines = ["", "| grid (batch x frames x crop) | " + " | ".join(f"{n} consumes" for n in names)
             + " | store, workers decode | store, device decode (ahead) |", "|---|" + "---|" * (len(names) + 2)]
    for grid, row in models["model"].items():
        consumed = [f"{rows[grid]['model_clips_per_s']:.0f}" if grid in rows else "-" for rows in models.values() if rows]
        cells = []
        for source, path in (("store (workers)", "workers"), ("store (device decode)", "device")):
            rate = loader.get((grid, source))
            short = stages.get(grid, {}).get(path, {}).get("short")
            keeps_up = rate is not None and rate >= row["model_clips_per_s"]
            verdict = "keeps up" if keeps_up else f"short: {short or 'stages not measured'}"
            cells.append("-" if rate is None else f"{rate:.0f} ({verdict})")
        shape = " x ".join(str(v) for v in row["shape"])
        lines.append(f"| {grid} ({shape}) | " + " | ".join(consumed + cells) + " |")
    return lines


def _stage_tables(report: dict[str, Any]) -> list[str]:
    rows = _rows(report, "stages")
    if not rows:
        return []
    lines = []
    for path, title in (("workers", "workers decode (per-core cost x workers)"), ("device", "device decode")):
        lines += ["", f"Stages of the store, {title}, clips/s:", "",
                  "| grid | model | delivered | read | decode | crop-resize | transfer | short |", "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            s = r[path]
            cells = [r["model_clips_per_s"], s["delivered"], s["read"], s["decode"], s["crop_resize"], s["transfer"]]
            lines.append(f"| {r['grid']} | " + " | ".join("-" if c is None else f"{c:.0f}" for c in cells) + f" | {s['short']} |")
    return lines


def _nvjpeg_table(report: dict[str, Any]) -> list[str]:
    nvjpeg = report.get("nvjpeg")
    if not isinstance(nvjpeg, dict) or "batched" not in nvjpeg:
        return []
    lines = ["", f"JPEG decode on the device ({nvjpeg['decoder']}), batched, against {nvjpeg['public']}:", "",
             "| frames | batch | images/s | Gpx/s | of the public figure |", "|---|---|---|---|---|"]
    for r in nvjpeg["batched"]:
        lines.append(f"| {r['size']} | {r['batch']} | {r['images_per_s']:.0f} | {r['gpx_per_s']:.2f} | "
                     f"{r['gpx_per_s'] / nvjpeg['public_gpx_per_s']:.2f}x |")
    for r in nvjpeg["store_per_grid"]:
        lines.append(f"| store, {r['grid']} ({r['pixels_per_frame']:.0f} px/frame) | grid's batch | - | {r['gpx_per_s']:.2f} | "
                     f"{r['gpx_per_s'] / nvjpeg['public_gpx_per_s']:.2f}x |")
    return lines


def _overlap_table(report: dict[str, Any], key: str) -> list[str]:
    rows = _rows(report, key)
    if not rows:
        return []
    lines = ["", "| source | grid | step alone ms | decode then step ms | overlapped ms | inflation |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['source']} | {r['grid']} | {r['step_alone_ms']:.1f} | {r['decode_then_step_ms']:.1f} | "
              f"{r['overlapped_ms']:.1f} | {r['inflation']:.2f}x |" for r in rows]
    return lines


def _end_to_end_tables(report: dict[str, Any]) -> list[str]:
    runs = {k: v for k, v in report.items() if k.startswith(("end_to_end", "transformer:end_to_end")) and isinstance(v, dict)}
    if not runs:
        return []
    lines = ["", "End to end (pipeline efficiency: the model-only time over the training time; 1 = the model's pace):", "",
             "| section | run | epochs | iterations | training s | model-only s | efficiency | top-1 | data wait | speed-up |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    waits = []
    for key, result in runs.items():
        if "baseline" not in result:
            lines.append(f"| {key} | {result.get('error') or result.get('skipped')} |")
            continue
        label = f"{key} ({result['backbone']}, {result.get('decode', '?')} decode, {result.get('epochs', '?')} epochs)"
        for run in ("baseline", "multigrid"):
            lines.append(_end_to_end_row(label, run, result))
        waits += [(key, grid, w) for grid, w in result["multigrid"].get("data_wait_grids", {}).items()]
        missing = result.get("model_only", {}).get("missing")
        if missing:
            lines.append(f"| {key} | model-only not computed: the model section lacks {', '.join(missing)} |")
    if waits:
        lines += ["", "The multigrid runs' data-wait meter, per grid:", "",
                  "| section | grid | iterations timed | waiting |", "|---|---|---|---|"]
        lines += [f"| {key} | {grid} | {w['iterations']} | {w['share']:.0%} |" for key, grid, w in waits]
    return lines


def _end_to_end_row(label: str, run: str, result: dict[str, Any]) -> str:
    r = result[run]
    model_s, efficiency = r.get("model_only_s"), r.get("pipeline_efficiency")
    speedup = ""
    if run == "multigrid":
        speedup = f"{result['speedup']:.2f}x ({result['iteration_saving']:.2f}x fewer iterations"
        ratio = result.get("model_only", {}).get("ratio")
        speedup += f"; model-only ratio {ratio:.2f}x, {result['speedup_of_model_ratio']:.2f} of it)" if ratio else ")"
    return (f"| {label} | {run} | {r['epochs']} | {r['iterations']} | {r['seconds']:.1f} | "
            f"{'-' if model_s is None else f'{model_s:.1f}'} | {'-' if efficiency is None else f'{efficiency:.2f}'} | "
            f"{r['top1']:.3f} | {r['data_wait_share']:.0%} | {speedup} |")


def _sizing_tables(report: dict[str, Any]) -> list[str]:
    entries = report.get("batch_sizing")
    if not isinstance(entries, list):
        return []
    lines: list[str] = []
    for entry in entries:
        lines += ["", f"Batches sized by {entry['method']}, {entry['backbone']}: step ms per iteration against the base "
                      f"iteration ({entry['base_ms']:.2f} ms):", "",
                  "| grid (frames x crop) | Eq. 1 batch | Eq. 1 rel. | sized batch | sized rel. |", "|---|---|---|---|---|"]
        lines += [f"| {r['grid']} | {r['equation1_batch']} | {r['equation1_rel']:.2f} | {r['sized_batch']} | "
                  f"{r['sized_rel']:.2f} |" for r in entry["grids"]]
    return lines


def _legacy_tables(report: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    other = _rows(report, "loader:other")
    if other:
        lines += ["", "| grid | source | loader clips/s |", "|---|---|---|"]
        lines += [f"| {r['grid']} | {r['source']} | {r['loader_clips_per_s']:.0f} |" for r in other]
    read = _rows(report, "read")
    if read:
        lines += ["", "| source | grid | read clips/s | read frames/s |", "|---|---|---|---|"]
        lines += [f"| {r['source']} | {r['grid']} | {r['read_clips_per_s']:.0f} | {r['read_frames_per_s']:.0f} |" for r in read]
    decode = _rows(report, "decode")
    if decode:
        lines += ["", "| source | grid | decode, per-clip resize | decode, batched | resize alone, per clip | resize alone, batched |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {r['source']} | {r['grid']} | {r['decode_per_clip_clips_per_s']:.0f} | {r['decode_batched_clips_per_s']:.0f} | "
                  f"{r['resize_per_clip_clips_per_s']:.0f} | {r['resize_batched_clips_per_s']:.0f} |" for r in decode]
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu.json and gpu.md")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on CPU: checks the script, measures nothing")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="seconds from the process start within which every section must end; a section whose "
                             "estimate would pass it is skipped (default 480; 120 with --smoke)")
    parser.add_argument("--data", type=Path, help="work folder for the generated data (default: a temporary one)")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated, run in this order: {','.join(SECTIONS)} (default: all)")
    parser.add_argument("--skip", default="", help="comma-separated sections or prefixes to leave out, e.g. transformer")
    parser.add_argument("--base", type=parse_shape, help="base grid BxTxS (default 8x16x112; the paper's resolution: 8x8x224)")
    parser.add_argument("--sampling-rate", type=int, help="frame stride at the base (default 4)")
    return parser.parse_args(argv)


def parse_shape(text: str) -> GridShape:
    try:
        batch, frames, crop = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not BxTxS (e.g. 8x8x224)") from None
    return GridShape(batch, frames, crop)


def with_base(setup: Setup, base: GridShape | None, sampling_rate: int | None) -> Setup:
    """``setup`` at another base grid: the videos' short side at least the store's level 0 (the jitter maximum,
    320 for a 224 crop), the width in the same 340:256 proportion."""
    if base is None and sampling_rate is None:
        return setup
    base = base or setup.base
    level0 = round(320 * base.crop_size / 224)
    height = max(setup.video_size[1], level0 + level0 % 2)
    width = max(setup.video_size[0], 2 * round(height * 340 / 256 / 2))
    return dataclasses.replace(setup, base=base, sampling_rate=sampling_rate or setup.sampling_rate,
                               video_size=(width, height))


def chosen_sections(args: argparse.Namespace) -> set[str]:
    sections = set(filter(None, args.sections.split(",")))
    if sections - set(SECTIONS):
        raise SystemExit(f"--sections: unknown {sorted(sections - set(SECTIONS))}; choose from {', '.join(SECTIONS)}")
    skip = [s for s in args.skip.split(",") if s]
    unknown = [s for s in skip if not any(name.startswith(s) for name in SECTIONS)]
    if unknown:
        raise SystemExit(f"--skip: {unknown} names no section; choose from {', '.join(SECTIONS)}")
    return {name for name in sections if not any(name.startswith(s) for s in skip)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    setup = with_base(SMOKE if args.smoke else FULL, args.base, args.sampling_rate)
    if args.smoke:
        # It measures nothing: one thread, so a shared CPU's other jobs do not turn torch's spinning
        # intra-op threads into minutes (a tiny step took 5-25 s with two threads at load 16, 0.1-0.5 s with one).
        torch.set_num_threads(1)
    if setup.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu.py needs CUDA; `--smoke` runs the same code on CPU with tiny sizes.")
    sections = chosen_sections(args)
    report = Report(args.out, args.budget_s or (120.0 if args.smoke else 480.0), setup.cost_scale)
    schedule = benchmark_schedule(setup)
    with tempfile.TemporaryDirectory() as scratch:
        root = args.data or Path(scratch)
        data = report.section("data", lambda: make_data(setup, root, sections))
        if "error" in data:
            raise SystemExit(f"making the data failed:\n{data['traceback']}")
        for name in SECTIONS:
            if name in sections:
                report.section(name, section_work(name, setup, schedule, data, report), estimated_cost(name, report, setup))
    rates = standin_rates(report.data, setup)
    if rates is not None:
        (args.out / "standin_rates.json").write_text(json.dumps(rates, indent=1))
    text = markdown(report.data)
    (args.out / "gpu.md").write_text(text)
    print(text)
    return report.data


def standin_rates(report: dict[str, Any], setup: Setup) -> dict[str, Any] | None:
    """The ``model`` section's per-grid clips/s in ``benchmarks/h200_rates.json``'s form, for
    ``benchmarks/standin.py --rates`` (every grid measured: nothing estimated); ``None`` without it."""
    rows = grid_rows(report, "model")
    if not rows:
        return None
    env = report.get("env", {}) if isinstance(report.get("env"), dict) else {}
    base = setup.base
    return {
        "description": f"{setup.backbone} training steps on batches already on the device ({setup.precision}, "
                       f"MultigridBatchNorm split as multigrid splits it), clips/s per grid at base "
                       f"{base.batch_size} x {base.num_frames} x {base.crop_size}",
        "source": f"benchmarks/gpu.py, section `model`, {env.get('gpu', setup.device)}, {env.get('date', '')}",
        "machine": {"gpu": env.get("gpu"), "cpu_cores": env.get("cpu_cores"), "workers": setup.workers},
        "backbone": setup.backbone, "precision": setup.precision,
        "base": f"{base.batch_size} x {base.num_frames} x {base.crop_size}", "sampling_rate": setup.sampling_rate,
        "layout_used_by_end_to_end": "contiguous",
        "grids": [{"grid": " x ".join(str(v) for v in r["shape"]), "batch_size": r["shape"][0], "num_frames": r["shape"][1],
                   "crop_size": r["shape"][2], "contiguous_clips_per_s": r.get("contiguous_clips_per_s"),
                   "channels_last_clips_per_s": r.get("channels_last_clips_per_s"), "source": "measured"} for r in rows],
    }


def estimated_cost(name: str, report: Report, setup: Setup) -> float:
    """``COST_S[name]``; for the transformer's end-to-end runs, at least the r3d_18 pair's measured seconds
    (workers decode) times how much slower the transformer's base-grid step measured, times its share of
    the epochs, so a slow model is skipped, not cut."""
    cost = float(COST_S[name])
    if name == "transformer:end_to_end" and "end_to_end:store" in report.data["seconds"]:
        rates = [{r["grid"]: r.get("contiguous_clips_per_s") for r in report.rows(key)}.get("base")
                 for key in ("model", "transformer:model")]
        if all(rates):
            epochs = setup.transformer_epochs / setup.epochs
            cost = max(cost, report.data["seconds"]["end_to_end:store"] * rates[0] / rates[1] * epochs)
    return cost


def transformer_end_to_end(setup: Setup, data: dict[str, Any], report: Report) -> dict[str, Any]:
    """``swin3d_t``'s pair, from the store decoded in the workers, sized to fit: ``transformer_epochs``
    baseline epochs (the same schedule's proportions), and the result says so."""
    epochs = (setup.transformer_epochs, setup.transformer_milestones)
    result = end_to_end(setup, data, "end_to_end:store", report, backbone=setup.transformer, epochs=epochs)
    result["sized_to_fit"] = (f"{setup.transformer_epochs} baseline epochs, milestones {list(setup.transformer_milestones)} "
                              f"({setup.backbone}: {setup.epochs}, {list(setup.milestones)}), to fit the time budget")
    return result


def section_work(name: str, setup: Setup, schedule: MultigridSchedule, data: dict[str, Any], report: Report) -> Callable[[], Any]:
    """What section ``name`` runs."""
    sample = Path(data["loader_manifests"]["mp4 gop250"]).parent / "000.mp4"
    store_device = lambda: TrainVideoDataset(store_manifest(data), ReaderSettings(frame_decode="device"))  # noqa: E731
    work: dict[str, Callable[[], Any]] = {
        "env": lambda: environment(setup.device, sample),
        "model": lambda: model_table(setup, schedule, setup.backbone),
        "loader": lambda: loader_table(setup, schedule, data),
        "stages": lambda: stage_table(setup, schedule, data, report),
        "nvjpeg": lambda: nvjpeg_table(setup, report),
        "overlap": lambda: overlap_table(setup, schedule, store_device(), "store"),
        **{key: (lambda key=key: end_to_end(setup, data, key, report)) for key in END_TO_END},
        "transformer:model": lambda: model_table(setup, schedule, setup.transformer, layouts=(False,)),
        "transformer:end_to_end": lambda: transformer_end_to_end(setup, data, report),
        "batch_sizing": lambda: batch_sizing_table(setup),
        "decode": lambda: decode_table(setup, schedule, data),
        "read": lambda: read_table(setup, schedule, data),
        "loader:other": lambda: other_loader_table(setup, schedule, data, nvdec_usable(report)),
        "precision": lambda: precision_and_layout(setup, schedule),
        "fsdp": lambda: fsdp_fit(setup, data),
        "compile": lambda: compile_table(setup, schedule, report.start + report.budget_s),
    }
    return work[name]


def nvdec_usable(report: Report) -> bool:
    env = report.data.get("env", {})
    return bool(isinstance(env, dict) and env.get("nvdec", {}).get("usable", False))


if __name__ == "__main__":
    main()
