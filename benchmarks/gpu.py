"""The GPU story in one command: does the loader feed the model at every grid, and does multigrid pay?

Issue 32's measurements, sized to end within 8 minutes (``--budget-s``, default 480, counted from the
process start) on a 16-core single-GPU machine. It makes its own data, then measures, for r3d_18 at
base 8 x 16 x 112 (stride 4), bf16-mixed, 14 workers, from the packed frame store, in this order
(the sections, each a ``--sections`` name):

1. ``env``: the machine, the date and the versions (Python, torch, CUDA, torchvision, Lightning and
   which package, torchcodec, simplejpeg, PyAV); which library decodes JPEG on the device; whether
   torchcodec decodes mp4 with NVDEC.
2. ``model``: clips/s the model consumes at each grid, base to coarsest (training steps on batches
   already on the GPU, MultigridBatchNorm split as multigrid splits it), contiguous and
   ``channels_last_3d``, the faster kept.
3. ``loader``: clips/s the loader delivers from the store at each grid, through a ``ChunkedDataLoader``
   as training builds it: (a) ``store (workers)``, the JPEGs decoded in the workers (libjpeg-turbo
   through simplejpeg), batches moved to the GPU; (b) ``store (device decode)``, the workers read the
   bytes and ``DecodeAhead`` decodes each batch on a side stream while the next is read (the
   training path's overlap).
4. ``stages``: per grid, each stage of both paths alone, as clips/s: read, decode, crop-resize,
   transfer. Workers path: one worker's CPU time per frame of each stage (``loader.py``'s
   ``stage_costs``, one torch thread) times the workers, and the pinned host-to-device copy.
   Device path: the workers reading the bytes (measured through the loader), nvjpeg decoding batches
   already read, the batched crop-resize-flip alone, and the bytes' copy to the GPU. Where a path
   delivers less than the model consumes, the stage that falls short is named.
5. ``nvjpeg``: the device JPEG decode in Gpx/s, batched, at 340x256 and 1280x720 and at the store's
   frames per grid, beside the best public figure (about 2.9 Gpx/s batched on one A100).
6. ``overlap``: per grid (coarsest, base), ms per iteration of the training step alone, decode then
   step, and the decode of the next batch on the side stream while the step runs; the overlapped
   step's inflation over the step alone.
7. ``end_to_end:store``: baseline against multigrid (``benchmarks/train.py``'s runs: same data, seed,
   SGD and step LR schedule; validation once after training, not timed), r3d_18 from scratch from
   the store with device decode: training wall-clock, iterations, top-1, the share of the loop's
   time spent waiting for data and the multigrid callback's data-wait meter per grid.
8. ``transformer:model``, ``transformer:end_to_end``: rows 2 and 7 for ``swin3d_t`` (bf16); skip
   both with ``--skip transformer``.

Then, while the budget lasts, what earlier runs measured: ``decode`` (per-clip resize loop against the
batched crop-resize), ``read`` (frame folders against the store), ``loader:other`` (mp4 at GOP 250 and
12, frame folders, NVDEC), ``end_to_end:frames``, ``end_to_end:frames-serial``, ``end_to_end:mp4``,
``precision`` (16-mixed, channels_last_3d), ``fsdp`` and ``compile``.

Every section past the budget is skipped and says so: a section starts only when the time used plus
its estimated cost (``COST_S``, for the full sizes) stays within ``--budget-s``. The data is made
first and always.

Data: Kinetics-like synthetic videos (340x256, 10 s at 30 fps, x264 veryfast): for the loader,
camera-like footage (``loader.py``'s) at GOP 250 packed into a store (level 0 at the grids' largest
short side); for training, the built-in synthetic classes (motion x texture, texture cell 12 px,
visible on every grid, so both runs can learn) packed into stores. Frame folders and GOP-12 videos
are made only when a section that reads them runs.

Results go to ``--out/gpu.json`` after every section (a run cut short still reports) and to
``--out/gpu.md`` at the end.

    python benchmarks/gpu.py --out gpu-results            # on the GPU machine, <= 8 minutes
    python benchmarks/gpu.py --smoke --out /tmp/smoke      # the same code on CPU, tiny sizes, < 1 minute

On a lent machine without a package registry, ``benchmarks/gpu_carry.sh`` fetches the wheels it lacks
and prints the one command to run there.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import itertools
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark scripts

from loader import Grid, render_camera_video, requests_for, schedule_grids, stage_costs  # noqa: E402
from train import run as train_run  # noqa: E402

from lightning_multigrid.data.dataset import TrainVideoDataset, collate_clips  # noqa: E402
from lightning_multigrid.data.decoding.device import (  # noqa: E402
    EncodedBatch,
    crop_resize_flip,
    crop_resize_flip_per_clip,
    decode_clips,
    decode_jpegs,
    jpeg_decoder,
)
from lightning_multigrid.data.decoding.settings import ReaderSettings  # noqa: E402
from lightning_multigrid.data.loaders import ChunkedDataLoader  # noqa: E402
from lightning_multigrid.data.manifests.load import load_manifest  # noqa: E402
from lightning_multigrid.data.prefetch import DecodeAhead  # noqa: E402
from lightning_multigrid.data.synthetic import generate_synthetic_dataset, write_video  # noqa: E402
from lightning_multigrid.data.tools.extract import extract_frames  # noqa: E402
from lightning_multigrid.data.tools.pack import pack_frames  # noqa: E402
from lightning_multigrid.data.transfer import BatchTransfer, normalize_video  # noqa: E402
from lightning_multigrid.module import VideoClassifier  # noqa: E402
from lightning_multigrid.norm import apply_bn_plan, convert_batchnorm  # noqa: E402
from lightning_multigrid.schedule import BNPlan, GridShape, MultigridConfig, MultigridSchedule, build_schedule  # noqa: E402

# The best public batched nvjpeg figure the issue compares with (one A100).
PUBLIC_NVJPEG_GPX_S = 2.9


@dataclass(frozen=True)
class Setup:
    """Every size the run uses; ``--smoke`` swaps in tiny ones."""

    device: str
    backbone: str
    transformer: str  # the transformer backbone of the ``transformer:*`` sections
    precision: str
    base: GridShape
    sampling_rate: int
    workers: int
    video_size: tuple[int, int]
    video_seconds: float
    fps: float
    loader_videos: int
    loader_seconds: float  # each loader row runs this long (after two warm-up batches)
    repeat_seconds: float  # each in-process stage (device decode, crop-resize, copies) runs this long
    stage_frames: int  # frames per grid whose workers' stage costs are timed in this process
    nvjpeg_sizes: tuple[tuple[int, int], ...]
    nvjpeg_batch: int
    num_train: int
    num_val: int
    epochs: int
    milestones: tuple[int, ...]
    lr: float
    grids: tuple[str, ...] | None  # None: every grid
    model_steps: int
    cost_scale: float  # COST_S (full sizes) times this is a section's estimated cost


FULL = Setup(
    device="cuda", backbone="r3d_18", transformer="swin3d_t", precision="bf16-mixed", base=GridShape(8, 16, 112),
    sampling_rate=4, workers=14, video_size=(340, 256), video_seconds=10.0, fps=30.0, loader_videos=16,
    loader_seconds=1.5, repeat_seconds=0.5, stage_frames=1024, nvjpeg_sizes=((340, 256), (1280, 720)),
    nvjpeg_batch=128, num_train=480, num_val=96, epochs=24, milestones=(18, 21), lr=0.0125, grids=None,
    model_steps=20, cost_scale=1.0,
)
SMOKE = Setup(
    device="cpu", backbone="tiny", transformer="tiny_swin3d", precision="32-true", base=GridShape(4, 8, 32),
    sampling_rate=2, workers=2, video_size=(64, 48), video_seconds=2.0, fps=12.0, loader_videos=3,
    loader_seconds=0.2, repeat_seconds=0.05, stage_frames=16, nvjpeg_sizes=((64, 48),), nvjpeg_batch=4,
    num_train=16, num_val=8, epochs=3, milestones=(2,), lr=0.0125, grids=("coarsest", "base"), model_steps=2,
    cost_scale=0.0,
)

# Estimated seconds of each section at the full sizes on a 16-core H100/H200 machine (the data is made
# first and always, about 50 s). A section starts only when the time used plus its estimate fits the budget.
COST_S = {
    "env": 5, "model": 25, "loader": 40, "stages": 40, "nvjpeg": 5, "overlap": 15, "end_to_end:store": 110,
    "transformer:model": 20, "transformer:end_to_end": 110,
    "decode": 20, "read": 35, "loader:other": 90, "end_to_end:frames": 130, "end_to_end:frames-serial": 100,
    "end_to_end:mp4": 100, "precision": 25, "fsdp": 40, "compile": 120,
}
SECTIONS = tuple(COST_S)


def process_age_s() -> float:
    """Seconds since this process started (imports included); 0 where ``/proc`` does not say."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return max(0.0, float(Path("/proc/uptime").read_text().split()[0]) - started)
    except (OSError, ValueError, IndexError):
        return 0.0


