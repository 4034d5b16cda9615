"""End-to-end: baseline vs multigrid training, side by side in one run.

Both runs train the same 3D CNN (`VideoClassifier`, `--backbone`, default the tiny one) from the
same seed on the built-in synthetic videos through `MultigridVideoDataModule`, with the same
optimizer and step LR schedule. The baseline runs `--epochs` epochs at the base shape; multigrid adds
`MultigridCallback` (long + short cycle, 1.5x epochs). Validation runs once after training
(multi-view, base shape, precise BN for multigrid), so the times compare training only.

Two sources of frames, each timed for both runs:

- ``mp4``: workers decode every clip from the H.264 files (the real pipeline). Multigrid decodes
  1.5x the clips of the baseline (1.5x epochs), so on a machine whose cores must both decode and
  train (2 CPU cores) decoding caps the speed-up.
- ``memory``: every video is decoded once, before the clock starts; workers draw the same clips
  (the same `sample_clip_params`) and resize and crop them from RAM. This is the regime of a GPU
  box whose loader keeps up: decoding is out of the timed loop.

    python benchmarks/train.py                        # both sources; about 8 minutes on 2 CPU cores
    python benchmarks/train.py --source memory        # the loader-keeps-up figure only
    python benchmarks/train.py --epochs 8 --milestones 6 --num-train 80   # a quick look

Prints the iterations, wall-clock time and top-1 of each run and the speed-ups.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn.functional as F

from lightning_multigrid.callback import MultigridCallback
from lightning_multigrid.data.datamodule import MultigridVideoDataModule
from lightning_multigrid.data.dataset import TrainVideoDataset
from lightning_multigrid.data.decode import VideoReader
from lightning_multigrid.data.sampling import ClipParams
from lightning_multigrid.data.synthetic import generate_synthetic_dataset
from lightning_multigrid.module import VideoClassifier


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", choices=("mp4", "memory", "both"), default="both", help="where clips come from")
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
    parser.add_argument("--backbone", default="tiny", help="a `VideoClassifier` backbone name")
    parser.add_argument("--width", type=int, default=8, help="channels of the tiny CNN's stem")
    parser.add_argument("--num-train", type=int, default=240)
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


class FramesInMemory(TrainVideoDataset):
    """Training clips cut from videos decoded once into RAM (shared with forked workers).

    The clip parameters come from the same draw as for decoding (`sample_clip_params`). The crop
    box is mapped back onto the source frame and only that region is resized (antialiased
    bilinear), which matches resize-then-crop up to sub-pixel rounding at a fraction of the cost.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.frames: dict[str, torch.Tensor] = {}  # path -> uint8 (T, 3, H, W)
        for entry in self.manifest.entries:
            with VideoReader(entry.path) as reader:
                self.metadata.put(entry.path, reader.metadata)
            with av.open(entry.path) as container:
                rgb = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
            self.frames[entry.path] = torch.from_numpy(np.stack(rgb)).permute(0, 3, 1, 2).contiguous()

    def _load(self, video_index: int, draw: Any) -> torch.Tensor:
        path = self.manifest.entries[video_index].path
        metadata = self.metadata.get(path)
        params: ClipParams = draw(metadata)
        source = self.frames[path]
        height, width = source.shape[-2:]
        scale_y, scale_x = height / params.resize_height, width / params.resize_width
        crop = params.crop_size
        top, left = round(params.crop_y * scale_y), round(params.crop_x * scale_x)
        bottom, right = round((params.crop_y + crop) * scale_y), round((params.crop_x + crop) * scale_x)
        region = source[list(params.frame_indices), :, top:bottom, left:right]
        clip = F.interpolate(region, size=(crop, crop), mode="bilinear", antialias=True)
        if params.flip:
            clip = clip.flip(-1)
        return clip.permute(1, 0, 2, 3).contiguous()  # (C, T, H, W)


