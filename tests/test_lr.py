"""BaselineLR: the user's scheduler read at baseline positions, without touching the real one."""

from __future__ import annotations

import math

import pytest
import torch
from torch.optim.lr_scheduler import CosineAnnealingLR, LambdaLR, LinearLR, MultiStepLR, OneCycleLR, SequentialLR

from lightning_multigrid.lr import BaselineLR


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
