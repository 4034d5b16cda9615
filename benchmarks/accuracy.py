"""Accuracy benchmark: does multigrid keep the baseline's top-1 at small scale?

Two synthetic tasks (``lightning_multigrid.data.synthetic``: 8 classes = 4 motion directions x 2
textures), rendered at 64 x 48 pixels, frames held in RAM so the loader is out of the timed loop:

- ``coarse``: texture cell 8 px, visible on every multigrid grid (the coarsest keeps a 6 px
  pattern);
- ``fine``: texture cell 2 px, a 4 px period that only the full grid resolves (the short cycle's
  half crop brings it under 2 px, past the sampling limit): the textures differ by fine detail.

Each task is trained at two lengths (``short``: ``--epochs`` baseline epochs, a few thousand
iterations; ``long``: ``--long-factor`` times that) by the baseline and by multigrid variants, all
with the same tiny model (``--backbone``: the 3D CNN ``tiny``, default, or the Video Swin Transformer
``tiny_swin3d``), optimizer, warm-up and step LR schedule, from the same seeds:

- ``baseline``: the base shape every iteration;
- ``defaults``: ``MultigridCallback()`` (long + short cycle, 1.5x epochs);
- ``long-only`` / ``short-only``: one of the two cycles;
- ``fewer-shapes``: the long cycle over two shapes, ``(0.5 T, S/sqrt 2)`` and ``(T, S)`` (the
  paper's S' ablation, fewer and larger steps);
- ``epochs-x2``: ``epoch_factor=2``;
- ``full-grid-25``: ``full_grid_share=0.25``: a quarter of the baseline's iterations at the full
  grid, in a fine-tuning phase without short cycle;
- ``bn-scaled``: ``scale_bn_base_size=True``: BatchNorm statistics cover as many values on every
  grid as at the base shape (on one device: over the whole batch);
- ``bn-scaled+fg25``: both;
- ``frames-only`` (``+bn``: with ``scale_bn_base_size``): a long cycle that coarsens frames only,
  ``(T/4, S)``, ``(T/2, S)``, ``(T, S)``, no short cycle: every grid keeps the full spatial detail;
- ``short-run``: ``MultigridCallback(short_run=True)``: the coarse grids at the base batch (LR
  factor 1) for half the epochs (1, 2 and 5 of 16 on ``(T/4, S/sqrt2)``, ``(T/2, S/sqrt2)``,
  ``(T/2, S)``), then the full grid; the baseline's steps and LR schedule.

The long schedule runs the baseline, the defaults, ``bn-scaled`` and ``frames-only+bn``.

The optimizer is SGD with momentum 0.9 at ``--lr`` 0.05 per 8 clips and weight decay 1e-4 (the
CNN's recipe); ``--optimizer adamw`` trains with AdamW instead (betas 0.9, 0.999; weight decay
0.05 unless ``--weight-decay`` is given; pass its ``--lr``, e.g. 1e-3), the usual recipe for
transformers. Either way norms, biases and position tables get no weight decay, and warm-up, step
decay and multigrid's LR scaling are the same.

**Fine-tuning scenario** (``--scenario finetune``), how most users train on a small dataset: the
baseline pretrains once on the ``coarse`` task (``--pretrain-task``, ``--epochs`` epochs, seed
``--pretrain-seed``) and its backbone is saved to ``--out/pretrained.pt``; every variant then
fine-tunes from those same weights on the ``fine`` task (``--finetune-task``) through
``VideoClassifier(weights=...)`` (a new classifier), at the short schedule, ``--seeds`` seeds,
with the same optimizer and LR schedule as from scratch. The fine task is calibrated so that the
baseline learns the fine detail at the base crop: the 2-px texture cell is a 4-px
period; for the 32-px crop the frames' 48-px short side is resized to 37-46 px, leaving a
3.1-3.8 px period, above the 2-px sampling limit; for a 16-px base crop (``--crop-size 16``) it is
resized to 18-23 px, leaving 1.5-1.9 px, below it. The check: the fine-tuned baseline must reach
well above 0.5 (4 directions x 2 textures: a model that sees the motion but not the texture gets
at most 0.5). Run at ``--crop-size 16`` too, it shows how much of the texture cue needs the full
crop (measured: 0.996 at 32 px, 0.856 at 16 px: stripes and checkerboard alias to different
patterns below the sampling limit, so the cue is weakened there, not erased).

**A second fine-tuning task** (``--finetune-pair texture``; the one above is ``detail``, the
default): the backbone pretrains on the motion direction only (the ``coarse`` task's videos, drawn
from another seed, labelled by direction: 4 classes) and fine-tunes on direction x texture (the
``coarse`` task, 8 classes): the classes now differ by a cue the pretraining never saw but that
every grid shows (an 8-px texture), not by detail only the full grid resolves.

**The map** (``--map``): top-1 against CPU saving for the schedule options we have
(``MAP_VARIANTS``: the paper's four shapes, without the coarsest shape, spatial-only, short cycle
only, ``full_grid_share=0.25``, ``epoch_factor=1``), on both fine-tuning tasks, ``--seeds`` seeds
each, written to ``--out/map.json``: per option and task the mean test top-1, its difference from
the baseline in points, the CPU and iteration savings, and the option that stays within 1 point
of the baseline on both tasks at the largest CPU saving (the pretrained default,
``config.PRETRAINED_LONG_CYCLE_FACTORS``), or none.

Validation (160 videos, base shape, precise BN for multigrid) runs every ``epochs / 8`` epochs
for the curves; its time (and precise BN's) is left out of the wall-clock, which is training
only. After training, every run is evaluated on an independent **test set** (``--num-test``,
800 videos, the same generator with another seed: 0.125 points a video, where 160 validation
videos cannot resolve one point). The table also gives the process's CPU seconds (user + sys of
this process, ``time.process_time``): steadier than wall-clock on a shared machine (the loader runs
in the main process, one torch thread); runs are measured one at a time, in one process, and
CPU seconds compare only when that process had the machine to itself. Results go to
``--out/results.json`` after every run (so a long run can be reported before it ends), then a
table per task and length (mean and spread of top-1 over seeds) and ``--out/accuracy.png``
(top-1 against wall-clock, like the paper's Figure 3) and ``--out/curves.png`` (validation
curves).

    python benchmarks/accuracy.py                      # every variant, 2 seeds (about 30 min of one free core)
    python benchmarks/accuracy.py --quick              # a smoke run: tiny data, 4 epochs, one seed
    python benchmarks/accuracy.py --scenario finetune --variants baseline defaults short-run --seeds 3
    python benchmarks/accuracy.py --variants baseline defaults short-run --long-variants baseline defaults \
        short-run --seeds 3 --long-seeds 3             # the short-run mode against the baseline and defaults
    python benchmarks/accuracy.py --accelerator gpu    # on a GPU machine
    python benchmarks/accuracy.py --report out/results.json   # tables and figures of saved results
    nice -n 19 python benchmarks/accuracy.py --map --seeds 3 --out out/map   # the pretrained default's map

Defaults kept from before the test set, except that one is added (``--num-test 800``).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lightning_multigrid._lightning import pl
from lightning_multigrid.callback import MultigridCallback
from lightning_multigrid.cli.compare import TrainingClock
from lightning_multigrid.data.datamodule import MultigridVideoDataModule
from lightning_multigrid.data.dataset import EvalVideoDataset, TrainVideoDataset
from lightning_multigrid.data.decoding.readers import InMemoryReader
from lightning_multigrid.data.sources import load_manifest
from lightning_multigrid.data.synthetic import generate_synthetic_dataset
from lightning_multigrid.grid import ClipSampling, GridShape
from lightning_multigrid.module import VideoClassifier
from lightning_multigrid.schedule import grid_counts

TASKS: dict[str, int] = {"coarse": 8, "fine": 2}  # name -> texture cell in pixels


@dataclass(frozen=True)
class FinetunePair:
    """A fine-tuning task: pretrain on ``pretrain`` (labelled ``labels``), fine-tune on ``finetune``."""

    pretrain: str
    labels: str  # "all": the 8 classes; "direction": the 4 motion directions only
    finetune: str


FINETUNE_PAIRS: dict[str, FinetunePair] = {
    # Pretrained on both cues at coarse detail; the classes differ by fine detail only the full grid resolves.
    "detail": FinetunePair("coarse", "all", "fine"),
    # Pretrained on motion only; the classes differ by a texture every grid shows, new to the backbone.
    "texture": FinetunePair("coarse", "direction", "coarse"),
}
# name -> MultigridCallback arguments (None: the baseline, no callback)
VARIANTS: dict[str, dict[str, Any] | None] = {
    "baseline": None,
    "defaults": {},
    "long-only": {"short_cycle": False},
    "short-only": {"long_cycle": False},
    "fewer-shapes": {"long_cycle_factors": [(0.5, 0.5**0.5), (1.0, 1.0)]},
    "epochs-x2": {"epoch_factor": 2.0},
    "full-grid-25": {"full_grid_share": 0.25},
    "bn-scaled": {"scale_bn_base_size": True},
    "bn-scaled+fg25": {"scale_bn_base_size": True, "full_grid_share": 0.25},
    # Coarse grids that keep the spatial detail: only frames are coarsened (long cycle only).
    "frames-only": {"short_cycle": False, "long_cycle_factors": [(0.25, 1.0), (0.5, 1.0), (1.0, 1.0)]},
    "frames-only+bn": {"short_cycle": False, "long_cycle_factors": [(0.25, 1.0), (0.5, 1.0), (1.0, 1.0)],
                       "scale_bn_base_size": True},
    # The short-run mode: coarse grids at the base batch for at most half the epochs, then the full grid.
    "short-run": {"short_run": True},
}
# The map's options (--map): the schedule options we have, for the pretrained default.
MAP_VARIANTS: dict[str, dict[str, Any] | None] = {
    "baseline": None,
    "defaults": {},  # the paper's four long-cycle shapes
    "no-coarsest": {"long_cycle_factors": [(0.5, 0.5**0.5), (0.5, 1.0), (1.0, 1.0)]},
    "spatial-only": {"long_cycle_factors": [(1.0, 0.5**0.5), (1.0, 1.0)]},
    "short-only": {"long_cycle": False},
    "full-grid-25": {"full_grid_share": 0.25},
    "epochs-x1": {"epoch_factor": 1.0},
}
# Diagnosis (the suspects), run with --variants: precise BN.
DIAGNOSES: dict[str, dict[str, Any]] = {
    "no-precise-bn": {"precise_bn_batches": 0},
}


# Schedule lengths: from scratch (short, long), and the fine-tuning scenario's two parts.
LENGTHS = ("short", "long", "pretrain", "pretrain-direction", "finetune")


@dataclass(frozen=True)
class Setting:
    task: str
    length: str
    epochs: int


# Weight decay when --weight-decay is not given: VideoClassifier's default with SGD (the CNN runs'),
# the usual transformer value with AdamW (Swin, MViT).
SGD_WEIGHT_DECAY = 1e-4
ADAMW_WEIGHT_DECAY = 0.05


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", choices=tuple(TASKS), default=list(TASKS))
    parser.add_argument("--lengths", nargs="+", choices=("short", "long"), default=["short", "long"])
    parser.add_argument(
        "--variants", nargs="+", choices=(*VARIANTS, *MAP_VARIANTS, *DIAGNOSES),
        help="runs of the short schedule (default: all but the diagnoses; with --map, MAP_VARIANTS)",
    )
    parser.add_argument(
        "--long-variants", nargs="+", choices=(*VARIANTS, *DIAGNOSES),
        default=["baseline", "defaults", "bn-scaled", "frames-only+bn"], help="runs of the long schedule",
    )
    parser.add_argument(
        "--scenario", choices=("scratch", "finetune"), default="scratch",
        help="scratch: every run from random weights; finetune: pretrain once, fine-tune from those weights",
    )
    parser.add_argument(
        "--finetune-pair", choices=tuple(FINETUNE_PAIRS), default="detail",
        help="finetune: detail (pretrain coarse, fine-tune fine) or texture (pretrain on direction, fine-tune coarse)",
    )
    parser.add_argument("--map", action="store_true", help="the map: MAP_VARIANTS on both fine-tuning pairs")
    parser.add_argument("--pretrain-seed", type=int, default=100, help="finetune: seed of the pretraining run")
    parser.add_argument("--first-seed", type=int, default=0, help="seeds are first-seed, first-seed + 1, ...")
    parser.add_argument("--seeds", type=int, default=2, help="seeds per run (short schedule)")
    parser.add_argument("--long-seeds", type=int, default=1, help="seeds per run (long schedule)")
    parser.add_argument("--epochs", type=int, default=16, help="baseline epochs of the short schedule")
    parser.add_argument("--long-factor", type=int, default=4, help="long schedule = this x the short one")
    parser.add_argument("--num-train", type=int, default=960)
    parser.add_argument("--num-val", type=int, default=160)
    parser.add_argument("--num-test", type=int, default=800, help="independent test videos per task (another seed)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--num-frames", type=int, default=8)
    parser.add_argument("--crop-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05, help="base LR for --batch-size clips")
    parser.add_argument(
        "--optimizer", choices=("sgd", "adamw"), default="sgd",
        help="sgd: momentum 0.9 (the default recipe); adamw: AdamW, betas (0.9, 0.999); pass its --lr (e.g. 1e-3)",
    )
    parser.add_argument(
        "--weight-decay", type=float,
        help=f"weight decay on weights (not norms, biases, position tables); default: {SGD_WEIGHT_DECAY} with sgd, "
        f"{ADAMW_WEIGHT_DECAY} with adamw",
    )
    parser.add_argument(
        "--backbone", choices=("tiny", "tiny_swin3d"), default="tiny",
        help="tiny: the 3D CNN; tiny_swin3d: the Video Swin Transformer (LayerNorm: no BatchNorm to group)",
    )
    parser.add_argument("--width", type=int, default=8, help="channels of the tiny CNN's stem (tiny_swin3d: its embedding)")
    parser.add_argument("--precise-bn-batches", type=int, default=10)
    parser.add_argument("--accelerator", default="cpu", help="cpu or gpu")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers (0: in the main process)")
    parser.add_argument(
        "--threads", type=int, default=1,
        help="torch CPU threads (1: on a shared 2-core machine, 2 threads ran 10x slower per step)",
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/accuracy"))
    parser.add_argument("--data", type=Path, help="keep the generated videos here (default: a temporary folder)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 32 videos, 4 epochs, one seed")
    parser.add_argument(
        "--report", type=Path, nargs="+", metavar="RESULTS",
        help="only print and plot saved results (several files are merged; figures go to --out)",
    )
    parser.add_argument("--markdown", action="store_true", help="with --report: also print Markdown tables")
    args = parser.parse_args()
    if args.weight_decay is None:
        args.weight_decay = ADAMW_WEIGHT_DECAY if args.optimizer == "adamw" else SGD_WEIGHT_DECAY
    if args.variants is None:
        args.variants = list(MAP_VARIANTS if args.map else VARIANTS)
    if args.quick:
        args.num_train, args.num_val, args.num_test, args.epochs, args.long_factor = 32, 16, 16, 4, 2
        args.seeds = args.long_seeds = 1
        args.precise_bn_batches = 2
    return args


def schedule_settings(epochs: int) -> tuple[int, list[int]]:
    """Warm-up epochs and step milestones of a baseline of ``epochs`` epochs (as the demo: 5, [30, 36] of 40)."""
    warmup = max(1, round(epochs / 8))
    return warmup, sorted({m for m in (round(0.75 * epochs), round(0.9 * epochs)) if warmup < m < epochs})


def run_one(
    args: argparse.Namespace,
    setting: Setting,
    variant: str,
    seed: int,
    data: tuple[TrainVideoDataset, EvalVideoDataset, EvalVideoDataset],
    weights: Path | None = None,
    save_backbone: Path | None = None,
) -> dict[str, Any]:
    """Train one run and validate it; ``weights``: start from this backbone state dict (fine-tuning);
    ``save_backbone``: write the trained backbone's state dict there (pretraining)."""
    pl.seed_everything(seed, verbose=False)
    datamodule = MultigridVideoDataModule(
        train_manifest="unused", val_manifest="unused", batch_size=args.batch_size, num_frames=args.num_frames,
        crop_size=args.crop_size, sampling_rate=2, flip=False, num_workers=args.workers, seed=seed,
    )
    datamodule.use_datasets(train=data[0], val=data[1])  # the frames held in memory
    warmup, milestones = schedule_settings(setting.epochs)
    model = VideoClassifier(
        num_classes=datamodule.num_classes, backbone=args.backbone, tiny_width=args.width, lr=args.lr, nesterov=False,
        optimizer=args.optimizer, weight_decay=args.weight_decay,
        milestones=milestones, warmup_epochs=warmup, dropout_rate=0.0,
        weights=None if weights is None else str(weights),
    )
    options = {**VARIANTS, **MAP_VARIANTS, **DIAGNOSES}[variant]
    clock = TrainingClock()
    callbacks: list[pl.Callback] = [clock]
    multigrid = None
    if options is not None:
        options = {"precise_bn_batches": args.precise_bn_batches, "preflight": False, **options}
        multigrid = MultigridCallback(**options)
        callbacks.append(multigrid)
    trainer = pl.Trainer(
        max_epochs=setting.epochs, accelerator=args.accelerator, devices=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, check_val_every_n_epoch=max(1, setting.epochs // 8), callbacks=callbacks,
    )
    trainer.fit(model, datamodule=datamodule)
    final = trainer.validate(model, datamodule=datamodule, verbose=False)[0]["val/top1"]
    test_top1 = evaluate_test(trainer, model, args, seed, data[2])
    if save_backbone is not None:
        torch.save(model.backbone.state_dict(), save_backbone)
    clock.curve[-1]["epoch"] = trainer.current_epoch  # the final validation
    full_grid = trainer.global_step
    if multigrid is not None and multigrid.schedule is not None:
        base = multigrid.schedule.base_shape
        counts = grid_counts(multigrid.schedule, len(data[0]))
        full_grid = sum(c.iterations for c in counts if c.grid.num_frames == base.num_frames
                        and c.grid.crop_size == base.crop_size)
    return {
        "task": setting.task, "length": setting.length, "variant": variant, "seed": seed, "backbone": args.backbone,
        "optimizer": args.optimizer, "lr": args.lr, "weight_decay": args.weight_decay,
        "baseline_epochs": setting.epochs, "epochs": trainer.current_epoch, "iterations": trainer.global_step,
        "full_grid_iterations": full_grid, "seconds": clock.train_seconds, "cpu_seconds": clock.train_cpu_seconds,
        "top1": float(final), "test_top1": test_top1, "test_videos": len(data[2]),
        "curve": clock.curve,
    }


def evaluate_test(
    trainer: pl.Trainer, model: VideoClassifier, args: argparse.Namespace, seed: int, test: EvalVideoDataset
) -> float:
    """Top-1 on the independent test set: a validation pass over it, through a DataModule of its own."""
    datamodule = MultigridVideoDataModule(
        batch_size=args.batch_size, num_frames=args.num_frames,
        crop_size=args.crop_size, sampling_rate=2, flip=False, num_workers=args.workers, seed=seed,
    )
    datamodule.use_datasets(val=test)  # no training manifest: the test set's classes are the task's own
    return float(trainer.validate(model, datamodule=datamodule, verbose=False)[0]["val/top1"])


def load_data(
    args: argparse.Namespace, task: str, root: Path, labels: str = "all", seed: int = 0
) -> tuple[TrainVideoDataset, EvalVideoDataset, EvalVideoDataset]:
    """Training, validation and test sets of ``task`` (videos of ``seed``; the test set's of another seed).

    ``labels="direction"`` labels each video by its motion direction only (4 classes).
    """
    directory, test_directory = root / f"{task}-{seed}", root / f"{task}-test"
    if not (directory / "train.csv").exists():
        generate_synthetic_dataset(
            directory, num_train=args.num_train, num_val=args.num_val, num_classes=8, width=64, height=48,
            num_frames=40, seed=seed, texture_cell=TASKS[task],
        )
    if not (test_directory / "val.csv").exists():
        # The same generator, another seed; its one training video is not used.
        generate_synthetic_dataset(
            test_directory, num_train=1, num_val=args.num_test, num_classes=8, width=64, height=48,
            num_frames=40, seed=1000, texture_cell=TASKS[task],
        )
    manifests = [_manifest(directory / "train.csv", labels), _manifest(directory / "val.csv", labels),
                 _manifest(test_directory / "val.csv", labels)]
    # Decoded once into RAM: decoding stays out of the timed loop, as on a GPU box whose loader keeps up.
    train = TrainVideoDataset(manifests[0], InMemoryReader(manifests[0].entries), flip=False)
    base = GridShape(args.batch_size, args.num_frames, args.crop_size)
    val, test = (
        EvalVideoDataset(m, InMemoryReader(m.entries), base_shape=base, clip_sampling=ClipSampling(sampling_rate=2))
        for m in manifests[1:]
    )
    return train, val, test


def _manifest(path: Path, labels: str) -> Any:
    """The manifest at ``path``, or (``labels="direction"``) a copy beside it labelled ``label // 2``.

    The synthetic classes are ``texture + 2 * direction`` (``SYNTHETIC_CLASS_NAMES``).
    """
    if labels == "all":
        return load_manifest(path)
    relabelled = path.with_name(f"{path.stem}-direction.csv")
    lines = [line.rsplit(" ", 1) for line in path.read_text().splitlines() if line.strip()]
    relabelled.write_text("".join(f"{video} {int(label) // 2}\n" for video, label in lines))
    return load_manifest(relabelled)


def summarize(results: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, float]]:
    """Mean and spread over seeds, per (task, length, variant)."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["task"], r["length"], r["variant"]), []).append(r)
    summary = {}
    for key, runs in groups.items():
        top1 = [r["top1"] for r in runs]
        summary[key] = {
            "seeds": len(runs),
            "test_top1": statistics.fmean(r.get("test_top1", math.nan) for r in runs),
            "top1": statistics.fmean(top1),
            "top1_min": min(top1),
            "top1_max": max(top1),
            "iterations": statistics.fmean(r["iterations"] for r in runs),
            "full_grid_iterations": statistics.fmean(r["full_grid_iterations"] for r in runs),
            "seconds": statistics.fmean(r["seconds"] for r in runs),
            "cpu_seconds": statistics.fmean(r.get("cpu_seconds", math.nan) for r in runs),
        }
    return summary


def tables(results: list[dict[str, Any]]) -> Iterator[tuple[str, str, dict[str, dict[str, Any]], dict[str, Any] | None]]:
    """Per task and schedule length with results: the summaries per variant and the baseline's."""
    summary = summarize(results)
    for task in TASKS:
        for length in LENGTHS:
            rows = {v: s for (t, n, v), s in summary.items() if t == task and n == length}
            if rows:
                yield task, length, rows, rows.get("baseline")


