"""`lightning-multigrid`: the command line.

``fit``, ``validate`` and ``test`` are handed, untouched, to the LightningCLI in
:mod:`lightning_multigrid.trainer_cli`. The rest are this module's: ``schedule`` previews a
schedule, ``check-data`` decodes every video of a manifest, ``extract-frames`` writes frame
folders, ``pack-frames`` a packed frame store, ``compare`` trains a config as the baseline and with
multigrid, ``make-synthetic`` writes
the demo dataset. They are registered in ``COMMANDS``, each with its argparse sub-parser and a
handler; settings errors print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import warnings
from collections.abc import Callable, Sequence

from lightning_multigrid.config import (
    DEFAULT_SHORT_RUN,
    DEFAULTS,
    MultigridConfig,
    MultigridOptions,
    ShortRun,
    default_long_cycle_factors,
)
from lightning_multigrid.grid import GridShape
from lightning_multigrid.schedule import build_schedule

__all__ = ["main"]


def _add_schedule_arguments(parser: argparse.ArgumentParser) -> None:
    base = parser.add_argument_group("baseline run")
    base.add_argument("--batch-size", type=int, required=True, help="clips per device")
    base.add_argument("--num-frames", type=int, required=True, help="frames per clip")
    base.add_argument("--crop-size", type=int, required=True, help="crop in pixels (square)")
    base.add_argument("--sampling-rate", type=int, default=1, help="frame stride (default 1)")
    base.add_argument("--max-epochs", type=int, required=True, help="baseline epochs")
    base.add_argument(
        "--milestones", type=int, nargs="*", default=[], metavar="M",
        help="epochs where the LR stages after the first start (stage 0 starts at 0)",
    )
    base.add_argument("--gamma", type=float, default=0.1, help="LR decay per stage (default 0.1)")
    base.add_argument("--devices", type=int, default=1, help="number of devices (default 1)")
    # Defaults come from the options' own (config.DEFAULTS); `%(default)s` shows them in the help.
    multigrid = parser.add_argument_group("multigrid")
    multigrid.add_argument(
        "--epoch-factor", type=float, default=DEFAULTS.epoch_factor, help="multigrid epochs / baseline (%(default)s)"
    )
    multigrid.add_argument(
        "--bn-base-size", type=int, default=DEFAULTS.bn_base_size, help="clips per BatchNorm group (%(default)s)"
    )
    multigrid.add_argument("--no-long-cycle", action="store_true", help="turn the long cycle off")
    multigrid.add_argument("--no-short-cycle", action="store_true", help="turn the short cycle off")
    multigrid.add_argument(
        "--long-cycle-factors", type=_factor_pair, nargs="+", metavar="T,S",
        help="(t_factor, s_factor) of each long-cycle shape, coarsest first, e.g. 0.5,0.707 0.5,1 1,1 "
        "(default: the paper's four; with --pretrained and a short --dataset-size run, the pretrained default)",
    )
    multigrid.add_argument(
        "--full-grid-share", type=float, default=DEFAULTS.full_grid_share,
        help="share of the baseline's iterations guaranteed at the full grid (%(default)s: the paper's schedule)",
    )
    multigrid.add_argument(
        "--scale-bn-base-size", action="store_true",
        help="scale the BatchNorm base size with each grid's relative batch (same values per statistic)",
    )
    multigrid.add_argument(
        "--short-run", action="store_true",
        help="short-run mode: coarse grids at the base batch for part of the run, then the full grid",
    )
    multigrid.add_argument(
        "--short-run-coarse-share", type=float, default=DEFAULT_SHORT_RUN.coarse_share,
        help="short-run mode: most epochs on coarse grids (%(default)s)",
    )
    multigrid.add_argument(
        "--short-run-max-lr-factor", type=int, default=DEFAULT_SHORT_RUN.max_lr_factor,
        help="short-run mode: largest batch growth (and LR factor) of a coarse grid (%(default)s)",
    )
    multigrid.add_argument(
        "--pretrained", action=argparse.BooleanOptionalAction, default=None,
        help="the model starts from pretrained weights (--no-pretrained: from scratch); sets the regime advice "
        "and, for a run of under 10,000 baseline steps (needs --dataset-size), the default long-cycle shapes",
    )
    output = parser.add_argument_group("output")
    output.add_argument("--dataset-size", type=int, help="clips in the training set: adds iteration counts")
    output.add_argument("--format", choices=("table", "json"), default="table", help="output format")
    output.add_argument("--plot", metavar="FILE", help="also write a PNG figure of the schedule")


def _factor_pair(text: str) -> tuple[float, float]:
    """``T,S`` -> ``(t_factor, s_factor)`` (their range is checked with the other options)."""
    try:
        t_factor, s_factor = (float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a T,S pair of factors: write each long-cycle shape as t_factor,s_factor, e.g. 0.5,1"
        ) from None
    return t_factor, s_factor


def _run_schedule(args: argparse.Namespace) -> None:
    from lightning_multigrid.preview import format_table, plot_schedule, schedule_to_dict

    if args.plot:
        _check_output_file("--plot", args.plot, figure=True)
    # Built even without --short-run: a bad --short-run-* value is refused, not ignored.
    short_run = ShortRun(coarse_share=args.short_run_coarse_share, max_lr_factor=args.short_run_max_lr_factor)
    options = MultigridOptions(
        long_cycle=not args.no_long_cycle,
        short_cycle=not args.no_short_cycle,
        epoch_factor=args.epoch_factor,
        long_cycle_factors=DEFAULTS.long_cycle_factors if args.long_cycle_factors is None else tuple(args.long_cycle_factors),
        bn_base_size=args.bn_base_size,
        full_grid_share=args.full_grid_share,
        scale_bn_base_size=args.scale_bn_base_size,
        short_run=short_run if args.short_run else None,
    )
    config = MultigridConfig(
        base=GridShape(args.batch_size, args.num_frames, args.crop_size),
        sampling_rate=args.sampling_rate,
        max_epochs=args.max_epochs,
        milestones=tuple(args.milestones),
        gamma=args.gamma,
        devices=args.devices,
        options=options,
    )
    if args.dataset_size is not None and args.dataset_size <= 0:
        raise ValueError(f"`--dataset-size` must be a positive integer, got {args.dataset_size!r}.")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        schedule = build_schedule(config)
        if args.long_cycle_factors is None and args.dataset_size is not None:
            # As the callback: the default shapes depend on the start and the run's baseline steps.
            factors = default_long_cycle_factors(args.pretrained, schedule.baseline_iterations(args.dataset_size))
            if factors != options.long_cycle_factors:
                caught.clear()
                options = dataclasses.replace(options, long_cycle_factors=factors)
                schedule = build_schedule(dataclasses.replace(config, options=options))
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr)
    if args.format == "json":
        print(json.dumps(schedule_to_dict(schedule, args.dataset_size, args.pretrained), indent=1))
    else:
        print(format_table(schedule, args.dataset_size, pretrained=args.pretrained))
    if args.plot:
        plot_schedule(schedule, args.plot, args.dataset_size)
        print(f"wrote {args.plot}", file=sys.stderr)


def _add_check_data_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "manifest",
        help="manifest file (`path label` lines, or a frame dataset's `folder label [num_frames]` lines or "
        "frame-list CSV) or a folder with one folder per class",
    )
    parser.add_argument("--root", help="directory the manifest's paths are relative to (default: its directory)")
    parser.add_argument("--class-names", help="class-names file, for labels written as names")
    _add_manifest_kind_argument(parser)
    parser.add_argument(
        "--filename-tmpl", metavar="TEMPLATE",
        help="frame datasets: the frames' file names, e.g. 'img_{:05d}.jpg' (mmaction2), '{video}_{:06d}.jpg' "
        "(PySlowFast), '{video}-{:06d}.jpg' (Charades); default: detected per folder. Other files are not frames",
    )
    parser.add_argument(
        "--allow-frame-gaps", action="store_true",
        help="frame datasets: accept folders whose frame numbers skip (default: such a folder fails)",
    )
    parser.add_argument("--workers", type=int, default=None, help="decoding processes (default: CPU count)")
    parser.add_argument(
        "--write-metadata", metavar="FILE",
        help="save the videos' metadata to FILE, for the datasets' `metadata_file` (skips probing)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_manifest_kind_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--manifest-kind", choices=("auto", "video", "frames"), default="auto",
        help="whether the manifest lists video files or frame folders (default: told from its content)",
    )


def _run_check_data(args: argparse.Namespace) -> None:
    from lightning_multigrid.data.decoding.frame_names import FrameLayout
    from lightning_multigrid.data.manifests.load import load_manifest
    from lightning_multigrid.data.tools.check import check_videos, format_report

    layout = FrameLayout(args.filename_tmpl, args.allow_frame_gaps)
    _check_workers(args.workers)
    if args.write_metadata:
        _check_output_file("--write-metadata", args.write_metadata)
    manifest = load_manifest(args.manifest, root=args.root, class_names=args.class_names, kind=args.manifest_kind)
    report = check_videos(manifest, workers=args.workers, progress=not args.no_progress, layout=layout)
    print(format_report(report))
    if args.write_metadata:
        report.metadata_cache().save(args.write_metadata)
        print(f"wrote {args.write_metadata}", file=sys.stderr)
    if not report.ok:
        raise SystemExit(1)


def _add_extract_frames_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("manifest", help="video manifest file (`path label` lines) or a folder with one folder per class")
    parser.add_argument("output_dir", help="where the frame folders and the new manifest go (created)")
    parser.add_argument("--root", help="directory the manifest's paths are relative to (default: its directory)")
    parser.add_argument("--class-names", help="class-names file, for labels written as names")
    parser.add_argument("--short-side", type=int, default=None, help="resize frames to this short side (default: keep)")
    parser.add_argument("--fps", type=float, default=None, help="resample to this frame rate (default: every frame)")
    parser.add_argument("--quality", type=int, default=90, help="JPEG quality 1-100 (90)")
    parser.add_argument("--manifest-name", help="file name of the new manifest (default: the input's stem + .txt)")
    _add_manifest_kind_argument(parser)
    parser.add_argument("--workers", type=int, default=None, help="extracting processes (default: CPU count)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _run_extract_frames(args: argparse.Namespace) -> None:
    from pathlib import Path

    from lightning_multigrid.data.manifests.load import load_manifest
    from lightning_multigrid.data.manifests.videos import read_folder_manifest
    from lightning_multigrid.data.tools.extract import extract_frames

    if Path(args.manifest).is_dir() and args.root is None and args.class_names is None:
        # The output folder may sit inside the input: it is not a class (on this run or the next).
        manifest = read_folder_manifest(args.manifest, exclude=[args.output_dir])
    else:
        manifest = load_manifest(args.manifest, root=args.root, class_names=args.class_names, kind=args.manifest_kind)
    report = extract_frames(
        manifest,
        args.output_dir,
        manifest_name=args.manifest_name,
        short_side=args.short_side,
        fps=args.fps,
        quality=args.quality,
        workers=args.workers,
        progress=not args.no_progress,
    )
    for failure in report.failures:
        print(f"FAILED {failure.path}: {failure.error}")
    redone = f" ({report.redone} redone: extracted before with other settings)" if report.redone else ""
    print(
        f"{report.extracted} videos extracted{redone}, {report.already_done} already done, "
        f"{len(report.failures)} failed; wrote {report.manifest}"
    )
    if report.failures:
        raise SystemExit(1)


def _add_pack_frames_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "manifest",
        help="frame manifest (what extract-frames writes) or video manifest (each video decoded once with PyAV)",
    )
    parser.add_argument("store", help="the store folder to write (created; an older store there is replaced)")
    parser.add_argument(
        "--crop-size", type=int, default=112,
        help="the base crop you train at (112): level 0 is the largest short side its grids draw (160 for 112)",
    )
    parser.add_argument(
        "--jitter-scales", type=int, nargs=2, metavar=("MIN", "MAX"),
        help="training short side range at the base crop, as the DataModule's `jitter_scales` (default: "
        "(256, 320) x crop / 224); level 0 is MAX",
    )
    parser.add_argument(
        "--levels", type=int, default=1,
        help="stored resolution levels: level 0 and smaller ones at 1/sqrt(2) steps, read where a clip draws a "
        "smaller short side (1)",
    )
    parser.add_argument("--quality", type=int, default=90, help="JPEG quality 1-100 of resized frames (90)")
    parser.add_argument("--root", help="directory the manifest's paths are relative to (default: its directory)")
    parser.add_argument("--class-names", help="class-names file, for labels written as names")
    _add_manifest_kind_argument(parser)
    parser.add_argument(
        "--filename-tmpl", metavar="TEMPLATE", help="frame manifests: the frames' file names (default: detected per folder)"
    )
    parser.add_argument(
        "--allow-frame-gaps", action="store_true", help="frame manifests: accept folders whose frame numbers skip"
    )
    parser.add_argument("--workers", type=int, default=None, help="packing processes (default: CPU count)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _run_pack_frames(args: argparse.Namespace) -> None:
    from lightning_multigrid.data.decoding.frame_names import FrameLayout
    from lightning_multigrid.data.manifests.load import load_manifest
    from lightning_multigrid.data.tools.pack import pack_frames

    layout = FrameLayout(args.filename_tmpl, args.allow_frame_gaps)
    _check_workers(args.workers)
    manifest = load_manifest(args.manifest, root=args.root, class_names=args.class_names, kind=args.manifest_kind)
    report = pack_frames(
        manifest,
        args.store,
        crop_size=args.crop_size,
        jitter_scales=tuple(args.jitter_scales) if args.jitter_scales else None,
        levels=args.levels,
        quality=args.quality,
        layout=layout,
        workers=args.workers,
        progress=not args.no_progress,
    )
    for failure in report.failures:
        print(f"FAILED {failure.path}: {failure.error}")
    levels = ", ".join(f"L{side} {size / 2**20:.1f} MiB" for side, size in zip(report.levels, report.level_bytes))
    print(
        f"{report.videos} videos ({report.frames} frames) packed into {report.store} ({levels}); "
        f"{len(report.failures)} failed and left out (listed in the store: check-data on it reports them)"
    )
    if report.failures:
        raise SystemExit(1)


def _add_make_synthetic_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", help="output directory (created)")
    parser.add_argument("--num-train", type=int, default=240, help="training videos (240)")
    parser.add_argument("--num-val", type=int, default=60, help="validation videos (60)")
    parser.add_argument("--num-classes", type=int, default=4, help="classes, 2-8 (4: texture x left/right)")
    parser.add_argument("--width", type=int, default=160, help="frame width in pixels, even (160)")
    parser.add_argument("--height", type=int, default=120, help="frame height in pixels, even (120)")
    parser.add_argument("--num-frames", type=int, default=50, help="frames per video (50)")
    parser.add_argument("--fps", type=float, default=25, help="frames per second (25)")
    parser.add_argument(
        "--texture-cell", type=int, default=None, help="checkerboard cell in pixels (default: short side / 20)"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (0)")
    parser.add_argument("--workers", type=int, default=None, help="encoding processes (default: CPU count)")
    parser.add_argument(
        "--store-crop-size", type=int, default=None, metavar="CROP",
        help="also pack train.store and val.store (pack-frames) for this base crop, to train from a frame store",
    )


def _run_make_synthetic(args: argparse.Namespace) -> None:
    from pathlib import Path

    from lightning_multigrid.data.manifests.load import load_manifest
    from lightning_multigrid.data.synthetic import generate_synthetic_dataset
    from lightning_multigrid.data.tools.pack import pack_frames, store_levels

    if args.store_crop_size is not None:
        store_levels(args.store_crop_size)  # refused before any video is written

    data = generate_synthetic_dataset(
        args.directory,
        num_train=args.num_train,
        num_val=args.num_val,
        num_classes=args.num_classes,
        width=args.width,
        height=args.height,
        num_frames=args.num_frames,
        fps=args.fps,
        seed=args.seed,
        workers=args.workers,
        texture_cell=args.texture_cell,
    )
    print(
        f"wrote {data.num_train} training and {data.num_val} validation videos "
        f"({args.width}x{args.height}, {args.num_frames} frames at {args.fps:g} fps, {data.num_classes} classes)\n"
        f"  {data.train_manifest}\n  {data.val_manifest}\n  {data.class_names_file}\n"
        "horizontal flips swap its left/right classes: train with flipping off"
    )
    if args.store_crop_size is not None:
        for split, manifest in (("train", data.train_manifest), ("val", data.val_manifest)):
            store = Path(args.directory) / f"{split}.store"
            report = pack_frames(
                load_manifest(manifest, class_names=data.class_names_file), store, crop_size=args.store_crop_size,
                workers=args.workers, progress=False,
            )
            print(f"  {report.store} (frame store for crop {args.store_crop_size}, level 0 L{report.levels[0]})")


def _add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="a `lightning-multigrid fit` YAML config")
    parser.add_argument("--max-epochs", type=int, help="baseline epochs (default: the config's)")
    parser.add_argument(
        "--limit-train-batches", type=float, metavar="FRACTION",
        help="train this fraction of each epoch's iterations, for a quick look (default: all)",
    )
    parser.add_argument(
        "--run-dir", metavar="DIR",
        help="run folder for both runs' logs and the figure (default: the config's trainer.default_root_dir, or runs)",
    )
    parser.add_argument(
        "--plot", metavar="FILE", help="validation curves PNG (default: compare.png in the run folder)"
    )


def _run_compare(args: argparse.Namespace) -> None:
    from lightning_multigrid.compare import format_comparison, plot_curves, run_compare

    if args.plot is not None:
        _check_output_file("--plot", args.plot, figure=True, creates_folder=True)
    comparison = run_compare(
        args.config, max_epochs=args.max_epochs, limit_train_batches=args.limit_train_batches,
        run_dir=args.run_dir, report=lambda line: print(line, flush=True),
    )
    print("\n" + format_comparison(comparison))
    plot = args.plot or comparison.run_dir / "compare.png"
    plot_curves(comparison, plot)
    print(f"figure (val/top1 over training wall-clock): {plot}")
    logs = [run.log_dir for run in (comparison.baseline, comparison.multigrid) if run.log_dir]
    if logs:
        print(f"logs (metrics.csv, config.yaml): {', '.join(logs)}")


FIGURE_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg")


def _check_workers(workers: int | None) -> None:
    if workers is not None and workers < 0:
        raise ValueError(f"`--workers` must be >= 0, got {workers!r}.")


def _check_output_file(option: str, path: str, figure: bool = False, creates_folder: bool = False) -> None:
    """Refuse, before any work, an output file that could not be written at the end.

    ``creates_folder``: the writer makes missing folders, so the nearest existing one must be writable.
    """
    from pathlib import Path

    file = Path(path)
    if figure and file.suffix.lower() not in FIGURE_SUFFIXES:
        raise ValueError(
            f"`{option}` {path}: cannot write a figure as {file.suffix or 'a file without extension'!r}; "
            f"name it with one of {', '.join(FIGURE_SUFFIXES)}."
        )
    if file.is_dir():
        raise ValueError(f"`{option}` {path} is a folder: pass a file name.")
    parent = file.absolute().parent
    folder = parent if not creates_folder else next(p for p in (parent, *parent.parents) if p.exists())
    if not folder.is_dir():
        raise ValueError(f"`{option}` {path}: its folder {file.parent} does not exist; create it or pass another path.")
    if not os.access(folder, os.W_OK) or (file.exists() and not os.access(file, os.W_OK)):
        raise ValueError(f"`{option}` {path} cannot be written (permission denied); pass another path.")


# name -> (help, add arguments, run)
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], None]]] = {
    "schedule": ("preview the multigrid schedule of a baseline run", _add_schedule_arguments, _run_schedule),
    "check-data": (
        "decode every video of a manifest and list the ones that fail",
        _add_check_data_arguments,
        _run_check_data,
    ),
    "extract-frames": (
        "turn a video manifest into a frame dataset (JPEG folders and a manifest), resumable",
        _add_extract_frames_arguments,
        _run_extract_frames,
    ),
    "pack-frames": (
        "pack a frame or video manifest into a frame store (one file of JPEG bytes per level, read by offset)",
        _add_pack_frames_arguments,
        _run_pack_frames,
    ),
    "compare": (
        "train a config as the baseline and with multigrid; print time, iterations and top-1 side by side",
        _add_compare_arguments,
        _run_compare,
    ),
    "make-synthetic": (
        "write the synthetic demo dataset (H.264 videos and manifests)",
        _add_make_synthetic_arguments,
        _run_make_synthetic,
    ),
}


# Handed to LightningCLI (model, data, trainer and `--multigrid.*` options from YAML or flags).
LIGHTNING_COMMANDS = ("fit", "validate", "test")


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``lightning-multigrid`` console script."""
    explicit = argv is not None
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in LIGHTNING_COMMANDS:
        from lightning_multigrid.trainer_cli import run

        run(argv if explicit else None)  # LightningCLI reads sys.argv itself
        return
    parser = argparse.ArgumentParser(prog="lightning-multigrid", description="Multigrid training for video models.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in LIGHTNING_COMMANDS:
        commands.add_parser(name, help=f"{name} a model (LightningCLI; see `lightning-multigrid {name} --help`)", add_help=False)
    for name, (help_text, add_arguments, _) in COMMANDS.items():
        add_arguments(commands.add_parser(name, help=help_text, description=help_text))
    args = parser.parse_args(argv)
    try:
        COMMANDS[args.command][2](args)
    except (ValueError, FileNotFoundError) as error:
        print(f"lightning-multigrid {args.command}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
