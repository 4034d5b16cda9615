"""The loss per grid of a run from scratch: does multigrid's warm-up hold?

Trains ``--backbone`` (default r3d_18, from scratch, fp32) on the synthetic videos held in RAM with
the recipe of ``benchmarks/gpu.py``'s r3d_18 rows (LR 0.0125 per 8 clips, SGD without Nesterov,
3 warm-up epochs from 0.1x, steps at ``--milestones``), with multigrid (``--baseline`` for the
baseline), and records at every optimizer step the grid, the LR the step used, the loss and the
share of the batch predicted as its most frequent class. It prints one line per stretch of steps on
one long-cycle grid (mean and last loss, the largest one-class share) and the validation top-1.

The run r3d_18 "never learnt" on the H200 (docs/gpu.md) collapsed at its start: the baseline's
warm-up (90 optimizer steps here) passed in 12 multigrid steps at r = 8, the loss climbed past
ln(classes), one class was predicted for whole batches and it never recovered. With the warm-up
held in optimizer steps (``lightning_multigrid.schedule.lr``) the start does not blow up (docs/accuracy.md).

    nice -n 19 python benchmarks/warmup.py                       # multigrid, about 220 steps
    nice -n 19 python benchmarks/warmup.py --baseline
    nice -n 19 python benchmarks/warmup.py --json out/warmup.json --max-steps 60
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from lightning_multigrid._lightning import pl
from lightning_multigrid.callback import MultigridCallback
from lightning_multigrid.data.datamodule import MultigridVideoDataModule
from lightning_multigrid.data.dataset import EvalVideoDataset, TrainVideoDataset
from lightning_multigrid.data.decoding.readers import InMemoryReader
from lightning_multigrid.data.sources import load_manifest
from lightning_multigrid.data.synthetic import generate_synthetic_dataset
from lightning_multigrid.grid import ClipSampling, GridShape
from lightning_multigrid.module import VideoClassifier


@dataclass(frozen=True)
class Step:
    """One optimizer step: where, on which grid, at which LR, and what the model did."""

    epoch: int
    batch_size: int
    num_frames: int
    crop_size: int
    lr: float
    loss: float
    one_class_share: float  # share of the batch predicted as its most frequent class


class StepRecorder(pl.Callback):
    """Records a :class:`Step` per optimizer step; stops the fit after ``max_steps`` of them (0: never)."""

    def __init__(self, max_steps: int = 0) -> None:
        self.steps: list[Step] = []
        self.max_steps = max_steps
        self._lr = math.nan

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Registered after MultigridCallback's pre-hook: sees the LR the step really uses.
        trainer.optimizers[0].register_step_pre_hook(self._read_lr)

    def _read_lr(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._lr = optimizer.param_groups[0]["lr"]

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        video = batch["video"]
        with torch.no_grad():
            predicted = pl_module(video).argmax(1)  # after the step: what the updated model predicts
        shares = torch.bincount(predicted).max().item() / len(predicted)
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.steps.append(Step(trainer.current_epoch, video.shape[0], video.shape[2], video.shape[3], self._lr,
                               float(loss), shares))
        if self.max_steps and len(self.steps) >= self.max_steps:
            trainer.should_stop = True


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbone", default="r3d_18")
    parser.add_argument("--baseline", action="store_true", help="train the baseline instead of multigrid")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--num-frames", type=int, default=8)
    parser.add_argument("--crop-size", type=int, default=48)
    parser.add_argument("--num-train", type=int, default=240)
    parser.add_argument("--num-val", type=int, default=80)
    parser.add_argument("--num-classes", type=int, default=4)
    parser.add_argument("--video-size", default="80x64", help="synthetic video WxH")
    parser.add_argument("--epochs", type=int, default=24, help="baseline epochs")
    parser.add_argument("--milestones", type=int, nargs="*", default=[18, 21])
    parser.add_argument("--warmup-epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.0125, help="base LR for --batch-size clips")
    parser.add_argument("--max-steps", type=int, default=0, help="stop after this many optimizer steps (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--data", type=Path, help="synthetic dataset folder (generated if empty)")
    parser.add_argument("--json", type=Path, help="also write every step and the summary here")
    return parser.parse_args(argv)


def load_data(args: argparse.Namespace, directory: Path) -> tuple[TrainVideoDataset, EvalVideoDataset]:
    """The synthetic videos (written unless ``directory`` has them), decoded once into RAM."""
    if not (directory / "train.csv").exists():
        width, height = map(int, args.video_size.split("x"))
        generate_synthetic_dataset(
            directory, num_train=args.num_train, num_val=args.num_val, num_classes=args.num_classes, width=width,
            height=height, num_frames=40, seed=0, texture_cell=max(2, round(min(width, height) / 10)),
        )
    train_manifest, val_manifest = load_manifest(directory / "train.csv"), load_manifest(directory / "val.csv")
    train = TrainVideoDataset(train_manifest, InMemoryReader(train_manifest.entries), flip=False)
    val = EvalVideoDataset(
        val_manifest, InMemoryReader(val_manifest.entries), base_shape=GridShape(args.batch_size, args.num_frames, args.crop_size),
        clip_sampling=ClipSampling(sampling_rate=2),
    )
    return train, val


def train(args: argparse.Namespace, data: tuple[TrainVideoDataset, EvalVideoDataset]) -> dict[str, Any]:
    """One run; returns its steps, top-1 and the baseline's warm-up in optimizer steps."""
    pl.seed_everything(args.seed, verbose=False)
    datamodule = MultigridVideoDataModule(
        train_manifest="unused", val_manifest="unused", batch_size=args.batch_size, num_frames=args.num_frames,
        crop_size=args.crop_size, sampling_rate=2, flip=False, num_workers=0, seed=args.seed,
    )
    datamodule.use_datasets(train=data[0], val=data[1])
    model = VideoClassifier(
        num_classes=datamodule.num_classes, backbone=args.backbone, lr=args.lr, nesterov=False,
        milestones=args.milestones, warmup_epochs=args.warmup_epochs, dropout_rate=0.0,
    )
    recorder = StepRecorder(args.max_steps)
    callbacks: list[pl.Callback] = [recorder]
    if not args.baseline:
        callbacks.append(MultigridCallback(precise_bn_batches=10, preflight=False))
    trainer = pl.Trainer(
        max_epochs=args.epochs, accelerator="cpu", devices=1, precision="32-true", logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        limit_val_batches=0, callbacks=callbacks,
    )
    started = time.perf_counter()
    trainer.fit(model, datamodule=datamodule)
    seconds = time.perf_counter() - started
    trainer.limit_val_batches = 1.0
    top1 = float(trainer.validate(model, datamodule=datamodule, verbose=False)[0]["val/top1"])
    steps_per_epoch = math.ceil(len(data[0]) / args.batch_size)
    return {
        "multigrid": not args.baseline, "top1": top1, "seconds": seconds,
        "warmup_steps": args.warmup_epochs * steps_per_epoch, "num_classes": datamodule.num_classes,
        "steps": [asdict(s) for s in recorder.steps],
    }


