"""`lightning-multigrid schedule` prints byte for byte what it printed before cost-sized batches.

``tests/golden/schedule_preview.json`` holds, per command line, the SHA-256 of stdout and stderr
captured from the code before the ``batch_sizing`` option (commit 80accf7): each config of
``configs/`` as its baseline (table and JSON, without and with ``--dataset-size``) and the demo with
each option that changes the schedule's path. With the option at its default the output must not move.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
from pathlib import Path

import pytest

from lightning_multigrid.cli import main

GOLDEN = json.loads((Path(__file__).parent / "golden" / "schedule_preview.json").read_text())


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize("command_line", sorted(GOLDEN))
def test_output_is_unchanged(command_line: str) -> None:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        main(["schedule", *command_line.split()])
    expected = GOLDEN[command_line]
    assert len(stdout.getvalue()) == expected["stdout_chars"]
    assert _sha256(stdout.getvalue()) == expected["stdout_sha256"]
    assert _sha256(stderr.getvalue()) == expected["stderr_sha256"]