def format_report(results: list[dict[str, Any]], machine: str) -> str:
    lines = []
    for task, length, rows, base in tables(results):
        epochs = next(r["baseline_epochs"] for r in results if r["task"] == task and r["length"] == length)
        lines.append(f"\n{task} task (texture cell {TASKS[task]} px), {length} schedule ({epochs} baseline epochs), "
                     f"{machine}")
        lines.append(f"{'run':<15} {'seeds':>5} {'top-1 mean':>10} {'min-max':>11} {'test top-1':>10} {'iterations':>10} "
                     f"{'full grid':>9} {'train s':>8} {'CPU s':>7} {'wall x':>7} {'CPU x':>6} {'vs base':>8}")
        for variant, s in rows.items():
            speed = f"{base['seconds'] / s['seconds']:.2f}x" if base else "-"
            cpu_speed = f"{base['cpu_seconds'] / s['cpu_seconds']:.2f}x" if base else "-"
            delta = f"{100 * (s['top1'] - base['top1']):+.1f}" if base else "-"
            lines.append(
                f"{variant:<15} {s['seeds']:>5} {s['top1']:>10.3f} {s['top1_min']:>5.3f}-{s['top1_max']:<5.3f} "
                f"{s['test_top1']:>10.3f} "
                f"{s['iterations']:>10.0f} {s['full_grid_iterations']:>9.0f} {s['seconds']:>8.1f} {s['cpu_seconds']:>7.1f} "
                f"{speed:>7} {cpu_speed:>6} {delta:>8}"
            )
    return "\n".join(lines)


