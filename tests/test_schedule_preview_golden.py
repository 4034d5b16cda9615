"""`lightning-multigrid schedule` prints byte for byte what it printed before cost-sized batches.

``tests/golden/schedule_preview.json`` holds, per command line, the SHA-256 of stdout and stderr
captured from the code before the ``batch_sizing`` option (commit 80accf7): each config of
``configs/`` as its baseline (table and JSON, without and with ``--dataset-size``) and the demo with
each option that changes the schedule's path. With the option at its default the output must not move.

Three deliberate changes since (issue 41, item 15), undone before hashing so that nothing else may move:
the table's last line names the flag (`--dataset-size`), warnings name flags (`--max-epochs`), and the
JSON says which epochs `max_epochs` counts with a `baseline_max_epochs` key after it.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
from pathlib import Path

import pytest

from lightning_multigrid.cli.commands import main

GOLDEN = json.loads((Path(__file__).parent / "golden" / "schedule_preview.json").read_text())


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# (what the command prints now, what it printed at 80accf7)
CHANGED_MESSAGES = (
    ("regime: give `--dataset-size` (the training clips) to see", "regime: give the dataset size to see"),
    ("Raise `--max-epochs` or `--epoch-factor`", "Raise `max_epochs` or `epoch_factor`"),
)


def _as_before(text: str, json_output: bool) -> str:
    """``text`` with the deliberate changes of :data:`CHANGED_MESSAGES` and ``baseline_max_epochs`` undone."""
    if json_output:
        data = json.loads(text)
        del data["baseline_max_epochs"]
        text = json.dumps(data, indent=1) + "\n"
    for now, before in CHANGED_MESSAGES:
        text = text.replace(now, before)
    return text


@pytest.mark.parametrize("command_line", sorted(GOLDEN))
def test_output_is_unchanged(command_line: str) -> None:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        main(["schedule", *command_line.split()])
    expected = GOLDEN[command_line]
    printed = _as_before(stdout.getvalue(), "--format json" in command_line)
    assert len(printed) == expected["stdout_chars"]
    assert _sha256(printed) == expected["stdout_sha256"]
    assert _sha256(_as_before(stderr.getvalue(), json_output=False)) == expected["stderr_sha256"]
