"""The CPU stand-in for the GPU: the real pipeline around a model that takes the H200's step times.

Issue 39 asks whether the pipeline (store, workers or device decode, decode-ahead, the callback, the
Lightning loop) keeps the model's pace. Without a GPU, this benchmark answers it on CPU: the model is
a stand-in whose ``training_step`` sleeps, per batch, the time r3d_18 took on one NVIDIA H200 for that
many clips at that grid (``h200_rates.json``: per-grid clips/s from ``benchmarks/gpu.py``'s ``model``
section, base 8 x 16 x 112, bf16-mixed, contiguous as the end-to-end runs were; the three short-cycle
grids the H200 did not measure are estimated from the measured grid of the same crop by the frames
ratio, and the report says which). A sleep uses no CPU, so the workers and the decode-ahead thread
have the machine's cores as they would beside a GPU. One tiny parameter makes the optimizer step.

Around it, everything is real: the built-in synthetic videos packed into a frame store (as
``benchmarks/train.py``'s ``store`` source does; made before the clock starts),
``MultigridVideoDataModule`` decoding in the workers (``--decode workers``) or reading bytes in the
workers and decoding, crop-resizing and flipping each batch on the training device, here the CPU,
one batch ahead in a background thread (``--decode device``, ``decode_ahead=1``), the Lightning
``Trainer`` loop, and ``MultigridCallback`` for the multigrid run. Baseline and multigrid run
gpu.py's end-to-end schedule: base 8 x 16 x 112, stride 4, 24 baseline epochs with LR milestones
18 and 21 (multigrid: 1.5x epochs, long + short cycle). The default run uses 240 training videos
(gpu.py: 480; the same schedule in epochs, half the iterations per epoch): at scale 7 the model alone
needs 84 s (baseline) and 30 s (multigrid), so the workers path's pair takes about 2.5 minutes on 2
cores; the device path's took 30 minutes on a shared 2-core machine (its batched crop-resize on one
CPU thread, issue 39's item 2), so ``--decode workers`` is the quick look.

**Scale.** The H200 machine fed its GPU with 14 workers. ``--scale`` multiplies every step time;
its default, 14 / ``--workers`` (7 with 2 workers), gives each worker here the share of the model's
pace each worker had there (the per-worker scale). ``--scale 1`` keeps the H200's own step times:
what 2 workers would have to deliver to feed an H200. Several values (``--scale 7 1``) run in turn.

Reported per run and per grid (``B x T x S``):

- model-only seconds: the sum of the sleeps asked for, which is clips / (the H200 rate / scale);
- end-to-end seconds: the whole ``trainer.fit`` (per grid: the iterations at that grid, each from
  the previous iteration's end to its own end, the epoch start's wait in the epoch's first
  iteration; the time from the last iteration to the end of ``fit`` is the run's ``tail_s``);
- the pipeline efficiency: model-only / end-to-end (issue 39's target: >= 0.90);
- per iteration: the step (the transfer's device work, then the sleep), and outside it the wait for
  the data (Lightning's ``train_dataloader_next``), ``MultigridCallback``'s hooks and the rest of
  the loop (backward, the optimizer step, Lightning's bookkeeping), read from a profiler that times
  only those actions; the transfer (``on_before_batch_transfer`` and ``batch_to_device``, which runs
  the DataModule's ``on_after_batch_transfer``) on its own;
- each epoch's first-batch wait (from the previous epoch's last iteration, or from the start of
  ``fit``, to the step: loader rebuild, workers, the first fetch) and its first iteration against
  the run's median ("steady") iteration at the same grid.

**What stands for the device.** The transfer's work in the training thread (normalising the uint8
video; any decode not done ahead) is device work on a GPU: a kernel queued before the step's. Here
the CPU does it, and the step sleeps that much less, so an iteration's device time stays the H200's
step (where the transfer takes longer than the step, the excess shows in the step's time). With
``--decode device`` the JPEG decode and crop-resize of the next batch run on the CPU in the
decode-ahead thread, beside the sleep, as nvjpeg and the resize run on a side stream beside the
step; on CPU they are slower than on a GPU, and they share the cores with the workers. The training
process uses ``--threads`` torch threads (default 1): more spin against the workers for the cores
(on 2 cores, normalising a base batch took 2.3 ms with one thread, 9 ms with two).

    python benchmarks/standin.py                         # both paths, both runs, scale 14/workers; a few minutes
    python benchmarks/standin.py --scale 1 --decode workers
    python benchmarks/standin.py --smoke --out /tmp/s    # tiny sizes, < 30 s

Prints a table per run and writes ``--out/standin.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import platform
import resource
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from grids import parse_shape

from lightning_multigrid._lightning import pl
from lightning_multigrid.callback import MultigridCallback
from lightning_multigrid.data.datamodule import MultigridVideoDataModule
from lightning_multigrid.data.reader_settings import ReaderSettings
from lightning_multigrid.data.sources import load_manifest
from lightning_multigrid.data.synthetic import generate_synthetic_dataset
from lightning_multigrid.data.tools.pack import pack_frames

RATES_FILE = Path(__file__).with_name("h200_rates.json")
H200_WORKERS = 14  # the workers that fed the H200 in the run the rates come from
DECODES = ("workers", "device")
RUNS = ("baseline", "multigrid")


@dataclass(frozen=True)
class Setup:
    """Every size of a stand-in run; ``--smoke`` swaps in tiny ones."""

    batch_size: int
    num_frames: int
    crop_size: int
    sampling_rate: int
    num_train: int
    epochs: int
    milestones: tuple[int, ...]
    video_size: tuple[int, int]  # width, height of the synthetic videos
    video_frames: int
    fps: float
    lr: float = 0.0125


FULL = Setup(batch_size=8, num_frames=16, crop_size=112, sampling_rate=4, num_train=240, epochs=24, milestones=(18, 21),
             video_size=(340, 256), video_frames=90, fps=30.0)
SMOKE = Setup(batch_size=4, num_frames=8, crop_size=32, sampling_rate=2, num_train=40, epochs=3, milestones=(2,),
              video_size=(64, 48), video_frames=24, fps=12.0)


# ---------------------------------------------------------------------------- the H200's rates


@dataclass(frozen=True)
class GridRate:
    """The H200's clips/s at one grid of its base, and where the figure comes from."""

    grid: str  # "B x T x S" on the H200's base
    num_frames: int
    crop_size: int
    clips_per_s: float
    source: str  # "measured" or how it was estimated


