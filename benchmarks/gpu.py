"""The GPU story in one command: does the loader feed the model at every grid, and does multigrid pay?

Sized to end within 9 minutes on a 16-core single-GPU machine. It makes its own data, then
measures, for r3d_18 at base 8 x 16 x 112 (stride 4), bf16-mixed, 14 workers:

1. ``env``: torch, CUDA, the GPU, which library decodes JPEG on the device (torchcodec or
   torchvision), and whether torchcodec decodes mp4 with NVDEC (and does not fall back to the CPU).
2. ``model``: clips/s the model consumes at each grid (training steps on batches already on the
   GPU, MultigridBatchNorm split as multigrid splits it).
3. ``loader``: clips/s the loader delivers at each grid, from each source, through a
   ``ChunkedDataLoader`` as training builds it, batches moved to the GPU (and decoded there for
   ``frames device``) before the clock reads: mp4 GOP 250 and GOP 12 (PyAV in workers), JPEG frames
   decoded in workers (Pillow, reduced size), JPEG frames decoded on the device, and mp4 decoded
   with NVDEC in the main process when torchcodec can. Set beside ``model``, it says grid by grid
   whether the loader or the GPU sets the pace.
4. ``end_to_end``: baseline against multigrid (``benchmarks/train.py``'s runs: same data, seed,
   optimizer and step LR schedule; validation once after training, not timed), for frames decoded
   on the device and for mp4: training wall-clock, iterations, top-1 and the share of the loop's
   time spent waiting for data.
5. ``read``, ``decode``, ``overlap``: the device-decode path stage by stage, per JPEG source
   (``encoded_sources``: frame folders and the same frames packed into a store, level 0 at the grids'
   largest short side; each source one line there): the workers reading the sampled
   JPEG bytes (clips/s and frames/s, nothing decoded); decoding batches already read, with the
   per-clip resize loop against the one batched crop-resize-flip (whole decode, and the
   crop-resize alone); and per grid the training step alone, the decode then the step in the
   training thread (``decode_ahead=0``), and the decode overlapped with the step
   (``data/prefetch.py``, a side stream), with the overlapped step's inflation over the step alone.
   ``end_to_end:frames-serial`` is ``end_to_end:frames`` with the serial decode, for the same comparison
   in a whole run; ``end_to_end:store`` trains from the training frames packed into stores.
6. ``gpu_path``: ``16-mixed`` and ``channels_last_3d`` steps; Lightning's ``strategy="fsdp"`` on one
   device with ``MultigridCallback`` (MultigridBatchNorm inside FSDP); ``torch.compile`` across the
   grids (compile time of each new shape, step time against eager).

Data: Kinetics-like synthetic videos (340x256, 10 s at 30 fps, x264 veryfast): for the loader,
camera-like footage (``loader.py``'s) at GOP 250 and GOP 12, and frames extracted from the GOP-250
set with ``extract_frames``; for training, the built-in synthetic classes (motion x texture, texture
cell 12 px, visible on every grid, so both runs can learn) and their extracted frames.

Results go to ``--out/gpu.json`` after every section (a run cut short still reports) and to
``--out/gpu.md`` at the end. Sections past ``--budget-s`` are skipped and say so.

    python benchmarks/gpu.py --out gpu-results            # on the GPU machine
    python benchmarks/gpu.py --smoke --out /tmp/smoke      # the same code on CPU, tiny sizes, < 1 minute
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
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

from loader import Grid, render_camera_video, requests_for, schedule_grids  # noqa: E402
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


@dataclass(frozen=True)
class Setup:
    """Every size the run uses; ``--smoke`` swaps in tiny ones."""

    device: str
    backbone: str
    precision: str
    base: GridShape
    sampling_rate: int
    workers: int
    video_size: tuple[int, int]
    video_seconds: float
    fps: float
    loader_videos: int
    loader_seconds: float
    num_train: int
    num_val: int
    epochs: int
    milestones: tuple[int, ...]
    lr: float
    grids: tuple[str, ...] | None  # None: every grid
    model_steps: int


FULL = Setup(
    device="cuda", backbone="r3d_18", precision="bf16-mixed", base=GridShape(8, 16, 112), sampling_rate=4, workers=14,
    video_size=(340, 256), video_seconds=10.0, fps=30.0, loader_videos=16, loader_seconds=1.5, num_train=480,
    num_val=96, epochs=24, milestones=(18, 21), lr=0.0125, grids=None, model_steps=20,
)
SMOKE = Setup(
    device="cpu", backbone="tiny", precision="32-true", base=GridShape(4, 8, 32), sampling_rate=2, workers=2,
    video_size=(64, 48), video_seconds=2.0, fps=12.0, loader_videos=3, loader_seconds=0.2, num_train=16,
    num_val=8, epochs=3, milestones=(2,), lr=0.0125, grids=("coarsest", "base"), model_steps=2,
)


class Report:
    """The results so far; written to ``gpu.json`` after every section."""

    def __init__(self, out: Path, budget_s: float) -> None:
        self.out, self.budget_s, self.start = out, budget_s, time.perf_counter()
        self.data: dict[str, Any] = {}
        out.mkdir(parents=True, exist_ok=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def section(self, name: str, work: Callable[[], Any], optional: bool = False) -> Any:
        """Run one section, keep its result or its error; skip an optional one past the budget."""
        if optional and self.elapsed() > self.budget_s:
            self.data[name] = {"skipped": f"time budget: {self.elapsed():.0f} s of {self.budget_s:.0f} s used"}
        else:
            started = time.perf_counter()
            try:
                self.data[name] = work()
            except Exception as error:  # one broken section must not cost the others' figures
                self.data[name] = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()[-3000:]}
            print(f"[{self.elapsed():5.0f} s] {name} done in {time.perf_counter() - started:.0f} s", flush=True)
        (self.out / "gpu.json").write_text(json.dumps(self.data, indent=1, default=str))
        return self.data[name]


# ---------------------------------------------------------------------------- environment


def environment(setup: Setup, sample_mp4: Path) -> dict[str, Any]:
    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda, "cpu_cores": os.cpu_count()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
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


def make_data(setup: Setup, root: Path, sections: set[str]) -> dict[str, Any]:
    """Loader sources (GOP 250 and 12, and frames) and the training dataset (videos and frames),
    each only when a selected section reads it."""
    width, height = setup.video_size
    num_frames = round(setup.video_seconds * setup.fps)
    data: dict[str, Any] = {"description": f"{width}x{height}, {setup.video_seconds:g} s at {setup.fps:g} fps",
                            "seconds": {}, "train_dir": str(root / "train")}
    started = time.perf_counter()
    manifests: dict[str, Path] = {}
    with ProcessPoolExecutor() as pool:
        jobs = []
        for gop in (250, 12):
            folder = root / f"gop{gop}"
            folder.mkdir(parents=True)
            for i in range(setup.loader_videos):
                jobs.append(pool.submit(_camera_video, folder / f"{i:03d}.mp4", width, height, num_frames, setup.fps, gop, i))
            (folder / "train.csv").write_text("".join(f"{i:03d}.mp4 0\n" for i in range(setup.loader_videos)))
            manifests[f"mp4 gop{gop}"] = folder / "train.csv"
        for job in jobs:
            job.result()
    manifests["frames"] = extract_frames(load_manifest(manifests["mp4 gop250"]), root / "frames250", progress=False).manifest
    # The same frames packed, level 0 at the grids' largest short side (160 for a 112 crop).
    manifests["store"] = pack_frames(load_manifest(manifests["frames"]), root / "frames250.store",
                                     crop_size=setup.base.crop_size, progress=False).store
    data["loader_manifests"] = {k: str(v) for k, v in manifests.items()}
    data["seconds"]["loader_data"] = time.perf_counter() - started
    if any(name.startswith("end_to_end") for name in sections):
        started = time.perf_counter()
        generate_synthetic_dataset(
            root / "train", num_train=setup.num_train, num_val=setup.num_val, seed=0, texture_cell=12,
            width=width, height=height, num_frames=num_frames, fps=setup.fps,
        )
        data["train_frame_manifests"] = tuple(
            str(extract_frames(load_manifest(root / "train" / f"{split}.csv"), root / "train" / "frames",
                               progress=False).manifest)
            for split in ("train", "val")
        )
        data["train_stores"] = tuple(
            str(pack_frames(load_manifest(path), root / "train" / f"{Path(path).stem}.store",
                            crop_size=setup.base.crop_size, progress=False).store)
            for path in data["train_frame_manifests"]
        )
        data["seconds"]["train_data"] = time.perf_counter() - started
        data["train_disk_mib"] = {
            "mp4": sum(p.stat().st_size for p in (root / "train").rglob("*.mp4")) / 2**20,
            "jpeg": sum(p.stat().st_size for p in (root / "train" / "frames").rglob("*.jpg")) / 2**20,
        }
    return data


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


def build_model(setup: Setup, channels_last: bool = False) -> torch.nn.Module:
    model = VideoClassifier(num_classes=4, backbone=setup.backbone, tiny_width=8, dropout_rate=0.0)
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


def model_table(setup: Setup, schedule: MultigridSchedule) -> list[dict[str, Any]]:
    model = build_model(setup)
    rows = []
    for grid in selected_grids(setup, schedule):
        plan = bn_plan(schedule, grid.shape)
        rate = step_rate(model, setup, grid.shape, plan, setup.precision, setup.model_steps)
        rows.append({"grid": grid.name, "shape": list(asdict(grid.shape).values()), "bn": plan.to_dict(),
                     "model_clips_per_s": rate})
        print(f"  model {grid.name}: {rate:.0f} clips/s", flush=True)
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


def loader_rate(dataset: Any, grid: Grid, setup: Setup, num_videos: int, decode: bool = True) -> float:
    """Clips/s delivered after two warm-up batches, over at least ``loader_seconds`` and 3 batches
    (``decode=False``: as the workers hand them over, encoded clips left encoded)."""
    loader = ChunkedDataLoader(
        dataset, batch_sampler=requests_for(grid, num_videos, seed=0), min_chunk_size=setup.base.batch_size,
        num_workers=setup.workers, collate_fn=collate_clips, pin_memory=setup.device == "cuda",
    )
    batches = iter(loader)

    def take() -> int:
        batch = next(batches)
        return consume(batch, setup.device) if decode else len(batch["label"])

    for _ in range(2):
        take()
    start, clips, count = time.perf_counter(), 0, 0
    while True:
        clips += take()
        count += 1
        elapsed = time.perf_counter() - start
        if elapsed >= setup.loader_seconds and count >= 3:
            del batches, loader
            return clips / elapsed


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


def loader_sources(setup: Setup, data: dict[str, Any], nvdec: bool) -> dict[str, Any]:
    manifests = {k: Path(v) for k, v in data["loader_manifests"].items()}
    sources: dict[str, Any] = {
        "mp4 gop250 (workers)": TrainVideoDataset(manifests["mp4 gop250"]),
        "mp4 gop12 (workers)": TrainVideoDataset(manifests["mp4 gop12"]),
        "frames (workers)": TrainVideoDataset(manifests["frames"]),
        # Decoded on `setup.device`: the GPU, or the CPU in --smoke.
        "frames (device decode)": TrainVideoDataset(manifests["frames"], ReaderSettings(frame_decode="device")),
    }
    if nvdec:
        sources["mp4 gop12 (NVDEC, main process)"] = NvdecClips(manifests["mp4 gop12"])
    return sources


def loader_table(setup: Setup, schedule: MultigridSchedule, data: dict[str, Any], nvdec: bool) -> list[dict[str, Any]]:
    rows = []
    sources = loader_sources(setup, data, nvdec)
    for grid, (name, dataset) in itertools.product(selected_grids(setup, schedule), sources.items()):
        if isinstance(dataset, NvdecClips):
            rate = dataset.batch_rate(grid, setup.loader_seconds)
        else:
            rate = loader_rate(dataset, grid, setup, setup.loader_videos)
        rows.append({"grid": grid.name, "source": name, "loader_clips_per_s": rate})
        print(f"  loader {grid.name} {name}: {rate:.0f} clips/s", flush=True)
    return rows


def stage_table(setup: Setup, schedule: MultigridSchedule, data: dict[str, Any]) -> list[dict[str, Any]]:
    """Each stage of the frame loader alone, per grid: the workers reading the sampled JPEG files
    (bytes only), the device decoding batches already read (nvjpeg, resize, crop, flip), and the
    host-to-device copy of a batch the workers decoded (uint8, pinned). The model's step is ``model``."""
    manifest = Path(data["loader_manifests"]["frames"])
    encoded = TrainVideoDataset(manifest, ReaderSettings(frame_decode="device"))
    rows = []
    for grid in selected_grids(setup, schedule):
        read = loader_rate(encoded, grid, setup, setup.loader_videos, decode=False)
        batches = [collate_clips([encoded[r] for r in requests])
                   for requests in itertools.islice(requests_for(grid, setup.loader_videos, seed=1), 3)]
        decode = _repeat_rate(lambda b: consume(b, setup.device), batches, setup)
        shape = grid.shape
        host = torch.zeros(shape.batch_size, 3, shape.num_frames, shape.crop_size, shape.crop_size, dtype=torch.uint8)
        pinned = [{"video": host.pin_memory() if setup.device == "cuda" else host}]
        transfer = _repeat_rate(lambda b: consume(b, setup.device), pinned, setup)
        rows.append({"grid": grid.name, "read_clips_per_s": read, "device_decode_clips_per_s": decode,
                     "transfer_clips_per_s": transfer})
        print(f"  stages {grid.name}: read {read:.0f}, decode {decode:.0f}, transfer {transfer:.0f} clips/s", flush=True)
    return rows


