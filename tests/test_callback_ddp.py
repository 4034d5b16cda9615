"""MultigridCallback in a real 2-process DDP fit on CPU (gloo) on real H.264 videos.

Lightning's ``strategy="ddp"`` re-launches the running script for rank 1, which cannot work from
inside pytest, so the fit runs in ``tests/ddp_fit.py`` (see its docstring), started as a
subprocess in its own session so a hang is killed, both ranks with it, after a bounded time.
Each rank records every training step; the test checks both ranks against each other and
against the schedule, and checks that the BatchNorm layer really synced statistics over the two
ranks where the schedule says ``sync`` (and did not where it says ``split``/``plain``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_multigrid.data.synthetic import SyntheticDataset
from lightning_multigrid.grid import GridShape
from lightning_multigrid.schedule import build_schedule
from lightning_multigrid.schedule.config import ClipCost, MultigridConfig, MultigridOptions

from conftest import run_ddp_script

SCRIPT = Path(__file__).with_name("ddp_fit.py")
TIMEOUT_S = 240
TRAIN_VIDEOS, DEVICES = 16, 2
CLIPS_PER_RANK = math.ceil(TRAIN_VIDEOS / DEVICES)

# Must match tests/ddp_fit.py.
SCHEDULE = build_schedule(
    MultigridConfig(
        base=GridShape(1, 8, 32),
        sampling_rate=2,
        max_epochs=4,
        milestones=(2,),
        devices=DEVICES,
        options=MultigridOptions(bn_base_size=2),
    )
)


def run_ddp_fit(data: SyntheticDataset, out_dir: Path, *extra: str) -> list[dict[str, Any]]:
    run_ddp_script(
        [str(SCRIPT), str(out_dir), str(data.root), str(data.train_manifest), str(data.val_manifest), *extra],
        cwd=out_dir,
        timeout_s=TIMEOUT_S,
    )
    return [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in range(DEVICES)]


@pytest.fixture(scope="module")
def ddp_fit_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ddp_fit")


@pytest.fixture(scope="module")
def ranks(synthetic_dataset: SyntheticDataset, ddp_fit_dir: Path) -> list[dict[str, Any]]:
    """The 2-process fit in float32, with a checkpoint at the end of every epoch."""
    return run_ddp_fit(synthetic_dataset, ddp_fit_dir, "32-true", str(ddp_fit_dir / "checkpoints"))


def approx(expected: list[float]) -> Any:
    """Equal up to float32 round-off: the statistics are derived from float32 running buffers."""
    return pytest.approx(expected, rel=1e-4, abs=1e-4)


def derived_batch_stats(step: dict[str, Any]) -> tuple[list[float], list[float]]:
    """The (mean, unbiased var) the layer folded into its running statistics this step."""
    m = step["momentum"]
    mean = [(a - (1 - m) * b) / m for a, b in zip(step["running_mean_after"], step["running_mean_before"])]
    var = [(a - (1 - m) * b) / m for a, b in zip(step["running_var_after"], step["running_var_before"])]
    return mean, var


def union_stats(steps: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """Mean and unbiased variance over the union of the ranks' BatchNorm inputs of one step."""
    total = sum(s["count"] for s in steps)
    channels = len(steps[0]["local_mean"])
    mean = [sum(s["count"] * s["local_mean"][c] for s in steps) / total for c in range(channels)]
    var = [
        sum(s["count"] * (s["local_var"][c] + (s["local_mean"][c] - mean[c]) ** 2) for s in steps) / total
        * total / (total - 1)
        for c in range(channels)
    ]
    return mean, var


def test_two_real_processes_built_the_expected_schedule(ranks):
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["pid"] != ranks[1]["pid"]
    for r in ranks:
        assert r["world_size"] == DEVICES
        assert r["backend"] == "gloo"
        assert r["current_epoch"] == SCHEDULE.max_epochs  # Lightning ran the multigrid epochs
        # The callback's schedule is the one for 2 devices (BN plans included) on both ranks.
        assert r["schedule"]["devices"] == DEVICES
        assert r["schedule"]["max_epochs"] == SCHEDULE.max_epochs
        assert r["schedule"]["stages"] == [
            {"start_epoch": s.start_epoch, "end_epoch": s.end_epoch, "bn": s.bn.to_dict()} for s in SCHEDULE.stages
        ]
    # The premise of the BN checks: the base shape syncs over both ranks, coarse shapes split.
    assert SCHEDULE.stages[-1].bn.mode == "sync" and SCHEDULE.stages[-1].bn.group_size == 2
    assert SCHEDULE.stages[0].bn.mode == "split"


