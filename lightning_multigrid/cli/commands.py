"""`lightning-multigrid`: the command line.

``fit``, ``validate`` and ``test`` are handed, untouched, to the LightningCLI in
:mod:`lightning_multigrid.cli.trainer`, and ``schedule`` (a schedule's preview) lives in
:mod:`lightning_multigrid.cli.schedule`. The rest are this module's: ``check-data`` decodes every
video of a manifest, ``extract-frames`` writes frame folders, ``pack-frames`` a packed frame store,
``compare`` trains a config as the baseline and with multigrid, ``make-synthetic`` writes the demo
dataset. They are registered in ``COMMANDS``, each with its argparse sub-parser and a
handler; settings errors print one line and exit with status 2, and output cut short by its reader
(``lightning-multigrid schedule --format json | head``) ends quietly, as a shell tool does.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from lightning_multigrid._checks import as_flags, check_output_file, check_positive_int
from lightning_multigrid.cli.schedule import add_schedule_arguments, run_schedule
from lightning_multigrid.grid import DEFAULT_NUM_FRAMES, DEFAULT_SAMPLING_RATE

__all__ = ["main"]


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
    parser.add_argument(
        "--num-frames", type=int, default=DEFAULT_NUM_FRAMES,
        help="the base clip's frames (the DataModule's `num_frames`): videos shorter than the clip's span are "
        f"listed, as their clips repeat the last frame ({DEFAULT_NUM_FRAMES})",
    )
    parser.add_argument(
        "--sampling-rate", type=int, default=DEFAULT_SAMPLING_RATE,
        help=f"the base clip's frame stride (the DataModule's `sampling_rate`) ({DEFAULT_SAMPLING_RATE})",
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
    from lightning_multigrid.data.sources import load_manifest
    from lightning_multigrid.data.tools.check import check_videos, format_report

    layout = FrameLayout(args.filename_tmpl, args.allow_frame_gaps)
    _check_workers(args.workers)
    check_positive_int("--num-frames", args.num_frames)
    check_positive_int("--sampling-rate", args.sampling_rate)
    if args.write_metadata:
        check_output_file("--write-metadata", args.write_metadata)
    manifest = load_manifest(args.manifest, root=args.root, class_names=args.class_names, kind=args.manifest_kind)
    report = check_videos(manifest, workers=args.workers, progress=not args.no_progress, layout=layout)
    print(_check_data_flags(format_report(report, args.num_frames, args.sampling_rate)))
    if args.write_metadata:
        report.metadata_cache().save(args.write_metadata)
        print(f"wrote {args.write_metadata}", file=sys.stderr)
    if not report.ok:
        raise SystemExit(1)


def _check_data_flags(text: str) -> str:
    """The report with this command's flags (`--filename-tmpl`) where the readers' reasons name their Python
    arguments (`filename_tmpl`): the same reasons are training's, where those are right."""
    parser = argparse.ArgumentParser()
    _add_check_data_arguments(parser)
    return as_flags(text, parser)


def _add_extract_frames_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("manifest", help="video manifest file (`path label` lines) or a folder with one folder per class")
    parser.add_argument("output_dir", help="where the frame folders and the new manifest go (created)")
    parser.add_argument("--root", help="directory the manifest's paths are relative to (default: its directory)")
    parser.add_argument("--class-names", help="class-names file, for labels written as names")
    parser.add_argument(
        "--short-side", type=int, default=None,
        help="shrink frames to this short side; smaller videos keep their size, never upscaled (default: keep)",
    )
    parser.add_argument("--fps", type=float, default=None, help="resample to this frame rate (default: every frame)")
    parser.add_argument("--quality", type=int, default=90, help="JPEG quality 1-100 (90)")
    parser.add_argument("--manifest-name", help="file name of the new manifest (default: the input's stem + .txt)")
    _add_manifest_kind_argument(parser)
    parser.add_argument("--workers", type=int, default=None, help="extracting processes (default: CPU count)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _run_extract_frames(args: argparse.Namespace) -> None:
    from pathlib import Path

    from lightning_multigrid.data.manifests.videos import read_folder_manifest
    from lightning_multigrid.data.sources import load_manifest
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
    parser.add_argument(
        "--subsampling", choices=("4:4:4", "4:2:0"), default="4:4:4",
        help="chroma of resized frames: 4:4:4 keeps the frames' colour detail; 4:2:0 is about 0.7x the bytes "
        "and 0.8x the decode time, with about twice the colour difference on textured colour (docs/data.md) (4:4:4)",
    )
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
    from lightning_multigrid.data.sources import load_manifest
    from lightning_multigrid.data.tools.pack import pack_frames

    layout = FrameLayout(args.filename_tmpl, args.allow_frame_gaps)
    _check_workers(args.workers)
    check_positive_int("--crop-size", args.crop_size)  # named as the flag; pack_frames checks `crop_size` again
    manifest = load_manifest(args.manifest, root=args.root, class_names=args.class_names, kind=args.manifest_kind)
    report = pack_frames(
        manifest,
        args.store,
        crop_size=args.crop_size,
        jitter_scales=tuple(args.jitter_scales) if args.jitter_scales else None,
        levels=args.levels,
        quality=args.quality,
        subsampling=args.subsampling,
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
        help="also pack the train and val frame stores (pack-frames) for this base crop, named as the DataModule's "
        "`synthetic: {format: store}` looks for them (train-L<level 0>.store)",
    )


def _run_make_synthetic(args: argparse.Namespace) -> None:
    from lightning_multigrid.data.synthetic import ensure_synthetic_stores, generate_synthetic_dataset
    from lightning_multigrid.data.tools.pack import store_levels

    if args.store_crop_size is not None:  # refused before any video is written
        check_positive_int("--store-crop-size", args.store_crop_size)
        store_levels(args.store_crop_size)

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
        # Where a DataModule with `synthetic: {format: store}` and this crop looks for them.
        for store in ensure_synthetic_stores(args.directory, args.store_crop_size, workers=args.workers):
            print(f"  {store} (frame store for crop {args.store_crop_size})")


def _add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="a `lightning-multigrid fit` YAML config")
    parser.add_argument("--max-epochs", type=int, help="baseline epochs (default: the config's)")
    parser.add_argument(
        "--limit-train-batches", type=float, metavar="FRACTION",
        help="train this fraction of each epoch's iterations (rounded down, at least one per epoch: a multigrid "
        "run's coarse epochs have few batches), for a quick look (default: all)",
    )
    parser.add_argument(
        "--run-dir", metavar="DIR",
        help="run folder for both runs' logs and the figure (default: the config's trainer.default_root_dir, or runs)",
    )
    parser.add_argument(
        "--plot", metavar="FILE",
        help="validation curves PNG (default: compare-version_N.png in the run folder, named after the runs' logs)",
    )