def _repeat_rate(work: Callable[[Any], int], batches: list[Any], setup: Setup) -> float:
    """Clips/s of ``work`` over ``batches`` cycled for ``loader_seconds`` after one warm-up pass."""
    for batch in batches:
        work(batch)
    start, clips = time.perf_counter(), 0
    for batch in itertools.cycle(batches):
        clips += work(batch)
        if time.perf_counter() - start >= setup.loader_seconds:
            return clips / (time.perf_counter() - start)
    raise AssertionError("itertools.cycle is endless")


# ---------------------------------------------------------------------------- the device path, stage by stage


def encoded_sources(data: dict[str, Any]) -> dict[str, TrainVideoDataset]:
    """The JPEG sources of ``read``, ``decode`` and ``overlap``: datasets whose workers return bytes
    (``frame_decode="device"``), same videos. A new source (a packed store) is one more line."""
    return {
        "frames": TrainVideoDataset(Path(data["loader_manifests"]["frames"]), ReaderSettings(frame_decode="device")),
        "store": TrainVideoDataset(Path(data["loader_manifests"]["store"]), ReaderSettings(frame_decode="device")),
    }


def host_batches(dataset: TrainVideoDataset, grid: Grid, setup: Setup, count: int = 3) -> list[dict[str, Any]]:
    """``count`` batches of ``grid`` as the workers hand them over (JPEG bytes), read in this process."""
    return [collate_clips([dataset[r] for r in requests])
            for requests in itertools.islice(requests_for(grid, setup.loader_videos, seed=1), count)]


