"""The default long-cycle shapes: the paper's four, or the pretrained default for a short run that
starts from pretrained weights; a user's ``long_cycle_factors`` always wins."""

from __future__ import annotations

import pytest

from lightning_multigrid.callback import MultigridCallback
from lightning_multigrid.module import VideoClassifier
from lightning_multigrid.schedule import config as config_module
from lightning_multigrid.schedule.config import (
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


# ------------------------------------------------------------------ the warm-up rule (issue 35 item 5, issue 36 item 17)


class WarmupRecorder(RecordingNet):
    """A user's module without a `pretrained` attribute, warm-up then cosine per step (test_callback's schedule)."""

    def __init__(self) -> None:
        super().__init__("warmup_cosine")


def warmup_run(model, callback, synthetic_dataset, train_manifest, caplog) -> tuple[int, str]:  # noqa: F811
    """The first step at the warm-up's peak LR (2x the base LR, on the r = 2 grid) and the summary's warm-up line."""
    caplog.clear()
    with caplog.at_level("INFO"):
        fit(model, make_datamodule(synthetic_dataset, train_manifest), callback, limit_val_batches=0)
    lines = [line for line in caplog.text.splitlines() if line.startswith("warm-up: ")]
    lrs = [step["lr"] for step in model.steps]
    return next(k for k, lr in enumerate(lrs) if lr >= 0.99 * max(lrs)), "\n".join(lines)


# The from-scratch rule holds the warm-up for the baseline's 10 optimizer steps (test_callback.py);
# the pretrained rule ramps over its share of the baseline timeline, which the coarse grids pass in fewer steps.
FROM_SCRATCH_PEAK_STEP = 10


@pytest.mark.parametrize(
    "pretrained, rule, source",
    [
        (None, "from-scratch rule", "WarmupRecorder has no `pretrained` attribute; pass `MultigridCallback(pretrained=True)`"),
        (True, "pretrained rule", "`MultigridCallback(pretrained=True)`"),
        (False, "from-scratch rule", "`MultigridCallback(pretrained=False)`"),
    ],
)
def test_the_callback_says_which_warmup_rule_and_the_user_can_choose_it(
    synthetic_dataset, train_manifest, caplog, pretrained, rule, source  # noqa: F811
):
    callback = MultigridCallback(bn_base_size=2, precise_bn_batches=0, milestones=MILESTONES, pretrained=pretrained)
    peak, line = warmup_run(WarmupRecorder(), callback, synthetic_dataset, train_manifest, caplog)
    assert rule in line and source in line
    assert (peak < FROM_SCRATCH_PEAK_STEP) if pretrained else (peak == FROM_SCRATCH_PEAK_STEP)


def test_the_callback_overrides_the_modules_pretrained(synthetic_dataset, train_manifest, caplog):  # noqa: F811
    class PretrainedWarmup(WarmupRecorder):
        pretrained = True

    callback = MultigridCallback(bn_base_size=2, precise_bn_batches=0, milestones=MILESTONES)
    peak, line = warmup_run(PretrainedWarmup(), callback, synthetic_dataset, train_manifest, caplog)
    assert "pretrained rule" in line and "the module's `pretrained` (True)" in line and peak < FROM_SCRATCH_PEAK_STEP
    callback = MultigridCallback(bn_base_size=2, precise_bn_batches=0, milestones=MILESTONES, pretrained=False)
    peak, line = warmup_run(PretrainedWarmup(), callback, synthetic_dataset, train_manifest, caplog)
    assert "from-scratch rule" in line and peak == FROM_SCRATCH_PEAK_STEP


def test_pretrained_option_from_yaml_and_checked():
    assert MultigridCallback(pretrained=True).options.pretrained is True
    with pytest.raises(ValueError, match="`pretrained` must be True or False or None, got 'yes'"):
        MultigridCallback(pretrained="yes")  # type: ignore[arg-type]


class LRRecordingClassifier(VideoClassifier):
    """VideoClassifier recording the LR every optimizer step uses (after the callback's pre-hook)."""

    def on_train_start(self) -> None:
        self.lrs: list[float] = []
        optimizer = self.trainer.optimizers[0]
        optimizer.register_step_pre_hook(lambda opt, args, kwargs: self.lrs.append(opt.param_groups[0]["lr"]))


@pytest.mark.parametrize("pretrained, rule", [(None, "pretrained rule"), (False, "from-scratch rule")])
def test_a_video_classifier_on_a_given_module_is_pretrained_unless_told(
    synthetic_dataset, train_manifest, caplog, pretrained, rule  # noqa: F811
):
    loaded = VideoClassifier(num_classes=4, backbone="tiny", tiny_width=4).backbone  # a module built with its weights
    # A 1-epoch warm-up in 8 epochs (a warm-up is at most a quarter of the run).
    model = LRRecordingClassifier(num_classes=4, backbone=loaded, warmup_epochs=1, milestones=(5,), pretrained=pretrained)
    assert model.pretrained is (pretrained is None)
    caplog.clear()
    with caplog.at_level("INFO"):
        fit(model, make_datamodule(synthetic_dataset, train_manifest), MultigridCallback(precise_bn_batches=0),
            limit_val_batches=0, max_epochs=8)
    assert f"warm-up: {rule}" in caplog.text and f"the module's `pretrained` ({model.pretrained})" in caplog.text
    peak = next(k for k, lr in enumerate(model.lrs) if lr >= 0.99 * max(model.lrs))
    # The baseline's warm-up is its first epoch, 32 steps: the from-scratch rule holds it that long and
    # peaks on the r = 2 grid; the pretrained rule ends it within the coarse r = 8 grid's epoch.
    assert (peak, max(model.lrs)) == ((32, pytest.approx(0.2)) if pretrained is False else (7, pytest.approx(0.8)))


def test_a_named_backbone_is_pretrained_with_weights_only():
    assert not VideoClassifier(num_classes=4, backbone="tiny", tiny_width=4).pretrained
    assert VideoClassifier(num_classes=4, backbone="tiny", tiny_width=4, pretrained=True).pretrained
    with pytest.raises(ValueError, match="`pretrained` must be True or False or None"):
        VideoClassifier(num_classes=4, pretrained=1)  # type: ignore[arg-type]