def _run_compare(args: argparse.Namespace) -> None:
    from lightning_multigrid.cli.compare import format_comparison, plot_curves, run_compare

    if args.plot is not None:
        check_output_file("--plot", args.plot, figure=True, creates_folder=True)
    comparison = run_compare(
        args.config, max_epochs=args.max_epochs, limit_train_batches=args.limit_train_batches,
        run_dir=args.run_dir, report=lambda line: print(line, flush=True),
    )
    print("\n" + format_comparison(comparison))
    plot = args.plot or comparison.run_dir / comparison.figure_name
    plot_curves(comparison, plot)
    print(f"figure (val/top1 over training wall-clock): {plot}")
    logs = [run.log_dir for run in (comparison.baseline, comparison.multigrid) if run.log_dir]
    if logs:
        print(f"logs (metrics.csv, config.yaml): {', '.join(logs)}")


def _check_workers(workers: int | None) -> None:
    if workers is not None and workers < 0:
        raise ValueError(f"`--workers` must be >= 0, got {workers!r}.")


# name -> (help, add arguments, run)
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], None]]] = {
    "schedule": ("preview the multigrid schedule of a baseline run", add_schedule_arguments, run_schedule),
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
        _choose_lightning_package(argv)
        from lightning_multigrid.cli.trainer import run

        run(argv if explicit else None)  # LightningCLI reads sys.argv itself
        return
    parser = argparse.ArgumentParser(prog="lightning-multigrid", description="Multigrid training for video models.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in LIGHTNING_COMMANDS:
        commands.add_parser(name, help=f"{name} a model (LightningCLI; see `lightning-multigrid {name} --help`)", add_help=False)
    parsers = {}
    for name, (help_text, add_arguments, _) in COMMANDS.items():
        parsers[name] = commands.add_parser(name, help=help_text, description=help_text)
        add_arguments(parsers[name])
    args = parser.parse_args(argv)
    try:
        COMMANDS[args.command][2](args)
        sys.stdout.flush()  # a closed pipe shows here, inside the try, not at the interpreter's exit
    except (ValueError, FileNotFoundError) as error:
        print(f"lightning-multigrid {args.command}: error: {as_flags(str(error), parsers[args.command])}", file=sys.stderr)
        raise SystemExit(2) from None
    except BrokenPipeError:
        # The reader (`head`) stopped reading: nothing to report. Python flushes stdout again at exit,
        # so point it at devnull first (the recipe of Python's `signal` documentation).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(1) from None


def _choose_lightning_package(argv: list[str]) -> None:
    """Use the Lightning package the command's class paths name (``lightning.pytorch.callbacks.ModelSummary``, as
    Lightning's docs write them; ``pytorch_lightning.callbacks...``), in flags or ``--config`` files: a Trainer of
    one package refuses the other's classes. Sets ``LIGHTNING_MULTIGRID_PACKAGE`` for this process (and the
    processes it starts: DDP ranks) before Lightning is imported. Refuses, in one line, class paths of both
    packages, and a package the process (or the variable) already fixed to the other.
    """
    from lightning_multigrid._package_choice import ENV_VAR, TRAINER_MODULE, packages_named

    named = packages_named([*argv, *_config_texts(argv)])
    if not named:
        return
    command = f"lightning-multigrid {argv[0]}: error:"
    if len(named) > 1:
        _refuse(f"{command} the configuration names classes of both Lightning packages (`lightning.pytorch.` and "
                "`pytorch_lightning.`), and a Trainer of one refuses the other's: write them all from one package.")
    package = named.pop()
    chosen = getattr(sys.modules.get("lightning_multigrid._lightning"), "PACKAGE", None) or os.environ.get(ENV_VAR)
    if chosen and chosen != package:
        _refuse(f"{command} the configuration names `{TRAINER_MODULE[package]}.` classes, but this process uses "
                f"`{chosen}` (`{ENV_VAR}` or an earlier import chose it): set `{ENV_VAR}={package}`, or write the "
                f"classes as `{TRAINER_MODULE[chosen]}.`.")
    os.environ[ENV_VAR] = package


def _config_texts(argv: list[str]) -> list[str]:
    """The text of every ``--config``/``-c`` file the arguments name (a value that is no file is YAML itself,
    already among the arguments)."""
    texts = []
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            value: str | None = arg.split("=", 1)[1]
        else:
            value = argv[i + 1] if arg in ("--config", "-c") and i + 1 < len(argv) else None
        if value is not None and os.path.isfile(value):
            with open(value, encoding="utf-8", errors="replace") as file:
                texts.append(file.read())
    return texts


def _refuse(message: str) -> None:
    print(message, file=sys.stderr)
    raise SystemExit(2)

