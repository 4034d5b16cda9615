"""The LightningModule side of the contract: the capabilities the callback reads with ``isinstance``
(contracts.py), on a real Trainer with a user's own module."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from lightning_multigrid.callback import MultigridCallback
from lightning_multigrid.contracts import MilestonesModule, PreflightModule, PretrainedModule
from lightning_multigrid.grid import GridShape
from lightning_multigrid.module import VideoClassifier

from test_callback import RecordingNet, fit, make_datamodule, train_manifest  # noqa: F401


class DeclaringNet(RecordingNet):
    """A user's module with a step-less LR schedule that declares its milestones and checks its grids."""

    def __init__(self, milestones: Sequence[int] | None) -> None:
        super().__init__("one_cycle")  # no MultiStepLR: nothing for the callback to find
        self._milestones = milestones
        self.preflight_grids: list[GridShape] = []

    @property
    def lr_milestones(self) -> Sequence[int] | None:
        return self._milestones

    def preflight(self, grids: Sequence[GridShape]) -> None:
        self.preflight_grids = list(grids)


def test_video_classifier_has_every_capability():
    model = VideoClassifier(num_classes=4, backbone="tiny")
    assert isinstance(model, MilestonesModule) and isinstance(model, PreflightModule)
    assert isinstance(model, PretrainedModule)
    assert not isinstance(RecordingNet(), MilestonesModule) and not isinstance(RecordingNet(), PreflightModule)


@pytest.mark.parametrize("declared, milestones", [((2,), (2,)), (None, ())])
def test_callback_reads_the_modules_milestones_and_preflight(
    synthetic_dataset, train_manifest, declared, milestones  # noqa: F811
):
    model = DeclaringNet(declared)
    callback = MultigridCallback(bn_base_size=2, precise_bn_batches=0)
    fit(model, make_datamodule(synthetic_dataset, train_manifest), callback, max_epochs=3, limit_val_batches=0)
    assert callback.schedule is not None
    # Declared: its LR stages; None: the callback looks for a step scheduler, finds none, one long cycle.
    assert callback.schedule.config.milestones == milestones
    assert model.preflight_grids == list(callback.schedule.distinct_grids())  # the module's own check ran