def load_rates(path: Path = RATES_FILE, layout: str = "contiguous") -> tuple[dict[str, Any], list[GridRate]]:
    """The rates file's description and its per-grid rates in ``layout`` (``contiguous`` or ``channels_last``).

    Raises:
        ValueError: when ``path`` has no rate for ``layout``.
    """
    table = json.loads(path.read_text())
    key = f"{layout}_clips_per_s"
    rates = [GridRate(g["grid"], g["num_frames"], g["crop_size"], g[key], g["source"]) for g in table["grids"] if key in g]
    if not rates:
        raise ValueError(f"{path} holds no `{key}` rates: choose --layout contiguous or channels_last.")
    return {k: v for k, v in table.items() if k != "grids"}, rates


def rates_base(description: dict[str, Any]) -> tuple[int, int]:
    """Frames and crop of the base the rates file was measured at (its ``"base"``, ``"B x T x S"``)."""
    base = parse_shape(description["base"].replace(" ", ""))
    return base.num_frames, base.crop_size


class StepTimes:
    """Seconds per clip at each grid of a run's base: the H200's rate at the same grid relative to its
    base (frames and crop over the base's), times ``scale``."""

    def __init__(self, rates: list[GridRate], h200_base: tuple[int, int], base: tuple[int, int], scale: float) -> None:
        if not scale > 0:
            raise ValueError(f"`--scale` must be > 0, got {scale!r}.")
        self.rates, self.h200_base, self.base, self.scale = rates, h200_base, base, scale
        self._cache: dict[tuple[int, int], GridRate] = {}

    def rate_at(self, num_frames: int, crop_size: int) -> GridRate:
        """The H200 grid whose frames and crop, relative to its base, match this grid's relative to ours.

        Raises:
            ValueError: when no H200 grid is within 15% in both.
        """
        key = (num_frames, crop_size)
        if key not in self._cache:
            want = (num_frames / self.base[0], crop_size / self.base[1])

            def distance(rate: GridRate) -> float:
                have = (rate.num_frames / self.h200_base[0], rate.crop_size / self.h200_base[1])
                return max(abs(math.log(h / w)) for h, w in zip(have, want))

            best = min(self.rates, key=distance)
            if distance(best) > math.log(1.15):
                raise ValueError(
                    f"no H200 rate for the grid {num_frames} x {crop_size} (frames x crop) at base {self.base[0]} x "
                    f"{self.base[1]}: the rates file holds {', '.join(r.grid for r in self.rates)}; use a base of "
                    "the same proportions."
                )
            self._cache[key] = best
        return self._cache[key]

    def seconds(self, clips: int, num_frames: int, crop_size: int) -> float:
        """The step time of ``clips`` clips at this grid: clips / (the H200's clips/s / scale)."""
        return clips * self.scale / self.rate_at(num_frames, crop_size).clips_per_s


