"""BaselineLR (the user's scheduler read at baseline positions, without touching the real one) and
MultigridLR (each optimizer step at the mapped LR times the long-cycle factor)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.optim.lr_scheduler import CosineAnnealingLR, LambdaLR, LinearLR, MultiStepLR, OneCycleLR, SequentialLR

from lightning_multigrid.grid import GridShape
from lightning_multigrid.schedule import build_schedule
from lightning_multigrid.schedule.config import MultigridConfig, MultigridOptions
from lightning_multigrid.schedule.lr import (
    BaselineLR,
    MultigridLR,
    Warmup,
    WarmupSearch,
    baseline_epochs_worked,
    find_warmup,
    search_warmup,
)


def _optimizer(lr: float = 0.1) -> torch.optim.Optimizer:
    model = torch.nn.Linear(3, 2)
    return torch.optim.SGD(
        [{"params": [model.weight]}, {"params": [model.bias], "lr": lr / 10}], lr=lr, momentum=0.9
    )


def test_multistep_per_epoch():
    optimizer = _optimizer()
    baseline = BaselineLR(optimizer, MultiStepLR(optimizer, [3, 6], gamma=0.1))
    assert baseline.lrs_at(0) == pytest.approx([0.1, 0.01])
    assert baseline.lrs_at(2.99) == pytest.approx([0.1, 0.01])
    assert baseline.lrs_at(3.0) == pytest.approx([0.01, 0.001])
    assert baseline.lrs_at(7.5) == pytest.approx([0.001, 0.0001])
    # The user's optimizer is untouched.
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.1, 0.01])


def test_warmup_then_multistep():
    optimizer = _optimizer()
    # Warm-up 0.1 -> 1.0 of the LR over 2 epochs, then decays at (absolute) epochs 2 + 3 = 5.
    scheduler = SequentialLR(
        optimizer, [LinearLR(optimizer, 0.1, total_iters=2), MultiStepLR(optimizer, [3])], milestones=[2]
    )
    baseline = BaselineLR(optimizer, scheduler)
    # Epoch 0: 0.1 * 0.1; epoch 1: 0.1 * (0.1 + 0.9 / 2) = 0.055; epochs 2-4: 0.1; from 5: 0.01.
    assert [baseline.lrs_at(e)[0] for e in (0, 1, 2, 4, 5)] == pytest.approx([0.01, 0.055, 0.1, 0.1, 0.01])


def test_cosine_per_step():
    optimizer = _optimizer()
    baseline = BaselineLR(optimizer, CosineAnnealingLR(optimizer, T_max=100), interval="step", steps_per_epoch=10)
    # Baseline epoch 2.5 = step 25: 0.1 * (1 + cos(pi * 25 / 100)) / 2.
    assert baseline.lrs_at(2.5)[0] == pytest.approx(0.05 * (1 + math.cos(math.pi / 4)))


def test_one_cycle_per_step_and_past_its_end():
    optimizer = _optimizer()
    scheduler = OneCycleLR(optimizer, max_lr=1.0, total_steps=40, pct_start=0.5, anneal_strategy="linear")
    baseline = BaselineLR(optimizer, scheduler, interval="step", steps_per_epoch=10)
    # Initial LR is max_lr / 25 = 0.04; after 19 steps (the peak at step pct_start * 40 - 1) it is 1.0.
    assert baseline.lrs_at(0)[0] == pytest.approx(0.04)
    assert baseline.lrs_at(1.9)[0] == pytest.approx(1.0)
    last = baseline.lrs_at(3.99)[0]
    assert baseline.lrs_at(10)[0] == pytest.approx(last)  # stepping past the end keeps the last LR


def test_lambda_frequency_and_no_scheduler():
    optimizer = _optimizer()
    baseline = BaselineLR(optimizer, LambdaLR(optimizer, lambda e: 0.5**e), frequency=2)
    # Stepped every 2 epochs: at epoch 5 it has stepped twice.
    assert baseline.lrs_at(5)[0] == pytest.approx(0.1 * 0.25)
    assert BaselineLR(optimizer, None).lrs_at(100) == pytest.approx([0.1, 0.01])


def test_rejects_bad_interval():
    with pytest.raises(ValueError, match="`interval` must be 'epoch' or 'step'"):
        BaselineLR(_optimizer(), None, interval="batch")  # type: ignore[arg-type]


def _step_size(optimizer: torch.optim.Optimizer, parameter: torch.Tensor) -> float:
    """The LR a real SGD step used on ``parameter``: with gradient 1 and no momentum, the change."""
    before = parameter.detach().clone()
    parameter.grad = torch.ones_like(parameter)
    optimizer.step()
    return float((before - parameter.detach()).mean())


def test_multigrid_lr_scales_each_step_and_gives_the_lr_back():
    # Baseline: 20 epochs, LR 0.1 then 0.01 from epoch 10. Multigrid (long cycle only) runs 30
    # epochs: shapes 0-13 (lr factor 8), 13-19 (4), 19-22 (2), 22-24 (1), then fine-tuning 24-27 at
    # baseline stage 0 and 27-30 at stage 1. Epochs 0-24 cover baseline 0-8.89 (10/27 per epoch),
    # 24-27 baseline 8.89-10, 27-30 baseline 10-20.
    schedule = build_schedule(
        MultigridConfig(base=GridShape(8, 16, 112), max_epochs=20, milestones=(10,), options=MultigridOptions(short_cycle=False))
    )
    weight = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    scheduler = MultiStepLR(optimizer, [10], gamma=0.1)
    lr = MultigridLR(schedule)
    lr.attach(optimizer, BaselineLR(optimizer, scheduler))

    lr.set_position(0, 0, 4)  # baseline 0: 0.1 * 8
    assert lr.effective_lr == pytest.approx(0.8)
    assert _step_size(optimizer, weight) == pytest.approx(0.8)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1)  # the scheduler's value again
    lr.set_position(13, 2, 4)  # epoch 13.5 -> baseline 5.0: 0.1 * 4
    assert _step_size(optimizer, weight) == pytest.approx(0.4)
    # A group added during training (e.g. by BackboneFinetuning) keeps its own LR, scaled.
    late = torch.nn.Parameter(torch.zeros(2))
    optimizer.add_param_group({"params": [late], "lr": 0.05})
    lr.set_position(14, 0, 4)  # epoch 14 -> baseline 5.19: 0.1 * 4, and 0.05 * 4
    late.grad = torch.ones_like(late)
    assert _step_size(optimizer, weight) == pytest.approx(0.4)
    assert float(-late.detach().mean()) == pytest.approx(0.05 * 4)
    lr.set_position(28, 0, 4)  # epoch 28 -> baseline 10 + 1 * 10/3: 0.01 * 1
    assert _step_size(optimizer, weight) == pytest.approx(0.01)

    lr.detach()
    assert _step_size(optimizer, weight) == pytest.approx(0.1)  # hooks gone: the user's LR
    assert lr.effective_lr is None


# ------------------------------------------------------------------------------- warm-up


def _warmup_scheduler(optimizer: torch.optim.Optimizer) -> SequentialLR:
    """VideoClassifier's: LR x 0.1 -> x 1 over 2 epochs (per epoch), then a decay at epoch 10."""
    return SequentialLR(
        optimizer, [LinearLR(optimizer, 0.1, total_iters=2), MultiStepLR(optimizer, [8])], milestones=[2]
    )


