"""Do the two decode paths train alike? Multigrid from the synthetic store, workers decode against device decode.

Issue 39, item 6: on an H200 the device-decode multigrid run ended at top-1 0.771 where the workers
run reached 0.979 from the same seed. Here, on CPU, the same tiny model (`VideoClassifier`, the tiny
3D CNN) trains with `MultigridCallback` from the built-in synthetic dataset packed as a frame store
(`SyntheticData(format="store")`), for each seed three times: the workers decode the JPEG frames
(``frame_decode="workers"``), the training device decodes them (``frame_decode="device"``, here
the CPU: libjpeg and the batched crop-resize) between steps (``decode_ahead=0``) and in the
decode-ahead thread (``decode_ahead=1``). Every run starts from the same seed (model, clips); the runs
of one seed differ only in who decodes. The settings are the README demo's (`configs/demo.yaml`: 240
videos with a 12-px texture, base 8 x 8 x 64, 40 baseline epochs, multigrid 60); validation once after
training (at the base shape, precise BN), as `benchmarks/train.py` does.

    python benchmarks/decode_paths.py                     # 3 seeds x 3 paths; about 10 minutes on 2 idle CPU cores
    # half the videos and epochs (about 3 minutes on 2 idle CPU cores; 2026-11-28: top-1 per seed
    # 0.725 / 0.325 / 0.850 workers, 0.725 / 0.375 / 0.850 device and device ahead, on a shared machine)
    python benchmarks/decode_paths.py --num-train 120 --num-val 40 --epochs 20 --milestones 15 18 --warmup-epochs 3

Prints each run's top-1, iterations and seconds, then per path the mean top-1 over the seeds and its
spread, and the largest difference between a device path and the workers path of the same seed.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from lightning_multigrid._lightning import pl
from lightning_multigrid.callback import MultigridCallback
from lightning_multigrid.data.datamodule import MultigridVideoDataModule
from lightning_multigrid.data.reader_settings import ReaderSettings
from lightning_multigrid.data.synthetic import SyntheticData
from lightning_multigrid.module import VideoClassifier

# (name, frame_decode, decode_ahead)
PATHS = (("workers", "workers", 1), ("device", "device", 0), ("device, ahead", "device", 1))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=40, help="baseline epochs (multigrid trains 1.5x as many)")
    parser.add_argument("--milestones", type=int, nargs="*", default=[30, 36], help="baseline LR milestones")
    parser.add_argument("--lr", type=float, default=0.0125)
    parser.add_argument("--warmup-epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--num-frames", type=int, default=8)
    parser.add_argument("--crop-size", type=int, default=64)
    parser.add_argument("--sampling-rate", type=int, default=2)
    parser.add_argument("--width", type=int, default=8, help="channels of the tiny CNN's stem")
    parser.add_argument("--num-train", type=int, default=240)
    parser.add_argument("--num-val", type=int, default=60)
    parser.add_argument("--texture-cell", type=int, default=12, help="the synthetic checkerboard's cell in pixels")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--data", type=Path, help="synthetic dataset folder (generated and packed there if empty)")
    return parser.parse_args()


def fit(args: argparse.Namespace, data: Path, seed: int, frame_decode: str, decode_ahead: int) -> dict[str, Any]:
    """One multigrid run on CPU; returns its top-1 after training, iterations and training seconds."""
    pl.seed_everything(seed, verbose=False)
    datamodule = MultigridVideoDataModule(
        synthetic=SyntheticData(str(data), size=(args.num_train, args.num_val), texture_cell=args.texture_cell, format="store"),
        reader_settings=ReaderSettings(frame_decode=frame_decode),  # type: ignore[arg-type]
        decode_ahead=decode_ahead,
        batch_size=args.batch_size, num_frames=args.num_frames, crop_size=args.crop_size,
        sampling_rate=args.sampling_rate, num_workers=args.workers, seed=seed,  # no flips: labels hold left/right motion
    )
    model = VideoClassifier(
        num_classes=4, backbone="tiny", tiny_width=args.width, lr=args.lr, nesterov=False,
        weight_decay=1e-4, milestones=args.milestones, warmup_epochs=args.warmup_epochs, dropout_rate=0.0,
    )
    trainer = pl.Trainer(
        max_epochs=args.epochs, accelerator="cpu", devices=1, limit_val_batches=0, num_sanity_val_steps=0,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[MultigridCallback(precise_bn_batches=10)],
    )
    started = time.perf_counter()
    trainer.fit(model, datamodule=datamodule)
    seconds = time.perf_counter() - started
    trainer.limit_val_batches = 1.0
    metrics = trainer.validate(model, datamodule=datamodule, verbose=False)[0]
    return {"top1": float(metrics["val/top1"]), "iterations": trainer.global_step, "seconds": seconds,
            "skipped": datamodule.skipped_videos}


def main() -> None:
    args = parse_args()
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as scratch:
        data = args.data or Path(scratch) / "synthetic"
        results: dict[str, list[float]] = {name: [] for name, _, _ in PATHS}
        for seed in args.seeds:
            for name, frame_decode, decode_ahead in PATHS:
                run = fit(args, data, seed, frame_decode, decode_ahead)
                results[name].append(run["top1"])
                print(f"seed {seed}  {name:>14}: top-1 {run['top1']:.3f}  {run['iterations']} iterations  "
                      f"{run['seconds']:.0f} s  {run['skipped']} skipped", flush=True)
    print()
    for name, top1 in results.items():
        spread = statistics.pstdev(top1) if len(top1) > 1 else 0.0
        print(f"{name:>14}: mean top-1 {statistics.fmean(top1):.3f} (sd {spread:.3f} over {len(top1)} seeds): "
              + " ".join(f"{t:.3f}" for t in top1))
    for name in ("device", "device, ahead"):
        gap = max(abs(a - b) for a, b in zip(results[name], results["workers"]))
        print(f"largest |{name} - workers| of one seed: {gap:.3f}")


if __name__ == "__main__":
    main()
