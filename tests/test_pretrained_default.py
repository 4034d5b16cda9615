"""The default long-cycle shapes: the paper's four, or the pretrained default for a short run that
starts from pretrained weights; a user's ``long_cycle_factors`` always wins."""

from __future__ import annotations

import pytest

from lightning_multigrid import config as config_module
from lightning_multigrid.callback import MultigridCallback
from lightning_multigrid.config import (
    DEFAULT_LONG_CYCLE_FACTORS,
    PRETRAINED_LONG_CYCLE_FACTORS,
    SHORT_RUN_BASELINE_STEPS,
    default_long_cycle_factors,
)

from test_callback import MILESTONES, RecordingNet, fit, make_datamodule, train_manifest  # noqa: F401

# A stand-in for the chosen default, different from the paper's, so the tests see which one is used.
WITHOUT_COARSEST = DEFAULT_LONG_CYCLE_FACTORS[1:]


@pytest.mark.parametrize(
    "pretrained, steps, expected",
    [
        (True, SHORT_RUN_BASELINE_STEPS - 1, PRETRAINED_LONG_CYCLE_FACTORS),
        (True, SHORT_RUN_BASELINE_STEPS, DEFAULT_LONG_CYCLE_FACTORS),  # a long run: the paper's
        (False, 100, DEFAULT_LONG_CYCLE_FACTORS),  # from scratch: the paper's
        (None, 100, DEFAULT_LONG_CYCLE_FACTORS),  # not known: the paper's
        (True, None, DEFAULT_LONG_CYCLE_FACTORS),  # length not known: the paper's
    ],
)
def test_default_long_cycle_factors(pretrained, steps, expected):
    assert default_long_cycle_factors(pretrained, steps) == expected


class PretrainedNet(RecordingNet):
    """A user's module that says it starts from pretrained weights (contracts.PretrainedModule)."""

    def __init__(self, pretrained: bool) -> None:
        super().__init__("multistep")
        self._pretrained = pretrained

    @property
    def pretrained(self) -> bool:
        return self._pretrained


@pytest.mark.parametrize(
    "pretrained, given, expected",
    [
        (True, None, WITHOUT_COARSEST),  # short (4 epochs x 32 steps) and pretrained: the pretrained default
        (False, None, DEFAULT_LONG_CYCLE_FACTORS),  # from scratch: the paper's
        (True, [(0.5, 1.0), (1.0, 1.0)], ((0.5, 1.0), (1.0, 1.0))),  # the user's choice wins
    ],
)
def test_callback_picks_the_default_by_start_and_length(
    synthetic_dataset, train_manifest, monkeypatch, pretrained, given, expected  # noqa: F811
):
    monkeypatch.setattr(config_module, "PRETRAINED_LONG_CYCLE_FACTORS", WITHOUT_COARSEST)
    callback = MultigridCallback(
        bn_base_size=2, precise_bn_batches=0, milestones=MILESTONES, preflight=False, long_cycle_factors=given
    )
    fit(PretrainedNet(pretrained), make_datamodule(synthetic_dataset, train_manifest), callback, limit_val_batches=0)
    assert callback.schedule is not None
    assert callback.schedule.config.options.long_cycle_factors == expected
