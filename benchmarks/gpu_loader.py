"""``benchmarks/gpu.py``'s loader sections: clips/s the loader delivers per grid (``loader``, and the
sources earlier runs measured, ``loader:other``), each stage of both store paths alone (``stages``), and
what the workers read (``read``).
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from bench_data import ensure, store_manifest
from grids import Grid, requests_for, selected_grids
from harness import Report, Setup, consume, grid_rows, repeat_rate
from loader import stage_costs

from lightning_multigrid.data.dataset import TrainVideoDataset, collate_clips
from lightning_multigrid.data.decoding.device import crop_resize_flip, decode_jpegs
from lightning_multigrid.data.loaders import ChunkedDataLoader
from lightning_multigrid.data.prefetch import DecodeAhead
from lightning_multigrid.data.reader_settings import ReaderSettings
from lightning_multigrid.data.sources import load_manifest
from lightning_multigrid.data.transfer import BatchTransfer
from lightning_multigrid.schedule import MultigridSchedule


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


def loader_table(setup: Setup, schedule: MultigridSchedule, data: dict[str, Any]) -> list[dict[str, Any]]:
    """Per grid, clips/s the store delivers (a) decoded in the workers, (b) decoded on the device ahead of use."""
    sources = {
        "store (workers)": (TrainVideoDataset(store_manifest(data)), "consume"),
        # Decoded on `setup.device`: the GPU, or the CPU in --smoke.
        "store (device decode)": (TrainVideoDataset(store_manifest(data), ReaderSettings(frame_decode="device")), "ahead"),
    }
    rows = []
    for grid, (name, (dataset, mode)) in itertools.product(selected_grids(schedule, setup.grids), sources.items()):
        rate = loader_rate(dataset, grid, setup, mode)
        rows.append({"grid": grid.name, "source": name, "loader_clips_per_s": rate})
        print(f"  loader {grid.name} {name}: {rate:.0f} clips/s", flush=True)
    return rows


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
    return repeat_rate(lambda h: int(h.to(setup.device, non_blocking=True).shape[0]), [host], setup)


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

    decode = repeat_rate(decode_batch, clips, setup)
    resize = repeat_rate(lambda k: int(crop_resize_flip(images[k], clips[k]).shape[0]), list(range(len(clips))), setup)
    copy = repeat_rate(copy_bytes, clips, setup)
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
    for grid in selected_grids(schedule, setup.grids):
        paths = {"workers": workers_stages(workers, grid, setup), "device": device_stages(encoded, grid, setup)}
        row: dict[str, Any] = {"grid": grid.name, "model_clips_per_s": model.get(grid.name)}
        for path, stages in paths.items():
            got = delivered.get((grid.name, f"store ({'workers' if path == 'workers' else 'device decode'})"))
            combined = "decode_then_crop_resize" if path == "device" else None
            row[path] = {**stages, "delivered": got, "short": short_stage(model.get(grid.name), got, stages, combined)}
        rows.append(row)
        print(f"  stages {grid.name}: workers short {row['workers']['short']}, device short {row['device']['short']}", flush=True)
    return rows


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
    for (name, dataset), grid in itertools.product(encoded_sources(setup, data).items(), selected_grids(schedule, setup.grids)):
        rate = loader_rate(dataset, grid, setup, "bytes")
        rows.append({"source": name, "grid": grid.name, "read_clips_per_s": rate,
                     "read_frames_per_s": rate * grid.shape.num_frames})
        print(f"  read {name} {grid.name}: {rate:.0f} clips/s", flush=True)
    return rows


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
    for grid, (name, dataset) in itertools.product(selected_grids(schedule, setup.grids), sources.items()):
        rate = dataset.batch_rate(grid, setup.loader_seconds) if isinstance(dataset, NvdecClips) else loader_rate(dataset, grid, setup)
        rows.append({"grid": grid.name, "source": name, "loader_clips_per_s": rate})
        print(f"  loader {grid.name} {name}: {rate:.0f} clips/s", flush=True)
    return rows


# ---------------------------------------------------------------------------- Markdown


def markdown_pace(report: dict[str, Any]) -> list[str]:
    """Per grid: what each model consumes beside what each store path delivers, and what sets the pace."""
    models = {key: {r["grid"]: r for r in grid_rows(report, key)} for key in ("model", "transformer:model")}
    if not models["model"]:
        return []
    loader = {(r["grid"], r["source"]): r["loader_clips_per_s"] for r in grid_rows(report, "loader")}
    stages = {r["grid"]: r for r in grid_rows(report, "stages")}
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


def markdown_stages(report: dict[str, Any]) -> list[str]:
    rows = grid_rows(report, "stages")
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


def markdown_earlier(report: dict[str, Any]) -> list[str]:
    """The sources earlier runs measured (``loader:other``) and what the workers read (``read``)."""
    lines: list[str] = []
    other = grid_rows(report, "loader:other")
    if other:
        lines += ["", "| grid | source | loader clips/s |", "|---|---|---|"]
        lines += [f"| {r['grid']} | {r['source']} | {r['loader_clips_per_s']:.0f} |" for r in other]
    read = grid_rows(report, "read")
    if read:
        lines += ["", "| source | grid | read clips/s | read frames/s |", "|---|---|---|---|"]
        lines += [f"| {r['source']} | {r['grid']} | {r['read_clips_per_s']:.0f} | {r['read_frames_per_s']:.0f} |" for r in read]
    return lines
