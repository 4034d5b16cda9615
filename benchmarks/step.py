"""The training step at every grid of a multigrid schedule: time, FLOPs, memory format, compile.

Equation 1 gives every grid about the FLOPs of a base-grid iteration, so multigrid's time saving
equals its iteration saving only where the model turns FLOPs into time alike at every grid. For each
distinct grid of the schedule built from ``--base`` (in order of first use) this measures, on
random clips, one forward + backward + SGD step of ``VideoClassifier`` (``--backbone``, default
the tiny CNN; BatchNorm converted and grouped as the schedule says):

- ``eager ms``: median step time; ``GFLOP``: forward + backward FLOPs (``FlopCounterMode``);
  ``ms/GFLOP rel.``: time per FLOP relative to the base grid (above 1: the grid costs more than
  its FLOPs say);
- ``cl3d ms``: the same step with the model and clips in ``channels_last_3d``;
- ``compile``: ``per_grid`` compiles a static graph per grid (fresh compile each grid: its compile
  time, then its steady step time); ``dynamic`` compiles once with batch, frames and crop marked
  dynamic and runs the grids in turn (the compile time at each grid is 0 where no recompile was
  needed).

Then the callback's own time per step: a real ``Trainer`` fits the tiny model on in-memory clips
with ``MultigridCallback`` on and with ``enabled=False`` (same run), timing its hooks and its LR
hooks around the optimizer step; the share is of a base-grid eager step.

Then batches sized by measured cost (``--batch-sizing``, for each of ``--sizing-backbones``, default
the tiny CNN and the tiny transformer): each grid's cost per clip measured as the callback measures
it when fitting starts (:func:`lightning_multigrid.schedule.cost.measure_clip_costs`), the schedule built from
it, and every grid's eager step timed (the fastest of ``--repeats``) at Equation 1's batch and at the
cost-sized batch, relative to the base iteration (target: every cost-sized iteration within 15% of
the base iteration's).

    python benchmarks/step.py                                   # demo 8x8x64 and fine-tuning 8x8x32, CPU
    python benchmarks/step.py --base 8x16x112 --backbone r3d_18 --compile dynamic
    python benchmarks/step.py --smoke --out /tmp/step           # seconds; what the test suite runs
    python benchmarks/step.py --compile none --callback-steps 0 --repeats 20 --batch-sizing time,flops
                                                                # cost-sized batches only (and the grid table)

Prints one table per base shape (and JSON with ``--out``). Timings are only meaningful on an idle
machine; CUDA is used when available (``--device``).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
from grids import bn_plans, parse_shape
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.flop_counter import FlopCounterMode

from lightning_multigrid._internals import mark_dynamic_dims, raise_recompile_limit
from lightning_multigrid._lightning import pl
from lightning_multigrid._tables import table_lines
from lightning_multigrid.callback import MultigridCallback
from lightning_multigrid.data.sampler import EpochShardSampler, ShortCycleBatchSampler
from lightning_multigrid.grid import ClipSampling, FixedGrid, GridPlan, GridShape
from lightning_multigrid.module import GRID_DIMS, VideoClassifier
from lightning_multigrid.norm import apply_bn_plan, convert_batchnorm
from lightning_multigrid.norm.convert import BNPlan
from lightning_multigrid.schedule import MultigridSchedule, build_schedule
from lightning_multigrid.schedule.config import BatchSizing, MultigridConfig, MultigridOptions
from lightning_multigrid.schedule.cost import measure_clip_costs
from lightning_multigrid.schedule.lr import MultigridLR
from lightning_multigrid.schedule.preview import grid_sizings

NUM_CLASSES = 10
# The step timer: wall clock, or with --clock process this process's CPU time (on a shared CPU,
# with --threads 1, it leaves out the time other processes take).
CLOCK: list[Callable[[], float]] = [time.perf_counter]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--base", type=lambda text: [parse_shape(shape) for shape in text.split(",")], default="8x8x64,8x8x32",
        help="base shapes BxTxS, comma-separated (demo, fine-tuning)",
    )
    parser.add_argument("--epochs", type=int, default=40, help="baseline epochs of the schedule")
    parser.add_argument("--milestones", type=int, nargs="*", default=[30, 36], help="baseline LR milestones")
    parser.add_argument("--no-long-cycle", action="store_true")
    parser.add_argument("--no-short-cycle", action="store_true")
    parser.add_argument("--backbone", default="tiny", help="a `VideoClassifier` backbone name")
    parser.add_argument("--width", type=int, default=8, help="stem width of the tiny CNN (as benchmarks/train.py)")
    parser.add_argument("--repeats", type=int, default=10, help="timed steps per grid and variant")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--compile", default="per_grid,dynamic", help="per_grid, dynamic, both comma-separated, or none")
    parser.add_argument("--compile-backend", default="inductor")
    parser.add_argument("--callback-steps", type=int, default=1000,
                        help="about this many steps of each callback fit (0: skip)")
    parser.add_argument("--batch-sizing", default="time",
                        help="cost-sized batches to check: time, flops, both comma-separated, or none")
    parser.add_argument("--sizing-backbones", default="tiny,tiny_swin3d",
                        help="backbones whose cost-sized batches are checked, comma-separated")
    parser.add_argument("--clock", choices=("wall", "process"), default="wall",
                        help="step timer: wall clock, or this process's CPU time (CPU only; use with --threads 1 "
                        "on a shared machine); the cost-sized batches' timed costs use the same")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, help="directory for step.json and step.txt")
    parser.add_argument("--smoke", action="store_true", help="tiny settings, every section, a few seconds")
    args = parser.parse_args(argv)
    if args.smoke:
        args.base, args.epochs, args.milestones, args.width = [GridShape(2, 4, 16)], 4, [3], 2
        args.repeats, args.warmup, args.callback_steps, args.compile_backend = 1, 0, 12, "eager"
        args.batch_sizing = "flops"  # timed costs of 16-pixel grids at 2 clips are noise: a grid may get 1 clip
    return args


def build(args: argparse.Namespace, base: GridShape, batch_sizing: BatchSizing = "equation1") -> MultigridConfig:
    return MultigridConfig(
        base=base,
        max_epochs=args.epochs,
        milestones=tuple(args.milestones),
        sampling_rate=2,
        devices=1,
        options=MultigridOptions(
            long_cycle=not args.no_long_cycle, short_cycle=not args.no_short_cycle, batch_sizing=batch_sizing
        ),
    )


# ------------------------------------------------------------------------ one step


class Stepper:
    """One training step of a model on one grid's random clips."""

    def __init__(self, model: nn.Module, grid: GridShape, device: torch.device, channels_last: bool = False,
                 dynamic: bool = False) -> None:
        self.model, self.device, self.dynamic = model, device, dynamic
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        shape = (grid.batch_size, 3, grid.num_frames, grid.crop_size, grid.crop_size)
        self.video = torch.randn(shape, device=device)
        if channels_last:
            self.video = self.video.contiguous(memory_format=torch.channels_last_3d)
        self.labels = torch.randint(0, NUM_CLASSES, (grid.batch_size,), device=device)

    def step(self) -> None:
        if self.dynamic:
            mark_dynamic_dims(self.video, GRID_DIMS)
        self.optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(self.model(self.video), self.labels).backward()
        self.optimizer.step()

    def timed(self) -> float:
        _sync(self.device)
        start = CLOCK[0]()
        self.step()
        _sync(self.device)
        return CLOCK[0]() - start

    def fastest_ms(self, repeats: int, warmup: int) -> float:
        """The fastest of ``repeats`` steps: what the callback's timed sizing measures (interference only adds time)."""
        for _ in range(warmup):
            self.step()
        return 1000 * min(self.timed() for _ in range(max(1, repeats)))

    def median_ms(self, repeats: int, warmup: int) -> float:
        for _ in range(warmup):
            self.step()
        return 1000 * statistics.median(self.timed() for _ in range(max(1, repeats)))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_flops(stepper: Stepper) -> int:
    with FlopCounterMode(display=False) as counter:
        stepper.step()
    return int(counter.get_total_flops())


