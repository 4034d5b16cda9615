"""``benchmarks/gpu.py``'s decode sections: the device JPEG decode in Gpx/s (``nvjpeg``), the decode of the
next batch overlapping the step (``overlap``), and the per-clip against the batched crop-resize (``decode``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import numpy as np
import torch
from bench_data import render_camera_video, store_manifest
from gpu_loader import host_batches, jpeg_tensors
from gpu_model import bn_plan, build_model, training_step
from grids import selected_grids
from harness import Report, Setup, grid_rows, repeat_rate, synchronize

from lightning_multigrid.data.dataset import TrainVideoDataset
from lightning_multigrid.data.decoding.device import (
    crop_resize_flip,
    crop_resize_flip_per_clip,
    decode_jpegs,
    jpeg_decoder,
)
from lightning_multigrid.data.prefetch import DecodeAhead
from lightning_multigrid.data.reader_settings import ReaderSettings
from lightning_multigrid.data.transfer import BatchTransfer, normalize_video
from lightning_multigrid.schedule import MultigridSchedule

# The best public batched nvjpeg figure the issue compares with (one A100).
PUBLIC_NVJPEG_GPX_S = 2.9


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
        images_per_s = repeat_rate(lambda b: len(decode_jpegs(b, device)), [batch], setup)
        rows.append({"size": f"{width}x{height}", "batch": setup.nvjpeg_batch, "images_per_s": images_per_s,
                     "gpx_per_s": images_per_s * width * height / 1e9})
        print(f"  nvjpeg {width}x{height}: {rows[-1]['gpx_per_s']:.2f} Gpx/s", flush=True)
    per_grid = [{"grid": r["grid"], "gpx_per_s": r["device"]["nvjpeg_gpx_per_s"],
                 "pixels_per_frame": r["device"]["decoded_pixels_per_frame"]} for r in report.rows("stages")]
    best = max([r["gpx_per_s"] for r in rows + per_grid], default=0.0)
    return {"decoder": jpeg_decoder(), "batched": rows, "store_per_grid": per_grid, "best_gpx_per_s": best,
            "public_gpx_per_s": PUBLIC_NVJPEG_GPX_S, "public": "about 2.9 Gpx/s batched on one A100 (issue 32)",
            "best_over_public": best / PUBLIC_NVJPEG_GPX_S}


def overlap_table(setup: Setup, schedule: MultigridSchedule, dataset: TrainVideoDataset, source: str) -> list[dict[str, Any]]:
    """Per grid (coarsest and base): ms per iteration of the training step alone on a decoded batch, of the
    decode then the step in one thread, and of the decode one batch ahead in ``DecodeAhead``'s thread (its
    own stream) while the step runs; ``inflation`` is overlapped over alone."""
    rows = []
    for grid in [g for g in selected_grids(schedule, setup.grids) if g.name in ("coarsest", "base")]:
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


def decode_table(setup: Setup, schedule: MultigridSchedule, data: dict[str, Any]) -> list[dict[str, Any]]:
    """Per grid, store batches already read: clips/s of the whole device decode (JPEG + crop-resize) and of
    the crop-resize alone, with the per-clip resize loop and with the one batched crop-resize."""
    dataset = TrainVideoDataset(store_manifest(data), ReaderSettings(frame_decode="device"))
    rows = []
    for grid in selected_grids(schedule, setup.grids):
        rows.append({"source": "store", "grid": grid.name, **decode_rates(setup, host_batches(dataset, grid, setup))})
        print(f"  decode store {grid.name}: {rows[-1]}", flush=True)
    return rows


def decode_rates(setup: Setup, batches: list[dict[str, Any]]) -> dict[str, float]:
    clips = [b["video"].clips for b in batches]
    images = [decode_jpegs(jpeg_tensors(c), setup.device) for c in clips]
    rates = {}
    for method, resize in (("per_clip", crop_resize_flip_per_clip), ("batched", crop_resize_flip)):
        rates[f"decode_{method}_clips_per_s"] = repeat_rate(
            lambda c, resize=resize: int(resize(decode_jpegs(jpeg_tensors(c), setup.device), c).shape[0]), clips, setup
        )
        rates[f"resize_{method}_clips_per_s"] = repeat_rate(
            lambda k, resize=resize: int(resize(images[k], clips[k]).shape[0]), list(range(len(clips))), setup
        )
    return rates


# ---------------------------------------------------------------------------- Markdown


def markdown_nvjpeg(report: dict[str, Any]) -> list[str]:
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


def markdown_overlap(report: dict[str, Any]) -> list[str]:
    rows = grid_rows(report, "overlap")
    if not rows:
        return []
    lines = ["", "| source | grid | step alone ms | decode then step ms | overlapped ms | inflation |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['source']} | {r['grid']} | {r['step_alone_ms']:.1f} | {r['decode_then_step_ms']:.1f} | "
              f"{r['overlapped_ms']:.1f} | {r['inflation']:.2f}x |" for r in rows]
    return lines


def markdown_decode(report: dict[str, Any]) -> list[str]:
    """The per-clip against the batched crop-resize (``decode``)."""
    rows = grid_rows(report, "decode")
    if not rows:
        return []
    lines = ["", "| source | grid | decode, per-clip resize | decode, batched | resize alone, per clip | resize alone, batched |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['source']} | {r['grid']} | {r['decode_per_clip_clips_per_s']:.0f} | {r['decode_batched_clips_per_s']:.0f} | "
              f"{r['resize_per_clip_clips_per_s']:.0f} | {r['resize_batched_clips_per_s']:.0f} |" for r in rows]
    return lines
