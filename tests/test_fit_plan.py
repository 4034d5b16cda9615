"""The fit plan's decisions, from literal facts: no Trainer, no model."""

from __future__ import annotations

import dataclasses

import pytest

from lightning_multigrid.fit import plan as fit_plan
from lightning_multigrid.fit.plan import (
    FitFacts,
    PretrainedChoice,
    choose_milestones,
    choose_pretrained,
    needs_baseline_length,
    plan_fit,
    short_run_option,
)
from lightning_multigrid.grid import ClipSampling, GridShape
from lightning_multigrid.schedule import build_schedule
from lightning_multigrid.schedule.config import DEFAULTS, ClipCost, MultigridConfig, MultigridOptions, ShortRun
from lightning_multigrid.schedule.lr import Warmup, WarmupSearch
from lightning_multigrid.schedule.preview import format_table

BASE = GridShape(8, 16, 112)
SAMPLING = ClipSampling(2)
# A 20-epoch baseline of 10 batches per epoch, two LR stages.
FACTS = FitFacts(base=BASE, clip_sampling=SAMPLING, max_epochs=20, module_name="MyModel", datamodule_name="MyData")
NOBODY = (
    "MyModel has no `pretrained` attribute; pass `MultigridCallback(pretrained=True)` if it starts from pretrained weights"
)


def _facts(**changes) -> FitFacts:
    return dataclasses.replace(FACTS, **changes)


# ------------------------------------------------------------------ the pretrained choice


@pytest.mark.parametrize(
    ("asked", "module", "expected"),
    [
        (True, False, PretrainedChoice(True, "`MultigridCallback(pretrained=True)`")),  # the callback wins
        (False, True, PretrainedChoice(False, "`MultigridCallback(pretrained=False)`")),
        (None, True, PretrainedChoice(True, "the module's `pretrained` (True)")),
        (None, False, PretrainedChoice(False, "the module's `pretrained` (False)")),
        (None, None, PretrainedChoice(None, NOBODY)),
    ],
)
def test_the_callback_says_else_the_module_says_else_nobody(asked, module, expected):
    assert choose_pretrained(_facts(module_pretrained=module), asked) == expected


def test_a_resume_keeps_the_checkpoints_rule_over_the_modules():
    # A VideoClassifier rebuilt without `weights=` once the weights file is gone says False.
    choice = choose_pretrained(_facts(module_pretrained=False, checkpoint_pretrained=True), None)
    assert choice == PretrainedChoice(True, (
        "the checkpoint's, pretrained=True: the run it resumes trained with this rule, which holds to its end; this "
        "fit's choice is not used (the module's `pretrained` (False); a model rebuilt without `weights=` once the "
        "weights file is gone, say)"
    ))


@pytest.mark.parametrize(("saved", "module"), [(False, False), (False, None), (True, True)])
def test_a_resume_that_agrees_keeps_this_fits_words(saved, module):
    facts = _facts(module_pretrained=module, checkpoint_pretrained=saved)
    assert choose_pretrained(facts, None) == choose_pretrained(_facts(module_pretrained=module), None)


def test_the_callback_asking_for_the_other_rule_than_the_checkpoints_is_refused():
    facts = _facts(module_pretrained=True, checkpoint_pretrained=True)
    with pytest.raises(ValueError, match=r"trained with the pretrained warm-up rule \(pretrained=True\), but this fit asks"):
        choose_pretrained(facts, False)
    with pytest.raises(ValueError, match=r"from-scratch warm-up rule \(pretrained=False\).*`MultigridCallback\(pretrained=True\)`"):
        choose_pretrained(_facts(checkpoint_pretrained=False), True)


# ------------------------------------------------------------------------- milestones


def test_milestones_given_then_the_modules_then_the_schedulers():
    facts = _facts(module_milestones=(8,), scheduler_milestones=(12,))
    assert choose_milestones(facts, [5, 15]) == ((5, 15), ())
    assert choose_milestones(facts, None) == ((8,), ())
    assert choose_milestones(_facts(scheduler_milestones=(12,)), None) == ((12,), ())
    # A module that declares no milestones (VideoClassifier without any) is taken at its word.
    assert choose_milestones(_facts(module_milestones=(), scheduler_milestones=(12,)), None) == ((), ())


def test_no_milestones_found_is_one_long_cycle_and_said():
    milestones, notes = choose_milestones(FACTS, None)
    assert milestones == ()
    assert notes == (
        "no LR milestones found (no MultiStepLR/StepLR): the long cycle runs once over the whole training. "
        "Pass `MultigridCallback(milestones=[...])` for a step-like schedule.",
    )


# ------------------------------------------------------------------------- short run