def measure_grids(args: argparse.Namespace, schedule: MultigridSchedule, device: torch.device) -> list[dict[str, Any]]:
    plans = bn_plans(schedule)
    model = VideoClassifier(num_classes=NUM_CLASSES, backbone=args.backbone, tiny_width=args.width).to(device)
    convert_batchnorm(model)
    modes = [m for m in args.compile.split(",") if m and m != "none"]
    dynamic_model = _compiled(model, args, "dynamic") if "dynamic" in modes else None
    rows = []
    for grid in schedule.distinct_grids():
        apply_bn_plan(model, plans[grid])
        eager = Stepper(model, grid, device)
        row: dict[str, Any] = {
            "grid": f"{grid.batch_size} x {grid.num_frames} x {grid.crop_size}", "batch_size": grid.batch_size,
            "num_frames": grid.num_frames, "crop_size": grid.crop_size, "gflop": step_flops(eager) / 1e9,
            "eager_ms": eager.median_ms(args.repeats, args.warmup),
        }
        model.to(memory_format=torch.channels_last_3d)
        row["channels_last_3d_ms"] = Stepper(model, grid, device, channels_last=True).median_ms(args.repeats, args.warmup)
        model.to(memory_format=torch.contiguous_format)
        if "per_grid" in modes:
            row.update(_compile_row("per_grid", _compiled(model, args, "per_grid"), grid, device, args, dynamic=False))
        if dynamic_model is not None:
            apply_bn_plan(dynamic_model, plans[grid])
            row.update(_compile_row("dynamic", dynamic_model, grid, device, args, dynamic=True))
        rows.append(row)
    base = rows[schedule.distinct_grids().index(schedule.config.base)] if schedule.config.base in plans else rows[-1]
    for row in rows:
        row["ms_per_gflop_rel"] = (row["eager_ms"] / row["gflop"]) / (base["eager_ms"] / base["gflop"])
    return rows