def read_table(setup: Setup, schedule: MultigridSchedule, data: dict[str, Any]) -> list[dict[str, Any]]:
    """Per source and grid: clips/s and frames/s the workers read (JPEG bytes, nothing decoded)."""
    rows = []
    for (name, dataset), grid in itertools.product(encoded_sources(data).items(), selected_grids(setup, schedule)):
        rate = loader_rate(dataset, grid, setup, setup.loader_videos, decode=False)
        rows.append({"source": name, "grid": grid.name, "read_clips_per_s": rate,
                     "read_frames_per_s": rate * grid.shape.num_frames})
        print(f"  read {name} {grid.name}: {rate:.0f} clips/s", flush=True)
    return rows


def decode_table(setup: Setup, schedule: MultigridSchedule, data: dict[str, Any]) -> list[dict[str, Any]]:
    """Per source and grid, batches already read: clips/s of the whole device decode (JPEG + crop-resize)
    and of the crop-resize alone, with the per-clip resize loop and with the one batched crop-resize."""
    rows = []
    for (name, dataset), grid in itertools.product(encoded_sources(data).items(), selected_grids(setup, schedule)):
        rows.append({"source": name, "grid": grid.name, **decode_rates(setup, host_batches(dataset, grid, setup))})
        print(f"  decode {name} {grid.name}: {rows[-1]}", flush=True)
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


