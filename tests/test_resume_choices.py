"""What a run chose holds on resume, or the resume is refused before the first step (issue 41, items 1, 2,
9, 12, 13): the warm-up rule of a fine-tuning run, ``pretrained`` after the weights file is gone, the
optimizer; and the warm-up is found (or said absent) wherever it ends.

A real Trainer fits ``VideoClassifier``'s tiny 3D CNN with ``MultigridCallback`` on real H.264 videos
(32 clips, base batch 1); checkpoints are real files; the pretrained weights are a real state-dict file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from test_resume import KillAfterEpoch

from lightning_multigrid import VideoClassifier
from lightning_multigrid._lightning import pl
from lightning_multigrid.callback import MultigridCallback

from test_callback import RecordingNet, make_datamodule
from test_callback import fit as fit_recording
from test_callback import train_manifest as train_manifest  # the module-scoped fixture

ModelCheckpoint = pl.callbacks.ModelCheckpoint
MODEL: dict[str, Any] = dict(num_classes=4, tiny_width=4, warmup_epochs=1, milestones=(5,))
MAX_EPOCHS = 8  # a 1-epoch warm-up: within the first quarter


class LRRecordingClassifier(VideoClassifier):
    """VideoClassifier recording the LR every optimizer step uses (after the callback's pre-hook)."""

    def on_train_start(self) -> None:
        self.lrs: list[float] = []
        optimizer = self.trainer.optimizers[0]
        optimizer.register_step_pre_hook(lambda opt, args, kwargs: self.lrs.append(opt.param_groups[0]["lr"]))


def seeded(**kwargs: Any) -> LRRecordingClassifier:
    """A model whose new classifier starts from the same random weights every time."""
    pl.seed_everything(0, verbose=False)
    return LRRecordingClassifier(**kwargs)


def fit(
    data: Any, model: VideoClassifier, *callbacks: pl.Callback, ckpt_path: str | None = None,
    callback: MultigridCallback | None = None, max_epochs: int = MAX_EPOCHS,
) -> VideoClassifier:
    pl.seed_everything(0, verbose=False)
    trainer = pl.Trainer(
        max_epochs=max_epochs, accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0, deterministic=True,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        callbacks=[callback or MultigridCallback(precise_bn_batches=0), *callbacks],
    )
    trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
    return model


def warmup_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [line for line in caplog.text.splitlines() if line.startswith("warm-up: ")]


# ------------------------------------------------------------------ items 1 and 13: the warm-up found, or none


def test_a_warmup_of_exactly_a_quarter_is_found(synthetic_dataset, train_manifest, caplog):
    # warmup_epochs=2 of max_epochs=8: the rise ends at the quarter. The scan stopped one step short
    # of seeing it stop, and the first step ran at r = 8 times the peak-to-be (0.8) instead of the start.
    model = LRRecordingClassifier(num_classes=4, tiny_width=4, warmup_epochs=2, milestones=(5,))
    with caplog.at_level("INFO"):
        fit(make_datamodule(synthetic_dataset, train_manifest), model)
    assert model.lrs[0] == pytest.approx(0.01)  # the baseline's first LR: 0.1 x warmup_start_factor
    assert model.lrs[1] > model.lrs[0]  # and rising
    assert warmup_lines(caplog) == [
        "warm-up: from-scratch rule (the baseline's LR rises over its first 2 epochs; a warm-up lasts the baseline "
        "warm-up's optimizer steps; the module's `pretrained` (False))."
    ]


@pytest.mark.parametrize("schedule, why", [
    ("multistep", "the baseline's LR does not rise at its start"),
    ("one_cycle", "the baseline's LR still rises after 25% of its epochs (as `OneCycleLR`'s does)"),
])
def test_the_summary_says_when_there_is_no_warmup(synthetic_dataset, train_manifest, caplog, schedule, why):
    with caplog.at_level("INFO"):
        fit_recording(RecordingNet(schedule), make_datamodule(synthetic_dataset, train_manifest),
                      MultigridCallback(bn_base_size=2, precise_bn_batches=0, milestones=[2]), limit_val_batches=0)
    (line,) = warmup_lines(caplog)
    assert line.startswith(f"warm-up: none ({why}") and line.endswith("so no warm-up rule applies.")
    assert "rule (" not in line


# ------------------------------------------------------------------ item 2: the warm-up rule holds on resume


@pytest.fixture(scope="module")
def fine_tuning(synthetic_dataset, train_manifest, tmp_path_factory) -> dict[str, Any]:
    """A fine-tuning run from a weights file, uninterrupted and killed after epoch 1 (its checkpoint kept)."""
    directory = tmp_path_factory.mktemp("fine_tuning")
    weights = directory / "kinetics.pt"
    torch.save(VideoClassifier(num_classes=4, tiny_width=4).backbone.state_dict(), weights)
    full = fit(make_datamodule(synthetic_dataset, train_manifest), seeded(**MODEL, weights=str(weights)))
    assert full.pretrained
    with pytest.raises(RuntimeError, match="killed after"):
        fit(make_datamodule(synthetic_dataset, train_manifest), seeded(**MODEL, weights=str(weights)),
            ModelCheckpoint(dirpath=directory, save_last=True, every_n_epochs=1), KillAfterEpoch(1))
    weights.unlink()  # the file is gone: the natural way to resume is without `weights=`
    return {"full": full, "ckpt": directory / "last.ckpt"}


def test_a_fine_tuning_run_resumed_without_weights_keeps_its_warmup_rule(synthetic_dataset, train_manifest, fine_tuning, caplog):
    full, ckpt = fine_tuning["full"], fine_tuning["ckpt"]
    resumed = LRRecordingClassifier(**MODEL)  # no `weights=`: the module says from scratch
    assert not resumed.pretrained
    with caplog.at_level("INFO"):
        fit(make_datamodule(synthetic_dataset, train_manifest), resumed, ckpt_path=str(ckpt))
    assert resumed.lrs == full.lrs[-len(resumed.lrs):]  # every resumed step at the uninterrupted run's LR
    assert len(resumed.lrs) < len(full.lrs) and max(full.lrs[: len(full.lrs) - len(resumed.lrs)]) < max(resumed.lrs)
    (line,) = warmup_lines(caplog)
    assert line.startswith("warm-up: pretrained rule (") and "the checkpoint's, pretrained=True" in line
    assert "this fit's choice is not used (the module's `pretrained` (False)" in line
    for name, value in full.state_dict().items():  # and, with dropout, the same weights
        torch.testing.assert_close(resumed.state_dict()[name], value, rtol=0, atol=0, msg=name)


def test_the_callback_asking_for_another_warmup_rule_is_refused(synthetic_dataset, train_manifest, fine_tuning):
    model = LRRecordingClassifier(**MODEL)
    with pytest.raises(ValueError, match=r"trained with the pretrained warm-up rule \(pretrained=True\), but this fit "
                                         r"asks for the other one with `MultigridCallback\(pretrained=False\)`.*"
                                         r"Resume with `MultigridCallback\(pretrained=True\)` or `pretrained=None`"):
        fit(make_datamodule(synthetic_dataset, train_manifest), model, ckpt_path=str(fine_tuning["ckpt"]),
            callback=MultigridCallback(precise_bn_batches=0, pretrained=False))
    assert not hasattr(model, "lrs")  # refused before training started


# ------------------------------------------------------------------ item 9: the weights file gone


def test_load_from_checkpoint_after_the_weights_file_is_gone(fine_tuning):
    ckpt = fine_tuning["ckpt"]
    with pytest.raises(FileNotFoundError, match=r"kinetics.pt'?: no such file.*pass `weights=None`, as in "
                                                r"`VideoClassifier.load_from_checkpoint\(path, weights=None\)`"):
        VideoClassifier.load_from_checkpoint(ckpt)
    restored = VideoClassifier.load_from_checkpoint(ckpt, weights=None)
    assert restored.pretrained and restored.loaded_weights is None
    saved = torch.load(ckpt, weights_only=True)["state_dict"]
    assert all(torch.equal(value, saved[key]) for key, value in restored.state_dict().items())


# ------------------------------------------------------------------ item 12: another optimizer


def test_resuming_with_another_optimizer_is_refused(synthetic_dataset, train_manifest, tmp_path: Path):
    with pytest.raises(RuntimeError, match="killed after"):
        fit(make_datamodule(synthetic_dataset, train_manifest), VideoClassifier(num_classes=4, tiny_width=4),
            ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_epochs=1), KillAfterEpoch(0), max_epochs=4)
    model = LRRecordingClassifier(num_classes=4, tiny_width=4, optimizer="adamw")
    with pytest.raises(ValueError, match=r"VideoClassifier\(optimizer='adamw'\) cannot resume the checkpoint .*last.ckpt: "
                                         r"it was trained with `optimizer`='sgd'.*Resume with `optimizer='sgd'`"):
        fit(make_datamodule(synthetic_dataset, train_manifest), model, ckpt_path=str(tmp_path / "last.ckpt"), max_epochs=4)
    assert not hasattr(model, "lrs")  # refused before training started
    # The same optimizer resumes.
    fit(make_datamodule(synthetic_dataset, train_manifest), VideoClassifier(num_classes=4, tiny_width=4),
        ckpt_path=str(tmp_path / "last.ckpt"), max_epochs=4)