def _compiled(model: nn.Module, args: argparse.Namespace, mode: str) -> nn.Module:
    copy_ = copy.deepcopy(model)
    if mode == "per_grid":
        raise_recompile_limit(64)
    copy_.compile(backend=args.compile_backend, dynamic=False if mode == "per_grid" else None)
    return copy_


def _compile_row(mode: str, model: nn.Module, grid: GridShape, device: torch.device, args: argparse.Namespace,
                 dynamic: bool) -> dict[str, float]:
    stepper = Stepper(model, grid, device, dynamic=dynamic)
    first = stepper.timed()  # compiles (or recompiles) here, when it must
    steady = stepper.median_ms(args.repeats, args.warmup)
    return {f"{mode}_compile_s": max(0.0, first - steady / 1000), f"{mode}_ms": steady}


# ------------------------------------------------------------------ the callback's own cost


class _Clips(Dataset[dict[str, Any]]):
    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, request: Any) -> dict[str, Any]:
        video = torch.zeros(3, request.num_frames, request.crop_size, request.crop_size)
        return {"video": video, "label": request.index % NUM_CLASSES}


class _GridData(pl.LightningDataModule):
    """In-memory clips at the plan's grids (``GridDataModule``): the loader costs next to nothing."""

    def __init__(self, base: GridShape, size: int) -> None:
        super().__init__()
        self.base_shape, self.clip_sampling = base, ClipSampling(sampling_rate=2)
        self.plan: GridPlan = FixedGrid(base, self.clip_sampling)
        self.dataset = _Clips(size)

    def serve(self, plan: GridPlan | None) -> None:
        self.plan = plan if plan is not None else FixedGrid(self.base_shape, self.clip_sampling)

    def train_dataloader(self) -> DataLoader[Any]:
        # As docs/data.md's own DataModule: the epoch the loader is built for (Lightning reloads it where
        # the grids change) and the sampler Lightning sets the epoch of.
        sampler = EpochShardSampler(len(self.dataset), shuffle=False)
        batch_sampler = ShortCycleBatchSampler(sampler, self.plan, start_epoch=self.trainer.current_epoch)
        return DataLoader(self.dataset, batch_sampler=batch_sampler)