def test_both_ranks_follow_the_schedule_in_lockstep(ranks):
    sequences = [[(s["epoch"], s["batch_idx"], s["shape"]) for s in r["steps"]] for r in ranks]
    assert len(sequences[0]) == len(sequences[1])
    assert sequences[0] == sequences[1]
    steps = ranks[0]["steps"]
    assert sorted({s["epoch"] for s in steps}) == list(range(SCHEDULE.max_epochs))
    for epoch in range(SCHEDULE.max_epochs):
        in_epoch = [s for s in steps if s["epoch"] == epoch]
        assert [s["batch_idx"] for s in in_epoch] == list(range(SCHEDULE.iterations_in_epoch(epoch, TRAIN_VIDEOS)))
        served = 0
        for step in in_epoch:
            grid = SCHEDULE.grid_at(epoch, step["batch_idx"])
            batch = min(grid.batch_size, CLIPS_PER_RANK - served)  # the last batch may be partial
            served += batch
            assert step["shape"] == [batch, 3, grid.num_frames, grid.crop_size, grid.crop_size], (epoch, step["batch_idx"])
        assert served == CLIPS_PER_RANK


def test_batchnorm_grouping_follows_the_plan_and_syncs_over_both_ranks(ranks):
    for r in ranks:
        for step in r["steps"]:
            plan = SCHEDULE.stage_at(step["epoch"]).bn
            assert step["mode"] == plan.mode, (r["rank"], step["epoch"], step["batch_idx"])
            if plan.mode == "sync":
                assert (step["num_splits"], step["group_size"]) == (1, plan.group_size)
            else:
                assert (step["num_splits"], step["group_size"]) == (plan.num_splits, None)
        modes = {s["mode"] for s in r["steps"]}
        assert modes == {"split", "plain", "sync"}
        sync_epochs = {s["epoch"] for s in r["steps"] if s["mode"] == "sync"}
        assert sync_epochs == {e for e in range(SCHEDULE.max_epochs) if SCHEDULE.stage_at(e).bn.mode == "sync"}
        assert all(s["group_size"] == 2 for s in r["steps"] if s["mode"] == "sync")


def test_sync_steps_normalise_with_the_statistics_of_both_ranks(ranks):
    sync_steps = 0
    for step0, step1 in zip(ranks[0]["steps"], ranks[1]["steps"]):
        mean0, var0 = derived_batch_stats(step0)
        mean1, var1 = derived_batch_stats(step1)
        union_mean, union_var = union_stats([step0, step1])
        where = (step0["epoch"], step0["batch_idx"])
        # DDP broadcasts rank 0's buffers before every training forward, whatever the BN mode.
        assert step0["running_mean_before"] == step1["running_mean_before"], where
        if step0["mode"] == "sync":
            sync_steps += 1
            # Both ranks used one set of statistics: those of the union of their batches...
            assert mean0 == approx(union_mean), where
            assert var0 == approx(union_var), where
            assert mean1 == approx(union_mean), where
            assert var1 == approx(union_var), where
            # ...so the running statistics stay bit-identical (they were before the step).
            assert step0["running_mean_after"] == step1["running_mean_after"], where
            assert step0["running_var_after"] == step1["running_var_after"], where
        else:
            # Split (equal groups) or plain: each rank's own batch mean, not the union's.
            for step, mean in ((step0, mean0), (step1, mean1)):
                if step["shape"][0] % step["num_splits"] == 0:
                    assert mean == approx(step["local_mean"]), where
            assert mean0 != approx(mean1), where
    assert sync_steps == sum(
        SCHEDULE.iterations_in_epoch(e, TRAIN_VIDEOS) for e in range(SCHEDULE.max_epochs) if SCHEDULE.stage_at(e).bn.mode == "sync"
    )


def test_ranks_end_with_identical_parameters_and_batchnorm_statistics(ranks):
    # Parameters: DDP averages gradients. BN buffers: DDP (broadcast_buffers=True) copies rank 0's
    # buffers to every rank at each forward through the DDP wrapper, the final validation's
    # included, so this holds with or without BN sync (a mutant whose "sync" layers use local
    # statistics passes it too): it checks consistency, not sync. Sync is checked per step in
    # test_sync_steps_normalise_with_the_statistics_of_both_ranks.
    assert ranks[0]["final_bn_mode"] == ranks[1]["final_bn_mode"] == "sync"
    assert ranks[0]["final"].keys() == ranks[1]["final"].keys()
    for name, values in ranks[0]["final"].items():
        assert values == ranks[1]["final"][name], name


# ------------------------------------------------------------ mixed precision, resume elsewhere