def format_markdown(results: list[dict[str, Any]]) -> str:
    """The same tables as Markdown, for the README."""
    lines = []
    for task, length, rows, base in tables(results):
        lines += [f"\n{task} task, {length} schedule\n",
                  "| run | seeds | top-1 mean (min-max) | test top-1 | iterations | full-grid iterations | wall s | "
                  "CPU s | speed-up wall / CPU |", "|---|---|---|---|---|---|---|---|---|"]
        for variant, s in rows.items():
            speed = (f"{base['seconds'] / s['seconds']:.2f}x / {base['cpu_seconds'] / s['cpu_seconds']:.2f}x"
                     if base else "-")
            lines.append(
                f"| {variant} | {s['seeds']} | {s['top1']:.3f} ({s['top1_min']:.3f}-{s['top1_max']:.3f}) | "
                f"{s['test_top1']:.3f} | "
                f"{s['iterations']:.0f} | {s['full_grid_iterations']:.0f} | {s['seconds']:.1f} | "
                f"{s['cpu_seconds']:.1f} | {speed} |"
            )
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], out: Path) -> None:
    """accuracy.png: mean top-1 against mean wall-clock per variant; curves.png: validation curves."""
    from matplotlib.figure import Figure

    summary = summarize(results)
    panels = sorted({(t, n) for t, n, _ in summary}, key=lambda p: (list(TASKS).index(p[0]), LENGTHS.index(p[1])))
    # Top row wall-clock (the paper's Figure 3), bottom row CPU seconds: on a shared machine the
    # process's CPU time is the steadier measure of the same work.
    figure = Figure(figsize=(4.2 * len(panels) + 1.6, 7.2))
    grid = figure.subplots(2, len(panels), squeeze=False)
    for row, (key, label) in enumerate((("seconds", "training wall-clock (s)"), ("cpu_seconds", "training CPU time (s)"))):
        for axis, (task, length) in zip(grid[row], panels):
            for (t, n, variant), s in summary.items():
                if (t, n) != (task, length):
                    continue
                marker = "s" if variant == "baseline" else "o"
                axis.errorbar(s[key], s["top1"], yerr=[[s["top1"] - s["top1_min"]], [s["top1_max"] - s["top1"]]],
                              fmt=marker, capsize=3, label=variant, color=_colour(variant))
            axis.set_title(f"{task} task, {length} schedule", fontsize=9)
            axis.set_xlabel(label)
            axis.set_ylabel("val top-1 (mean, min-max over seeds)")
            axis.set_ylim(0, 1.03)  # chance is 0.125: one scale for every panel
            axis.grid(alpha=0.3)
    handles = {h.get_label(): h for axis in grid.flat for h in axis.get_legend_handles_labels()[0]}
    figure.legend(list(handles.values()), list(handles), fontsize=7, loc="outside right center")
    figure.set_layout_engine("constrained")
    figure.savefig(out / "accuracy.png", dpi=100)

    figure = Figure(figsize=(4.2 * len(panels), 3.8))
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    for axis, (task, length) in zip(axes, panels):
        for r in results:
            if (r["task"], r["length"]) != (task, length) or r["seed"] != min(
                x["seed"] for x in results if (x["task"], x["length"]) == (task, length)
            ):
                continue
            axis.plot([p["seconds"] for p in r["curve"]], [p["top1"] for p in r["curve"]], marker=".", label=r["variant"],
                      color=_colour(r["variant"]))
        axis.set_title(f"{task} task, {length} schedule (first seed)", fontsize=9)
        axis.set_xlabel("training wall-clock (s)")
        axis.set_ylabel("val top-1")
        axis.grid(alpha=0.3)
    axes[-1].legend(fontsize=7, loc="lower right")
    figure.tight_layout()
    figure.savefig(out / "curves.png", dpi=110)