# ---------------------------------------------------------------------------- measuring the loop


@dataclass
class Iteration:
    """One training iteration, from the previous iteration's end (or fit's start) to its own end."""

    epoch: int
    batch_idx: int
    grid: str  # "B x T x S" as the batch came (a last partial batch has fewer clips)
    num_frames: int
    crop_size: int
    clips: int
    model_s: float  # the H200's step time for this batch, scaled
    device_s: float = 0.0  # the transfer's device work in the training thread (normalising), counted in the step
    step_s: float = 0.0  # device_s plus the sleep as it took: at least model_s
    iteration_s: float = 0.0
    fetch_s: float = 0.0
    transfer_s: float = 0.0
    callback_s: float = 0.0

    @property
    def loop_s(self) -> float:
        """What is left outside the step (which holds the transfer), the data wait and the callback:
        Lightning's loop, backward and the optimizer step, the other hooks."""
        return self.iteration_s - self.step_s - self.fetch_s - self.callback_s


def _category(action: str) -> str | None:
    """Which share of an iteration a profiled Lightning action is (``None``: not timed).

    ``batch_to_device`` encloses the DataModule's ``on_after_batch_transfer``; nested actions are
    not timed twice."""
    if action.endswith("train_dataloader_next"):
        return "fetch_s"
    if action.endswith(".on_before_batch_transfer") or (action.startswith("[Strategy]") and action.endswith(".batch_to_device")):
        return "transfer_s"
    if action.startswith("[Callback]") and "MultigridCallback" in action:
        return "callback_s"
    return None


class ShareProfiler(pl.profilers.Profiler):
    """Times the fetch, the transfer and ``MultigridCallback``'s hooks, summed until :meth:`take`."""

    def __init__(self) -> None:
        super().__init__()
        self._started: dict[str, float] = {}
        self.pending: dict[str, float] = {}

    def start(self, action_name: str) -> None:
        if _category(action_name) is not None:
            self._started[action_name] = time.perf_counter()

    def stop(self, action_name: str) -> None:
        started = self._started.pop(action_name, None)
        category = _category(action_name)
        if started is not None and category is not None:
            self.pending[category] = self.pending.get(category, 0.0) + time.perf_counter() - started

    def take(self) -> dict[str, float]:
        """The shares timed since the last call."""
        pending, self.pending = self.pending, {}
        return pending


class PaceMeter(pl.Callback):
    """Closes each iteration at ``on_train_batch_end``: its duration since the previous one's end (the
    first from :attr:`start`, set just before ``fit``), and the profiler's shares."""

    def __init__(self, profiler: ShareProfiler) -> None:
        self.profiler = profiler
        self.iterations: list[Iteration] = []
        self.current: Iteration | None = None  # set by the model's step
        self.start = 0.0
        self.last_end = 0.0

    def begin(self) -> None:
        self.start = self.last_end = time.perf_counter()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        now = time.perf_counter()
        iteration = self.current
        if iteration is None:
            raise RuntimeError("the stand-in's training_step did not run for this batch")
        iteration.iteration_s = now - self.last_end
        for name, seconds in self.profiler.take().items():
            setattr(iteration, name, seconds)
        self.iterations.append(iteration)
        self.current, self.last_end = None, now