def run(
    args: argparse.Namespace, data_dir: Path, multigrid: bool, train_dataset: TrainVideoDataset | None
) -> dict[str, float]:
    pl.seed_everything(0, verbose=False)
    datamodule = MultigridVideoDataModule(
        train_manifest=str(data_dir / "train.csv"),
        val_manifest=str(data_dir / "val.csv"),
        root_dir=str(data_dir),
        batch_size=args.batch_size,
        num_frames=args.num_frames,
        crop_size=args.crop_size,
        sampling_rate=args.sampling_rate,
        flip=False,
        num_workers=args.workers,
        pin_memory=torch.cuda.is_available(),
        num_views=args.num_views,
        seed=0,
    )
    if train_dataset is not None:
        datamodule._train_dataset = train_dataset  # setup() keeps a dataset it already has
    model = VideoClassifier(
        num_classes=datamodule.num_classes,
        backbone=args.backbone,
        tiny_width=args.width,
        lr=args.lr,
        nesterov=False,
        milestones=args.milestones,
        warmup_epochs=args.warmup_epochs,
        dropout_rate=0.0,
    )
    callbacks = [MultigridCallback(precise_bn_batches=20)] if multigrid else []
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
    start = time.perf_counter()
    trainer.fit(model, datamodule=datamodule)
    train_seconds = time.perf_counter() - start
    trainer.limit_val_batches = 1.0
    metrics = trainer.validate(model, datamodule=datamodule, verbose=False)[0]
    return {
        "iterations": trainer.global_step,
        "epochs": trainer.current_epoch,
        "seconds": train_seconds,
        "top1": metrics["val/top1"],
    }


def device_name(args: argparse.Namespace) -> str:
    if torch.cuda.is_available() and args.accelerator != "cpu":
        return f"{torch.cuda.get_device_name()}, {args.workers} workers"
    cpu = platform.processor() or platform.machine()
    return f"CPU ({cpu}, {torch.get_num_threads()} threads, {args.workers} workers)"


def main() -> None:
    args = parse_args()
    sources = ("mp4", "memory") if args.source == "both" else (args.source,)
    results: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        data_dir = args.data or Path(scratch) / "synthetic"
        data = f"the videos of {data_dir}"
        if not (data_dir / "train.csv").exists():
            data = f"{args.num_train} synthetic training videos (texture cell {args.texture_cell} px)"
            generate_synthetic_dataset(
                data_dir, num_train=args.num_train, num_val=args.num_val, seed=0, texture_cell=args.texture_cell
            )
        for source in sources:
            dataset = None
            if source == "memory":
                dataset = FramesInMemory(str(data_dir / "train.csv"), root=str(data_dir), flip=False)
            results[source] = {
                "baseline": run(args, data_dir, multigrid=False, train_dataset=dataset),
                "multigrid": run(args, data_dir, multigrid=True, train_dataset=dataset),
            }

    model = f"tiny 3D CNN (width {args.width})" if args.backbone == "tiny" else args.backbone
    print(f"\nbaseline vs multigrid, {model}, base {args.batch_size} x {args.num_frames} x {args.crop_size}, "
          f"LR {args.lr:g}, {data}, on {device_name(args)}")
    print(f"{'source':<7} {'run':<10} {'epochs':>6} {'iterations':>10} {'train s':>8} {'top-1':>6}")
    for source, pair in results.items():
        for name, result in pair.items():
            print(f"{source:<7} {name:<10} {result['epochs']:>6} {result['iterations']:>10} "
                  f"{result['seconds']:>8.1f} {result['top1']:>6.3f}")
    for source, pair in results.items():
        baseline, multigrid = pair["baseline"], pair["multigrid"]
        print(
            f"{source}: speed-up {baseline['seconds'] / multigrid['seconds']:.2f}x wall-clock, "
            f"{baseline['iterations'] / multigrid['iterations']:.2f}x fewer iterations; "
            f"top-1 {multigrid['top1'] - baseline['top1']:+.3f}"
        )


if __name__ == "__main__":
    main()
