"""`lightning-multigrid check-data`: its report names the command's flags (issue 41, item 15)."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_multigrid.cli.commands import main


def test_check_data_names_the_template_flag_not_the_python_argument(tmp_path, frames, capsys):
    """A folder that mixes file name patterns said "pass `filename_tmpl`"; the command's option is `--filename-tmpl`."""
    frames.coded("a", num_frames=6, pattern="frame{:04d}.jpg")
    frames.write("a", [np.full((48, 64, 3), 128, np.uint8)] * 6, pattern="flow{:04d}.jpg")
    (tmp_path / "m.txt").write_text("a 0\n")
    with pytest.raises(SystemExit) as failed:
        main(["check-data", str(tmp_path / "m.txt"), "--workers", "1", "--no-progress"])
    out = capsys.readouterr().out
    assert failed.value.code == 1
    assert "mixes file name patterns 'flow<number>.jpg' (6 files), 'frame<number>.jpg' (6 files): pass `--filename-tmpl`" in out
    assert "`filename_tmpl`" not in out