def stretches(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive steps on one long-cycle grid (frames and the cycle's largest crop), summarised."""
    groups: list[list[dict[str, Any]]] = []
    for step in steps:
        key = step["num_frames"]
        if groups and groups[-1][0]["num_frames"] == key and groups[-1][-1]["epoch"] >= step["epoch"] - 1:
            groups[-1].append(step)
        else:
            groups.append([step])
    first = 0
    summary = []
    for group in groups:
        summary.append({
            "steps": f"{first}-{first + len(group) - 1}",
            "frames": group[0]["num_frames"],
            "crops": sorted({s["crop_size"] for s in group}),
            "lr": (group[0]["lr"], group[-1]["lr"]),
            "mean_loss": sum(s["loss"] for s in group) / len(group),
            "last_loss": group[-1]["loss"],
            "max_one_class_share": max(s["one_class_share"] for s in group),
        })
        first += len(group)
    return summary


def format_report(result: dict[str, Any]) -> str:
    lines = [
        f"{'multigrid' if result['multigrid'] else 'baseline'}: {len(result['steps'])} steps, top-1 "
        f"{result['top1']:.3f}, baseline warm-up {result['warmup_steps']} steps, ln(classes) "
        f"{math.log(result['num_classes']):.2f}",
        f"{'steps':<9} {'frames':>6} {'crops':<12} {'LR first-last':<17} {'mean loss':>9} {'last loss':>9} "
        f"{'max 1-class':>11}",
    ]
    for s in stretches(result["steps"]):
        crops = "/".join(str(c) for c in s["crops"])
        lr = f"{s['lr'][0]:.4f}-{s['lr'][1]:.4f}"
        lines.append(f"{s['steps']:<9} {s['frames']:>6} {crops:<12} {lr:<17} {s['mean_loss']:>9.3f} "
                     f"{s['last_loss']:>9.3f} {s['max_one_class_share']:>11.2f}")
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as scratch:
        result = train(args, load_data(args, args.data or Path(scratch) / "synthetic"))
    print(format_report(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"args": vars(args) | {"data": str(args.data), "json": str(args.json)},
                                         **result}, indent=1))


if __name__ == "__main__":
    main()
