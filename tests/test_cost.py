"""Measured cost per clip: the measurement leaves the model as it was, and a real Trainer trains on the
batches sized by it (LR factors and BatchNorm groups following them), also after a resume."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from lightning_multigrid._lightning import pl
from lightning_multigrid.callback import MultigridCallback
from lightning_multigrid.grid import GridShape
from lightning_multigrid.models import build_backbone
from lightning_multigrid.schedule import build_schedule
from lightning_multigrid.schedule.config import ClipCost, MultigridConfig, MultigridOptions
from lightning_multigrid.schedule.cost import implausible_costs_warning, measure_clip_costs

from test_callback import BASE_LR, MAX_EPOCHS, MILESTONES, RecordingNet, StopAfter, make_datamodule
from test_callback import train_manifest as train_manifest  # the module-scoped fixture

CONFIG = MultigridConfig(base=GridShape(2, 8, 32), max_epochs=4, milestones=(2,), options=MultigridOptions(batch_sizing="flops"))


def test_flops_follow_frames_x_pixels_for_a_convolution_and_leave_the_model_as_it_was():
    model = build_backbone("tiny", 4, tiny_width=4)
    model.eval()  # restored afterwards; measured in train mode
    before = {name: value.clone() for name, value in model.state_dict().items()}
    rng = torch.get_rng_state()
    costs = measure_clip_costs(model, CONFIG.cost_grids(), "flops")
    assert [(c.num_frames, c.crop_size) for c in costs] == [(g.num_frames, g.crop_size) for g in CONFIG.cost_grids()]
    base = costs[0].cost_per_clip
    # The tiny CNN's stem dominates and its FLOPs grow with frames x pixels: 4 x 32 costs about 1/2.
    assert next(c.cost_per_clip for c in costs if (c.num_frames, c.crop_size) == (4, 32)) / base == pytest.approx(0.5, rel=0.05)
    assert not model.training and all(not m.training for m in model.modules())
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_time_is_seconds_per_clip():
    costs = measure_clip_costs(build_backbone("tiny", 4, tiny_width=4), CONFIG.cost_grids()[:2], "time", repeats=1, warmup=0)
    assert all(0 < c.cost_per_clip < 10 for c in costs)


def test_a_smaller_grid_at_a_base_clips_cost_is_flagged():
    config = dataclasses.replace(CONFIG, clip_costs=tuple(
        ClipCost(g.num_frames, g.crop_size, 1.2 if (g.num_frames, g.crop_size) == (2, 23) else 0.5)
        for g in CONFIG.cost_grids()
    ))
    # 2 x 23 at 1.2 / 0.5 = 2.4 base clips' cost: round(2 / 2.4) = 1 clip.
    assert "2 x 23 (2.40x, 1 clips)" in (implausible_costs_warning(config) or "")
    plausible = dataclasses.replace(CONFIG, clip_costs=tuple(ClipCost(g.num_frames, g.crop_size, 1.0) for g in CONFIG.cost_grids()[:1])
                                    + tuple(ClipCost(g.num_frames, g.crop_size, 0.5) for g in CONFIG.cost_grids()[1:]))
    assert implausible_costs_warning(plausible) is None


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="`method` must be 'flops' or 'time'"):
        measure_clip_costs(nn.Linear(1, 1), CONFIG.cost_grids(), "equation1")  # type: ignore[arg-type]


class TokenAttention(nn.Module):
    """Self-attention over (T x H/4 x W/4) tokens: its FLOPs grow with the square of the tokens, so
    coarse grids cost less per clip than Equation 1 says and their cost-sized batches are larger."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = nn.functional.avg_pool3d(x, (1, 4, 4)).flatten(2).transpose(1, 2)  # (N, T*H*W/16, C)
        attended = torch.softmax(tokens @ tokens.transpose(1, 2), dim=-1) @ tokens
        return x + attended.mean(dim=1)[:, :, None, None, None]


