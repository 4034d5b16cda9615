"""`lightning-multigrid fit`: what its console says about the settings it was given (issue 41, item 15)."""

from __future__ import annotations

import pytest
import torch
from test_cli_compare import run_cli, tiny_config, work_dir

from lightning_multigrid.cli.trainer import setting_flags
from lightning_multigrid.module import VideoClassifier


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        ("--multigrid.epoch_factor", "-1", "`--multigrid.epoch_factor` must be a positive number, got -1.0."),
        ("--model.lr", "-1", "`--model.lr` must be a positive number, got -1.0."),  # jsonargparse wraps a subclass's error
        ("--data.batch_size", "0", "`--data.batch_size` must be a positive integer, got 0."),
    ],
)
def test_a_value_a_class_refuses_is_one_line_naming_the_flag(tmp_path, flag, value, expected):
    """It was a 40-line traceback through jsonargparse ending in "`epoch_factor` must be ...": the Python name."""
    config, work = tiny_config(tmp_path), work_dir(tmp_path)
    result = run_cli("fit", "--config", str(config), flag, value, cwd=work)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == f"lightning-multigrid fit: error: {expected}"


def test_setting_flags_names_each_key_a_name_ends():
    keys = ["multigrid.epoch_factor", "model.init_args.num_classes", "data.init_args.num_classes", "trainer.max_epochs"]
    assert setting_flags("`epoch_factor` must be > 0; `max_epochs` too", keys) == (
        "`--multigrid.epoch_factor` must be > 0; `--trainer.max_epochs` too"
    )
    assert setting_flags("`num_classes` must match", keys) == "`--model.num_classes` or `--data.num_classes` must match"
    assert setting_flags("`weights=None` or `unknown`", keys) == "`weights=None` or `unknown`"  # not a key: as it was


@pytest.mark.slow
def test_fit_with_weights_shows_what_was_loaded(tmp_path):
    """`VideoClassifier(weights=...)` logs "Loaded N tensors ..." at INFO: the command line had no handler, so it
    never showed."""
    config, work = tiny_config(tmp_path), work_dir(tmp_path)
    weights = tmp_path / "weights.pt"
    torch.save(VideoClassifier(num_classes=4, backbone="tiny", tiny_width=4).state_dict(), weights)
    result = run_cli(
        "fit", "--config", str(config), "--model.weights", str(weights), "--trainer.max_epochs", "1",
        "--multigrid.enabled", "false", "--trainer.enable_progress_bar", "false", cwd=work,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"Loaded 24 tensors of tiny from {weights}; left new (the classifier, 4 classes): fc.weight, fc.bias" in (
        result.stderr
    )