@pytest.mark.parametrize(
    ("given", "expected"),
    [(None, None), (False, None), (True, ShortRun()), (ShortRun(0.3, 2), ShortRun(0.3, 2))],
)
def test_short_run_none_true_false_or_a_value(given, expected):
    assert short_run_option(given) == expected


@pytest.mark.parametrize("given", ["yes", 1, {"coarse_share": 0.3}])
def test_short_run_of_another_kind_is_refused(given):
    with pytest.raises(ValueError, match="`short_run` must be True, False or a ShortRun"):
        short_run_option(given)


# ------------------------------------------------------------------- the baseline's length


@pytest.mark.parametrize(
    ("changes", "pretrained", "given", "expected"),
    [
        ({}, None, True, False),
        ({"val_check_interval": 0.5}, None, True, False),  # a fraction of an epoch needs no count
        ({"stepwise_lr": True}, None, True, True),
        ({"max_steps": 1000}, None, True, True),
        ({"val_check_interval": 50}, None, True, True),
        ({}, True, False, True),  # is the run short? it picks the default long-cycle shapes
        ({}, True, True, False),  # ... unless the user named them
        ({}, False, False, False),
        ({"module_pretrained": True}, None, False, True),
    ],
)
def test_the_baseline_length_is_read_only_where_a_decision_counts_it(changes, pretrained, given, expected):
    options = dataclasses.replace(DEFAULTS, pretrained=pretrained)
    assert needs_baseline_length(_facts(**changes), options, long_cycle_factors_given=given) is expected


def test_steps_per_epoch_count_accumulation_and_default_to_one():
    assert FACTS.steps_per_epoch == 1  # not read: nothing counts steps
    assert _facts(batches_per_epoch=10, accumulate_grad_batches=3).steps_per_epoch == 4  # ceil(10 / 3)


# ------------------------------------------------------------------------------- the plan


def test_a_fresh_plan_holds_the_config_the_schedule_and_the_trainer_settings():
    facts = _facts(devices=2, scheduler_milestones=(15,), module_pretrained=False)
    plan = plan_fit(facts, DEFAULTS, long_cycle_factors_given=True)
    config = MultigridConfig(base=BASE, max_epochs=20, milestones=(15,), sampling_rate=2, devices=2, options=DEFAULTS)
    assert plan.config == config
    assert plan.schedule == build_schedule(config)
    assert plan.grids_to_measure == ()
    assert plan.notes == ()
    assert plan.trainer_settings == {"max_epochs": plan.schedule.max_epochs}
    assert plan.pretrained == PretrainedChoice(False, "the module's `pretrained` (False)")
    assert not plan.uses_pretrained


def test_the_baselines_limits_are_mapped():
    # 10 batches, 2 per optimizer step: 5 steps per epoch, 100 over the 20 epochs.
    facts = _facts(batches_per_epoch=10, accumulate_grad_batches=2, max_steps=100, val_check_interval=4)
    plan = plan_fit(facts, DEFAULTS)
    assert plan.steps_per_epoch == 5
    assert plan.limits == {"max_steps": -1, "val_check_interval": 0.4}  # 4 of 10 batches
    assert plan.trainer_settings == {"max_steps": -1, "val_check_interval": 0.4, "max_epochs": plan.schedule.max_epochs}
    with pytest.raises(ValueError, match=r"`Trainer\(max_steps=99\)` ends the baseline run"):
        plan_fit(dataclasses.replace(facts, max_steps=99), DEFAULTS)


def test_the_default_long_cycle_shapes_follow_the_warmup_rule_and_the_baselines_steps(monkeypatch):
    asked = []
    chosen = ((0.5, 1.0), (1.0, 1.0))
    monkeypatch.setattr(fit_plan, "default_long_cycle_factors", lambda *args: asked.append(args) or chosen)
    facts = _facts(batches_per_epoch=30, accumulate_grad_batches=2, module_pretrained=True)  # 15 steps per epoch
    plan = plan_fit(facts, DEFAULTS, long_cycle_factors_given=False)
    assert asked == [(True, 20 * 15)]
    assert plan.config.options.long_cycle_factors == chosen
    asked.clear()
    assert plan_fit(facts, DEFAULTS, long_cycle_factors_given=True).config.options == DEFAULTS  # the user's win
    assert asked == []


def test_schedule_warnings_become_notes():
    # 2 multigrid epochs cannot give each of the four long-cycle shapes one.
    plan = plan_fit(_facts(max_epochs=1), DEFAULTS, milestones=[])
    assert len(plan.notes) == 1 and "too few for every long-cycle shape to get an epoch" in plan.notes[0]


# ------------------------------------------------------------------------------- resume


def _saved(**changes) -> dict:
    config = MultigridConfig(base=BASE, max_epochs=20, sampling_rate=2, options=DEFAULTS)
    return dataclasses.replace(config, **changes).to_dict()