def _colour(variant: str) -> Any:
    """One colour per variant, the same in every panel."""
    from matplotlib import colormaps

    names = [*VARIANTS, *(v for v in MAP_VARIANTS if v not in VARIANTS), *DIAGNOSES]
    return colormaps["tab20"](names.index(variant) % 20)


def machine_name(accelerator: str) -> str:
    if accelerator != "cpu" and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)"


def main() -> None:
    args = parse_args()
    if args.report is not None:
        saved = [json.loads(path.read_text()) for path in args.report]
        merged = [r for s in saved for r in s["results"]]
        print(format_report(merged, saved[0]["machine"]))
        if args.markdown:
            print(format_markdown(merged))
        args.out.mkdir(parents=True, exist_ok=True)
        plot(merged, args.out)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    machine = machine_name(args.accelerator)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        root = args.data or Path(scratch)
        if args.map:
            runs = (r for pair in FINETUNE_PAIRS for r in run_finetune(args, root, pair))
        elif args.scenario == "finetune":
            runs = run_finetune(args, root, args.finetune_pair)
        else:
            runs = run_scratch(args, root)
        for result in runs:
            results.append(result)
            print(f"{result['task']} {result['length']} {result['variant']} seed {result['seed']}: top-1 "
                  f"{result['top1']:.3f}, {result['iterations']} iterations, {result['seconds']:.1f} s", flush=True)
            (args.out / "results.json").write_text(
                json.dumps({"machine": machine, "args": vars(args) | {"out": str(args.out)}, "results": results},
                           indent=1, default=str)
            )
    print(format_report(results, machine))
    plot(results, args.out)
    print(f"\nwrote {args.out / 'results.json'}, {args.out / 'accuracy.png'}, {args.out / 'curves.png'}")
    if args.map:
        saving_map = build_map(results, machine)
        (args.out / "map.json").write_text(json.dumps(saving_map, indent=1))
        print(format_map(saving_map))
        print(f"wrote {args.out / 'map.json'}")


