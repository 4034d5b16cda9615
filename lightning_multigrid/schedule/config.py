"""What a multigrid schedule is built from: the multigrid options and the baseline run's settings.

:class:`MultigridOptions` holds the user's multigrid options (the callback's, the ``schedule``
command's), each default written once here (:data:`DEFAULTS`); it checks itself on construction.
:class:`MultigridConfig` holds them whole beside the baseline run's settings (base grid, epochs,
milestones, devices) and picks the batch sizing once (:attr:`MultigridConfig.sizer`: Equation 1, or
each grid's measured cost per clip, :class:`ClipCost`; the sizing is :mod:`lightning_multigrid.schedule.sizing`'s, the
measuring :mod:`lightning_multigrid.schedule.cost`'s). Pure Python, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal, get_args

from lightning_multigrid._checks import check_bool, check_instance, check_positive_int, check_positive_number, is_number
from lightning_multigrid.grid import ClipSampling, GridShape
from lightning_multigrid.schedule.sizing import BatchSizer, CostSizer, Equation1Sizer, cost_sized_batch, scaled_size

__all__ = [
    "BatchSizing",
    "ClipCost",
    "DEFAULTS",
    "DEFAULT_SHORT_RUN",
    "DEFAULT_LONG_CYCLE_FACTORS",
    "DEFAULT_SHORT_CYCLE_FACTORS",
    "PRETRAINED_LONG_CYCLE_FACTORS",
    "SHORT_RUN_BASELINE_STEPS",
    "MultigridConfig",
    "MultigridOptions",
    "ShortRun",
    "check_milestones",
    "default_long_cycle_factors",
]

# (t_factor, s_factor) of the long-cycle base shapes, coarsest first (paper, Section 3.2).
DEFAULT_LONG_CYCLE_FACTORS: tuple[tuple[float, float], ...] = (
    (0.25, 0.5**0.5),
    (0.5, 0.5**0.5),
    (0.5, 1.0),
    (1.0, 1.0),
)
# Crop factors of the first two short-cycle iterations, relative to the baseline crop.
DEFAULT_SHORT_CYCLE_FACTORS: tuple[float, float] = (0.5, 0.5**0.5)
# Runs of fewer baseline optimizer steps per device are short: below multigrid's published regime
# (the preview's `VALIDATED_MIN_STEPS`, the same constant).
SHORT_RUN_BASELINE_STEPS = 10_000
# The default long-cycle shapes of a short run that starts from pretrained weights. To be chosen from
# the accuracy map (benchmarks/accuracy.py --map, docs/accuracy.md): the option that stays within 1
# point of the baseline on both fine-tuning tasks at the largest CPU saving. Until that map is taken
# on a quiet machine, the paper's shapes.
PRETRAINED_LONG_CYCLE_FACTORS: tuple[tuple[float, float], ...] = DEFAULT_LONG_CYCLE_FACTORS


# How a grid's batch is sized: Equation 1 (frames x pixels), or each grid's measured cost per clip
# (FLOPs of a forward + backward, or step time), so an iteration costs what a base iteration costs.
BatchSizing = Literal["equation1", "flops", "time"]


@dataclass(frozen=True, slots=True)
class ClipCost:
    """The measured cost of one clip of a grid, for batches sized by cost (``batch_sizing``).

    Args:
        num_frames: frames of the grid's clips.
        crop_size: crop of the grid's clips, in pixels.
        cost_per_clip: the cost of one clip in any unit (FLOPs, seconds), > 0; the schedule reads
            it relative to the base grid's, so one run's costs must share the unit.

    Raises:
        ValueError: naming the field, when a size is not a positive integer or the cost not a
            positive number.
    """

    num_frames: int
    crop_size: int
    cost_per_clip: float

    def __post_init__(self) -> None:
        check_positive_int("num_frames", self.num_frames)
        check_positive_int("crop_size", self.crop_size)
        check_positive_number("cost_per_clip", self.cost_per_clip)


def _is_factor(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1


@dataclass(frozen=True, slots=True)
class ShortRun:
    """The short-run mode, for runs of a few thousand iterations (see :class:`MultigridOptions`).

    Args:
        coarse_share: at most this fraction of the baseline's epochs on coarse grids, in ``[0, 1)``.
        max_lr_factor: largest batch growth (= LR factor) of a coarse grid, an integer >= 1 (1:
            every grid keeps the base batch and the run keeps the baseline's optimizer steps).
    """

    coarse_share: float = 0.5
    max_lr_factor: int = 1

    def __post_init__(self) -> None:
        if not is_number(self.coarse_share) or not 0 <= self.coarse_share < 1:
            raise ValueError(f"`short_run.coarse_share` must be a number in [0, 1), got {self.coarse_share!r}.")
        check_positive_int("short_run.max_lr_factor", self.max_lr_factor)


@dataclass(frozen=True, slots=True)
class MultigridOptions:
    """The multigrid options: everything about a schedule the user chooses, as one checked value.

    Args:
        long_cycle: vary frames and crop over epochs (paper, Section 3.2).
        short_cycle: vary the crop every iteration.
        epoch_factor: multigrid epochs relative to the baseline's ``max_epochs``.
        long_cycle_factors: ``(t_factor, s_factor)`` per long-cycle shape, coarsest first,
            each factor in ``(0, 1]``; the last one is usually ``(1, 1)``.
        short_cycle_factors: crop factors of the two smaller short-cycle iterations, in
            ``(0, 1]``, relative to the baseline crop. With both cycles on, no short-cycle crop may
            exceed a long-cycle crop (checked by :class:`MultigridConfig`, which knows the crop).
        bn_base_size: clips over which BatchNorm computes statistics.
        full_grid_share: at least this fraction of the baseline's iterations run at the full
            grid (base batch, frames and crop): the fine-tuning phase drops the short cycle and
            lasts ``ceil(full_grid_share * max_epochs)`` epochs or the paper's length, whichever
            is longer (one is added when the schedule has none). ``0`` keeps the paper's
            schedule exactly. For data whose classes differ by detail that only the full grid
            resolves, on short schedules (docs/accuracy.md).
        scale_bn_base_size: multiply ``bn_base_size`` by each long-cycle shape's relative batch
            ``r``, so a statistic covers as many values (clips x frames x pixels) on every grid
            as at the base shape; the paper keeps the clips fixed, so on the coarsest grid a
            statistic covers ``r`` times fewer values.
        short_run: the short-run mode (``None``: off), for runs of a few thousand iterations
            (progressive resizing, as Composer's ``ProgressiveResizing`` and FFCV do): the coarse
            grids of ``long_cycle_factors`` (those below the base shape) keep the base batch, or
            grow it by at most ``short_run.max_lr_factor`` (the LR factor); together they take at
            most ``short_run.coarse_share`` of the baseline's epochs, coarsest first, each grid's
            share proportional to ``1 / r`` (``r``: its Equation 1 cost ratio), so the mild grids
            get most of it and a coarse grid that rounds to no epoch is left out; the remaining
            epochs run at the full grid. ``max_epochs`` stays the baseline's and the LR stages
            stay at the baseline's milestones (the user's LR schedule maps one to one). The short
            cycle, ``epoch_factor`` and the fine-tuning phase are not used.
        pretrained: whether the model starts from pretrained weights, which picks the warm-up rule
            (:class:`~lightning_multigrid.schedule.lr.MultigridLR`'s ``warmup_in_steps``: the pretrained rule
            ramps over the warm-up's share of the baseline timeline, the from-scratch rule over its
            optimizer steps) and the default long-cycle shapes of a short run. ``None``: the
            LightningModule says (a ``pretrained`` attribute,
            :class:`~lightning_multigrid.contracts.PretrainedModule`; from scratch without one).
        batch_sizing: how each grid's batch is sized. ``"equation1"`` (the paper's): by frames x
            pixels, ``B * round(T*S^2 / (t*s^2))``. ``"flops"``/``"time"``: by each grid's cost per
            clip, measured for the model when fitting starts (FLOPs of one forward + backward, or
            its step time): ``round(B / relative cost)`` clips, so an iteration costs what a base
            iteration costs where the cost does not grow with frames x pixels (attention, or a grid
            the hardware runs slower per FLOP). The LR factor is then ``batch / B``, BatchNorm
            groups follow the batch, and each shape's epochs follow its average batch. Off
            (``"equation1"``) until measured to pay (docs/benchmarks.md).

    Raises:
        ValueError: naming the option, its constraint and its value.
    """

    long_cycle: bool = True
    short_cycle: bool = True
    epoch_factor: float = 1.5
    long_cycle_factors: Sequence[tuple[float, float]] = DEFAULT_LONG_CYCLE_FACTORS  # a tuple once built
    short_cycle_factors: tuple[float, float] = DEFAULT_SHORT_CYCLE_FACTORS
    bn_base_size: int = 8
    full_grid_share: float = 0.0
    scale_bn_base_size: bool = False
    short_run: ShortRun | None = None
    pretrained: bool | None = None
    batch_sizing: BatchSizing = "equation1"

    def __post_init__(self) -> None:
        for name in ("long_cycle", "short_cycle", "scale_bn_base_size"):
            check_bool(name, getattr(self, name))
        check_bool("pretrained", self.pretrained, allow_none=True)
        if self.short_run is not None and not isinstance(self.short_run, ShortRun):
            raise ValueError(
                f"`short_run` must be a ShortRun(coarse_share, max_lr_factor) or None (off), got {self.short_run!r}."
            )
        check_positive_number("epoch_factor", self.epoch_factor)
        check_positive_int("bn_base_size", self.bn_base_size)
        if self.batch_sizing not in get_args(BatchSizing):
            raise ValueError(
                f"`batch_sizing` must be one of {', '.join(map(repr, get_args(BatchSizing)))}, got {self.batch_sizing!r}."
            )
        if not is_number(self.full_grid_share) or not 0 <= self.full_grid_share <= 1:
            raise ValueError(f"`full_grid_share` must be a number in [0, 1], got {self.full_grid_share!r}.")
        if self.short_run is not None and self.full_grid_share > 0:
            raise ValueError(
                f"`short_run` and `full_grid_share`={self.full_grid_share!r} both decide the full grid's "
                "share: the short-run mode runs the full grid for all but `short_run.coarse_share` of the epochs. "
                "Set `full_grid_share=0`, or turn `short_run` off."
            )
        factors = self.long_cycle_factors
        if not isinstance(factors, Sequence) or not factors:
            raise ValueError(f"`long_cycle_factors` must name at least one shape, got {factors!r}.")
        for pair in factors:
            if not isinstance(pair, Sequence) or len(pair) != 2 or not all(_is_factor(f) for f in pair):
                raise ValueError(f"`long_cycle_factors` must be (t_factor, s_factor) pairs in (0, 1], got {pair!r}.")
        short = self.short_cycle_factors
        if not isinstance(short, Sequence) or len(short) != 2 or not all(_is_factor(f) for f in short):
            raise ValueError(f"`short_cycle_factors` must be two factors in (0, 1], got {short!r}.")
        # Lists (a YAML config, a checkpoint) become tuples, so equal options compare equal.
        object.__setattr__(self, "long_cycle_factors", tuple((pair[0], pair[1]) for pair in factors))
        object.__setattr__(self, "short_cycle_factors", (short[0], short[1]))

    @property
    def trains_short_cycle(self) -> bool:
        """Whether the stages train a short cycle: it is on and the short-run mode, which does not use it, off."""
        return self.short_cycle and self.short_run is None

    @property
    def max_lr_factor(self) -> int | None:
        """The cap on a grid's batch growth (= its LR factor): the short-run mode's; ``None`` (none) without it."""
        return None if self.short_run is None else self.short_run.max_lr_factor

    def manages_batchnorm(self, convert_batchnorm: bool) -> bool:
        """Whether the callback sets BatchNorm's grouping: with the long cycle only (without it the batch never
        changes and the model's BatchNorm stays as it is, DESIGN.md section 1), unless ``convert_batchnorm=False``."""
        return convert_batchnorm and self.long_cycle

    def to_dict(self) -> dict[str, Any]:
        """The options as plain values (``short_run`` a dict or ``None``), as checkpoints store them."""
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> MultigridOptions:
        """Rebuild options from :meth:`to_dict`, or from the flat keys checkpoints held before.

        Before the options were one value, a checkpoint's config held them at its top level, the
        short-run mode as ``short_run`` (a bool), ``short_run_coarse_share`` and
        ``short_run_max_lr_factor``; an option a still older checkpoint lacks takes its default.
        """
        values = dict(values)
        flat = {field: values.pop(key) for key, field in _FLAT_SHORT_RUN.items() if key in values}
        short_run = values.get("short_run")
        if isinstance(short_run, Mapping):
            values["short_run"] = ShortRun(**short_run)
        elif isinstance(short_run, bool):  # the flat format
            values["short_run"] = ShortRun(**flat) if short_run else None
        return cls(**values)


