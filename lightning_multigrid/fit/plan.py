"""The fit plan: everything a multigrid fit decides, once, from what the run says. Pure Python.

``MultigridCallback`` reads what the Trainer, the LightningModule, the DataModule and a resumed
checkpoint say into one :class:`FitFacts`, in one place (:func:`~lightning_multigrid.fit.facts.read_fit`); then
:func:`plan_fit` decides the rest from those facts and the callback's options: the warm-up rule and
who chose it, the LR milestones, the long-cycle shapes, the :class:`~lightning_multigrid.schedule.config.MultigridConfig`
(or the checkpoint's, which a resume keeps or refuses), the Trainer limits mapped onto the multigrid
run, the schedule and the summary. The callback only applies the :class:`FitPlan`. With batches
sized by measured cost the plan names the grids to measure (:attr:`FitPlan.grids_to_measure`): the
callback measures them (torch: :func:`~lightning_multigrid.fit.facts.with_measured_costs`) and hands
the costs in (:meth:`FitPlan.with_clip_costs`).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lightning_multigrid.grid import ClipSampling, GridShape
from lightning_multigrid.schedule.build import MultigridSchedule, build_schedule
from lightning_multigrid.schedule.config import (
    ClipCost,
    MultigridConfig,
    MultigridOptions,
    ShortRun,
    default_long_cycle_factors,
)
from lightning_multigrid.schedule.limits import map_baseline_limits
from lightning_multigrid.schedule.preview import format_table

if TYPE_CHECKING:
    from lightning_multigrid.schedule.lr import WarmupSearch

__all__ = [
    "FitFacts", "FitPlan", "PretrainedChoice", "check_same_base", "check_same_length", "choose_milestones",
    "choose_pretrained", "needs_baseline_length", "plan_fit", "short_run_option",
]


@dataclass(frozen=True, slots=True)
class FitFacts:
    """What the run says about the baseline, read once when fitting starts.

    Args:
        base: the DataModule's base grid.
        clip_sampling: the DataModule's clip sampling.
        max_epochs: the baseline's epochs (the Trainer's ``max_epochs``).
        devices: ranks training together (the Trainer's world size).
        max_steps: the Trainer's (``-1``: none).
        val_check_interval: the Trainer's (an ``int`` counts baseline batches).
        accumulate_grad_batches: the Trainer's.
        limit_train_batches: the Trainer's (a fraction, or a number of batches).
        stepwise_lr: a scheduler of the user's steps every optimizer step (``interval="step"``).
        module_name: the LightningModule's class name, for messages.
        module_pretrained: the module's ``pretrained`` (``None``: it has none).
        module_milestones: the module's ``lr_milestones`` (``None``: it declares none).
        has_batchnorm: the module has BatchNorm layers.
        datamodule_name: the DataModule's class name, for the summary.
        dataset_size: training clips, over all devices (``None``: the DataModule does not say).
        checkpoint_config: a resumed checkpoint's schedule config (``MultigridConfig.to_dict``);
            ``None`` for a fresh fit.
        checkpoint_pretrained: the warm-up rule a resumed checkpoint trained with (``None``: a fresh
            fit, or a checkpoint saved before the rule was kept).
        batches_per_epoch: the baseline's train batches per epoch (with ``limit_train_batches``);
            ``None`` when not read: reading may build the train loader, so only where
            :func:`needs_baseline_length` says.
        scheduler_milestones: the LR milestones found in the user's ``MultiStepLR``/``StepLR``
            (:func:`~lightning_multigrid.schedule.lr.find_milestones`, at :attr:`steps_per_epoch`).
    """

    base: GridShape
    clip_sampling: ClipSampling
    max_epochs: int
    devices: int = 1
    max_steps: int = -1
    val_check_interval: float = 1.0
    accumulate_grad_batches: int = 1
    limit_train_batches: float = 1.0
    stepwise_lr: bool = False
    module_name: str = "LightningModule"
    module_pretrained: bool | None = None
    module_milestones: tuple[int, ...] | None = None
    has_batchnorm: bool = True
    datamodule_name: str = "LightningDataModule"
    dataset_size: int | None = None
    checkpoint_config: Mapping[str, Any] | None = None
    checkpoint_pretrained: bool | None = None
    batches_per_epoch: int | None = None
    scheduler_milestones: tuple[int, ...] = ()

    @property
    def steps_per_epoch(self) -> int:
        """Baseline optimizer steps per epoch (1 where the length was not read: nothing counts steps then)."""
        return max(1, math.ceil((self.batches_per_epoch or 1) / self.accumulate_grad_batches))


@dataclass(frozen=True, slots=True)
class PretrainedChoice:
    """Whether the run starts from pretrained weights, which picks its warm-up rule, and who says it.

    Args:
        pretrained: ``None`` when nobody says (the run trains as from scratch).
        source: who says it, for the summary.
    """

    pretrained: bool | None
    source: str


@dataclass(frozen=True, slots=True)
class FitPlan:
    """What a fit trains: :func:`plan_fit`'s answer, which ``MultigridCallback`` applies.

    Args:
        facts: what the run said.
        config: what the schedule is built from (a resumed checkpoint's, on resume).
        pretrained: the warm-up rule's choice.
        limits: Trainer settings given for the baseline, mapped onto the multigrid run
            (:func:`~lightning_multigrid.schedule.limits.map_baseline_limits`).
        schedule: the schedule; ``None`` until the costs of :attr:`grids_to_measure` are in.
        notes: what the decisions have to tell the user (logged as information).
    """

    facts: FitFacts
    config: MultigridConfig
    pretrained: PretrainedChoice
    limits: Mapping[str, Any]
    schedule: MultigridSchedule | None
    notes: tuple[str, ...] = ()

    @property
    def uses_pretrained(self) -> bool:
        """The warm-up rule trained with: pretrained, or from scratch (also when nobody says)."""
        return bool(self.pretrained.pretrained)

    @property
    def steps_per_epoch(self) -> int:
        """Baseline optimizer steps per epoch, the unit of the user's step-wise schedulers."""
        return self.facts.steps_per_epoch

    @property
    def grids_to_measure(self) -> tuple[GridShape, ...]:
        """The grids whose cost per clip the schedule still needs (none with Equation 1's batches, or on a
        resume, which has the checkpoint's costs)."""
        if self.config.sizer.measure is not None and not self.config.clip_costs:
            return self.config.cost_grids()
        return ()

    @property
    def trainer_settings(self) -> dict[str, Any]:
        """The Trainer settings the fit runs with instead of the user's: the mapped limits and the multigrid epochs."""
        assert self.schedule is not None, "FitPlan: measure `grids_to_measure` first (`with_clip_costs`)."
        return {**self.limits, "max_epochs": self.schedule.max_epochs}

    def with_clip_costs(self, costs: Sequence[ClipCost]) -> FitPlan:
        """This plan with the measured costs of :attr:`grids_to_measure`, and the schedule sized by them."""
        config = dataclasses.replace(self.config, clip_costs=tuple(costs))
        schedule, notes = _scheduled(config)
        return dataclasses.replace(self, config=config, schedule=schedule, notes=self.notes + notes)

    def summary(self, *, convert_batchnorm: bool, manage_lr: bool, warmup_search: WarmupSearch | None) -> str:
        """The schedule table the callback logs when fitting starts, and the warm-up rule used when it manages the LR.

        Args:
            convert_batchnorm: the callback's.
            manage_lr: the callback's.
            warmup_search: what the LR wrapper found of the baseline's warm-up (``None``: not searched).
        """
        assert self.schedule is not None
        facts = self.facts
        table = format_table(
            self.schedule, facts.dataset_size, convert_batchnorm, self.pretrained.pretrained,
            size_hint=f"give {facts.datamodule_name} a `train_dataset_size` property (its training clips)",
            has_batchnorm=facts.has_batchnorm, limit_train_batches=facts.limit_train_batches,
        )
        return "Multigrid schedule\n" + table + ("\n" + self._warmup_rule(warmup_search) if manage_lr else "")

    def _warmup_rule(self, search: WarmupSearch | None) -> str:
        """The summary line naming the warm-up rule and who chose it, or saying there is no warm-up."""
        if search is not None and search.warmup is None:
            return f"warm-up: none ({search.describe()}), so no warm-up rule applies."
        found = "" if search is None else f"{search.describe()}; "
        source = self.pretrained.source
        if self.pretrained.pretrained:
            return f"warm-up: pretrained rule ({found}a warm-up covers its share of the baseline timeline; {source})."
        return f"warm-up: from-scratch rule ({found}a warm-up lasts the baseline warm-up's optimizer steps; {source})."


def plan_fit(
    facts: FitFacts, options: MultigridOptions, *, milestones: Sequence[int] | None = None,
    long_cycle_factors_given: bool = True,
) -> FitPlan:
    """Decide a fit from what the run says and the callback's options.

    Args:
        facts: what the run says.
        options: the callback's multigrid options.
        milestones: the callback's ``milestones`` (``None``: the module's or the schedulers', see
            :func:`choose_milestones`).
        long_cycle_factors_given: the user named the long-cycle shapes; otherwise they are the
            default for the run (:func:`~lightning_multigrid.schedule.config.default_long_cycle_factors`).

    Raises:
        ValueError: for what cannot train: ``max_steps`` ending the baseline early, a resume that
            asks for another warm-up rule, base grid or baseline length than its checkpoint's, and
            the config's own checks.
    """
    pretrained = choose_pretrained(facts, options.pretrained)
    steps = facts.steps_per_epoch
    limits = map_baseline_limits(
        max_steps=facts.max_steps, val_check_interval=facts.val_check_interval,
        batches_per_epoch=facts.batches_per_epoch or 1, steps_per_epoch=steps, max_epochs=facts.max_epochs,
    )
    if not long_cycle_factors_given:
        factors = default_long_cycle_factors(bool(pretrained.pretrained), facts.max_epochs * steps)
        options = dataclasses.replace(options, long_cycle_factors=factors)
    chosen, notes = choose_milestones(facts, milestones)
    config = MultigridConfig(
        base=facts.base, max_epochs=facts.max_epochs, milestones=chosen,
        sampling_rate=facts.clip_sampling.sampling_rate, devices=facts.devices,
        jitter_scales=facts.clip_sampling.jitter_scales, options=options,
    )
    if facts.checkpoint_config is not None:
        config, note = _resumed_config(facts.checkpoint_config, config)
        notes += note
    plan = FitPlan(facts, config, pretrained, limits, schedule=None, notes=notes)
    if plan.grids_to_measure:
        return plan
    schedule, built = _scheduled(config)
    return dataclasses.replace(plan, schedule=schedule, notes=notes + built)


def needs_baseline_length(facts: FitFacts, options: MultigridOptions, *, long_cycle_factors_given: bool) -> bool:
    """Whether the plan needs the baseline's batches per epoch: a step-wise scheduler, ``max_steps`` or an
    integer ``val_check_interval`` counts them, and the default long-cycle shapes of a run from pretrained
    weights depend on whether it is short."""
    counted = facts.stepwise_lr or facts.max_steps != -1 or isinstance(facts.val_check_interval, int)
    return counted or (not long_cycle_factors_given and bool(choose_pretrained(facts, options.pretrained).pretrained))


def choose_pretrained(facts: FitFacts, asked: bool | None) -> PretrainedChoice:
    """Whether the run starts from pretrained weights: a resumed checkpoint's choice, else the callback's
    ``pretrained`` (``asked``), else the module's.

    The rule a run trained with holds to its end (its warm-up and LRs must not change under a resume):
    a module that says otherwise than the checkpoint is told, and the checkpoint's is kept.

    Raises:
        ValueError: ``MultigridCallback(pretrained=...)`` asks for the other rule than the checkpoint's.
    """
    if asked is not None:
        choice = PretrainedChoice(asked, f"`MultigridCallback(pretrained={asked})`")
    elif facts.module_pretrained is not None:
        choice = PretrainedChoice(facts.module_pretrained, f"the module's `pretrained` ({facts.module_pretrained})")
    else:
        choice = PretrainedChoice(None, (
            f"{facts.module_name} has no `pretrained` attribute; pass `MultigridCallback(pretrained=True)` "
            "if it starts from pretrained weights"
        ))
    saved = facts.checkpoint_pretrained
    if saved is None or bool(choice.pretrained) == saved:
        return choice
    rule = "pretrained" if saved else "from-scratch"
    if asked is not None:
        raise ValueError(
            f"MultigridCallback: the checkpoint was trained with the {rule} warm-up rule (pretrained={saved}), but "
            f"this fit asks for the other one with {choice.source}. The rule sets the warm-up's LRs, so the resumed run "
            f"would train other steps than the run it continues. Resume with `MultigridCallback(pretrained={saved})` or "
            "`pretrained=None` (the checkpoint's rule); for the other rule, start a new run from the checkpoint's "
            "weights (`model.load_state_dict(torch.load(path)['state_dict'])`, then `fit` without `ckpt_path`)."
        )
    return PretrainedChoice(saved, (
        f"the checkpoint's, pretrained={saved}: the run it resumes trained with this rule, which holds to its end; "
        f"this fit's choice is not used ({choice.source}; a model rebuilt without `weights=` once the weights file is gone, say)"
    ))


def choose_milestones(facts: FitFacts, given: Sequence[int] | None) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The baseline's LR milestones: given to the callback, declared by the module (``lr_milestones``), or
    found in its schedulers; and a note when none are found."""
    if given is not None:
        return tuple(given), ()
    if facts.module_milestones is not None:
        return facts.module_milestones, ()
    if facts.scheduler_milestones:
        return facts.scheduler_milestones, ()
    return (), (
        "no LR milestones found (no MultiStepLR/StepLR): the long cycle runs once over the whole training. "
        "Pass `MultigridCallback(milestones=[...])` for a step-like schedule.",
    )


def short_run_option(short_run: bool | ShortRun | None) -> ShortRun | None:
    """The callback's ``short_run`` as the options hold it: ``True`` is the mode with its defaults.

    Raises:
        ValueError: for anything else than a bool, ``None`` or a :class:`~lightning_multigrid.schedule.config.ShortRun`.
    """
    if short_run is None or isinstance(short_run, ShortRun):
        return short_run
    if short_run is True:
        return ShortRun()
    if short_run is False:
        return None
    raise ValueError(
        f"`short_run` must be True, False or a ShortRun(coarse_share, max_lr_factor), got {short_run!r}."
    )


def check_same_base(restored: MultigridConfig, config: MultigridConfig) -> None:
    """Refuse to resume a schedule built for another base shape or clip sampling than the DataModule's.

    Raises:
        ValueError: naming both values and the fix.
    """
    names = ("base", "sampling_rate", "jitter_scales")
    changed = [name for name in names if getattr(restored, name) != getattr(config, name)]
    if not changed:
        return
    saved = ", ".join(f"{name}={getattr(restored, name)}" for name in changed)
    now = ", ".join(f"{name}={getattr(config, name)}" for name in changed)
    raise ValueError(
        f"MultigridCallback: the checkpoint's multigrid schedule was built for {saved}, but this run's DataModule "
        f"has {now}. Every grid, epoch and LR factor of the schedule follows from the base shape and the clip "
        "sampling, so the run cannot go on exactly with other ones (it would serve the checkpoint's grids, not "
        "yours). Resume with the checkpoint's DataModule settings; for a smaller batch (less memory per step), start "
        "a new run from the checkpoint's weights: `model.load_state_dict(torch.load(path)['state_dict'])`, then "
        "`fit` without `ckpt_path`."
    )


def check_same_length(restored: MultigridConfig, config: MultigridConfig) -> None:
    """Refuse to resume a schedule built for another baseline ``max_epochs`` than the Trainer's.

    The stages' epochs are the whole schedule scaled to ``epoch_factor * max_epochs``, so a longer
    baseline moves every stage: its schedule does not continue the checkpoint's (a finished run
    resumed with a larger ``max_epochs`` would train 0 steps and return as if done).

    Raises:
        ValueError: naming both values and the fix.
    """
    if restored.max_epochs == config.max_epochs:
        return
    outcome = "end where it is" if config.max_epochs > restored.max_epochs else "run past yours"
    raise ValueError(
        f"MultigridCallback: the checkpoint's multigrid schedule was built for a {restored.max_epochs}-epoch baseline "
        f"(`max_epochs`={restored.max_epochs}), but this Trainer has `max_epochs`={config.max_epochs}. Every stage's "
        "epochs follow from `max_epochs` (scaled to `epoch_factor` times it), so a schedule of another length does not "
        f"continue the checkpoint's, and the checkpoint's own would {outcome}. "
        f"Resume with `max_epochs={restored.max_epochs}`; to train longer, start a new run from the checkpoint's "
        "weights (`model.load_state_dict(torch.load(path)['state_dict'])`, then `fit` without `ckpt_path`, with a "
        "pretrained warm-up: `MultigridCallback(pretrained=True)`)."
    )


def _resumed_config(saved: Mapping[str, Any], config: MultigridConfig) -> tuple[MultigridConfig, tuple[str, ...]]:
    """The checkpoint's config, which a resume keeps (or refuses), and a note when this run's settings differ.

    The checkpoint fixes the epochs (they must not move under a resumed run); the BatchNorm plan
    follows the devices this run has, which may differ from the saved run's.
    """
    restored = dataclasses.replace(MultigridConfig.from_dict(dict(saved)), devices=config.devices)
    check_same_base(restored, config)
    check_same_length(restored, config)
    if dataclasses.replace(restored, clip_costs=()) == config:
        return restored, ()
    return restored, (f"the checkpoint's schedule settings differ from this run's; resuming the checkpoint's schedule ({restored}).",)


def _scheduled(config: MultigridConfig) -> tuple[MultigridSchedule, tuple[str, ...]]:
    """The schedule of ``config`` and its warnings (a short schedule's, say), as notes for the user."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        schedule = build_schedule(config)
    return schedule, tuple(str(warning.message) for warning in caught)