class StandInModel(pl.LightningModule):
    """A model whose step takes the H200's time for the batch's clips at its grid, asleep.

    ``training_step`` sleeps ``StepTimes.seconds`` for the batch (no CPU used: the workers and the
    decode-ahead thread keep the cores), less the device work the transfer already did in the training
    thread for this batch (the DataModule's ``on_after_batch_transfer``: normalising, on a GPU a kernel
    queued before the step's, here CPU work), so an iteration's device time is the H200's step unless
    that work takes longer. Then it returns a loss of one parameter so the optimizer steps and
    ``MultigridCallback``'s LR scaling runs. SGD with ``MultiStepLR`` at ``milestones``, which the
    callback reads as the baseline's LR stages.
    """

    def __init__(self, step_times: StepTimes, meter: PaceMeter, lr: float, milestones: tuple[int, ...]) -> None:
        super().__init__()
        self.step_times, self.meter, self.lr, self.milestones = step_times, meter, lr, milestones
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        video = batch["video"]  # (N, C, T, H, W)
        clips, num_frames, crop_size = int(video.shape[0]), int(video.shape[2]), int(video.shape[-1])
        model_s = self.step_times.seconds(clips, num_frames, crop_size)
        device_s = self.meter.profiler.pending.get("transfer_s", 0.0)  # this batch's transfer, timed just before
        started = time.perf_counter()
        time.sleep(max(0.0, model_s - device_s))
        self.meter.current = Iteration(
            self.current_epoch, batch_idx, f"{clips} x {num_frames} x {crop_size}", num_frames, crop_size, clips, model_s,
            device_s=device_s, step_s=device_s + time.perf_counter() - started,
        )
        return (self.weight - 1.0).pow(2).sum()

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=list(self.milestones), gamma=0.1)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}


# ---------------------------------------------------------------------------- one run


@dataclass
class RunResult:
    """One run's measurements: its iterations, the time ``fit`` took, CPU seconds."""

    decode: str
    run: str
    scale: float
    fit_s: float
    cpu_s: float
    iterations: list[Iteration] = field(default_factory=list)


