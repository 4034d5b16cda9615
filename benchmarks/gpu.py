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
camera-like footage (``bench_data.py``'s, as ``loader.py`` makes it) at GOP 250 packed into a store
(level 0 at the grids' largest short side); for training, the built-in synthetic classes (motion x
texture, texture cell 12 px, visible on every grid, so both runs can learn) packed into stores. Frame
folders and GOP-12 videos are made only when a section that reads them runs.

Results go to ``--out/gpu.json`` after every section (a run cut short still reports) and to
``--out/gpu.md`` at the end.

    python benchmarks/gpu.py --out gpu-results            # on the GPU machine, <= 8 minutes
    python benchmarks/gpu.py --out gpu-224 --base 8x8x224 --sampling-rate 8   # the paper's resolution
    python benchmarks/gpu.py --smoke --out /tmp/smoke      # the same code on CPU, tiny sizes, < 1 minute

On a lent machine without a package registry, ``benchmarks/gpu_carry.sh`` fetches the wheels it lacks
and prints the one command to run there. This script is the command (arguments, sections, running,
output); its sibling modules, imported as the script runs, hold the rest: ``harness.py`` (sizes, budget,
report, timing, environment, Markdown parts), ``bench_data.py`` (the data), ``grids.py`` (the grids and
their batches), and the sections by family: ``gpu_model.py``, ``gpu_loader.py``, ``gpu_decode.py``,
``gpu_e2e.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from bench_data import make_data, store_manifest
from gpu_decode import decode_table, markdown_decode, markdown_nvjpeg, markdown_overlap, nvjpeg_table, overlap_table
from gpu_e2e import END_TO_END, end_to_end, fsdp_fit, markdown_end_to_end, transformer_end_to_end
from gpu_loader import (
    loader_table,
    markdown_earlier,
    markdown_pace,
    markdown_stages,
    other_loader_table,
    read_table,
    stage_table,
)
from gpu_model import batch_sizing_table, compile_table, markdown_sizing, model_table, precision_and_layout
from grids import benchmark_schedule, parse_shape
from harness import Report, Setup, environment, grid_rows, markdown_head, markdown_json, markdown_tail

from lightning_multigrid.data.dataset import TrainVideoDataset
from lightning_multigrid.data.reader_settings import ReaderSettings
from lightning_multigrid.data.tools.pack import store_levels
from lightning_multigrid.schedule import GridShape, MultigridSchedule

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


def markdown(report: dict[str, Any]) -> str:
    lines = markdown_head(report, "benchmarks/gpu.py")
    lines += markdown_end_to_end(report)
    lines += markdown_pace(report)
    lines += markdown_overlap(report)
    lines += markdown_sizing(report)
    lines += markdown_stages(report)
    lines += markdown_nvjpeg(report)
    lines += markdown_earlier(report)
    lines += markdown_decode(report)
    lines += markdown_json(report, ("precision", "fsdp", "compile"))
    return "\n".join(lines + markdown_tail(report)) + "\n"


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


def with_base(setup: Setup, base: GridShape | None, sampling_rate: int | None) -> Setup:
    """``setup`` at another base grid: the videos' short side at least the store's level 0 (the jitter maximum,
    320 for a 224 crop: what ``pack_frames`` packs), the width in the same 340:256 proportion."""
    if base is None and sampling_rate is None:
        return setup
    base = base or setup.base
    level0 = store_levels(base.crop_size)[0]
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
    schedule = benchmark_schedule(setup.base, setup.sampling_rate)
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
