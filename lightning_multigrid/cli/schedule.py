"""`lightning-multigrid schedule`: preview the multigrid schedule of a baseline run.

Its arguments (the baseline run, the multigrid options with the defaults of
:data:`~lightning_multigrid.schedule.config.DEFAULTS`, the output) and its handler, registered in
:mod:`lightning_multigrid.cli.commands`. Pure Python: the preview imports no torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import warnings
from typing import get_args

from lightning_multigrid._checks import as_flags, check_output_file
from lightning_multigrid.grid import GridShape
from lightning_multigrid.schedule.build import build_schedule
from lightning_multigrid.schedule.config import (
    DEFAULT_SHORT_RUN,
    DEFAULTS,
    BatchSizing,
    MultigridConfig,
    MultigridOptions,
    ShortRun,
    default_long_cycle_factors,
)

__all__ = ["add_schedule_arguments", "run_schedule", "schedule_config", "schedule_options"]


def add_schedule_arguments(parser: argparse.ArgumentParser) -> None:
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
        "--batch-sizing", choices=get_args(BatchSizing), default=DEFAULTS.batch_sizing,
        help="how each grid's batch is sized: equation1 (the paper's, by frames x pixels; %(default)s), or by the "
        "cost per clip of --cost-model's backbone, counted in FLOPs or timed, so every iteration costs a base "
        "iteration's; the table then shows both batches",
    )
    multigrid.add_argument(
        "--cost-model", metavar="BACKBONE",
        help="with --batch-sizing flops or time: the VideoClassifier backbone (e.g. tiny, x3d_m, r3d_18) whose cost "
        "per clip is measured, with random weights: FLOPs on the meta device (seconds, no memory), time on this "
        "machine's GPU or CPU at each grid's Equation 1 batch",
    )
    multigrid.add_argument(
        "--pretrained", action=argparse.BooleanOptionalAction, default=None,
        help="the model starts from pretrained weights (--no-pretrained: from scratch); sets the regime advice "
        "and, for a run of under 10,000 baseline steps (needs --dataset-size), the default long-cycle shapes",
    )
    output = parser.add_argument_group("output")
    output.add_argument("--dataset-size", type=int, help="clips in the training set: adds iteration counts")
    output.add_argument(
        "--format", choices=("table", "json"), default="table",
        help="output format; in the JSON, `max_epochs` is the multigrid run's epochs (the `epochs` list's length) and "
        "`baseline_max_epochs` the baseline's (--max-epochs)",
    )
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


def schedule_options(args: argparse.Namespace) -> MultigridOptions:
    """The multigrid options of ``schedule``'s parsed arguments (``--long-cycle-factors`` unset: the paper's)."""
    # Built even without --short-run: a bad --short-run-* value is refused, not ignored.
    short_run = ShortRun(coarse_share=args.short_run_coarse_share, max_lr_factor=args.short_run_max_lr_factor)
    return MultigridOptions(
        long_cycle=not args.no_long_cycle,
        short_cycle=not args.no_short_cycle,
        epoch_factor=args.epoch_factor,
        long_cycle_factors=DEFAULTS.long_cycle_factors if args.long_cycle_factors is None else tuple(args.long_cycle_factors),
        bn_base_size=args.bn_base_size,
        full_grid_share=args.full_grid_share,
        scale_bn_base_size=args.scale_bn_base_size,
        short_run=short_run if args.short_run else None,
        batch_sizing=args.batch_sizing,
    )


def schedule_config(args: argparse.Namespace) -> MultigridConfig:
    """The schedule's config of ``schedule``'s parsed arguments."""
    return MultigridConfig(
        base=GridShape(args.batch_size, args.num_frames, args.crop_size),
        sampling_rate=args.sampling_rate,
        max_epochs=args.max_epochs,
        milestones=tuple(args.milestones),
        gamma=args.gamma,
        devices=args.devices,
        options=schedule_options(args),
    )


def _with_clip_costs(config: MultigridConfig, cost_model: str | None) -> MultigridConfig:
    """``config`` with its grids' costs measured for ``--cost-model`` when batches are sized by cost."""
    if config.sizer.measure is None:
        return config
    from lightning_multigrid.schedule.cost import (  # torch: only when asked for
        implausible_costs_warning,
        measure_backbone_costs,
    )

    assert cost_model is not None  # checked in run_schedule
    config = dataclasses.replace(config, clip_costs=measure_backbone_costs(config, cost_model))
    warning = implausible_costs_warning(config)
    if warning is not None:
        print(f"warning: {_as_flags(warning)}", file=sys.stderr)
    return config


def _as_flags(message: str) -> str:
    """A message of the library's (`max_epochs`) with this command's flags (`--max-epochs`), as its errors are."""
    parser = argparse.ArgumentParser()
    add_schedule_arguments(parser)
    return as_flags(message, parser)


def run_schedule(args: argparse.Namespace) -> None:
    from lightning_multigrid.schedule.preview import format_table, plot_schedule, schedule_to_dict

    if args.plot:
        check_output_file("--plot", args.plot, figure=True)
    if args.batch_sizing != "equation1" and args.cost_model is None:
        raise ValueError(
            f"`--batch-sizing {args.batch_sizing}` sizes each grid's batch by a model's measured cost: name the "
            "model with `--cost-model BACKBONE` (e.g. x3d_m), or use `--batch-sizing equation1`."
        )
    if args.batch_sizing == "equation1" and args.cost_model is not None:
        raise ValueError(
            f"`--cost-model {args.cost_model}` is measured only with `--batch-sizing flops` or `time`; add one, "
            "or drop `--cost-model`."
        )
    config = _with_clip_costs(schedule_config(args), args.cost_model)
    options = config.options
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
                config = _with_clip_costs(dataclasses.replace(config, options=options, clip_costs=()), args.cost_model)
                schedule = build_schedule(config)
    for warning in caught:
        print(f"warning: {_as_flags(str(warning.message))}", file=sys.stderr)
    if args.format == "json":
        print(json.dumps(schedule_to_dict(schedule, args.dataset_size, args.pretrained), indent=1))
    else:
        print(format_table(schedule, args.dataset_size, pretrained=args.pretrained,
                           size_hint="give `--dataset-size` (the training clips)"))
    if args.plot:
        plot_schedule(schedule, args.plot, args.dataset_size)
        print(f"wrote {args.plot}", file=sys.stderr)
