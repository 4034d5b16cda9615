"""End-to-end: baseline vs multigrid training, side by side in one run.

Both runs train the same model (`VideoClassifier`, `--backbone`, default the tiny 3D CNN; `tiny_swin3d`: the tiny transformer) from the
same seed on the built-in synthetic videos through `MultigridVideoDataModule`, with the same
optimizer and step LR schedule. The baseline runs `--epochs` epochs at the base shape; multigrid adds
`MultigridCallback` (long + short cycle, 1.5x epochs). Validation runs once after training
(multi-view, base shape, precise BN for multigrid), so the times compare training only.

Sources of frames, each timed for both runs (``--source``, comma-separated):

- ``mp4``: workers decode every clip from the H.264 files (the real pipeline). Multigrid decodes
  1.5x the clips of the baseline (1.5x epochs), so on a machine whose cores must both decode and
  train (2 CPU cores) decoding caps the speed-up.
- ``frames``: the videos extracted once to JPEG frames (``extract_frames``, before the clock
  starts); workers decode only the sampled frames, at reduced size where the grid allows.
- ``frames-gpu``: the same frames; workers read the JPEG bytes, the GPU decodes (nvjpeg),
  resizes, crops and flips each batch (``frame_decode="device"``).
- ``store``: the videos packed once (``pack_frames``, before the clock starts) into a frame store whose
  level 0 is the largest short side the grids draw; workers read each sampled frame by offset and
  decode it as ``frames`` does. ``store-gpu``: the same store, decoded on the GPU.
- ``memory``: every video is decoded once, before the clock starts; workers draw the same clips
  (the same `sample_clip_params`) and resize and crop them from RAM. This is the regime of a
  loader that keeps up: decoding is out of the timed loop, so it shows what the model consumes.

The default is ``mp4,memory`` on CPU and ``mp4,frames,frames-gpu`` on a GPU. For every multigrid
run the clips/s reached at each grid are printed (time from one batch's start to the next), to
set beside ``benchmarks/loader.py``'s loading capacity at the same grid.

    python benchmarks/train.py                        # mp4 and memory; about 8 minutes on 2 CPU cores
    python benchmarks/train.py --source memory        # the loader-keeps-up figure only
    python benchmarks/train.py --source memory,frames,store   # the store beside frames held in RAM
    python benchmarks/train.py --epochs 8 --milestones 6 --num-train 80   # a quick look
    # GPU, Kinetics-like synthetic videos (340x256, 10 s at 30 fps), r3d_18 and the tiny CNN:
    python benchmarks/train.py --accelerator gpu --precision bf16-mixed --workers 14 --kinetics-like \
        --backbone r3d_18,tiny --batch-size 8 --num-frames 16 --crop-size 112 --sampling-rate 4 \
        --num-train 1600 --epochs 12 --milestones 8 10

Prints the iterations, wall-clock time, CPU seconds (this process and its workers) and top-1 of each
run, the speed-ups and each speed-up's share of the iteration saving.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import platform
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from lightning_multigrid._lightning import pl
from lightning_multigrid.callback import MultigridCallback
from lightning_multigrid.data.datamodule import MultigridVideoDataModule
from lightning_multigrid.data.dataset import TrainVideoDataset
from lightning_multigrid.data.decoding.readers import InMemoryReader
from lightning_multigrid.data.reader_settings import ReaderSettings
from lightning_multigrid.data.sources import load_manifest
from lightning_multigrid.data.synthetic import generate_synthetic_dataset
from lightning_multigrid.data.tools.extract import extract_frames
from lightning_multigrid.data.tools.pack import pack_frames
from lightning_multigrid.fit.meter import format_grid
from lightning_multigrid.grid import EvalViews
from lightning_multigrid.module import VideoClassifier


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--source", default="auto",
        help="comma-separated: mp4, frames, frames-gpu, store, store-gpu, memory (auto: mp4,memory on CPU, "
        "mp4,frames,frames-gpu on GPU)",
    )
    parser.add_argument("--epochs", type=int, default=40, help="baseline epochs")
    parser.add_argument("--milestones", type=int, nargs="*", default=[30, 36], help="baseline LR milestones")
    # 0.0125 for 8 clips is PySlowFast's Kinetics LR (0.1 per 64 clips); multigrid multiplies it by
    # up to 8 on the coarsest grid. At 4x that, r3d_18's multigrid run failed to learn once (README).
    parser.add_argument("--lr", type=float, default=0.0125, help="base LR (for --batch-size clips)")
    parser.add_argument("--warmup-epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--num-frames", type=int, default=8)
    parser.add_argument("--crop-size", type=int, default=64)
    parser.add_argument("--sampling-rate", type=int, default=2)
    parser.add_argument("--backbone", default="tiny", help="`VideoClassifier` backbone names, comma-separated")
    parser.add_argument("--width", type=int, default=8, help="channels of the tiny CNN's stem (tiny_swin3d: its embedding)")
    parser.add_argument("--num-train", type=int, default=240)
    parser.add_argument("--video-size", default="160x120", help="synthetic video WxH (160x120)")
    parser.add_argument("--video-frames", type=int, default=50, help="frames per synthetic video (50)")
    parser.add_argument("--fps", type=float, default=25, help="synthetic video frame rate (25)")
    parser.add_argument("--kinetics-like", action="store_true", help="synthetic videos of 340x256, 10 s at 30 fps")
    parser.add_argument("--num-val", type=int, default=60)
    parser.add_argument("--num-views", type=int, default=1, help="validation clips per video")
    parser.add_argument(
        "--texture-cell", type=int, default=12,
        help="synthetic checkerboard cell in pixels: 12 stays visible on every grid; 6 (the demo's) "
        "is blurred away on the coarse ones",
    )
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers of each run")
    parser.add_argument("--data", type=Path, help="synthetic dataset directory (generated if empty)")
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--precision", default="32-true")
    return parser.parse_args()


class GridThroughput(pl.Callback):
    """Clips/s reached at each grid (clips of a batch over the time to the next batch's start), and
    the time the loop waited for data: from one batch's end to the next one's start (fetching the
    batch, its transfer and, with ``frame_decode="device"``, its decoding; epoch ends included)."""

    def __init__(self) -> None:
        self.totals: dict[tuple[int, int], list[float]] = {}  # (frames, crop) -> [clips, seconds]
        self._last: tuple[float, tuple[int, int], int] | None = None
        self.wait_seconds = 0.0
        self._batch_end = 0.0
        self._synchronize = torch.cuda.is_available()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._batch_end = time.perf_counter()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if self._synchronize:
            torch.cuda.synchronize()  # the step's GPU work is done: what follows is waiting for data
        self._batch_end = time.perf_counter()

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()
        self.wait_seconds += now - self._batch_end
        if self._last is not None and batch_idx > 0:
            start, grid, clips = self._last
            total = self.totals.setdefault(grid, [0.0, 0.0])
            total[0] += clips
            total[1] += now - start
        video = batch["video"][-1] if isinstance(batch["video"], list) else batch["video"]
        self._last = (now, (int(video.shape[2]), int(video.shape[3])), int(video.shape[0]))

    def rates(self) -> dict[tuple[int, int], float]:
        return {grid: clips / seconds for grid, (clips, seconds) in sorted(self.totals.items()) if seconds > 0}


def run(
    args: argparse.Namespace,
    data_dir: Path,
    multigrid: bool,
    train_dataset: TrainVideoDataset | None,
    backbone: str,
    manifests: tuple[Path, Path] | None = None,
    frame_decode: str = "workers",
    decode_ahead: int = 1,
) -> dict[str, Any]:
    pl.seed_everything(0, verbose=False)
    train_manifest, val_manifest = manifests or (data_dir / "train.csv", data_dir / "val.csv")
    datamodule = MultigridVideoDataModule(
        train_manifest=str(train_manifest),
        val_manifest=str(val_manifest),
        reader_settings=ReaderSettings(frame_decode=frame_decode),  # type: ignore[arg-type]
        decode_ahead=decode_ahead,
        batch_size=args.batch_size,
        num_frames=args.num_frames,
        crop_size=args.crop_size,
        sampling_rate=args.sampling_rate,
        flip=False,
        num_workers=args.workers,
        pin_memory=torch.cuda.is_available(),
        eval_views=EvalViews(num_views=args.num_views),
        seed=0,
    )
    if train_dataset is not None:
        datamodule.use_datasets(train=train_dataset)
    model = VideoClassifier(
        num_classes=datamodule.num_classes,
        backbone=backbone,
        tiny_width=args.width,
        lr=args.lr,
        nesterov=False,
        milestones=args.milestones,
        warmup_epochs=args.warmup_epochs,
        dropout_rate=0.0,
    )
    throughput = GridThroughput()
    callbacks: list[pl.Callback] = [throughput]
    multigrid_callback = MultigridCallback(precise_bn_batches=20) if multigrid else None
    if multigrid_callback is not None:
        callbacks.append(multigrid_callback)
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        accelerator=args.accelerator,
        devices=1,
        precision=args.precision,
        limit_val_batches=0,  # validate once, after training
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    start, cpu_start = time.perf_counter(), cpu_seconds()
    trainer.fit(model, datamodule=datamodule)
    train_seconds = time.perf_counter() - start
    multiprocessing.active_children()  # reap the workers fit's teardown stopped, so their CPU time counts
    train_cpu_seconds = cpu_seconds() - cpu_start
    trainer.limit_val_batches = 1.0
    metrics = trainer.validate(model, datamodule=datamodule, verbose=False)[0]
    return {
        "iterations": trainer.global_step,
        "epochs": trainer.current_epoch,
        "seconds": train_seconds,
        "cpu_seconds": train_cpu_seconds,
        "top1": metrics["val/top1"],
        "grid_rates": throughput.rates(),
        "data_wait_share": throughput.wait_seconds / train_seconds,
        "data_wait_grids": data_wait_grids(multigrid_callback),
    }


def data_wait_grids(callback: MultigridCallback | None) -> dict[str, dict[str, float]]:
    """The multigrid callback's data-wait meter per grid (``"batch x frames x crop"``): iterations timed,
    seconds waited and spent, and the share waited; empty for a baseline run (no callback)."""
    meter = getattr(callback, "_meter", None)  # the meter the callback's end-of-fit summary reads
    if meter is None:
        return {}
    return {
        format_grid(grid): {"iterations": wait.iterations, "wait_s": wait.wait_s, "total_s": wait.total_s, "share": wait.share}
        for grid, wait in meter.grids.items()
    }


def device_name(args: argparse.Namespace) -> str:
    if torch.cuda.is_available() and args.accelerator != "cpu":
        return f"{torch.cuda.get_device_name()}, {args.workers} workers"
    cpu = platform.processor() or platform.machine()
    return f"CPU ({cpu}, {torch.get_num_threads()} threads, {args.workers} workers)"


SOURCES = ("mp4", "frames", "frames-gpu", "store", "store-gpu", "memory")


def check_sources(args: argparse.Namespace, on_gpu: bool) -> list[str]:
    """The ``--source`` list (``auto`` resolved for the machine); exits on a name it does not know."""
    if args.source == "auto":
        sources = ["mp4", "frames", "frames-gpu"] if on_gpu else ["mp4", "memory"]
    else:
        sources = args.source.split(",")
    unknown = [s for s in sources if s not in SOURCES]
    if unknown:
        raise SystemExit(f"--source: unknown {unknown}; choose from {', '.join(SOURCES)}")
    for gpu_source in ("frames-gpu", "store-gpu"):
        if gpu_source in sources and not on_gpu:
            raise SystemExit(f"--source {gpu_source} needs CUDA and --accelerator gpu (or auto)")
    return sources


def prepare_data(
    args: argparse.Namespace, data_dir: Path, sources: list[str]
) -> tuple[str, tuple[Path, ...] | None, tuple[Path, ...] | None]:
    """Write the synthetic videos unless ``data_dir`` has them; extract frames and pack stores when a source reads them.

    Returns:
        The data's description for the report, the frame datasets' train and val manifests, and the
        train and val stores (each ``None`` when no source reads them).
    """
    width, height = (340, 256) if args.kinetics_like else map(int, args.video_size.split("x"))
    video_frames, fps = (300, 30.0) if args.kinetics_like else (args.video_frames, args.fps)
    data = f"the videos of {data_dir}"
    if not (data_dir / "train.csv").exists():
        data = (
            f"{args.num_train} synthetic training videos ({width}x{height}, {video_frames} frames at {fps:g} fps, "
            f"texture cell {args.texture_cell} px)"
        )
        started = time.perf_counter()
        generate_synthetic_dataset(
            data_dir, num_train=args.num_train, num_val=args.num_val, seed=0, texture_cell=args.texture_cell,
            width=width, height=height, num_frames=video_frames, fps=fps,
        )
        print(f"wrote the videos in {time.perf_counter() - started:.0f} s", flush=True)
    frame_manifests = None
    if any(s.startswith("frames") for s in sources):
        started = time.perf_counter()
        frame_manifests = tuple(
            extract_frames(load_manifest(data_dir / f"{split}.csv"), data_dir / "frames", progress=False).manifest
            for split in ("train", "val")
        )
        print(f"extracted frames in {time.perf_counter() - started:.0f} s (not timed below)", flush=True)
    stores = None
    if any(s.startswith("store") for s in sources):
        started = time.perf_counter()
        # Level 0 from the DataModule's own jitter rule for this crop (pack_frames -> store_levels).
        stores = tuple(
            pack_frames(load_manifest(data_dir / f"{split}.csv"), data_dir / f"{split}-crop{args.crop_size}.store",
                        crop_size=args.crop_size, progress=False).store
            for split in ("train", "val")
        )
        print(f"packed the stores in {time.perf_counter() - started:.0f} s (not timed below)", flush=True)
    return data, frame_manifests, stores


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its children that have ended (the workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def print_results(args: argparse.Namespace, results: dict[tuple[str, str], dict[str, dict[str, Any]]], data: str) -> None:
    print(f"\nbaseline vs multigrid, base {args.batch_size} x {args.num_frames} x {args.crop_size}, "
          f"LR {args.lr:g}, {args.precision}, {data}, on {device_name(args)}")
    print(f"{'model':<14} {'source':<10} {'run':<10} {'epochs':>6} {'iterations':>10} {'train s':>8} {'CPU s':>8} "
          f"{'top-1':>6} {'data wait':>9}")
    for (backbone, source), pair in results.items():
        model = f"{backbone} w{args.width}" if backbone in ("tiny", "tiny_swin3d") else backbone
        for name, result in pair.items():
            print(f"{model:<14} {source:<10} {name:<10} {result['epochs']:>6} {result['iterations']:>10} "
                  f"{result['seconds']:>8.1f} {result['cpu_seconds']:>8.1f} {result['top1']:>6.3f} "
                  f"{result['data_wait_share']:>9.0%}")
    for (backbone, source), pair in results.items():
        baseline, multigrid = pair["baseline"], pair["multigrid"]
        speedup, saving = baseline["seconds"] / multigrid["seconds"], baseline["iterations"] / multigrid["iterations"]
        cpu = baseline["cpu_seconds"] / multigrid["cpu_seconds"]
        print(
            f"{backbone} {source}: speed-up {speedup:.2f}x wall-clock ({cpu:.2f}x CPU), {saving:.2f}x fewer "
            f"iterations: {speedup / saving:.2f} of the iteration saving; top-1 {multigrid['top1'] - baseline['top1']:+.3f}"
        )
    speedups = {key: pair["baseline"]["seconds"] / pair["multigrid"]["seconds"] for key, pair in results.items()}
    for (backbone, source), speedup in speedups.items():
        memory = speedups.get((backbone, "memory"))
        if memory and source != "memory":
            print(f"{backbone} {source}: speed-up {speedup / memory:.2f} of the memory source's (loader out of the loop)")
    print("\nclips/s reached per grid (frames x crop) in the multigrid runs:")
    for (backbone, source), pair in results.items():
        rates = ", ".join(f"{t}x{c}: {r:.0f}" for (t, c), r in pair["multigrid"]["grid_rates"].items())
        print(f"{backbone} {source}: {rates}")


def main() -> None:
    args = parse_args()
    on_gpu = torch.cuda.is_available() and args.accelerator != "cpu"
    sources = check_sources(args, on_gpu)
    backbones = args.backbone.split(",")
    results: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        data_dir = args.data or Path(scratch) / "synthetic"
        data, frame_manifests, stores = prepare_data(args, data_dir, sources)
        for backbone, source in itertools.product(backbones, sources):
            dataset = None
            if source == "memory":
                manifest = load_manifest(data_dir / "train.csv", root=data_dir)
                dataset = TrainVideoDataset(manifest, InMemoryReader(manifest.entries), flip=False)
            manifests = frame_manifests if source.startswith("frames") else stores if source.startswith("store") else None
            decode = "device" if source.endswith("-gpu") else "workers"
            results[backbone, source] = {
                name: run(args, data_dir, multigrid, dataset, backbone, manifests, decode)  # type: ignore[arg-type]
                for name, multigrid in (("baseline", False), ("multigrid", True))
            }
            for name, result in results[backbone, source].items():
                print(f"{backbone} {source} {name}: {result['seconds']:.1f} s, top-1 {result['top1']:.3f}", flush=True)

    print_results(args, results, data)


if __name__ == "__main__":
    main()