def test_a_resume_keeps_the_checkpoints_config_with_this_runs_devices():
    plan = plan_fit(_facts(devices=4, checkpoint_config=_saved()), DEFAULTS, milestones=[])
    assert plan.config == MultigridConfig(base=BASE, max_epochs=20, sampling_rate=2, devices=4, options=DEFAULTS)
    assert plan.notes == ()


def test_a_resume_with_other_options_keeps_the_checkpoints_and_says_so():
    saved = _saved(options=dataclasses.replace(DEFAULTS, epoch_factor=2.0))
    plan = plan_fit(_facts(checkpoint_config=saved), DEFAULTS, milestones=[])
    assert plan.config.options.epoch_factor == 2.0
    assert len(plan.notes) == 1
    assert plan.notes[0].startswith("the checkpoint's schedule settings differ from this run's; resuming")


@pytest.mark.parametrize(
    ("saved", "match"),
    [
        ({"max_epochs": 30}, r"built for a 30-epoch baseline \(`max_epochs`=30\), but this Trainer has `max_epochs`=20"),
        ({"base": GridShape(4, 16, 112)}, r"built for base=GridShape\(batch_size=4"),
        ({"sampling_rate": 4}, r"built for sampling_rate=4, but this run's DataModule has sampling_rate=2"),
    ],
)
def test_a_resume_of_another_baseline_is_refused(saved, match):
    with pytest.raises(ValueError, match=match):
        plan_fit(_facts(checkpoint_config=_saved(**saved)), DEFAULTS, milestones=[])


# ------------------------------------------------------------------- batches sized by cost


def test_batches_sized_by_cost_wait_for_the_measured_grids():
    options = dataclasses.replace(DEFAULTS, batch_sizing="flops")
    plan = plan_fit(FACTS, options, milestones=[])
    assert plan.schedule is None
    assert plan.grids_to_measure == plan.config.cost_grids()
    costs = [ClipCost(g.num_frames, g.crop_size, g.num_frames * g.crop_size**2) for g in plan.grids_to_measure]
    measured = plan.with_clip_costs(costs)
    assert measured.config.clip_costs == tuple(costs)
    assert measured.schedule == build_schedule(measured.config)
    assert measured.grids_to_measure == ()
    # A resume has the checkpoint's costs: nothing to measure.
    resumed = plan_fit(_facts(checkpoint_config=measured.config.to_dict()), options, milestones=[])
    assert resumed.grids_to_measure == () and resumed.schedule is not None


# ------------------------------------------------------------------------------- summary


def _table(plan, convert_batchnorm=True) -> str:
    facts = plan.facts
    return format_table(
        plan.schedule, facts.dataset_size, convert_batchnorm, plan.pretrained.pretrained,
        size_hint="give MyData a `train_dataset_size` property (its training clips)",
        has_batchnorm=facts.has_batchnorm, limit_train_batches=facts.limit_train_batches,
    )


def test_the_summary_is_the_table_then_the_warmup_rule():
    plan = plan_fit(_facts(dataset_size=1000), MultigridOptions(pretrained=True), milestones=[15])
    summary = plan.summary(convert_batchnorm=True, manage_lr=True, warmup_search=None)
    assert summary == (
        "Multigrid schedule\n" + _table(plan) + "\nwarm-up: pretrained rule (a warm-up covers its share of the "
        "baseline timeline; `MultigridCallback(pretrained=True)`)."
    )
    # Without the LR managed, no rule applies; without a dataset size, the table says how to give it.
    plan = plan_fit(FACTS, DEFAULTS, milestones=[15])
    summary = plan.summary(convert_batchnorm=False, manage_lr=False, warmup_search=None)
    assert summary == "Multigrid schedule\n" + _table(plan, convert_batchnorm=False)
    assert "give MyData a `train_dataset_size` property" in summary


@pytest.mark.parametrize(
    ("search", "expected"),
    [
        (
            WarmupSearch(None, 0),
            "warm-up: none (the baseline's LR does not rise at its start), so no warm-up rule applies.",
        ),
        (
            WarmupSearch(Warmup(2.0, (0.01,), (0.1,)), 20),
            "warm-up: from-scratch rule (the baseline's LR rises over its first 2 epochs; a warm-up lasts the "
            f"baseline warm-up's optimizer steps; {NOBODY}).",
        ),
    ],
)
def test_the_summary_names_the_warmup_rule_and_who_chose_it(search, expected):
    plan = plan_fit(FACTS, DEFAULTS, milestones=[15])
    assert plan.summary(convert_batchnorm=True, manage_lr=True, warmup_search=search).splitlines()[-1] == expected