def jpeg_tensors(clips: list[Any]) -> list[torch.Tensor]:
    return [torch.frombuffer(jpeg, dtype=torch.uint8) for clip in clips for jpeg in clip.jpegs]


def overlap_table(setup: Setup, schedule: MultigridSchedule, data: dict[str, Any]) -> list[dict[str, Any]]:
    """Per grid (coarsest and base, first source): ms per iteration of the training step alone on a
    decoded batch, of the decode then the step in one thread, and of the decode one batch ahead in
    ``DecodeAhead``'s thread (its own stream) while the step runs; ``inflation`` is overlapped over alone."""
    name, dataset = next(iter(encoded_sources(data).items()))
    rows = []
    for grid in [g for g in selected_grids(setup, schedule) if g.name in ("coarsest", "base")]:
        step = training_step(build_model(setup), setup, bn_plan(schedule, grid.shape), setup.precision)
        rows.append({"source": name, "grid": grid.name, **overlap_times(setup, step, host_batches(dataset, grid, setup))})
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


def end_to_end(setup: Setup, data: dict[str, Any], source: str, decode_ahead: int = 1) -> dict[str, Any]:
    """Baseline and multigrid on the same data through ``benchmarks/train.py``'s ``run``; frames are
    decoded on the device ``decode_ahead`` batches ahead of the step (0: between steps)."""
    args = argparse.Namespace(
        batch_size=setup.base.batch_size, num_frames=setup.base.num_frames, crop_size=setup.base.crop_size,
        sampling_rate=setup.sampling_rate, workers=setup.workers, num_views=1, width=8, lr=setup.lr,
        milestones=list(setup.milestones), warmup_epochs=min(3, setup.milestones[0] - 1), epochs=setup.epochs,
        accelerator="gpu" if setup.device == "cuda" else "cpu", precision=setup.precision,
    )
    data_dir = Path(data["train_dir"])
    encoded = {"frames": "train_frame_manifests", "store": "train_stores"}
    manifests = tuple(Path(p) for p in data[encoded[source]]) if source in encoded else None
    decode = "device" if source in encoded else "workers"
    results = {}
    for name, multigrid in (("baseline", False), ("multigrid", True)):
        result = train_run(args, data_dir, multigrid, None, setup.backbone, manifests, decode, decode_ahead)  # type: ignore[arg-type]
        result["grid_rates"] = {f"{t}x{c}": r for (t, c), r in result["grid_rates"].items()}
        results[name] = result
        print(f"  {source} {name}: {result['seconds']:.1f} s, {result['iterations']} iterations, "
              f"top-1 {result['top1']:.3f}, data wait {result['data_wait_share']:.0%}", flush=True)
    results["speedup"] = results["baseline"]["seconds"] / results["multigrid"]["seconds"]
    return results