def train(setup: Setup, store: Path, decode: str, multigrid: bool, step_times: StepTimes, workers: int) -> RunResult:
    """One fit of the stand-in model from ``store``, decoded in the workers or on the device (the CPU)."""
    pl.seed_everything(0, verbose=False)
    datamodule = MultigridVideoDataModule(
        train_manifest=str(store), reader_settings=ReaderSettings(frame_decode=decode),  # type: ignore[arg-type]
        decode_ahead=1, batch_size=setup.batch_size, num_frames=setup.num_frames, crop_size=setup.crop_size,
        sampling_rate=setup.sampling_rate, flip=False, num_workers=workers, pin_memory=False, seed=0,
    )
    profiler = ShareProfiler()
    meter = PaceMeter(profiler)
    model = StandInModel(step_times, meter, setup.lr, setup.milestones)
    callbacks: list[pl.Callback] = [MultigridCallback()] if multigrid else []
    trainer = pl.Trainer(
        max_epochs=setup.epochs, accelerator="cpu", devices=1, precision="32-true", limit_val_batches=0,
        num_sanity_val_steps=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, profiler=profiler, callbacks=[*callbacks, meter],  # the meter last: it closes an iteration
    )
    cpu_start = cpu_seconds()
    meter.begin()
    trainer.fit(model, datamodule=datamodule)
    fit_s = time.perf_counter() - meter.start
    multiprocessing.active_children()  # reap the stopped workers, so their CPU time counts
    return RunResult(decode, "multigrid" if multigrid else "baseline", step_times.scale, fit_s, cpu_seconds() - cpu_start,
                     meter.iterations)


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its children that have ended (the workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


# ---------------------------------------------------------------------------- the report


def _sums(iterations: list[Iteration]) -> dict[str, float]:
    names = ("model_s", "step_s", "iteration_s", "fetch_s", "transfer_s", "callback_s", "loop_s")
    return {name: sum(getattr(i, name) for i in iterations) for name in names}


def _grid_key(iteration: Iteration) -> tuple[int, int]:
    return iteration.num_frames, iteration.crop_size


def grid_rows(result: RunResult, step_times: StepTimes) -> list[dict[str, Any]]:
    """Per grid (frames x crop), coarsest first: clips, model-only and end-to-end seconds, their ratio, and
    per iteration the step, the transfer (inside the step), and outside it the wait, the callback and the
    rest of the loop."""
    rows = []
    for key in sorted({_grid_key(i) for i in result.iterations}, key=lambda k: k[0] * k[1] ** 2):
        at_grid = [i for i in result.iterations if _grid_key(i) == key]
        sums, count = _sums(at_grid), len(at_grid)
        rate = step_times.rate_at(*key)
        rows.append({
            "grid": max(at_grid, key=lambda i: i.clips).grid, "iterations": count, "clips": sum(i.clips for i in at_grid),
            "h200_grid": rate.grid, "h200_clips_per_s": rate.clips_per_s, "h200_source": rate.source,
            "scaled_clips_per_s": rate.clips_per_s / step_times.scale,
            "model_s": sums["model_s"], "e2e_s": sums["iteration_s"], "efficiency": sums["model_s"] / sums["iteration_s"],
            **{f"{name[:-2]}_ms_per_iteration": 1000 * sums[name] / count
               for name in ("step_s", "fetch_s", "transfer_s", "callback_s", "loop_s")},
            "outside_step_ms_per_iteration": 1000 * (sums["iteration_s"] - sums["step_s"]) / count,
            "step_beyond_model_ms_per_iteration": 1000 * (sums["step_s"] - sums["model_s"]) / count,
        })
    return rows


def steady_iterations(iterations: list[Iteration]) -> dict[tuple[int, int], float]:
    """The median iteration (wait + step) per grid, over every iteration but an epoch's first."""
    by_grid: dict[tuple[int, int], list[float]] = {}
    for iteration in iterations:
        if iteration.batch_idx > 0:
            by_grid.setdefault(_grid_key(iteration), []).append(iteration.iteration_s)
    return {key: statistics.median(values) for key, values in by_grid.items()}


def epoch_rows(result: RunResult) -> list[dict[str, Any]]:
    """Per epoch: its first iteration's wait (everything but the step) and the whole iteration, against a
    steady iteration at the same grid: the run's median there (``steady_source`` "measured"), or where no
    other iteration ran at that grid (a coarse batch only an epoch's first), the first iteration's own
    step plus the run's median time outside the step (``"step + median outside"``)."""
    steady = steady_iterations(result.iterations)
    later = [i.iteration_s - i.step_s for i in result.iterations if i.batch_idx > 0]
    outside = statistics.median(later) if later else 0.0
    rows = []
    for first in (i for i in result.iterations if i.batch_idx == 0):
        reference = steady.get(_grid_key(first))
        source = "measured"
        if reference is None:
            reference, source = first.step_s + outside, "step + median outside"
        wait_s = first.iteration_s - first.step_s
        rows.append({
            "epoch": first.epoch, "grid": first.grid, "first_wait_s": wait_s, "first_iteration_s": first.iteration_s,
            "steady_iteration_s": reference, "steady_source": source, "first_wait_ratio": wait_s / reference,
            "first_iteration_ratio": first.iteration_s / reference,
        })
    return rows


def run_report(result: RunResult, step_times: StepTimes) -> dict[str, Any]:
    """One run's report: totals, per grid, per epoch."""
    sums, iterations = _sums(result.iterations), result.iterations
    steady = [i for i in iterations if i.batch_idx > 0] or iterations
    steady_sums = _sums(steady)
    epochs = epoch_rows(result)
    ratios = [e["first_iteration_ratio"] for e in epochs]
    totals = {
        "iterations": len(iterations), "epochs": len(epochs), "clips": sum(i.clips for i in iterations),
        "model_s": sums["model_s"], "e2e_s": result.fit_s, "efficiency": sums["model_s"] / result.fit_s,
        "iterations_s": sums["iteration_s"], "tail_s": result.fit_s - sums["iteration_s"], "cpu_s": result.cpu_s,
        "step_s": sums["step_s"], "wait_s": sums["fetch_s"], "transfer_s": sums["transfer_s"],
        "callback_s": sums["callback_s"], "loop_s": sums["loop_s"],
        "first_waits_s": sum(e["first_wait_s"] for e in epochs),
        "steady_outside_step_ms": 1000 * (steady_sums["iteration_s"] - steady_sums["step_s"]) / len(steady),
        "steady_wait_ms": 1000 * steady_sums["fetch_s"] / len(steady),
        "steady_overhead_ms": 1000 * (steady_sums["callback_s"] + steady_sums["loop_s"]) / len(steady),
        "steady_transfer_ms": 1000 * steady_sums["transfer_s"] / len(steady),
        "max_first_iteration_ratio": max(ratios) if ratios else None,
        "median_first_iteration_ratio": statistics.median(ratios) if ratios else None,
    }
    return {"decode": result.decode, "run": result.run, "scale": result.scale, "totals": totals,
            "grids": grid_rows(result, step_times), "epochs": epochs}


def format_run(report: dict[str, Any]) -> str:
    """The run's table: per grid and the total."""
    totals = report["totals"]
    lines = [
        f"\n{report['run']}, {report['decode']} decode, scale {report['scale']:g}: model-only {totals['model_s']:.1f} s, "
        f"end to end {totals['e2e_s']:.1f} s (CPU {totals['cpu_s']:.1f} s), efficiency {totals['efficiency']:.2f}; "
        f"{totals['iterations']} iterations",
        f"{'grid':<14} {'H200 clips/s':>12} {'iters':>6} {'clips':>6} {'model s':>8} {'e2e s':>7} {'eff':>5} "
        f"{'step ms':>8} {'xfer ms':>8} {'wait ms':>8} {'cb ms':>6} {'loop ms':>8}",
    ]
    for row in report["grids"]:
        estimated = "*" if row["h200_source"] != "measured" else " "
        lines.append(
            f"{row['grid']:<14} {row['h200_clips_per_s']:>11.0f}{estimated} {row['iterations']:>6} {row['clips']:>6} "
            f"{row['model_s']:>8.2f} {row['e2e_s']:>7.2f} {row['efficiency']:>5.2f} {row['step_ms_per_iteration']:>8.1f} "
            f"{row['transfer_ms_per_iteration']:>8.1f} {row['fetch_ms_per_iteration']:>8.1f} "
            f"{row['callback_ms_per_iteration']:>6.2f} {row['loop_ms_per_iteration']:>8.1f}"
        )
    lines.append(
        f"{'total':<14} {'':>12} {totals['iterations']:>6} {totals['clips']:>6} {totals['model_s']:>8.2f} "
        f"{totals['e2e_s']:>7.2f} {totals['efficiency']:>5.2f}   (tail after the last step {totals['tail_s']:.2f} s)"
    )
    worst, median = totals["max_first_iteration_ratio"], totals["median_first_iteration_ratio"]
    first = "n/a" if worst is None else f"{median:.2f}x (median), up to {worst:.2f}x"
    lines.append(
        f"steady iteration outside the step: {totals['steady_outside_step_ms']:.1f} ms (wait {totals['steady_wait_ms']:.1f}, "
        f"callback + loop {totals['steady_overhead_ms']:.1f}; transfer, inside the step, {totals['steady_transfer_ms']:.1f}); "
        f"epoch starts: first-batch waits {totals['first_waits_s']:.2f} s over {totals['epochs']} epochs, first "
        f"iteration {first} a steady one at its grid"
    )
    return "\n".join(lines)


# ---------------------------------------------------------------------------- data and main


def make_store(setup: Setup, root: Path) -> tuple[Path, float]:
    """The built-in synthetic training videos packed into a store (level 0 at the grids' largest short side,
    as training packs it); returns the store's manifest and the seconds it took."""
    started = time.perf_counter()
    width, height = setup.video_size
    store = root / f"train-crop{setup.crop_size}.store"
    settings = root / "standin-data.json"  # what the store in ``root`` was made with: reused only for the same
    wanted = json.dumps(asdict(setup))
    if store.is_dir() and settings.is_file() and settings.read_text() == wanted:
        return store, 0.0
    generate_synthetic_dataset(root, num_train=setup.num_train, num_val=1, seed=0, texture_cell=12, width=width,
                               height=height, num_frames=setup.video_frames, fps=setup.fps)
    store = Path(pack_frames(load_manifest(root / "train.csv"), store, crop_size=setup.crop_size, progress=False).store)
    settings.write_text(wanted)
    return store, time.perf_counter() - started


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--decode", default="workers,device", help="comma-separated: workers, device")
    parser.add_argument("--runs", default="baseline,multigrid", help="comma-separated: baseline, multigrid")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers (default 2)")
    parser.add_argument("--scale", type=float, nargs="+",
                        help=f"step-time multipliers, each a run of its own (default: {H200_WORKERS} / --workers)")
    parser.add_argument("--rates", type=Path, default=RATES_FILE,
                        help=f"per-grid model rates (default {RATES_FILE.name}; gpu.py writes standin_rates.json)")
    parser.add_argument("--layout", default="contiguous", choices=("contiguous", "channels_last"),
                        help="the H200 rates' memory layout (the end-to-end runs used contiguous)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of the training process (default 1; the workers use one each)")
    parser.add_argument("--num-train", type=int, help=f"training videos (default {FULL.num_train}; gpu.py's 480)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, < 30 s")
    parser.add_argument("--data", type=Path,
                        help="keep the synthetic videos and store here (reused when made with the same sizes)")
    parser.add_argument("--out", type=Path, help="write standin.json here")
    args = parser.parse_args(argv)
    for name, allowed in (("decode", DECODES), ("runs", RUNS)):
        chosen = getattr(args, name).split(",")
        if not chosen or any(c not in allowed for c in chosen):
            parser.error(f"--{name} {getattr(args, name)!r}: choose from {', '.join(allowed)}, comma-separated")
        setattr(args, name, chosen)
    if args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers} (the stand-in measures the workers' pipeline)")
    return args


def _runs(args: argparse.Namespace) -> Iterator[tuple[float, str, str]]:
    for scale in args.scale:
        for decode in args.decode:
            for run in args.runs:
                yield scale, decode, run


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    setup = SMOKE if args.smoke else FULL
    if args.num_train:
        setup = Setup(**{**asdict(setup), "num_train": args.num_train})
    args.scale = args.scale or [H200_WORKERS / args.workers]
    torch.set_num_threads(args.threads)
    description, rates = load_rates(args.rates, layout=args.layout)
    report: dict[str, Any] = {
        "machine": {"cpu": platform.processor() or platform.machine(), "cpu_cores": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(), "workers": args.workers},
        "setup": {**asdict(setup), "layout": args.layout, "smoke": args.smoke},
        "rates": {**description, "file": args.rates.name, "grids": [asdict(r) for r in rates]},
        "scale_note": f"default scale {H200_WORKERS} / workers: each worker's share of the model's pace as on the H200 "
                      f"machine ({H200_WORKERS} workers); 1: the H200's own step times",
        "runs": [],
    }
    with tempfile.TemporaryDirectory() as scratch:
        store, data_s = make_store(setup, args.data or Path(scratch) / "synthetic")
        report["data_s"] = data_s
        print(f"made and packed {setup.num_train} videos in {data_s:.0f} s (not timed below)", flush=True)
        for scale, decode, run in _runs(args):
            step_times = StepTimes(rates, rates_base(description), (setup.num_frames, setup.crop_size), scale)
            result = train(setup, store, decode, run == "multigrid", step_times, args.workers)
            report["runs"].append(run_report(result, step_times))
            print(format_run(report["runs"][-1]), flush=True)
            if args.out:
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / "standin.json").write_text(json.dumps(report, indent=1))
    print("\n* estimated: the H200 did not measure this grid (rates file: the measured grid of the same crop "
          "times the frames ratio)")
    return report


if __name__ == "__main__":
    main()
