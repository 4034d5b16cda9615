"""The packed frame store under concurrent use, with real processes: a store packed again while a run
reads it, two packing runs into one store at once, and a store whose files are partly absent."""

from __future__ import annotations

import encodings.utf_8_sig  # noqa: F401 -- imported before a block runs as a user who cannot read the stdlib
import gc
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from test_data_frame_layouts import as_other_user
from torch import nn
from torch.utils.data import DataLoader

from lightning_multigrid._lightning import pl
from lightning_multigrid.cli.commands import main
from lightning_multigrid.data.clip_params import ClipRequest
from lightning_multigrid.data.datamodule import MultigridVideoDataModule
from lightning_multigrid.data.dataset import TrainVideoDataset
from lightning_multigrid.data.manifests.entries import ManifestError
from lightning_multigrid.data.manifests.store_folder import HEADER_FILE
from lightning_multigrid.data.sources import load_manifest
from lightning_multigrid.data.store.format import FrameStore, packing_lock
from lightning_multigrid.data.synthetic import SyntheticDataset, synthetic_store_files
from lightning_multigrid.data.tools.pack import pack_frames

from conftest import FrameFactory

WAITING = "waiting for another process"


def smooth_manifest(tmp_path: Path, frames: FrameFactory, count: int = 3) -> Path:
    for i in range(count):
        frames.smooth(f"v{i}", num_frames=12, width=160, height=120, seed=i)
    manifest = tmp_path / "m.txt"
    manifest.write_text("".join(f"v{i} {i}\n" for i in range(count)))
    return manifest