class _TimedCallback(MultigridCallback):
    """The real callback; the time spent in its per-step hooks is added up."""

    seconds = 0.0

    def on_train_batch_start(self, *args: Any) -> None:
        start = time.perf_counter()
        super().on_train_batch_start(*args)
        _TimedCallback.seconds += time.perf_counter() - start

    def on_train_batch_end(self, *args: Any) -> None:
        start = time.perf_counter()
        super().on_train_batch_end(*args)
        _TimedCallback.seconds += time.perf_counter() - start


def _timed_hook(function: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = function(*args, **kwargs)
        _TimedCallback.seconds += time.perf_counter() - start
        return result

    return wrapper


def callback_cost(args: argparse.Namespace, base: GridShape) -> dict[str, float]:
    """Microseconds per step in the callback's hooks (with its LR hooks), on and off."""
    # The LR hooks run inside optimizer.step(): time them where they are defined.
    MultigridLR._scale = _timed_hook(MultigridLR._scale)  # type: ignore[method-assign]
    MultigridLR._restore = _timed_hook(MultigridLR._restore)  # type: ignore[method-assign]
    result = {}
    for enabled in (True, False):
        _TimedCallback.seconds = 0.0
        trainer = pl.Trainer(
            max_epochs=2, accelerator="cpu", devices=1, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            callbacks=[_TimedCallback(enabled=enabled, precise_bn_batches=0, preflight=False, milestones=[1])],
        )
        model = VideoClassifier(num_classes=NUM_CLASSES, backbone="tiny", tiny_width=2, lr=0.01)
        # About --callback-steps steps over the multigrid run (3 epochs, their batches 1-8x the base
        # batch): the one-time cost of Lightning's first `log` calls is spread as over a real run.
        trainer.fit(model, datamodule=_GridData(base, size=max(64, args.callback_steps) * base.batch_size))
        steps = max(1, trainer.global_step)
        result["on_us" if enabled else "off_us"] = 1e6 * _TimedCallback.seconds / steps
    return result


# ------------------------------------------------------------------ cost-sized batches

SIZING_TARGET = 0.15  # every cost-sized iteration within 15% of the base iteration's time


def sizing_rows(args: argparse.Namespace, base: GridShape, backbone: str, method: BatchSizing,
                device: torch.device) -> dict[str, Any]:
    """Each grid's step time at Equation 1's batch and at the cost-sized batch, relative to the base iteration."""
    model = VideoClassifier(num_classes=NUM_CLASSES, backbone=backbone, tiny_width=args.width).to(device)
    convert_batchnorm(model)
    config = build(args, base, method)
    costs = measure_clip_costs(model, config.cost_grids(), cast(Any, method), device=device,
                               repeats=args.repeats, warmup=args.warmup, clock=CLOCK[0])
    sized_config = dataclasses.replace(config, clip_costs=costs)
    sized_plans = bn_plans(build_schedule(sized_config))
    paper_plans = bn_plans(build_schedule(config.with_equation1_batches()))

    def step_ms(grid: GridShape, plans: dict[GridShape, BNPlan]) -> float:
        apply_bn_plan(model, plans.get(grid, BNPlan()))
        return Stepper(model, grid, device).fastest_ms(args.repeats, args.warmup)

    base_ms = step_ms(base, sized_plans)
    rows = []
    for g in grid_sizings(sized_config):
        paper_ms = step_ms(GridShape(g.equation1_batch, g.num_frames, g.crop_size), paper_plans)
        sized_ms = step_ms(GridShape(g.sized_batch, g.num_frames, g.crop_size), sized_plans)
        rows.append({
            "grid": f"{g.num_frames} x {g.crop_size}", "relative_cost": g.relative_cost,
            "equation1_batch": g.equation1_batch, "equation1_ms": paper_ms, "equation1_rel": paper_ms / base_ms,
            "sized_batch": g.sized_batch, "sized_ms": sized_ms, "sized_rel": sized_ms / base_ms,
        })
    return {
        "backbone": backbone, "method": method, "base_ms": base_ms, "grids": rows,
        "equation1_max_deviation": max(abs(r["equation1_rel"] - 1) for r in rows),
        "sized_max_deviation": max(abs(r["sized_rel"] - 1) for r in rows),
    }


def sizing_table(entry: dict[str, Any]) -> list[str]:
    lines = [["grid (frames x crop)", "cost/clip rel.", "Eq. 1 batch", "Eq. 1 ms", "Eq. 1 rel.",
              "sized batch", "sized ms", "sized rel.", "within 15%"]]
    for r in entry["grids"]:
        lines.append([r["grid"], f"{r['relative_cost']:.3f}", str(r["equation1_batch"]), f"{r['equation1_ms']:.2f}",
                      f"{r['equation1_rel']:.2f}", str(r["sized_batch"]), f"{r['sized_ms']:.2f}", f"{r['sized_rel']:.2f}",
                      "yes" if abs(r["sized_rel"] - 1) <= SIZING_TARGET else "NO"])
    return [
        f"cost-sized batches by {entry['method']}, {entry['backbone']}: step time per iteration relative to the "
        f"base iteration ({entry['base_ms']:.2f} ms)",
        *table_lines(lines),
        f"largest deviation from the base iteration: Equation 1 {entry['equation1_max_deviation']:.0%}, "
        f"cost-sized {entry['sized_max_deviation']:.0%} (target {SIZING_TARGET:.0%})",
    ]


# ------------------------------------------------------------------------ report


def table(rows: list[dict[str, Any]], modes: list[str]) -> list[str]:
    header = ["grid", "GFLOP", "eager ms", "ms/GFLOP rel.", "cl3d ms"]
    for mode in modes:
        header += [f"{mode} compile s", f"{mode} ms"]
    lines = [header]
    for r in rows:
        line = [r["grid"], f"{r['gflop']:.3f}", f"{r['eager_ms']:.2f}", f"{r['ms_per_gflop_rel']:.2f}",
                f"{r['channels_last_3d_ms']:.2f}"]
        for mode in modes:
            line += [f"{r[f'{mode}_compile_s']:.2f}", f"{r[f'{mode}_ms']:.2f}"]
        lines.append(line)
    return table_lines(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.manual_seed(0)
    device = torch.device(args.device)
    if args.clock == "process" and device.type != "cpu":
        raise SystemExit("--clock process times this process's CPU: use it with --device cpu.")
    CLOCK[0] = time.process_time if args.clock == "process" else time.perf_counter
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    modes = [m for m in args.compile.split(",") if m and m != "none"]
    report: dict[str, Any] = {
        "env": {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
                "threads": torch.get_num_threads(), "clock": args.clock, "torch": torch.__version__,
                "backbone": args.backbone,
                "compile_backend": args.compile_backend},
        "bases": [],
    }
    text = []
    for base in args.base:
        schedule = build_schedule(build(args, base))
        rows = measure_grids(args, schedule, device)
        entry: dict[str, Any] = {"base": f"{base.batch_size} x {base.num_frames} x {base.crop_size}", "grids": rows}
        text += [f"base {entry['base']}, {args.backbone}, {device}", *table(rows, modes)]
        if args.callback_steps:
            cost = callback_cost(args, base)
            base_ms = next(r["eager_ms"] for r in rows if r["grid"] == entry["base"]) if any(
                r["grid"] == entry["base"] for r in rows) else rows[-1]["eager_ms"]
            cost["share_of_base_step"] = (cost["on_us"] - cost["off_us"]) / (1000 * base_ms)
            entry["callback"] = cost
            text.append(f"callback: {cost['on_us']:.0f} us/step on, {cost['off_us']:.0f} us/step off: "
                        f"{cost['share_of_base_step']:.2%} of a base-grid step")
        methods = [m for m in args.batch_sizing.split(",") if m and m != "none"]
        entry["batch_sizing"] = []
        for backbone in (b for b in args.sizing_backbones.split(",") if b) if methods else ():
            for method in methods:
                sizing = sizing_rows(args, base, backbone, cast(BatchSizing, method), device)
                entry["batch_sizing"].append(sizing)
                text += ["", *sizing_table(sizing)]
        text.append("")
        report["bases"].append(entry)
    print("\n".join(text))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "step.json").write_text(json.dumps(report, indent=2))
        (args.out / "step.txt").write_text("\n".join(text))
    return report


if __name__ == "__main__":
    main()