# ---------------------------------------------------------------------------- the rest of the GPU path


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
    lines = [f"# benchmarks/gpu.py on {report.get('env', {}).get('gpu', 'CPU (--smoke)')}", ""]
    lines.append("```\n" + json.dumps(report.get("env", {}), indent=1) + "\n```\n")
    lines += _pace_table(report)
    stages = [r for r in report.get("stages", []) if isinstance(r, dict) and "grid" in r]
    if stages:
        lines += ["", "| grid | frames: workers read (bytes) | device decode | transfer (uint8, pinned) |", "|---|---|---|---|"]
        lines += [f"| {r['grid']} | {r['read_clips_per_s']:.0f} | {r['device_decode_clips_per_s']:.0f} | "
                  f"{r['transfer_clips_per_s']:.0f} |" for r in stages]
    lines += _device_path_tables(report)
    e2e = {k: v for k, v in report.items() if k.startswith("end_to_end")}
    if e2e:
        lines += ["", "| source | run | epochs | iterations | training s | top-1 | data wait | speed-up |",
                  "|---|---|---|---|---|---|---|---|"]
        for key, result in e2e.items():
            if "baseline" not in result:
                lines.append(f"| {key.split(':')[1]} | {result.get('error') or result.get('skipped')} |")
                continue
            for run in ("baseline", "multigrid"):
                r = result[run]
                speedup = f"{result['speedup']:.2f}x" if run == "multigrid" else ""
                lines.append(f"| {key.split(':')[1]} | {run} | {r['epochs']} | {r['iterations']} | {r['seconds']:.1f} | "
                             f"{r['top1']:.3f} | {r['data_wait_share']:.0%} | {speedup} |")
    for key in ("gpu_path:precision", "gpu_path:fsdp", "gpu_path:compile"):
        if key in report:
            lines += ["", f"`{key}`:", "```", json.dumps(report[key], indent=1, default=str)[:4000], "```"]
    return "\n".join(lines) + "\n"


