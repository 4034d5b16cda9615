"""The modules that moved into rooms still import by their old paths, as the same module objects."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import lightning_multigrid
from lightning_multigrid._moved import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_path_is_the_moved_module(old: str) -> None:
    module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])
    assert module.__spec__.name == MOVED[old]  # its own spec, not the old path's


def test_old_path_gives_the_same_classes_in_a_fresh_process() -> None:
    # Old path first, then the new one: one class, whichever path a config or a user's code names.
    code = (
        "from lightning_multigrid.config import MultigridConfig as old\n"
        "from lightning_multigrid.schedule.config import MultigridConfig as new\n"
        "from lightning_multigrid.schedule import build_schedule\n"
        "assert old is new and callable(build_schedule)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_no_moved_module_is_left_at_its_old_place() -> None:
    top = Path(lightning_multigrid.__file__).parent.parent
    assert [old for old in MOVED if (top / f"{old.replace('.', '/')}.py").exists()] == []


def test_the_schedule_room_offers_every_name_the_schedule_module_did() -> None:
    import lightning_multigrid.schedule as room
    from lightning_multigrid.schedule import build

    assert sorted(room.__all__) == sorted(build.__all__)
    assert all(getattr(room, name) is getattr(build, name) for name in build.__all__)


def test_load_manifest_keeps_its_old_path() -> None:
    from lightning_multigrid.data.manifests.load import load_manifest as old
    from lightning_multigrid.data.sources import load_manifest

    assert old is load_manifest
