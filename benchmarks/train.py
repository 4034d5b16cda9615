"""End-to-end: baseline vs multigrid training, side by side in one run.

Both runs train the same tiny 3D CNN (`VideoClassifier(backbone="tiny")`) from the same seed on
the built-in synthetic videos through `MultigridVideoDataModule`, with the same optimizer and
step LR schedule. The baseline runs `--epochs` epochs at the base shape; multigrid adds
`MultigridCallback` (long + short cycle, 1.5x epochs). Validation runs once after training
(multi-view, base shape), so the wall-clock times compare training only.

    python benchmarks/train.py                      # about 6 minutes on 2 CPU cores
    python benchmarks/train.py --epochs 8 --milestones 6 --num-train 80   # a quick look

The defaults are the demo's settings (configs/demo.yaml).

Prints the iterations, wall-clock time and top-1 of each run and the speed-up.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path

import pytorch_lightning as pl
import torch

from lightning_multigrid.callback import MultigridCallback
from lightning_multigrid.data.datamodule import MultigridVideoDataModule
from lightning_multigrid.data.synthetic import generate_synthetic_dataset
from lightning_multigrid.module import VideoClassifier


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=40, help="baseline epochs")
    parser.add_argument("--milestones", type=int, nargs="*", default=[30, 36], help="baseline LR milestones")
    parser.add_argument("--lr", type=float, default=0.05, help="base LR (for --batch-size clips)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--num-frames", type=int, default=8)
    parser.add_argument("--crop-size", type=int, default=64)
    parser.add_argument("--sampling-rate", type=int, default=2)
    parser.add_argument("--width", type=int, default=8, help="channels of the tiny CNN's stem")
    parser.add_argument("--num-train", type=int, default=240)
    parser.add_argument("--num-val", type=int, default=60)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers of each run")
    parser.add_argument("--data", type=Path, help="synthetic dataset directory (generated if empty)")
    parser.add_argument("--accelerator", default="auto")
    return parser.parse_args()


def run(args: argparse.Namespace, data_dir: Path, multigrid: bool) -> dict[str, float]:
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
        num_views=1,
        seed=0,
    )
    model = VideoClassifier(
        num_classes=datamodule.num_classes,
        backbone="tiny",
        tiny_width=args.width,
        lr=args.lr,
        nesterov=False,
        milestones=args.milestones,
        warmup_epochs=5,
        dropout_rate=0.0,
    )
    callbacks = [MultigridCallback(precise_bn_batches=20)] if multigrid else []
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        accelerator=args.accelerator,
        devices=1,
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
        "epochs": trainer.current_epoch,
        "iterations": trainer.global_step,
        "seconds": train_seconds,
        "top1": metrics["val/top1"],
    }


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        data_dir = args.data or Path(scratch) / "synthetic"
        if not (data_dir / "train.csv").exists():
            generate_synthetic_dataset(data_dir, num_train=args.num_train, num_val=args.num_val, seed=0)
        baseline = run(args, data_dir, multigrid=False)
        multigrid = run(args, data_dir, multigrid=True)

    device = torch.cuda.get_device_name() if torch.cuda.is_available() and args.accelerator != "cpu" else (
        f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    )
    print(f"\nbaseline vs multigrid, tiny 3D CNN, base {args.batch_size} x {args.num_frames} x {args.crop_size}, "
          f"{args.num_train} training videos, on {device}")
    print(f"{'run':<10} {'epochs':>6} {'iterations':>10} {'train s':>8} {'top-1':>6}")
    for name, result in (("baseline", baseline), ("multigrid", multigrid)):
        print(f"{name:<10} {result['epochs']:>6} {result['iterations']:>10} {result['seconds']:>8.1f} {result['top1']:>6.3f}")
    print(
        f"speed-up {baseline['seconds'] / multigrid['seconds']:.2f}x wall-clock, "
        f"{baseline['iterations'] / multigrid['iterations']:.2f}x fewer iterations; "
        f"top-1 {multigrid['top1'] - baseline['top1']:+.3f}"
    )


if __name__ == "__main__":
    main()
