"""What the benchmarks share: the run's sizes, the time budget and the report, timing on the device and
finishing a batch as training would, the machine's description, and the report's generic Markdown parts.

A sibling module of the benchmark scripts: a script run as ``python benchmarks/gpu.py`` has
``benchmarks/`` first on ``sys.path``, so ``import harness`` needs no path manipulation.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import itertools
import json
import os
import platform
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lightning_multigrid.data.decoding.device import EncodedBatch, decode_clips, jpeg_decoder
from lightning_multigrid.schedule import GridShape


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
    transformer_epochs: int  # the transformer's end-to-end pair: fewer epochs, to fit the budget
    transformer_milestones: tuple[int, ...]
    lr: float
    grids: tuple[str, ...] | None  # the loader and stage sections' grids (None: every one); the model measures all
    model_steps: int
    sizing_repeats: int  # timed steps per grid of the ``batch_sizing`` section
    cost_scale: float  # COST_S (full sizes) times this is a section's estimated cost


def process_age_s() -> float:
    """Seconds since this process started (imports included); 0 where ``/proc`` does not say."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return max(0.0, float(Path("/proc/uptime").read_text().split()[0]) - started)
    except (OSError, ValueError, IndexError):
        return 0.0


class Report:
    """The results so far, written to ``out/name.json`` after every section; sections run within a budget
    counted from the process start."""

    def __init__(self, out: Path, budget_s: float, cost_scale: float, name: str = "gpu") -> None:
        self.out, self.budget_s, self.cost_scale, self.name = out, budget_s, cost_scale, name
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
        (self.out / f"{self.name}.json").write_text(json.dumps(self.data, indent=1, default=str))
        return self.data[name]

    def rows(self, name: str) -> list[dict[str, Any]]:
        """A section's rows that hold a grid (none when it failed or was skipped)."""
        return grid_rows(self.data, name)


def grid_rows(report: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """The rows of section ``key`` that hold a grid (none when it failed or was skipped)."""
    section = report.get(key, [])
    return [r for r in section if isinstance(r, dict) and "grid" in r] if isinstance(section, list) else []


# ---------------------------------------------------------------------------- timing


def synchronize(setup: Setup) -> None:
    if setup.device == "cuda":
        torch.cuda.synchronize()


def repeat_rate(work: Callable[[Any], int], items: list[Any], setup: Setup) -> float:
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


def consume(batch: dict[str, Any], device: str | None) -> int:
    """Finish a batch as training would and return its clips: encoded clips decoded on ``device`` (the CPU
    when ``None``), decoded ones moved to ``device`` (left on the host when ``None``), the GPU synchronised."""
    video = batch["video"]
    if isinstance(video, EncodedBatch):
        out = decode_clips(video, device or "cpu")
    else:
        out = video[0] if isinstance(video, list) else video
        if device is not None:
            out = out.to(device, non_blocking=True)
    if out.is_cuda:
        torch.cuda.synchronize()
    return int(out.shape[0])


# ---------------------------------------------------------------------------- the machine


def environment(device: str, sample_mp4: Path) -> dict[str, Any]:
    """The machine, the date and the versions; which library decodes JPEG on the device; whether NVDEC decodes mp4."""
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
    info["nvdec"] = nvdec_probe(sample_mp4, device)
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


# ---------------------------------------------------------------------------- Markdown


def markdown_head(report: dict[str, Any], title: str) -> list[str]:
    """The title (the GPU, or CPU) and the environment as a JSON block."""
    env = report.get("env", {}) if isinstance(report.get("env"), dict) else {}
    lines = [f"# {title} on {env.get('gpu', 'CPU (--smoke)')}, {env.get('date', 'date not recorded')}", ""]
    return lines + ["```\n" + json.dumps(env, indent=1, default=str) + "\n```"]


def markdown_json(report: dict[str, Any], keys: tuple[str, ...]) -> list[str]:
    """Sections without a table of their own, as JSON blocks (cut at 4000 characters)."""
    lines: list[str] = []
    for key in keys:
        if key in report:
            lines += ["", f"`{key}`:", "```", json.dumps(report[key], indent=1, default=str)[:4000], "```"]
    return lines


def markdown_tail(report: dict[str, Any]) -> list[str]:
    """What was not measured (skipped for time, or failed) and the seconds each section took."""
    not_run = {k: v.get("skipped") or v.get("error") for k, v in report.items()
               if isinstance(v, dict) and ("skipped" in v or "error" in v)}
    lines = ["", "Not measured:", ""] + [f"- `{k}`: {why}" for k, why in not_run.items()] if not_run else []
    seconds = report.get("seconds", {})
    return lines + ["", "Seconds per section: " + ", ".join(f"{k} {v:.0f}" for k, v in seconds.items())]
