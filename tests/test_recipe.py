"""VideoClassifier's optimisation options as one value: checked once, read from the hyper-parameters."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lightning_multigrid.fit.recipe import OptimizerRecipe

RECIPE = OptimizerRecipe(
    lr=0.2, optimizer="sgd", momentum=0.9, nesterov=True, weight_decay=1e-4, warmup_epochs=2,
    warmup_start_factor=0.5, milestones=[4, 6], gamma=0.1, backbone_lr_factor=1.0,
)


def test_the_milestones_follow_the_schedules_rule_then_the_warmup():
    assert RECIPE.milestones == (4, 6)  # a list (YAML, hparams) becomes a tuple
    # The schedule's rule (config.check_milestones), word for word, then the warm-up's.
    for milestones in ([6, 4], [0, 4]):
        with pytest.raises(ValueError, match=r"`milestones` must be strictly increasing and > 0"):
            dataclasses.replace(RECIPE, milestones=milestones)
    with pytest.raises(ValueError, match=r"`milestones` must be integers \(epochs\)"):
        dataclasses.replace(RECIPE, milestones=[2.5])
    with pytest.raises(ValueError, match="must come after the warm-up: the first is 2 but `warmup_epochs`=2"):
        dataclasses.replace(RECIPE, milestones=[2, 6])


def test_the_recipe_is_read_from_the_hyper_parameters_where_the_lr_finder_writes():
    hparams = {f.name: getattr(RECIPE, f.name) for f in dataclasses.fields(RECIPE)} | {"lr": 0.05, "num_classes": 3}
    assert OptimizerRecipe.from_hparams(hparams) == dataclasses.replace(RECIPE, lr=0.05)


def test_the_scheduler_warms_up_then_decays_at_the_absolute_milestones():
    optimizer = RECIPE.build_optimizer([{"params": [torch.zeros(1, requires_grad=True)]}])
    assert isinstance(optimizer, torch.optim.SGD) and optimizer.defaults["nesterov"] is True
    scheduler = RECIPE.build_scheduler(optimizer)
    lrs = []
    for _ in range(8):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    # Epochs 0-1 ramp from 0.2 * 0.5 to 0.2 (LinearLR over 2 epochs); 0.2 until 4, 0.02 until 6, then 0.002.
    assert lrs == pytest.approx([0.1, 0.15, 0.2, 0.2, 0.02, 0.02, 0.002, 0.002])