def cli(*args: str) -> subprocess.Popen[str]:
    """``lightning-multigrid *args`` in a new process (this checkout: PYTHONPATH is inherited)."""
    return subprocess.Popen(
        [sys.executable, "-m", "lightning_multigrid.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
    )


def finish(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{out}\n{err}"
    return out + err


def generations(store: Path) -> set[str]:
    return {p.name.split("-", 1)[1].split(".")[0] for p in store.iterdir() if p.name.startswith("videos-")}


def wait_until_waiting(procs: list[subprocess.Popen[str]]) -> list[str]:
    """Read each process's stderr until it says it waits for the packing lock (so both run at once)."""
    lines: list[str] = []
    for proc in procs:
        assert proc.stderr is not None
        timer = threading.Timer(120, proc.kill)
        timer.start()
        try:
            for line in proc.stderr:
                lines.append(line)
                if WAITING in line:
                    break
        finally:
            timer.cancel()
        assert lines and WAITING in lines[-1], "".join(lines)
    return lines


def test_a_run_reading_a_store_keeps_its_frames_while_another_process_packs_it_again(
    tmp_path: Path, frames: FrameFactory
) -> None:
    manifest = smooth_manifest(tmp_path, frames)
    store = pack_frames(load_manifest(manifest), tmp_path / "s.store", crop_size=112, workers=1, progress=False).store
    dataset = TrainVideoDataset(store)  # the run: its store opened in the main process
    requests = [ClipRequest(i, 4, 112, (1.0, 2.0), (128, 160), seed=i) for i in range(3)]
    # New workers every epoch, each opening the level files it was handed (as `persistent_workers=False`).
    loader = DataLoader(dataset, batch_size=None, sampler=requests, num_workers=1, persistent_workers=False)
    before = [item["video"] for item in loader]
    finish(cli("pack-frames", str(manifest), str(store), "--crop-size", "56", "--workers", "1", "--no-progress"))
    assert FrameStore(store).levels == (80,)  # the store was packed again, for another crop
    after = [item["video"] for item in loader]  # the next epoch's worker
    again = pickle.loads(pickle.dumps(dataset))  # a spawned worker takes its own hold on the same files
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert all(torch.equal(a, again[r]["video"]) for a, r in zip(before, requests))
    assert len(generations(store)) == 2  # the run's files kept beside the new ones
    del dataset, loader, again
    gc.collect()  # the run lets go: the next packing removes its files
    finish(cli("pack-frames", str(manifest), str(store), "--crop-size", "56", "--workers", "1", "--no-progress"))
    assert generations(store) == {FrameStore(store).token}


def test_two_packing_runs_into_one_store_take_turns(tmp_path: Path, frames: FrameFactory) -> None:
    manifest = smooth_manifest(tmp_path, frames)
    store = tmp_path / "s.store"
    args = ("pack-frames", str(manifest), str(store), "--crop-size", "112", "--workers", "1", "--no-progress")
    with packing_lock(store):  # both start while a third packing holds the store: they run at once
        procs = [cli(*args), cli(*args)]
        wait_until_waiting(procs)
    for proc in procs:
        assert "3 videos (36 frames) packed" in finish(proc)
    assert len(TrainVideoDataset(store)) == 3
    assert generations(store) == {FrameStore(store).token}  # the first run's files removed by the second


def test_two_runs_that_pack_the_synthetic_stores_at_once_pack_them_once(
    synthetic_dataset: SyntheticDataset, tmp_path: Path
) -> None:
    root = tmp_path / "synthetic"
    shutil.copytree(Path(synthetic_dataset.train_manifest).parent, root)  # copy2: the manifests keep their times
    script = (
        "import json, sys\n"
        "from lightning_multigrid.data.store.format import FrameStore\n"
        "from lightning_multigrid.data.synthetic import ensure_synthetic_stores\n"
        "stores = ensure_synthetic_stores(sys.argv[1], 32)\n"
        "print(json.dumps([FrameStore(s).token for s in stores]))\n"
    )
    train_store, _ = synthetic_store_files(root, 46)
    with packing_lock(train_store):
        procs = [
            subprocess.Popen([sys.executable, "-c", script, str(root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
            for _ in range(2)
        ]
        wait_until_waiting(procs)
    tokens = [json.loads(finish(proc).splitlines()[0]) for proc in procs]
    assert tokens[0] == tokens[1]  # the second found the stores the first packed


@pytest.mark.parametrize("absent", ["videos", "frames", "offsets"])
def test_a_store_whose_files_are_absent_is_refused_at_open_naming_the_file(
    tmp_path: Path, frames: FrameFactory, capsys: pytest.CaptureFixture[str], absent: str
) -> None:
    store = pack_frames(load_manifest(smooth_manifest(tmp_path, frames)), tmp_path / "s.store", crop_size=112,
                        workers=1, progress=False).store
    header = json.loads((store / HEADER_FILE).read_text())
    name = header["videos_file"] if absent == "videos" else header["files"][0][absent]
    (store / name).unlink()
    expected = rf"{store}: the frame store's store.json names {name}, which is not in the folder.*pack-frames"
    with pytest.raises(ManifestError, match=expected):
        TrainVideoDataset(store)
    with pytest.raises(ManifestError, match=expected):
        FrameStore(store)
    with pytest.raises(SystemExit) as exit_code:
        main(["check-data", str(store), "--workers", "1", "--no-progress"])
    assert exit_code.value.code == 2
    captured = capsys.readouterr()
    assert f"names {name}, which is not in the folder" in captured.err and "FAILED" not in captured.out


@pytest.mark.parametrize("crop", [0, -5])
def test_a_crop_size_below_1_is_refused_naming_the_crop_size(
    tmp_path: Path, frames: FrameFactory, capsys: pytest.CaptureFixture[str], crop: int
) -> None:
    manifest = smooth_manifest(tmp_path, frames, count=1)
    with pytest.raises(ValueError, match=rf"^`crop_size` must be a positive integer, got {crop}\.$"):
        pack_frames(load_manifest(manifest), tmp_path / "s.store", crop_size=crop, workers=1, progress=False)
    for argv, flag in (
        (["pack-frames", str(manifest), str(tmp_path / "s.store"), "--crop-size", str(crop)], "--crop-size"),
        (["make-synthetic", str(tmp_path / "synthetic"), "--store-crop-size", str(crop)], "--store-crop-size"),
    ):
        with pytest.raises(SystemExit) as exit_code:
            main(argv)
        assert exit_code.value.code == 2
        assert f"error: `{flag}` must be a positive integer, got {crop}." in capsys.readouterr().err
    assert not (tmp_path / "synthetic").exists() and not (tmp_path / "s.store").exists()  # refused before any work


# ---------------------------------------------------------------------------- read-only folders


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A temporary folder another user can reach (pytest's are private to their owner)."""
    with tempfile.TemporaryDirectory() as name:
        os.chmod(name, 0o755)
        yield Path(name)


def make_read_only(folder: Path) -> None:
    for path in [folder, *folder.rglob("*")]:
        os.chmod(path, 0o555 if path.is_dir() else 0o444)


@pytest.mark.parametrize("existing", [False, True], ids=["new-store", "packed-store"])
def test_packing_into_a_read_only_folder_is_one_line_naming_it(
    shared_dir: Path, capsys: pytest.CaptureFixture[str], existing: bool
) -> None:
    """Issue 41, item 11: an OSError on `.packing` with a traceback before."""
    manifest = smooth_manifest(shared_dir, FrameFactory(shared_dir), count=1)
    out = shared_dir / "out"
    out.mkdir()
    store = out / "s.store"
    if existing:
        pack_frames(load_manifest(manifest), store, crop_size=56, workers=0, progress=False)
    make_read_only(out)
    with as_other_user():
        with pytest.raises(SystemExit) as exit_code:
            main(["pack-frames", str(manifest), str(store), "--crop-size", "56", "--workers", "0", "--no-progress"])
        with pytest.raises(ValueError, match=rf"The store folder {store} cannot be written"):
            pack_frames(load_manifest(manifest), store, crop_size=56, workers=0, progress=False)
    assert exit_code.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    where = "" if existing else f" (in {out})"
    assert err == (
        f"lightning-multigrid pack-frames: error: The store folder {store} cannot be written{where}: the folder or its "
        "disk is read-only for this user. Pass a store folder you can write to.\n"
    )
    assert not (store / ".packing").exists()


# ---------------------------------------------------------------------------- a DataModule kept between fits


class LabelNet(pl.LightningModule):
    """A tiny 3D CNN that records the labels it trained on."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv3d(3, 2, 3, padding=1), nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(2, 4))
        self.labels: list[int] = []

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.labels += batch["label"].tolist()
        return nn.functional.cross_entropy(self.net(batch["video"]), batch["label"])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit_once(datamodule: MultigridVideoDataModule) -> list[int]:
    model = LabelNet()
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, datamodule=datamodule)
    return sorted(model.labels)


def test_a_datamodule_kept_between_fits_reads_a_store_packed_again_and_lets_the_old_packing_go(
    tmp_path: Path, frames: FrameFactory
) -> None:
    """Issue 41, item 5: the second fit trained every clip from the old packing, whose files stayed on disk."""
    manifest = smooth_manifest(tmp_path, frames, count=3)
    store = pack_frames(load_manifest(manifest), tmp_path / "s.store", crop_size=32, workers=0, progress=False).store
    datamodule = MultigridVideoDataModule(train_manifest=str(store), batch_size=1, num_frames=4, crop_size=32,
                                          sampling_rate=1, num_workers=0)
    assert fit_once(datamodule) == [0, 1, 2]
    manifest.write_text("v0 3\nv1 3\n")  # packed again: two videos, both of class 3
    pack_frames(load_manifest(manifest), store, crop_size=32, workers=0, progress=False)
    assert len(generations(store)) == 2  # the DataModule still holds the first packing
    assert fit_once(datamodule) == [3, 3]
    assert generations(store) == {FrameStore(store).token}  # the first packing's files removed


def test_a_dataset_given_on_a_store_packed_again_is_kept_with_a_warning(tmp_path: Path, frames: FrameFactory) -> None:
    manifest = smooth_manifest(tmp_path, frames, count=3)
    store = pack_frames(load_manifest(manifest), tmp_path / "s.store", crop_size=32, workers=0, progress=False).store
    datamodule = MultigridVideoDataModule(train_manifest=str(store), batch_size=1, num_frames=4, crop_size=32,
                                          sampling_rate=1, num_workers=0)
    datamodule.use_datasets(train=TrainVideoDataset(store))
    manifest.write_text("v0 3\nv1 3\n")
    pack_frames(load_manifest(manifest), store, crop_size=32, workers=0, progress=False)
    with pytest.warns(UserWarning, match=rf"reads the frame store {store} as it was when opened.*keeps the old packing"):
        assert fit_once(datamodule) == [0, 1, 2]