class Report:
    """The results so far; written to ``gpu.json`` after every section."""

    def __init__(self, out: Path, budget_s: float, cost_scale: float) -> None:
        self.out, self.budget_s, self.cost_scale = out, budget_s, cost_scale
        self.start = time.perf_counter() - process_age_s()
        self.data: dict[str, Any] = {"seconds": {}}
        out.mkdir(parents=True, exist_ok=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def section(self, name: str, work: Callable[[], Any], cost_s: float | None = None) -> Any:
        """Run one section, keep its result or its error; skip it when its estimated cost would pass the budget
        (``cost_s`` None: always run)."""
        estimate = (cost_s or 0.0) * self.cost_scale
        if cost_s is not None and self.elapsed() + estimate > self.budget_s:
            self.data[name] = {"skipped": f"time budget: {self.elapsed():.0f} s of {self.budget_s:.0f} s used, "
                                          f"this section's estimate {estimate:.0f} s would pass it"}
            print(f"[{self.elapsed():5.0f} s] {name} skipped: {self.data[name]['skipped']}", flush=True)
        else:
            started = time.perf_counter()
            try:
                self.data[name] = work()
            except Exception as error:  # one broken section must not cost the others' figures
                self.data[name] = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()[-3000:]}
            self.data["seconds"][name] = time.perf_counter() - started
            print(f"[{self.elapsed():5.0f} s] {name} done in {time.perf_counter() - started:.0f} s", flush=True)
        self.data["seconds"].pop("total", None)
        self.data["seconds"]["total"] = self.elapsed()  # last
        (self.out / "gpu.json").write_text(json.dumps(self.data, indent=1, default=str))
        return self.data[name]

    def rows(self, name: str) -> list[dict[str, Any]]:
        """A section's rows that hold a grid (none when it failed or was skipped)."""
        section = self.data.get(name, [])
        return [r for r in section if isinstance(r, dict) and "grid" in r] if isinstance(section, list) else []


