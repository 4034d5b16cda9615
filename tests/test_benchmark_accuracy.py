"""`benchmarks/accuracy.py --quick`: the accuracy benchmark runs end to end (smoke test)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def parse(monkeypatch: pytest.MonkeyPatch, *argv: str) -> Any:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # as `python benchmarks/accuracy.py` has it
    module = importlib.import_module("accuracy")
    monkeypatch.setattr(sys, "argv", ["accuracy.py", *argv])
    return module.parse_args()


def test_weight_decay_defaults_by_optimizer_unless_given(monkeypatch):
    assert (parse(monkeypatch).optimizer, parse(monkeypatch).weight_decay) == ("sgd", 1e-4)
    assert parse(monkeypatch, "--optimizer", "adamw").weight_decay == 0.05
    assert parse(monkeypatch, "--optimizer", "adamw", "--weight-decay", "0.01").weight_decay == 0.01
    assert parse(monkeypatch, "--weight-decay", "0").weight_decay == 0.0


@pytest.mark.slow
def test_accuracy_benchmark_quick(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "accuracy.py"), "--quick", "--tasks", "fine", "--lengths", "short",
         "--variants", "baseline", "defaults", "full-grid-25", "--out", str(tmp_path)],
        capture_output=True, text=True, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    runs = json.loads((tmp_path / "results.json").read_text())["results"]
    assert [r["variant"] for r in runs] == ["baseline", "defaults", "full-grid-25"]
    baseline, defaults, share = runs
    # --quick: 32 videos in batches of 8 for 4 baseline epochs = 16 iterations, all at the full grid.
    assert (baseline["iterations"], baseline["full_grid_iterations"]) == (16, 16)
    assert defaults["iterations"] < 16 and defaults["epochs"] == 6  # round(1.5 * 4)
    # full_grid_share=0.25: ceil(0.25 * 4) = 1 fine-tuning epoch of 4 iterations at the full grid, at least.
    assert share["full_grid_iterations"] >= 4 > defaults["full_grid_iterations"]
    assert all(0 <= r["top1"] <= 1 and r["seconds"] > 0 and r["curve"] for r in runs)
    # Every run is scored on the independent test set too (--quick: 16 videos; default 800).
    assert all(0 <= r["test_top1"] <= 1 and r["test_videos"] == 16 and r["cpu_seconds"] > 0 for r in runs)
    assert all((r["optimizer"], r["weight_decay"]) == ("sgd", 1e-4) for r in runs)  # the defaults, recorded
    assert "fine task (texture cell 2 px), short schedule" in result.stdout
    for figure in ("accuracy.png", "curves.png"):
        assert (tmp_path / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_accuracy_benchmark_map(tmp_path):
    """--map: both fine-tuning pairs, each pretrained once, the options against their baseline, map.json."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "accuracy.py"), "--quick", "--map", "--variants", "baseline",
         "no-coarsest", "--out", str(tmp_path)],
        capture_output=True, text=True, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    runs = json.loads((tmp_path / "results.json").read_text())["results"]
    assert [(r["pair"], r["task"], r["length"], r["variant"]) for r in runs] == [
        ("detail", "coarse", "pretrain", "baseline"), ("detail", "fine", "finetune", "baseline"),
        ("detail", "fine", "finetune", "no-coarsest"),
        ("texture", "coarse", "pretrain-direction", "baseline"), ("texture", "coarse", "finetune", "baseline"),
        ("texture", "coarse", "finetune", "no-coarsest"),
    ]
    saving_map = json.loads((tmp_path / "map.json").read_text())
    assert saving_map["pairs"] == ["detail", "texture"]
    option = saving_map["options"]["no-coarsest"]
    for pair in ("detail", "texture"):
        finetuned = [r for r in runs if r["pair"] == pair and r["length"] == "finetune"]
        base, variant = finetuned
        assert option["pairs"][pair]["points_vs_baseline"] == pytest.approx(100 * (variant["test_top1"] - base["test_top1"]))
        assert option["pairs"][pair]["cpu_saving"] == pytest.approx(base["cpu_seconds"] / variant["cpu_seconds"])
    holds = all(option["pairs"][p]["points_vs_baseline"] >= -1 for p in ("detail", "texture"))
    assert option["within_1_point_on_every_pair"] == holds
    assert saving_map["chosen"] == ("no-coarsest" if holds else None)
    assert "map: test top-1 against saving" in result.stdout