# The flat checkpoint keys of the short-run mode -> ShortRun's fields.
_FLAT_SHORT_RUN = {"short_run_coarse_share": "coarse_share", "short_run_max_lr_factor": "max_lr_factor"}


# The options as their defaults, the one place a default is written: the callback's signature and
# the `schedule` command read theirs from these.
DEFAULTS = MultigridOptions()
DEFAULT_SHORT_RUN = ShortRun()


def default_long_cycle_factors(pretrained: bool | None, baseline_steps: int | None) -> tuple[tuple[float, float], ...]:
    """The long-cycle shapes when the user names none.

    ``PRETRAINED_LONG_CYCLE_FACTORS`` for a short run (fewer than ``SHORT_RUN_BASELINE_STEPS``
    baseline optimizer steps per device) from pretrained weights; the paper's four shapes otherwise,
    and when either is not known (``None``).
    """
    if pretrained and baseline_steps is not None and baseline_steps < SHORT_RUN_BASELINE_STEPS:
        return PRETRAINED_LONG_CYCLE_FACTORS
    return DEFAULT_LONG_CYCLE_FACTORS


def check_milestones(milestones: Sequence[Any], max_epochs: int | None = None) -> None:
    """Raise ``ValueError`` unless ``milestones`` are integer epochs, strictly increasing, > 0 (and < ``max_epochs``)."""
    previous = 0
    for milestone in milestones:
        if not isinstance(milestone, int) or isinstance(milestone, bool):
            raise ValueError(f"`milestones` must be integers (epochs), got {milestones!r}.")
        if milestone <= previous:
            raise ValueError(f"`milestones` must be strictly increasing and > 0, got {list(milestones)!r}.")
        previous = milestone
    if max_epochs is not None and milestones and milestones[-1] >= max_epochs:
        raise ValueError(f"`milestones` must be < `max_epochs`={max_epochs}, got {list(milestones)!r}.")