def run_scratch(args: argparse.Namespace, root: Path) -> Iterator[dict[str, Any]]:
    """The from-scratch runs: every task, length, seed and variant asked for."""
    for task in args.tasks:
        data = load_data(args, task, root)
        for length in args.lengths:
            long = length == "long"
            setting = Setting(task, length, args.epochs * (args.long_factor if long else 1))
            for seed in range(args.first_seed, args.first_seed + (args.long_seeds if long else args.seeds)):
                for variant in args.long_variants if long else args.variants:
                    yield run_one(args, setting, variant, seed, data)


def run_finetune(args: argparse.Namespace, root: Path, pair_name: str) -> Iterator[dict[str, Any]]:
    """A fine-tuning task (``FINETUNE_PAIRS``): pretrain once, then fine-tune every variant from those weights.

    The baseline pretrains on the pair's ``pretrain`` task with its labels (``--epochs`` epochs, seed
    ``--pretrain-seed``; the direction-only pretraining on videos of another seed than the
    fine-tuning's); its backbone goes to ``--out/pretrained-<pair>.pt``, which every fine-tuning
    run loads through ``VideoClassifier(weights=...)`` (new classifier), and fine-tunes on the
    pair's ``finetune`` task for ``--epochs`` baseline epochs (the short schedule).
    """
    pair = FINETUNE_PAIRS[pair_name]
    weights = args.out / f"pretrained-{pair_name}.pt"
    pretrain_data = load_data(args, pair.pretrain, root, pair.labels, seed=0 if pair.labels == "all" else 1)
    length = "pretrain" if pair.labels == "all" else f"pretrain-{pair.labels}"
    pretrain = run_one(args, Setting(pair.pretrain, length, args.epochs), "baseline",
                       args.pretrain_seed, pretrain_data, save_backbone=weights)
    del pretrain_data  # the frames in RAM
    yield pretrain | {"pair": pair_name}
    data = load_data(args, pair.finetune, root)
    setting = Setting(pair.finetune, "finetune", args.epochs)
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for variant in args.variants:
            yield run_one(args, setting, variant, seed, data, weights=weights) | {"pair": pair_name}