@pytest.fixture(scope="module")
def bf16_ranks(synthetic_dataset: SyntheticDataset, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The same 2-process fit under ``precision="bf16-mixed"``."""
    return run_ddp_fit(synthetic_dataset, tmp_path_factory.mktemp("ddp_fit_bf16"), "bf16-mixed")


@pytest.mark.slow
def test_sync_batchnorm_trains_under_bf16_mixed_precision(bf16_ranks):
    # Sync BatchNorm on bfloat16 activations with float32 weights used to raise "mixed dtype".
    ranks = bf16_ranks
    for r in ranks:
        assert r["precision"] == "bf16-mixed"
        assert r["dtypes"] == ["torch.bfloat16"]  # autocast really gave BatchNorm half input
        assert r["current_epoch"] == SCHEDULE.max_epochs
        assert all(math.isfinite(v) for values in r["final"].values() for v in values)
    sync_steps = [(s0, s1) for s0, s1 in zip(ranks[0]["steps"], ranks[1]["steps"]) if s0["mode"] == "sync"]
    assert sync_steps
    for step0, step1 in sync_steps:
        union_mean, _ = union_stats([step0, step1])
        # float32 statistics of the bfloat16 input: those of the union of both ranks' batches.
        assert derived_batch_stats(step0)[0] == pytest.approx(union_mean, rel=1e-3, abs=1e-3)
        assert step0["running_mean_after"] == step1["running_mean_after"]
        assert step0["running_var_after"] == step1["running_var_after"]


def test_resume_on_one_device_replans_batchnorm(ranks, ddp_fit_dir, synthetic_dataset, caplog):
    # A 2-device checkpoint resumed on 1 device keeps the epochs but plans BatchNorm for 1 device
    # (the 2-device plan syncs over 2 ranks that no longer exist).
    from lightning_multigrid._lightning import pl
    from lightning_multigrid.callback import MultigridCallback
    from lightning_multigrid.data.datamodule import MultigridVideoDataModule

    from ddp_fit import BASE, MILESTONES, RecordingNet

    checkpoints = ddp_fit_dir / "checkpoints"
    first_sync = min(s.start_epoch for s in SCHEDULE.stages if s.bn.mode == "sync")
    assert first_sync >= 1
    (checkpoint,) = checkpoints.glob(f"epoch={first_sync - 1}-*.ckpt")
    # Every rank's random state is in the checkpoint (gathered at the save; issue 41, item 3); on 1 device
    # it is not restored (the run cannot be exact there anyway), and the summary says so.
    (state,) = (v for k, v in torch.load(checkpoint, weights_only=True)["callbacks"].items() if "MultigridCallback" in k)
    assert len(state["rng"]) == DEVICES and all(set(r) >= {"torch", "numpy", "python"} for r in state["rng"])
    model = RecordingNet()
    callback = MultigridCallback(bn_base_size=2, precise_bn_batches=0, milestones=MILESTONES)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=4, num_sanity_val_steps=0, limit_val_batches=0,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[callback],
    )
    datamodule = MultigridVideoDataModule(
        train_manifest=str(synthetic_dataset.train_manifest), val_manifest=str(synthetic_dataset.val_manifest),
        root_dir=str(synthetic_dataset.root), num_workers=0, flip=False, seed=1, **BASE,
    )
    with caplog.at_level("INFO"):
        trainer.fit(model, datamodule=datamodule, ckpt_path=str(checkpoint))
    assert f"holds the random state of {DEVICES} processes and this fit has 1: not restored" in caplog.text
    schedule = callback.schedule
    assert schedule is not None and schedule.config.devices == 1
    assert [(s.start_epoch, s.end_epoch) for s in schedule.stages] == [(s.start_epoch, s.end_epoch) for s in SCHEDULE.stages]
    assert {s["epoch"] for s in model.steps} == set(range(first_sync, SCHEDULE.max_epochs))
    for step in model.steps:
        assert step["mode"] == schedule.stage_at(step["epoch"]).bn.mode != "sync"


def test_timed_batch_sizes_are_rank_0s_on_both_ranks(synthetic_dataset, tmp_path, monkeypatch):
    """Each rank times the grids (differently); both train on rank 0's costs, in lockstep, without a hang."""
    monkeypatch.setenv("DDP_FIT_BATCH_SIZING", "time")
    ranks = run_ddp_fit(synthetic_dataset, tmp_path)
    costs = [r["schedule"]["clip_costs"] for r in ranks]
    assert costs[0] and costs[0] == costs[1]
    schedule = build_schedule(dataclasses.replace(
        SCHEDULE.config, options=dataclasses.replace(SCHEDULE.config.options, batch_sizing="time"),
        clip_costs=tuple(ClipCost(*cost) for cost in costs[0]),
    ))
    sequences = [[(s["epoch"], s["batch_idx"], s["shape"]) for s in r["steps"]] for r in ranks]
    assert sequences[0] == sequences[1]
    assert [r["current_epoch"] for r in ranks] == [schedule.max_epochs] * DEVICES
    for epoch, batch_idx, shape in sequences[0]:
        grid = schedule.grid_at(epoch, batch_idx)
        served = sum(schedule.grid_at(epoch, i).batch_size for i in range(batch_idx))
        assert shape == [min(grid.batch_size, CLIPS_PER_RANK - served), 3, grid.num_frames, grid.crop_size, grid.crop_size]