def test_find_warmup_reads_the_initial_rise():
    optimizer = _optimizer()
    warmup = find_warmup(BaselineLR(optimizer, _warmup_scheduler(optimizer)), max_epochs=20)
    # Epoch LRs 0.01, 0.055, 0.1, 0.1: the rise ends at epoch 2; the second group is a tenth.
    assert warmup == Warmup(2.0, pytest.approx((0.01, 0.001)), pytest.approx((0.1, 0.01)))
    # Per step, every 2nd step (frequency): 10 steps per epoch, so the ramp's 4 steps take 0.8 epochs.
    ramp = LinearLR(optimizer, 0.1, total_iters=4)
    assert find_warmup(BaselineLR(optimizer, ramp, "step", 2, 10), max_epochs=20).end_epoch == pytest.approx(0.8)  # type: ignore[union-attr]


def test_find_warmup_sees_a_rise_that_ends_at_the_quarter():
    # 2 of 8 epochs: LRs 0.01, 0.055, 0.1, then 0.1; the scan of floor(8 x 0.25) = 2 steps saw it still rising
    # (issue 41, item 1). A rise one step longer is not a warm-up.
    optimizer = _optimizer()
    ramp = SequentialLR(optimizer, [LinearLR(optimizer, 0.1, total_iters=2), MultiStepLR(optimizer, [4])], milestones=[2])
    search = search_warmup(BaselineLR(optimizer, ramp), max_epochs=8)
    assert search == WarmupSearch(Warmup(2.0, pytest.approx((0.01, 0.001)), pytest.approx((0.1, 0.01))), 2)
    optimizer = _optimizer()
    longer = SequentialLR(optimizer, [LinearLR(optimizer, 0.1, total_iters=3), MultiStepLR(optimizer, [4])], milestones=[3])
    assert search_warmup(BaselineLR(optimizer, longer), max_epochs=8) == WarmupSearch(None, None)


@pytest.mark.parametrize(
    "make",
    [
        lambda o: MultiStepLR(o, [5]),  # no rise
        lambda o: None,  # constant
        # OneCycleLR rises over 30% of the run: the schedule itself, not a warm-up.
        lambda o: OneCycleLR(o, max_lr=1.0, total_steps=200),
    ],
)
def test_find_warmup_none(make):
    optimizer = _optimizer()
    assert find_warmup(BaselineLR(optimizer, make(optimizer), "step" if make(optimizer) is None else "epoch"), 200) is None