def _device_path_tables(report: dict[str, Any]) -> list[str]:
    """``read``, ``decode`` and ``overlap`` as tables (clips/s; ms per iteration)."""
    def rows(key: str) -> list[dict[str, Any]]:
        section = report.get(key, [])
        return [r for r in section if isinstance(r, dict) and "grid" in r] if isinstance(section, list) else []

    lines: list[str] = []
    read, decode, overlap = rows("device_path:read"), rows("device_path:decode"), rows("device_path:overlap")
    if read:
        lines += ["", "| source | grid | read clips/s | read frames/s |", "|---|---|---|---|"]
        lines += [f"| {r['source']} | {r['grid']} | {r['read_clips_per_s']:.0f} | {r['read_frames_per_s']:.0f} |" for r in read]
    if decode:
        lines += ["", "| source | grid | decode, per-clip resize | decode, batched | resize alone, per clip | resize alone, batched |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {r['source']} | {r['grid']} | {r['decode_per_clip_clips_per_s']:.0f} | {r['decode_batched_clips_per_s']:.0f} | "
                  f"{r['resize_per_clip_clips_per_s']:.0f} | {r['resize_batched_clips_per_s']:.0f} |" for r in decode]
    if overlap:
        lines += ["", "| source | grid | step alone ms | decode then step ms | overlapped ms | inflation |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {r['source']} | {r['grid']} | {r['step_alone_ms']:.1f} | {r['decode_then_step_ms']:.1f} | "
                  f"{r['overlapped_ms']:.1f} | {r['inflation']:.2f}x |" for r in overlap]
    return lines


