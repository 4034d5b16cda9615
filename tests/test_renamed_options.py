"""A previous release's config through the real command line: the error names each old key's new key."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from lightning_multigrid.cli.commands import main
from lightning_multigrid.cli.renamed_options import RENAMED, renamed_hint

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

# configs/demo.yaml's `data:` section as the previous release wrote it (git show 1c0e601^:configs/demo.yaml)
OLD_DEMO_DATA = """\
data:
  class_path: lightning_multigrid.data.datamodule.MultigridVideoDataModule
  init_args:
    synthetic_dir: data/synthetic
    synthetic_size: [240, 60]
    synthetic_texture_cell: 12
    synthetic_format: store
    batch_size: 8
    num_frames: 8
    crop_size: 64
    sampling_rate: 2
    num_workers: 2
"""


def _error(args: list[str], monkeypatch, capsys) -> str:
    monkeypatch.setattr(sys, "argv", ["lightning-multigrid"])
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(CONFIGS / "demo.yaml"), *args, "--print_config"])
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_an_old_demo_config_names_every_new_key(tmp_path, monkeypatch, capsys):
    old = tmp_path / "old.yaml"
    old.write_text(OLD_DEMO_DATA)
    error = _error(["--config", str(old)], monkeypatch, capsys)
    assert "Option 'synthetic_dir' is not accepted" in error  # the parser stops at the first
    for key, new in [("synthetic_dir", "path"), ("synthetic_size", "size"), ("synthetic_texture_cell", "texture_cell"),
                     ("synthetic_format", "format")]:
        assert f"`{key}` is now `data.synthetic.{new}`" in error


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--data.frame_decode", "device"], "`frame_decode` is now `data.reader_settings.frame_decode`"),
        (["--data.num_views", "2"], "`num_views` is now `data.eval_views.num_views`"),
        (["--multigrid.short_run_coarse_share", "0.3"], "`short_run_coarse_share` is now `multigrid.short_run.coarse_share`"),
    ],
)
def test_an_old_flag_names_its_new_key(args, line, monkeypatch, capsys):
    assert line in _error(args, monkeypatch, capsys)


def test_an_old_multigrid_section_names_its_new_key(tmp_path, monkeypatch, capsys):
    old = tmp_path / "old.yaml"
    old.write_text("multigrid:\n  short_run: true\n  short_run_max_lr_factor: 2\n")
    error = _error(["--config", str(old)], monkeypatch, capsys)
    assert "`short_run_max_lr_factor` is now `multigrid.short_run.max_lr_factor`" in error


def test_other_errors_get_no_hint():
    assert renamed_hint("Option 'batch_sise' is not accepted") == ""
    assert renamed_hint("Given value: {'num_views': 2}") == ""  # shown, but nothing was refused


def test_every_new_key_exists():
    # Each new key is a field of today's grouped values, so the hint never sends a user to another dead key.
    from dataclasses import fields

    from lightning_multigrid.data.reader_settings import ReaderSettings
    from lightning_multigrid.data.synthetic import SyntheticData
    from lightning_multigrid.grid import EvalViews
    from lightning_multigrid.schedule.config import ShortRun

    groups = {"data.synthetic": SyntheticData, "data.eval_views": EvalViews, "data.reader_settings": ReaderSettings,
              "multigrid.short_run": ShortRun}
    for new in RENAMED.values():
        group, _, field = new.rpartition(".")
        assert field in {f.name for f in fields(groups[group])}, new
