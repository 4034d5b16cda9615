"""``benchmarks/gpu.py``'s end-to-end sections: baseline against multigrid through ``benchmarks/train.py``
(``end_to_end:*``, ``transformer:end_to_end``), each run's model-only time and pipeline efficiency, and a
short fit under FSDP (``fsdp``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench_data import ensure
from harness import Report, Setup
from train import run as train_run

from lightning_multigrid.data.synthetic import generate_synthetic_dataset
from lightning_multigrid.module import VideoClassifier
from lightning_multigrid.schedule import MultigridConfig, build_schedule, grid_counts

# An end-to-end section: (source, how the frames are decoded, batches decoded ahead).
END_TO_END = {
    "end_to_end:store": ("store", "workers", 1), "end_to_end:store-device": ("store", "device", 1),
    "end_to_end:frames": ("frames", "device", 1), "end_to_end:frames-serial": ("frames", "device", 0),
    "end_to_end:mp4": ("mp4", "workers", 1),
}


def end_to_end(setup: Setup, data: dict[str, Any], section: str, report: Report, backbone: str | None = None,
               epochs: tuple[int, tuple[int, ...]] | None = None) -> dict[str, Any]:
    """Baseline and multigrid on the same data through ``benchmarks/train.py``'s ``run``, from the section's
    source decoded as :data:`END_TO_END` says (on the device: ``decode_ahead`` batches ahead of the step, 0
    between steps); ``epochs``: (baseline epochs, LR milestones), default the setup's. Each run's model-only
    time (:func:`model_only`) and pipeline efficiency (model-only over its training time) beside it."""
    source, decode, decode_ahead = END_TO_END[section]
    backbone = backbone or setup.backbone
    num_epochs, milestones = epochs or (setup.epochs, setup.milestones)
    args = argparse.Namespace(
        batch_size=setup.base.batch_size, num_frames=setup.base.num_frames, crop_size=setup.base.crop_size,
        sampling_rate=setup.sampling_rate, workers=setup.workers, num_views=1, width=8, lr=setup.lr,
        milestones=list(milestones), warmup_epochs=min(3, milestones[0] - 1), epochs=num_epochs,
        accelerator="gpu" if setup.device == "cuda" else "cpu", precision=setup.precision,
    )
    encoded = {"frames": "train_frame_manifests", "store": "train_stores"}
    if source == "frames":
        ensure(setup, data, "train_frame_manifests")
    manifests = tuple(Path(p) for p in data[encoded[source]]) if source in encoded else None
    results: dict[str, Any] = {"backbone": backbone, "source": source, "decode": decode, "decode_ahead": decode_ahead,
                               "epochs": num_epochs, "milestones": list(milestones), "num_train": setup.num_train}
    for name, multigrid in (("baseline", False), ("multigrid", True)):
        result = train_run(args, Path(data["train_dir"]), multigrid, None, backbone, manifests, decode, decode_ahead)  # type: ignore[arg-type]
        result["grid_rates"] = {f"{t}x{c}": r for (t, c), r in result["grid_rates"].items()}
        results[name] = result
        print(f"  {backbone} {source} ({decode} decode) {name}: {result['seconds']:.1f} s, {result['iterations']} "
              f"iterations, top-1 {result['top1']:.3f}, data wait {result['data_wait_share']:.0%}", flush=True)
    results["speedup"] = results["baseline"]["seconds"] / results["multigrid"]["seconds"]
    results["iteration_saving"] = results["baseline"]["iterations"] / max(results["multigrid"]["iterations"], 1)
    model_key = "model" if backbone == setup.backbone else "transformer:model"
    results["model_only"] = model_only(setup, report.rows(model_key), num_epochs, milestones)
    add_efficiency(results)
    return results


def model_only(setup: Setup, model_rows: list[dict[str, Any]], epochs: int, milestones: tuple[int, ...]) -> dict[str, Any]:
    """Seconds the model alone needs for each run's clips: per grid, the clips the run draws (``grid_counts``
    of the schedule the callback builds, the baseline's epochs x videos at the base) over the model's clips/s
    at that grid (section ``model``), in the layout the runs train in (contiguous: ``train.py`` does not
    convert) and in the faster layout per grid. ``missing`` names grids the model section did not measure."""
    schedule = build_schedule(MultigridConfig(base=setup.base, sampling_rate=setup.sampling_rate, max_epochs=epochs,
                                              milestones=milestones))
    rates = {tuple(r["shape"]): r for r in model_rows}
    runs = {"baseline": [(setup.base, epochs * setup.num_train)],
            "multigrid": [(c.grid, c.clips) for c in grid_counts(schedule, setup.num_train)]}
    out: dict[str, Any] = {"layout": "contiguous", "grids": [], "missing": []}
    for run, counts in runs.items():
        seconds = {"contiguous": 0.0, "fastest": 0.0}
        for shape, clips in counts:
            row = rates.get((shape.batch_size, shape.num_frames, shape.crop_size))
            if row is None:
                out["missing"].append(f"{run} {shape.batch_size}x{shape.num_frames}x{shape.crop_size}")
                continue
            contiguous = row.get("contiguous_clips_per_s", row["model_clips_per_s"])
            seconds["contiguous"] += clips / contiguous
            seconds["fastest"] += clips / row["model_clips_per_s"]
            out["grids"].append({"run": run, "grid": row["grid"], "clips": clips, "contiguous_clips_per_s": contiguous,
                                 "seconds": clips / contiguous})
        out[f"{run}_s"], out[f"{run}_fastest_layout_s"] = seconds["contiguous"], seconds["fastest"]
    if not out["missing"]:
        out["ratio"] = out["baseline_s"] / out["multigrid_s"]
        out["fastest_layout_ratio"] = out["baseline_fastest_layout_s"] / out["multigrid_fastest_layout_s"]
    return out


def add_efficiency(results: dict[str, Any]) -> None:
    """Each run's pipeline efficiency (model-only seconds over training seconds; 1 = the model's pace) and
    the speed-up's share of the model-only ratio, where the model's rates cover every grid."""
    only = results["model_only"]
    if only["missing"]:
        return
    for run in ("baseline", "multigrid"):
        results[run]["model_only_s"] = only[f"{run}_s"]
        results[run]["pipeline_efficiency"] = only[f"{run}_s"] / results[run]["seconds"]
    results["speedup_of_model_ratio"] = results["speedup"] / only["ratio"]


def transformer_end_to_end(setup: Setup, data: dict[str, Any], report: Report) -> dict[str, Any]:
    """``swin3d_t``'s pair, from the store decoded in the workers, sized to fit: ``transformer_epochs``
    baseline epochs (the same schedule's proportions), and the result says so."""
    epochs = (setup.transformer_epochs, setup.transformer_milestones)
    result = end_to_end(setup, data, "end_to_end:store", report, backbone=setup.transformer, epochs=epochs)
    result["sized_to_fit"] = (f"{setup.transformer_epochs} baseline epochs, milestones {list(setup.transformer_milestones)} "
                              f"({setup.backbone}: {setup.epochs}, {list(setup.milestones)}), to fit the time budget")
    return result


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


# ---------------------------------------------------------------------------- Markdown


def markdown_end_to_end(report: dict[str, Any]) -> list[str]:
    runs = {k: v for k, v in report.items() if k.startswith(("end_to_end", "transformer:end_to_end")) and isinstance(v, dict)}
    if not runs:
        return []
    lines = ["", "End to end (pipeline efficiency: the model-only time over the training time; 1 = the model's pace):", "",
             "| section | run | epochs | iterations | training s | model-only s | efficiency | top-1 | data wait | speed-up |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    waits = []
    for key, result in runs.items():
        if "baseline" not in result:
            lines.append(f"| {key} | {result.get('error') or result.get('skipped')} |")
            continue
        label = f"{key} ({result['backbone']}, {result.get('decode', '?')} decode, {result.get('epochs', '?')} epochs)"
        for run in ("baseline", "multigrid"):
            lines.append(_end_to_end_row(label, run, result))
        waits += [(key, grid, w) for grid, w in result["multigrid"].get("data_wait_grids", {}).items()]
        missing = result.get("model_only", {}).get("missing")
        if missing:
            lines.append(f"| {key} | model-only not computed: the model section lacks {', '.join(missing)} |")
    if waits:
        lines += ["", "The multigrid runs' data-wait meter, per grid:", "",
                  "| section | grid | iterations timed | waiting |", "|---|---|---|---|"]
        lines += [f"| {key} | {grid} | {w['iterations']} | {w['share']:.0%} |" for key, grid, w in waits]
    return lines


def _end_to_end_row(label: str, run: str, result: dict[str, Any]) -> str:
    r = result[run]
    model_s, efficiency = r.get("model_only_s"), r.get("pipeline_efficiency")
    speedup = ""
    if run == "multigrid":
        speedup = f"{result['speedup']:.2f}x ({result['iteration_saving']:.2f}x fewer iterations"
        ratio = result.get("model_only", {}).get("ratio")
        speedup += f"; model-only ratio {ratio:.2f}x, {result['speedup_of_model_ratio']:.2f} of it)" if ratio else ")"
    return (f"| {label} | {run} | {r['epochs']} | {r['iterations']} | {r['seconds']:.1f} | "
            f"{'-' if model_s is None else f'{model_s:.1f}'} | {'-' if efficiency is None else f'{efficiency:.2f}'} | "
            f"{r['top1']:.3f} | {r['data_wait_share']:.0%} | {speedup} |")