def _pace_table(report: dict[str, Any]) -> list[str]:
    """Per grid: what the model consumes beside what each source delivers, and which sets the pace."""
    model = {r["grid"]: r for r in report.get("model", []) if isinstance(r, dict) and "grid" in r}
    loader = [r for r in report.get("loader", []) if isinstance(r, dict) and "grid" in r]
    if not model or not loader:
        return []
    sources = list(dict.fromkeys(r["source"] for r in loader))
    lines = ["| grid (batch x frames x crop) | model consumes | " + " | ".join(sources) + " |",
             "|---|---|" + "---|" * len(sources)]
    for grid, row in model.items():
        cells = []
        for source in sources:
            rate = next((r["loader_clips_per_s"] for r in loader if r["grid"] == grid and r["source"] == source), None)
            if rate is None:
                cells.append("-")
            else:
                cells.append(f"{rate:.0f} ({'keeps up' if rate >= row['model_clips_per_s'] else 'loader-bound'})")
        shape = " x ".join(str(v) for v in row["shape"])
        lines.append(f"| {grid} ({shape}) | {row['model_clips_per_s']:.0f} | " + " | ".join(cells) + " |")
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu.json and gpu.md")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on CPU: checks the script, measures nothing")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="skip the optional sections after this many seconds (default 420; 60 with --smoke)")
    parser.add_argument("--data", type=Path, help="work folder for the generated data (default: a temporary one)")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated, in this order: {','.join(SECTIONS)} (default: all)")
    return parser.parse_args(argv)


SECTIONS = (
    "env", "model", "read", "decode", "overlap", "end_to_end:frames", "end_to_end:frames-serial", "end_to_end:store",
    "loader", "stages",
    "end_to_end:mp4", "precision", "fsdp", "compile",
)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    setup = SMOKE if args.smoke else FULL
    if setup.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu.py needs CUDA; `--smoke` runs the same code on CPU with tiny sizes.")
    sections = set(args.sections.split(","))
    if sections - set(SECTIONS):
        raise SystemExit(f"--sections: unknown {sorted(sections - set(SECTIONS))}; choose from {', '.join(SECTIONS)}")
    report = Report(args.out, args.budget_s or (60.0 if args.smoke else 420.0))
    schedule = benchmark_schedule(setup)
    with tempfile.TemporaryDirectory() as scratch:
        root = args.data or Path(scratch)
        data = report.section("data", lambda: make_data(setup, root, sections))
        if "error" in data:
            raise SystemExit(f"making the data failed:\n{data['traceback']}")
        sample = Path(data["loader_manifests"]["mp4 gop12"]).parent / "000.mp4"
        work: dict[str, tuple[str, Callable[[], Any], bool]] = {
            "env": ("env", lambda: environment(setup, sample), False),
            "model": ("model", lambda: model_table(setup, schedule), False),
            "read": ("device_path:read", lambda: read_table(setup, schedule, data), False),
            "decode": ("device_path:decode", lambda: decode_table(setup, schedule, data), False),
            "overlap": ("device_path:overlap", lambda: overlap_table(setup, schedule, data), False),
            "end_to_end:frames": ("end_to_end:frames (device decode)", lambda: end_to_end(setup, data, "frames"), False),
            "end_to_end:frames-serial": ("end_to_end:frames (device decode, serial)",
                                         lambda: end_to_end(setup, data, "frames", decode_ahead=0), False),
            "end_to_end:store": ("end_to_end:store (device decode)", lambda: end_to_end(setup, data, "store"), False),
            "loader": ("loader", lambda: loader_table(setup, schedule, data, nvdec_usable(report)), False),
            "stages": ("stages", lambda: stage_table(setup, schedule, data), False),
            "end_to_end:mp4": ("end_to_end:mp4 (workers)", lambda: end_to_end(setup, data, "mp4"), False),
            "precision": ("gpu_path:precision", lambda: precision_and_layout(setup, schedule), True),
            "fsdp": ("gpu_path:fsdp", lambda: fsdp_fit(setup, data), True),
            "compile": ("gpu_path:compile",
                        lambda: compile_table(setup, schedule, report.start + report.budget_s + 90), True),
        }
        for name in SECTIONS:
            if name in sections:
                key, run, optional = work[name]
                report.section(key, run, optional)
    text = markdown(report.data)
    (args.out / "gpu.md").write_text(text)
    print(text)
    return report.data


def nvdec_usable(report: Report) -> bool:
    env = report.data.get("env", {})
    return bool(isinstance(env, dict) and env.get("nvdec", {}).get("usable", False))


if __name__ == "__main__":
    main()