# ---------------------------------------------------------------------------- environment


def environment(setup: Setup, sample_mp4: Path) -> dict[str, Any]:
    from lightning_multigrid._lightning import PACKAGE

    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "cpu_cores": os.cpu_count(), "lightning_package": PACKAGE,
    }
    for package in ("torchvision", PACKAGE.replace("_", "-"), "torchmetrics", "simplejpeg", "av", "numpy"):
        try:
            info[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            info[package] = "not installed"
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(0)
        info["gpu"] = torch.cuda.get_device_name()
        info["gpu_memory_gib"] = round(properties.total_memory / 2**30, 1)
    info["jpeg_decoder"] = jpeg_decoder()
    try:
        import torchcodec

        info["torchcodec"] = torchcodec.__version__
    except Exception as error:  # a torchcodec built for another torch raises OSError or RuntimeError
        info["torchcodec"] = f"does not load: {type(error).__name__}: {str(error)[:300]}"
    info["nvdec"] = nvdec_probe(sample_mp4, setup.device)
    return info


def nvdec_probe(path: Path, device: str) -> dict[str, Any]:
    """Decode two frames with torchcodec on ``device``; say whether it fell back to the CPU."""
    if device != "cuda":
        return {"usable": False, "reason": "no CUDA"}
    try:
        from torchcodec.decoders import VideoDecoder

        decoder = VideoDecoder(str(path), device="cuda")
        frames = decoder.get_frames_at([0, 10]).data
        fallback = str(getattr(decoder, "cpu_fallback", "not reported by this torchcodec"))
        uses_nvdec = frames.is_cuda and "True" not in fallback and "not reported" not in fallback
        return {"usable": uses_nvdec, "frames_on": str(frames.device), "cpu_fallback": fallback}
    except Exception as error:  # any failure means: not usable here
        return {"usable": False, "reason": f"{type(error).__name__}: {str(error)[:300]}"}


# ---------------------------------------------------------------------------- data


def _camera_video(path: Path, width: int, height: int, num_frames: int, fps: float, gop: int, seed: int) -> None:
    frames = render_camera_video(width, height, num_frames, np.random.default_rng(seed))
    write_video(path, frames, fps=fps, crf=23, preset="veryfast", gop_size=gop)


def camera_videos(setup: Setup, folder: Path, gop: int) -> Path:
    """``loader_videos`` camera-like videos at ``gop`` in ``folder``; returns their manifest."""
    width, height = setup.video_size
    num_frames = round(setup.video_seconds * setup.fps)
    folder.mkdir(parents=True)
    with ProcessPoolExecutor() as pool:
        jobs = [pool.submit(_camera_video, folder / f"{i:03d}.mp4", width, height, num_frames, setup.fps, gop, i)
                for i in range(setup.loader_videos)]
        for job in jobs:
            job.result()
    (folder / "train.csv").write_text("".join(f"{i:03d}.mp4 0\n" for i in range(setup.loader_videos)))
    return folder / "train.csv"


def make_data(setup: Setup, root: Path, sections: set[str]) -> dict[str, Any]:
    """The loader's videos (GOP 250) packed into a store, and, when a training section is selected, the
    training videos packed into stores (straight from the mp4 files). Frame folders and GOP-12 videos
    are made later, by the sections that read them (:func:`ensure`)."""
    width, height = setup.video_size
    num_frames = round(setup.video_seconds * setup.fps)
    data: dict[str, Any] = {"description": f"{width}x{height}, {setup.video_seconds:g} s at {setup.fps:g} fps",
                            "seconds": {}, "root": str(root), "train_dir": str(root / "train")}
    started = time.perf_counter()
    manifests = {"mp4 gop250": camera_videos(setup, root / "gop250", 250)}
    # Level 0 at the grids' largest short side (160 for a 112 crop), as training packs it.
    manifests["store"] = pack_frames(load_manifest(manifests["mp4 gop250"]), root / "gop250.store",
                                     crop_size=setup.base.crop_size, progress=False).store
    data["loader_manifests"] = {k: str(v) for k, v in manifests.items()}
    data["seconds"]["loader_data"] = time.perf_counter() - started
    if any(name.startswith(("end_to_end", "transformer:end_to_end")) for name in sections):
        started = time.perf_counter()
        train = root / "train"
        generate_synthetic_dataset(
            train, num_train=setup.num_train, num_val=setup.num_val, seed=0, texture_cell=12,
            width=width, height=height, num_frames=num_frames, fps=setup.fps,
        )
        data["train_stores"] = tuple(
            str(pack_frames(load_manifest(train / f"{split}.csv"), train / f"{split}.store",
                            crop_size=setup.base.crop_size, progress=False).store)
            for split in ("train", "val")
        )
        data["seconds"]["train_data"] = time.perf_counter() - started
        data["train_disk_mib"] = {
            "mp4": sum(p.stat().st_size for p in train.glob("**/*.mp4")) / 2**20,
            "store": sum(p.stat().st_size for p in train.glob("*.store/**/*") if p.is_file()) / 2**20,
        }
    return data


def ensure(setup: Setup, data: dict[str, Any], what: str) -> Any:
    """Data only some sections read, made on first use (its time counts in that section):
    ``"mp4 gop12"``, ``"frames"`` (the GOP-250 videos extracted) or ``"train_frame_manifests"``."""
    root = Path(data["root"])
    manifests = data["loader_manifests"]
    if what == "mp4 gop12" and what not in manifests:
        manifests[what] = str(camera_videos(setup, root / "gop12", 12))
    elif what == "frames" and what not in manifests:
        manifests[what] = str(extract_frames(load_manifest(Path(manifests["mp4 gop250"])), root / "frames250",
                                             progress=False).manifest)
    elif what == "train_frame_manifests" and what not in data:
        train = Path(data["train_dir"])
        data[what] = tuple(
            str(extract_frames(load_manifest(train / f"{split}.csv"), train / "frames", progress=False).manifest)
            for split in ("train", "val")
        )
    return data[what] if what in data else manifests[what]


# ---------------------------------------------------------------------------- grids and the model


def benchmark_schedule(setup: Setup) -> MultigridSchedule:
    return build_schedule(
        MultigridConfig(base=setup.base, sampling_rate=setup.sampling_rate, max_epochs=100, milestones=(50, 80))
    )


def selected_grids(setup: Setup, schedule: MultigridSchedule) -> list[Grid]:
    grids = schedule_grids(schedule)
    return [g for g in grids if setup.grids is None or g.name.split()[0] in setup.grids]


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
    """Per grid, clips/s of ``backbone``'s training steps in each memory layout of ``layouts``
    (``True``: ``channels_last_3d``, model and input), the faster kept as ``model_clips_per_s``."""
    models = {channels_last: build_model(setup, channels_last, backbone) for channels_last in layouts}
    rows = []
    for grid in selected_grids(setup, schedule):
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


def consume(batch: dict[str, Any], device: str) -> int:
    """Put a batch's clips on the device as training would (decoding them there when encoded)."""
    video = batch["video"]
    if isinstance(video, EncodedBatch):
        out = decode_clips(video, device)
    else:
        out = video.to(device, non_blocking=True)
    if out.is_cuda:
        torch.cuda.synchronize()
    return int(out.shape[0])


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


def store_manifest(data: dict[str, Any]) -> Path:
    return Path(data["loader_manifests"]["store"])


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


def end_to_end(setup: Setup, data: dict[str, Any], source: str, decode_ahead: int = 1, backbone: str | None = None) -> dict[str, Any]:
    """Baseline and multigrid on the same data through ``benchmarks/train.py``'s ``run``; frames and stores are
    decoded on the device ``decode_ahead`` batches ahead of the step (0: between steps)."""
    backbone = backbone or setup.backbone
    args = argparse.Namespace(
        batch_size=setup.base.batch_size, num_frames=setup.base.num_frames, crop_size=setup.base.crop_size,
        sampling_rate=setup.sampling_rate, workers=setup.workers, num_views=1, width=8, lr=setup.lr,
        milestones=list(setup.milestones), warmup_epochs=min(3, setup.milestones[0] - 1), epochs=setup.epochs,
        accelerator="gpu" if setup.device == "cuda" else "cpu", precision=setup.precision,
    )
    encoded = {"frames": "train_frame_manifests", "store": "train_stores"}
    if source == "frames":
        ensure(setup, data, "train_frame_manifests")
    manifests = tuple(Path(p) for p in data[encoded[source]]) if source in encoded else None
    decode = "device" if source in encoded else "workers"
    results: dict[str, Any] = {"backbone": backbone, "source": source, "decode_ahead": decode_ahead}
    for name, multigrid in (("baseline", False), ("multigrid", True)):
        result = train_run(args, Path(data["train_dir"]), multigrid, None, backbone, manifests, decode, decode_ahead)  # type: ignore[arg-type]
        result["grid_rates"] = {f"{t}x{c}": r for (t, c), r in result["grid_rates"].items()}
        results[name] = result
        print(f"  {backbone} {source} {name}: {result['seconds']:.1f} s, {result['iterations']} iterations, "
              f"top-1 {result['top1']:.3f}, data wait {result['data_wait_share']:.0%}", flush=True)
    results["speedup"] = results["baseline"]["seconds"] / results["multigrid"]["seconds"]
    results["iteration_saving"] = results["baseline"]["iterations"] / max(results["multigrid"]["iterations"], 1)
    return results


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
    """``torch.compile`` (default mode; Dynamo marks a dimension dynamic when it changes): the first
    steps at each new grid (compile time included) and steady steps, against eager; grids that
    would start after ``deadline`` (``time.perf_counter()``) are left out."""
    if setup.device != "cuda":
        return [{"skipped": "compiling on CPU takes minutes; the GPU run measures it"}]
    import torch._dynamo

    for name in ("recompile_limit", "cache_size_limit"):  # the name changed across torch versions
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)  # about 12 shapes per multigrid run
    started = time.perf_counter()
    eager = build_model(setup)
    compiled = cast(torch.nn.Module, torch.compile(build_model(setup)))
    print(f"  compile: models built in {time.perf_counter() - started:.1f} s", flush=True)
    rows: list[dict[str, Any]] = []
    for grid in selected_grids(setup, schedule):
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
    env = report.get("env", {}) if isinstance(report.get("env"), dict) else {}
    lines = [f"# benchmarks/gpu.py on {env.get('gpu', 'CPU (--smoke)')}, {env.get('date', 'date not recorded')}", ""]
    lines.append("```\n" + json.dumps(env, indent=1, default=str) + "\n```")
    lines += _pace_table(report)
    lines += _stage_tables(report)
    lines += _nvjpeg_table(report)
    lines += _overlap_table(report, "overlap")
    lines += _end_to_end_tables(report)
    lines += _legacy_tables(report)
    for key in ("precision", "fsdp", "compile"):
        if key in report:
            lines += ["", f"`{key}`:", "```", json.dumps(report[key], indent=1, default=str)[:4000], "```"]
    not_run = {k: v.get("skipped") or v.get("error") for k, v in report.items()
               if isinstance(v, dict) and ("skipped" in v or "error" in v)}
    if not_run:
        lines += ["", "Not measured:", ""] + [f"- `{k}`: {why}" for k, why in not_run.items()]
    seconds = report.get("seconds", {})
    lines += ["", "Seconds per section: " + ", ".join(f"{k} {v:.0f}" for k, v in seconds.items())]
    return "\n".join(lines) + "\n"