class AttentionRecordingNet(RecordingNet):
    """``RecordingNet`` (it records every step's grid, LR and BatchNorm grouping) with a token attention."""

    def __init__(self) -> None:
        super().__init__("multistep")
        self.net = nn.Sequential(
            nn.Conv3d(3, 4, 3, padding=1), nn.BatchNorm3d(4), nn.ReLU(), TokenAttention(),
            nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(4, 4),
        )


def _fit(synthetic_dataset: Any, train_manifest: Path, batch_sizing: str, root: Path, ckpt_path: str | None = None,
         stop_after: int | None = None) -> tuple[AttentionRecordingNet, MultigridCallback]:
    pl.seed_everything(0, verbose=False)
    model = AttentionRecordingNet()
    callback = MultigridCallback(bn_base_size=4, precise_bn_batches=0, milestones=MILESTONES, batch_sizing=batch_sizing)
    callbacks: list[pl.Callback] = [callback, pl.callbacks.ModelCheckpoint(dirpath=root, save_last=True, save_top_k=0)]
    if stop_after is not None:
        callbacks.append(StopAfter(stop_after))
    trainer = pl.Trainer(
        max_epochs=MAX_EPOCHS, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, deterministic=True, callbacks=callbacks,
    )
    datamodule = make_datamodule(synthetic_dataset, train_manifest, batch_size=2)
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return model, callback


def _assert_steps_follow(model: AttentionRecordingNet, callback: MultigridCallback, clips: int = 32) -> None:
    schedule = callback.schedule
    assert schedule is not None
    for epoch in sorted({s["epoch"] for s in model.steps}):
        steps = [s for s in model.steps if s["epoch"] == epoch]
        assert len(steps) == schedule.iterations_in_epoch(epoch, clips)
        stage = schedule.stage_at(epoch)
        assert stage.lr_factor == stage.shape.batch_size / 2  # the batch used over the base batch
        for step in steps:
            grid = schedule.grid_at(epoch, step["batch_idx"])
            served = sum(schedule.grid_at(epoch, i).batch_size for i in range(step["batch_idx"]))
            assert step["shape"] == (min(grid.batch_size, clips - served), 3, grid.num_frames, grid.crop_size, grid.crop_size)
            assert step["bn"] == (stage.bn.mode, stage.bn.num_splits)
            assert step["lr"] == pytest.approx(BASE_LR * 0.1**stage.lr_stage * stage.lr_factor, rel=1e-6)


@pytest.mark.slow
def test_fit_trains_on_the_cost_sized_batches(synthetic_dataset, train_manifest, tmp_path):
    model, callback = _fit(synthetic_dataset, train_manifest, "flops", tmp_path)
    schedule = callback.schedule
    assert schedule is not None and schedule.config.clip_costs
    _assert_steps_follow(model, callback)
    # The attention makes coarse clips cheaper than frames x pixels: larger batches than Equation 1's.
    config = schedule.config
    paper = build_schedule(config.with_equation1_batches())
    sized = {(s.shape.num_frames, s.shape.crop_size): s.shape.batch_size for s in schedule.stages}
    equation1 = {(s.shape.num_frames, s.shape.crop_size): s.shape.batch_size for s in paper.stages}
    assert sized[(2, 23)] > equation1[(2, 23)]
    assert sized[(8, 32)] == equation1[(8, 32)] == 2
    assert {s["shape"][0] for s in model.steps} - {g.batch_size for g in paper.distinct_grids()}


@pytest.mark.slow
def test_resume_keeps_the_measured_costs(synthetic_dataset, train_manifest, tmp_path):
    # Timed costs differ from one measurement to the next: a resume that measured again would build
    # another schedule.
    interrupted, first = _fit(synthetic_dataset, train_manifest, "time", tmp_path / "a", stop_after=2)
    resumed, second = _fit(synthetic_dataset, train_manifest, "time", tmp_path / "a",
                           ckpt_path=str(tmp_path / "a" / "last.ckpt"))
    assert second.schedule == first.schedule
    assert min(s["epoch"] for s in resumed.steps) == 2
    _assert_steps_follow(resumed, second)
