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


def test_parameter_groups_split_decay_and_the_head_at_its_own_lr():
    weight, bias, table = (torch.nn.Parameter(torch.zeros(*shape)) for shape in ((4, 3), (4,), (5, 2)))
    frozen, head = torch.nn.Parameter(torch.zeros(2, 2), requires_grad=False), torch.nn.Parameter(torch.zeros(2, 4))
    named = [("conv.weight", weight), ("conv.bias", bias), ("relative_position_bias_table", table),
             ("stem.weight", frozen), ("fc.weight", head)]
    plain = RECIPE.parameter_groups(named, head=set())
    assert [(g["name"], len(g["params"]), g["weight_decay"], "lr" in g) for g in plain] == [
        ("decay", 2, 1e-4, False), ("no_decay", 2, 0.0, False)  # the frozen weight is left out
    ]
    split = dataclasses.replace(RECIPE, backbone_lr_factor=0.1).parameter_groups(named, head={"fc.weight"})
    assert [(g["name"], [id(p) for p in g["params"]], g.get("lr")) for g in split] == [
        ("backbone/decay", [id(weight)], pytest.approx(0.02)), ("backbone/no_decay", [id(bias), id(table)], pytest.approx(0.02)),
        ("head/decay", [id(head)], None),
    ]