def _rows(report: dict[str, Any], key: str) -> list[dict[str, Any]]:
    section = report.get(key, [])
    return [r for r in section if isinstance(r, dict) and "grid" in r] if isinstance(section, list) else []


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
    lines = ["", "| section | run | epochs | iterations | training s | top-1 | data wait | speed-up |",
             "|---|---|---|---|---|---|---|---|"]
    waits = []
    for key, result in runs.items():
        if "baseline" not in result:
            lines.append(f"| {key} | {result.get('error') or result.get('skipped')} |")
            continue
        for run in ("baseline", "multigrid"):
            r = result[run]
            speedup = f"{result['speedup']:.2f}x ({result['iteration_saving']:.2f}x fewer iterations)" if run == "multigrid" else ""
            lines.append(f"| {key} ({result['backbone']}) | {run} | {r['epochs']} | {r['iterations']} | {r['seconds']:.1f} | "
                         f"{r['top1']:.3f} | {r['data_wait_share']:.0%} | {speedup} |")
        waits += [(key, grid, w) for grid, w in result["multigrid"].get("data_wait_grids", {}).items()]
    if waits:
        lines += ["", "The multigrid runs' data-wait meter, per grid:", "",
                  "| section | grid | iterations timed | waiting |", "|---|---|---|---|"]
        lines += [f"| {key} | {grid} | {w['iterations']} | {w['share']:.0%} |" for key, grid, w in waits]
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
    return parser.parse_args(argv)


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
    setup = SMOKE if args.smoke else FULL
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
                report.section(name, section_work(name, setup, schedule, data, report), estimated_cost(name, report))
    text = markdown(report.data)
    (args.out / "gpu.md").write_text(text)
    print(text)
    return report.data