def build_map(results: list[dict[str, Any]], machine: str) -> dict[str, Any]:
    """Per map option and fine-tuning pair: mean test top-1, points from the baseline, CPU and iteration
    savings; and the option within 1 point of the baseline on every pair at the largest CPU saving."""
    finetuned = [r for r in results if r["length"] == "finetune"]
    pairs = sorted({r["pair"] for r in finetuned})
    options: dict[str, dict[str, Any]] = {}
    for variant in dict.fromkeys(r["variant"] for r in finetuned):
        per_pair = {}
        for pair in pairs:
            runs = [r for r in finetuned if r["pair"] == pair and r["variant"] == variant]
            base = [r for r in finetuned if r["pair"] == pair and r["variant"] == "baseline"]
            if not runs or not base:
                continue
            mean = {k: statistics.fmean(r[k] for r in runs) for k in ("test_top1", "cpu_seconds", "iterations")}
            ref = {k: statistics.fmean(r[k] for r in base) for k in ("test_top1", "cpu_seconds", "iterations")}
            per_pair[pair] = {
                "seeds": len(runs), "test_top1": mean["test_top1"],
                "test_top1_min": min(r["test_top1"] for r in runs), "test_top1_max": max(r["test_top1"] for r in runs),
                "points_vs_baseline": 100 * (mean["test_top1"] - ref["test_top1"]),
                "cpu_saving": ref["cpu_seconds"] / mean["cpu_seconds"],
                "iteration_saving": ref["iterations"] / mean["iterations"],
            }
        holds = len(per_pair) == len(pairs) and all(p["points_vs_baseline"] >= -1.0 for p in per_pair.values())
        options[variant] = {
            "options": MAP_VARIANTS.get(variant, VARIANTS.get(variant)), "pairs": per_pair,
            "within_1_point_on_every_pair": holds,
            "min_cpu_saving": min((p["cpu_saving"] for p in per_pair.values()), default=math.nan),
        }
    candidates = [v for v, o in options.items() if v != "baseline" and o["within_1_point_on_every_pair"]]
    chosen = max(candidates, key=lambda v: options[v]["min_cpu_saving"], default=None)
    return {
        "machine": machine, "pairs": pairs, "options": options, "chosen": chosen,
        "note": "CPU savings hold only for runs measured one at a time on an otherwise idle machine; "
                "chosen: within 1 point of the baseline's test top-1 on every pair, largest CPU saving "
                "(null: no option holds on every pair).",
    }


def format_map(saving_map: dict[str, Any]) -> str:
    pairs = saving_map["pairs"]
    header = f"{'option':<14}" + "".join(f" {p + ' top-1':>13} {'pts':>6} {'CPU x':>6} {'iter x':>6}" for p in pairs)
    lines = ["\nmap: test top-1 against saving, per fine-tuning pair (" + saving_map["machine"] + ")", header]
    for variant, option in saving_map["options"].items():
        cells = ""
        for pair in pairs:
            p = option["pairs"].get(pair)
            cells += (f" {p['test_top1']:>13.3f} {p['points_vs_baseline']:>+6.1f} {p['cpu_saving']:>5.2f}x "
                      f"{p['iteration_saving']:>5.2f}x" if p else f" {'-':>13} {'-':>6} {'-':>6} {'-':>6}")
        lines.append(f"{variant:<14}{cells}{'  holds' if option['within_1_point_on_every_pair'] else ''}")
    chosen = saving_map["chosen"]
    lines.append(f"chosen: {chosen}" if chosen else "chosen: none (no option stays within 1 point on every pair)")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