@dataclass(frozen=True, slots=True)
class MultigridConfig:
    """The baseline run's settings and the multigrid options: what a schedule is built from.

    Args:
        base: the baseline grid ``B x T x S``: clips per device, frames per clip, crop in pixels.
        max_epochs: baseline number of epochs.
        milestones: epochs (0-based) where the baseline LR stages after the first start,
            strictly increasing, each in ``(0, max_epochs)``.
        sampling_rate: baseline frame stride ``tau``, a positive integer.
        gamma: LR decay per baseline stage (used for ``relative_lr`` only).
        devices: number of devices (ranks) training together.
        jitter_scales: ``(min, max)`` short side in pixels before the baseline crop; default
            :func:`~lightning_multigrid.grid.default_jitter_scales` (``(256, 320) * S / 224``).
        options: the multigrid options (:class:`MultigridOptions`; default: the paper's).
        clip_costs: with ``options.batch_sizing`` other than ``"equation1"``, the measured cost
            per clip of every grid of :meth:`cost_grids` (:class:`ClipCost`; the base grid's
            included); empty otherwise.

    Raises:
        ValueError: naming the setting; also when, with both cycles on, a long-cycle crop is
            smaller than a short-cycle crop, or when ``clip_costs`` are given to Equation 1's sizing
            or name a grid twice.
    """

    base: GridShape
    max_epochs: int
    milestones: tuple[int, ...] = ()
    sampling_rate: int = 1
    gamma: float = 0.1
    devices: int = 1
    jitter_scales: tuple[int, int] | None = None
    options: MultigridOptions = DEFAULTS
    clip_costs: tuple[ClipCost, ...] = ()
    _clip_sampling: ClipSampling = field(init=False, repr=False, compare=False)
    _sizer: BatchSizer = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.base, GridShape):
            raise TypeError(f"`base` must be a GridShape(batch_size, num_frames, crop_size), got {self.base!r}.")
        check_instance("options", self.options, MultigridOptions)
        for name in ("max_epochs", "devices"):
            check_positive_int(name, getattr(self, name))
        check_positive_number("gamma", self.gamma)
        check_milestones(self.milestones, self.max_epochs)
        sampling = ClipSampling(self.sampling_rate, self.jitter_scales)
        sampling.check_fits(self.crop_size)
        object.__setattr__(self, "_clip_sampling", sampling)
        object.__setattr__(self, "jitter_scales", sampling.jitter_scales)
        object.__setattr__(self, "milestones", tuple(self.milestones))
        if self.options.long_cycle and self.options.short_cycle:
            self._check_short_cycle_crops()
        object.__setattr__(self, "clip_costs", tuple(self.clip_costs))
        object.__setattr__(self, "_sizer", self._pick_sizer())

    def _pick_sizer(self) -> BatchSizer:
        """The one place that reads ``batch_sizing``: Equation 1's sizer (no ``clip_costs``), or the measured costs'."""
        method = self.options.batch_sizing
        if method == "equation1":
            if self.clip_costs:
                raise ValueError(
                    f"`clip_costs` are given ({len(self.clip_costs)} grids) but `batch_sizing`='equation1' does not "
                    "read them: pass `batch_sizing`='flops' or 'time' to size batches by them, or no `clip_costs`."
                )
            return Equation1Sizer(self.base)
        return CostSizer(self.base, method, self._clip_costs_by_grid())

    def _clip_costs_by_grid(self) -> dict[tuple[int, int], float]:
        """``clip_costs`` by ``(num_frames, crop_size)``; refused when a grid is named twice."""
        costs: dict[tuple[int, int], float] = {}
        for cost in self.clip_costs:
            check_instance("clip_costs entry", cost, ClipCost)
            key = (cost.num_frames, cost.crop_size)
            if key in costs:
                raise ValueError(f"`clip_costs` names the {key[0]} x {key[1]} grid (frames x crop) twice: give one cost per grid.")
            costs[key] = cost.cost_per_clip
        return costs

    @property
    def batch_size(self) -> int:
        """Baseline clips per device ``B``."""
        return self.base.batch_size

    @property
    def num_frames(self) -> int:
        """Baseline frames per clip ``T``."""
        return self.base.num_frames

    @property
    def crop_size(self) -> int:
        """Baseline crop ``S`` in pixels."""
        return self.base.crop_size

    @property
    def clip_sampling(self) -> ClipSampling:
        """``sampling_rate`` and ``jitter_scales`` as one value."""
        return self._clip_sampling

    @property
    def sizer(self) -> BatchSizer:
        """How each grid's batch is sized (``options.batch_sizing``): :class:`~lightning_multigrid.schedule.sizing.Equation1Sizer`,
        or :class:`~lightning_multigrid.schedule.sizing.CostSizer` over ``clip_costs``."""
        return self._sizer

    @property
    def num_lr_stages(self) -> int:
        return len(self.milestones) + 1

    @property
    def lr_stage_edges(self) -> tuple[int, ...]:
        """Baseline epochs where each LR stage starts, then ``max_epochs``: ``(0, *milestones, max_epochs)``."""
        return (0, *self.milestones, self.max_epochs)

    def lr_stage_bounds(self, lr_stage: int) -> tuple[int, int]:
        """Baseline epochs ``[start, end)`` of an LR stage."""
        edges = self.lr_stage_edges
        return edges[lr_stage], edges[lr_stage + 1]

    # ------------------------------------------------------------ Equation 1 over the base grid

    def grid_size(self, t_factor: float, s_factor: float) -> tuple[int, int]:
        """Frames and crop (pixels) of a ``(t_factor, s_factor)`` shape of the base grid, at least 1 each."""
        return scaled_size(self.num_frames, t_factor), scaled_size(self.crop_size, s_factor)

    def relative_batch(self, num_frames: int, crop_size: float) -> int:
        """Equation 1: batch relative to the baseline so every iteration costs about the same."""
        return Equation1Sizer(self.base).relative_batch(num_frames, crop_size)

    # ---------------------------------------------------- batches sized by measured cost

    @property
    def sizes_by_cost(self) -> bool:
        """Whether batches are sized by measured cost per clip (``batch_sizing`` other than Equation 1)."""
        return self.sizer.measure is not None

    def with_equation1_batches(self) -> MultigridConfig:
        """This config with the paper's batches (``batch_sizing='equation1'``, no costs): what the preview compares with."""
        return replace(self, options=replace(self.options, batch_sizing="equation1"), clip_costs=())

    def cost_grids(self) -> tuple[GridShape, ...]:
        """Every grid a schedule of this config may train on, base grid first, each at Equation 1's batch.

        What to measure for ``clip_costs``: the long-cycle shapes (the base shape's for fine-tuning,
        the only one without the long cycle) and, with the short cycle on, their short-cycle crops.
        Equation 1's batch keeps each measured step near a base iteration's memory and FLOPs.
        """
        options = self.options
        factors = [(1.0, 1.0), *(options.long_cycle_factors if options.long_cycle else ())]
        sizes: dict[tuple[int, int], None] = {}
        for t_factor, s_factor in factors:
            num_frames, crop_size = self.grid_size(t_factor, s_factor)
            for crop in (crop_size, *(self.short_cycle_crops() if options.trains_short_cycle else ())):
                sizes[(num_frames, crop)] = None
        return tuple(
            GridShape(self.batch_size * self.relative_batch(num_frames, crop), num_frames, crop) for num_frames, crop in sizes
        )

    def relative_cost(self, num_frames: int, crop_size: int) -> float:
        """Measured cost of one clip of a grid relative to one base-grid clip (``clip_costs``).

        Raises:
            ValueError: when ``clip_costs`` lack the grid or the base grid (every grid with Equation 1's sizing).
        """
        return self.sizer.relative_cost(num_frames, crop_size)

    def sized_batch(self, num_frames: int, crop_size: int) -> int:
        """Clips per device so an iteration of a grid costs what a base iteration costs, by measured cost
        (:func:`~lightning_multigrid.schedule.sizing.cost_sized_batch`: ``round(B / relative_cost)``, at least 1)."""
        return cost_sized_batch(self.batch_size, self.relative_cost(num_frames, crop_size))

    def short_cycle_crops(self) -> tuple[int, ...]:
        """Crops (pixels) of the two smaller short-cycle iterations."""
        return tuple(scaled_size(self.crop_size, f) for f in self.options.short_cycle_factors)

    # ---------------------------------------------------------------------------- checkpoints

    def to_dict(self) -> dict[str, Any]:
        """The settings as plain values (``base`` and ``options`` dicts), as checkpoints store them; see :meth:`from_dict`."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        return {
            **values, "base": asdict(self.base), "options": self.options.to_dict(),
            "clip_costs": [asdict(cost) for cost in self.clip_costs],
        }

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> MultigridConfig:
        """Rebuild a config from :meth:`to_dict` (sequences become tuples on construction).

        Also reads checkpoints written before the config held one ``GridShape`` (flat
        ``batch_size``/``num_frames``/``crop_size``), an integer ``sampling_rate`` (a float then)
        or one ``MultigridOptions`` (the options flat beside the baseline's settings).
        """
        values = dict(values)
        base = values.pop("base", None)
        if base is None:
            base = {name: values.pop(name) for name in ("batch_size", "num_frames", "crop_size")}
        values["base"] = GridShape(**base)
        rate = values.get("sampling_rate")
        if isinstance(rate, float) and rate.is_integer():
            values["sampling_rate"] = int(rate)
        options = values.pop("options", None)
        if options is None:  # the flat format: every key that is not the baseline's is an option
            baseline = {f.name for f in fields(cls) if f.init}
            options = {name: values.pop(name) for name in list(values) if name not in baseline}
        values["options"] = MultigridOptions.from_dict(options)
        values["clip_costs"] = tuple(ClipCost(**cost) for cost in values.get("clip_costs", ()))
        return cls(**values)

    def _check_short_cycle_crops(self) -> None:
        """Every short-cycle crop at most every long-cycle crop, in pixels.

        The short cycle shrinks the long-cycle crop and grows the batch by ``round((long/short)^2)``;
        a short crop above the long crop would enlarge the crop instead, with the same batch or, below
        ``long/short = 1/sqrt(2)``, a batch of 0 clips.
        """
        largest_short = max(self.short_cycle_crops())
        short_factors = self.options.short_cycle_factors
        for t_factor, s_factor in self.options.long_cycle_factors:
            long_crop = self.grid_size(t_factor, s_factor)[1]
            if long_crop < largest_short:
                raise ValueError(
                    f"`long_cycle_factors` entry ({t_factor}, {s_factor}) gives a {long_crop}-pixel crop, "
                    f"smaller than the {largest_short}-pixel short-cycle crop of `short_cycle_factors`="
                    f"{tuple(short_factors)} (of crop_size={self.crop_size}): the short cycle would "
                    f"enlarge the crop (and can give batches of no clips). Use s_factors >= "
                    f"{max(short_factors):.3f}, smaller `short_cycle_factors`, or `short_cycle=False`."
                )