def estimated_cost(name: str, report: Report) -> float:
    """``COST_S[name]``; for the transformer's end-to-end runs, at least the r3d_18 runs' measured seconds
    times how much slower the transformer's base-grid step measured, so a slow model is skipped, not cut."""
    cost = float(COST_S[name])
    if name == "transformer:end_to_end" and "end_to_end:store" in report.data["seconds"]:
        rates = [{r["grid"]: r["model_clips_per_s"] for r in report.rows(key)}.get("base") for key in ("model", "transformer:model")]
        if all(rates):
            cost = max(cost, report.data["seconds"]["end_to_end:store"] * rates[0] / rates[1])
    return cost


def section_work(name: str, setup: Setup, schedule: MultigridSchedule, data: dict[str, Any], report: Report) -> Callable[[], Any]:
    """What section ``name`` runs."""
    sample = Path(data["loader_manifests"]["mp4 gop250"]).parent / "000.mp4"
    store_device = lambda: TrainVideoDataset(store_manifest(data), ReaderSettings(frame_decode="device"))  # noqa: E731
    work: dict[str, Callable[[], Any]] = {
        "env": lambda: environment(setup, sample),
        "model": lambda: model_table(setup, schedule, setup.backbone),
        "loader": lambda: loader_table(setup, schedule, data),
        "stages": lambda: stage_table(setup, schedule, data, report),
        "nvjpeg": lambda: nvjpeg_table(setup, report),
        "overlap": lambda: overlap_table(setup, schedule, store_device(), "store"),
        "end_to_end:store": lambda: end_to_end(setup, data, "store"),
        "transformer:model": lambda: model_table(setup, schedule, setup.transformer, layouts=(False,)),
        "transformer:end_to_end": lambda: end_to_end(setup, data, "store", backbone=setup.transformer),
        "decode": lambda: decode_table(setup, schedule, data),
        "read": lambda: read_table(setup, schedule, data),
        "loader:other": lambda: other_loader_table(setup, schedule, data, nvdec_usable(report)),
        "end_to_end:frames": lambda: end_to_end(setup, data, "frames"),
        "end_to_end:frames-serial": lambda: end_to_end(setup, data, "frames", decode_ahead=0),
        "end_to_end:mp4": lambda: end_to_end(setup, data, "mp4"),
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