def test_baseline_epochs_worked_counts_optimizer_steps():
    # Long cycle only: 13 epochs at r = 8 (1/8 of a baseline epoch's steps each), then r = 4 (1/4).
    schedule = build_schedule(
        MultigridConfig(base=GridShape(8, 16, 112), max_epochs=20, milestones=(10,), options=MultigridOptions(short_cycle=False))
    )
    assert [(s.start_epoch, s.lr_factor) for s in schedule.stages[:2]] == [(0, 8), (13, 4)]
    assert baseline_epochs_worked(schedule, 4.0) == pytest.approx(4 / 8)
    assert baseline_epochs_worked(schedule, 14.5) == pytest.approx(13 / 8 + 1.5 / 4)
    # Short cycle only: batches 4b, 2b, b -> 3 iterations per 7 base batches.
    short = build_schedule(MultigridConfig(base=GridShape(8, 16, 112), max_epochs=20, options=MultigridOptions(long_cycle=False)))
    assert baseline_epochs_worked(short, 7.0) == pytest.approx(3.0)


def test_warmup_follows_the_reference_over_the_baseline_steps():
    """PySlowFast's warm-up (lr_policy.get_lr_at_epoch), ``start + progress * (end - start)`` with
    ``end`` the scaled LR where it ends, counted in the baseline warm-up's optimizer steps."""
    schedule = build_schedule(
        MultigridConfig(base=GridShape(8, 16, 112), max_epochs=20, milestones=(10,), options=MultigridOptions(short_cycle=False))
    )
    weight = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    lr = MultigridLR(schedule)
    lr.attach(optimizer, BaselineLR(optimizer, _warmup_scheduler(optimizer)))

    # The warm-up's 2 baseline epochs of steps are taken after 13 epochs at r = 8 and 1.5 at r = 4
    # (13/8 + 1.5/4 = 2): it ends at epoch 14.5, in the r = 4 shape, so end = 4 * 0.1.
    def reference(worked: float) -> float:
        start, end, length = 0.01, 4 * 0.1, 2.0
        return start + worked * (end - start) / length

    for epoch, batch_idx, worked in ((0, 0, 0.0), (0, 2, 0.5 / 8), (4, 0, 0.5), (13, 2, 13 / 8 + 0.5 / 4)):
        lr.set_position(epoch, batch_idx, 4)
        assert lr.effective_lr == pytest.approx(reference(worked))
        assert _step_size(optimizer, weight) == pytest.approx(reference(worked))
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01)  # the (unstepped) scheduler's value again
    lr.set_position(14, 2, 4)  # past the warm-up: baseline epoch 14.5 * 10/27 = 5.4, 0.1 * 4
    assert lr.effective_lr == pytest.approx(0.4)


def test_warmup_for_pretrained_weights_covers_its_share_of_the_baseline_timeline():
    # The same schedule and warm-up: 2 of the first stage's 10 baseline epochs are its first 2/10
    # of multigrid epochs 0-27, 5.4 epochs at r = 8 (held in steps: 14.5 epochs, docs/accuracy.md).
    schedule = build_schedule(
        MultigridConfig(base=GridShape(8, 16, 112), max_epochs=20, milestones=(10,), options=MultigridOptions(short_cycle=False))
    )
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    lr = MultigridLR(schedule, warmup_in_steps=False)
    lr.attach(optimizer, BaselineLR(optimizer, _warmup_scheduler(optimizer)))
    end = schedule.lr_stage_starts[1] * 2 / 10
    assert schedule.stage_at(int(end)).lr_factor == 8
    for epoch, batch_idx in ((0, 0), (2, 2), (5, 0)):
        lr.set_position(epoch, batch_idx, 4)
        assert lr.effective_lr == pytest.approx(0.01 + (epoch + batch_idx / 4) / end * (8 * 0.1 - 0.01))
    lr.set_position(6, 0, 4)  # past the warm-up: the user's 0.1 at r = 8
    assert lr.effective_lr == pytest.approx(0.8)


def test_warmup_ends_with_the_first_lr_stage():
    # A warm-up of 4 baseline epochs at r = 8 would need 32 multigrid epochs of steps; the first LR
    # stage (its milestone at baseline epoch 5) ends first, and the user's decay is kept.
    schedule = build_schedule(
        MultigridConfig(base=GridShape(8, 16, 112), max_epochs=20, milestones=(5,), options=MultigridOptions(short_cycle=False))
    )
    optimizer = _optimizer()
    scheduler = SequentialLR(optimizer, [LinearLR(optimizer, 0.1, total_iters=4), MultiStepLR(optimizer, [1])], [4])
    lr = MultigridLR(schedule)
    lr.attach(optimizer, BaselineLR(optimizer, scheduler))
    stage_1 = schedule.lr_stage_starts[1]
    lr.set_position(stage_1, 0, 4)
    assert lr.effective_lr == pytest.approx(0.01 * schedule.stage_at(stage_1).lr_factor)
