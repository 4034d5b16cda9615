"""`lightning-multigrid check-data` and `make-synthetic` on real files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lightning_multigrid.cli.commands import main
from lightning_multigrid.data.dataset import TrainVideoDataset
from lightning_multigrid.data.manifests.entries import read_class_names
from lightning_multigrid.data.manifests.videos import read_manifest
from lightning_multigrid.data.reader_settings import ReaderSettings
from lightning_multigrid.data.synthetic import SyntheticDataset, ensure_synthetic_dataset, render_synthetic_video
from lightning_multigrid.data.tools.check import check_videos

from conftest import BROKEN_KINDS, VideoFactory


def test_check_data_on_a_good_dataset(synthetic_dataset: SyntheticDataset, capsys: pytest.CaptureFixture[str]) -> None:
    main(["check-data", str(synthetic_dataset.train_manifest), "--workers", "2", "--no-progress"])
    out = capsys.readouterr().out
    assert "16 of 16 video files decode, 0 fail." in out
    assert "total duration  0:00:32 (32.0 s), 2.00-2.00 s per video" in out
    assert "fps             12.00-12.00" in out
    assert "resolution      64x48 to 64x48" in out
    assert "FAILED" not in out


def test_check_data_names_the_videos_shorter_than_a_base_clip(
    videos: VideoFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lengths = (10, 14, 15, 30)
    paths = [videos.coded(f"v{n}.mp4", num_frames=n, fps=12) for n in lengths]
    (tmp_path / "m.csv").write_text("".join(f"{path.name} 0\n" for path in paths))
    main(["check-data", str(tmp_path / "m.csv"), "--workers", "1", "--no-progress", "--num-frames", "8",
          "--sampling-rate", "2"])
    lines = capsys.readouterr().out.splitlines()
    # 8 frames at stride 2 span (8 - 1) * 2 + 1 = 15 source frames: the 10- and 14-frame videos are shorter.
    short = lines.index("short videos    2 of 4 have fewer frames than a base clip spans (15: 8 frames at stride 2): "
                        "their clips repeat the last frame")
    assert lines[short + 1:] == [f"  {paths[0]}: 10 frames", f"  {paths[1]}: 14 frames"]
    # The DataModule's defaults: 16 frames at stride 4 span 61.
    main(["check-data", str(tmp_path / "m.csv"), "--workers", "1", "--no-progress"])
    assert "short videos    4 of 4 have fewer frames than a base clip spans (61: 16 frames at stride 4)" in (
        capsys.readouterr().out
    )
    with pytest.raises(SystemExit) as exit_info:
        main(["check-data", str(tmp_path / "m.csv"), "--sampling-rate", "0"])
    assert exit_info.value.code == 2
    assert "`--sampling-rate` must be a positive integer, got 0." in capsys.readouterr().err


def test_check_data_lists_bad_files_and_exits_1(
    videos: VideoFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = videos.coded("good.mp4", num_frames=12, width=96, height=64, fps=24)
    lines = [f"{good.name} 0\n"] + [f"{videos.broken(kind).name} 1\n" for kind in BROKEN_KINDS]
    (tmp_path / "m.csv").write_text("".join(lines))
    with pytest.raises(SystemExit) as exit_info:
        main(["check-data", str(tmp_path / "m.csv"), "--workers", "1", "--no-progress"])
    assert exit_info.value.code == 1
    out = capsys.readouterr().out
    assert f"1 of {1 + len(BROKEN_KINDS)} video files decode, {len(BROKEN_KINDS)} fail." in out
    failed = [line for line in out.splitlines() if line.startswith("FAILED ")]
    assert len(failed) == len(BROKEN_KINDS)
    assert f"FAILED {tmp_path / 'missing.mp4'}: the file does not exist" in failed
    assert f"FAILED {tmp_path / 'audio_only.mp4'}: no video stream (streams: audio)" in failed
    assert any(line.startswith(f"FAILED {tmp_path / 'truncated.mp4'}: the file is truncated") for line in failed)
    assert "resolution      96x64 to 96x64" in out and "fps             24.00-24.00" in out


@pytest.mark.parametrize(("command", "match"), [
    (["check-data", "m.csv", "--filename-tmpl", "img.jpg"], "`--filename-tmpl` 'img.jpg' has no frame-number field"),
    (["extract-frames", "m.csv", "out", "--short-side", "0"], "`--short-side`"),
])
def test_cli_errors_name_the_flag_not_the_python_argument(
    command: list[str], match: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("m.csv").write_text("a.mp4 0\n")
    with pytest.raises(SystemExit) as exit_info:
        main(command)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert match in err and "filename_tmpl" not in err and "short_side" not in err, err


def test_check_data_settings_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["check-data", str(tmp_path / "missing.csv")])
    assert exit_info.value.code == 2
    assert "check-data: error: Manifest" in capsys.readouterr().err
    (tmp_path / "m.csv").write_text("a.mp4 0\nb.mp4\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["check-data", str(tmp_path / "m.csv")])
    assert exit_info.value.code == 2
    assert "m.csv:2: malformed line" in capsys.readouterr().err


def test_check_data_writes_a_metadata_file(synthetic_dataset: SyntheticDataset, tmp_path: Path) -> None:
    meta = tmp_path / "meta.json"
    main(["check-data", str(synthetic_dataset.val_manifest), "--workers", "1", "--no-progress", "--write-metadata", str(meta)])
    dataset = TrainVideoDataset(synthetic_dataset.val_manifest, ReaderSettings(metadata_file=meta))
    assert len(dataset.reader.metadata) == synthetic_dataset.num_val


def test_make_synthetic(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "synthetic"
    main([
        "make-synthetic", str(out_dir), "--num-train", "8", "--num-val", "4", "--num-classes", "8",
        "--width", "64", "--height", "48", "--num-frames", "16", "--fps", "8", "--workers", "2",
    ])
    assert "wrote 8 training and 4 validation videos" in capsys.readouterr().out
    names = read_class_names(out_dir / "classnames.txt")
    assert names[:3] == ("checker_left", "stripes_left", "checker_right") and len(names) == 8
    train = read_manifest(out_dir / "train.csv", class_names=names)
    val = read_manifest(out_dir / "val.csv", class_names=names)
    assert [e.label for e in train.entries] == list(range(8))
    assert [e.label for e in val.entries] == list(range(4))
    assert (out_dir / "train.csv").read_text().splitlines()[0] == "train/checker_left/00000.mp4 0"
    report = check_videos(train, workers=1, progress=False)
    assert report.ok
    shapes = {
        (r.metadata.width, r.metadata.height, r.metadata.num_frames, round(r.metadata.fps)) for r in report.results if r.metadata
    }
    assert shapes == {(64, 48, 16, 8)}


def test_make_synthetic_rejects_bad_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["make-synthetic", str(tmp_path), "--width", "63"])
    assert exit_info.value.code == 2
    assert "`--width` must be an even number" in capsys.readouterr().err  # the flag, not the Python name


def test_synthetic_videos_need_motion_and_texture() -> None:
    # Same seed, same video; the two textures have the same mean colour (coarse grids cannot
    # tell them apart) and the object moves the way its label says.
    def render(label: int) -> np.ndarray:
        return render_synthetic_video(label, 160, 120, 20, np.random.default_rng(3))

    assert np.array_equal(render(0), render(0))
    for label, axis, sign in [(0, 1, -1), (2, 1, 1), (4, 0, -1), (6, 0, 1)]:
        video = render(label).astype(np.int32)
        moving = np.abs(video[1:] - video[:-1]).sum(axis=(0, 3)) > 0  # pixels that ever change
        coords = np.nonzero(moving.any(axis=1 - axis))[0]
        first = np.abs(video[1] - video[0]).sum(axis=(2,)).nonzero()[axis].mean()
        last = np.abs(video[-1] - video[-2]).sum(axis=(2,)).nonzero()[axis].mean()
        assert coords.size and np.sign(last - first) == sign
    checker, stripes = render(0), render(1)
    assert abs(float(checker.mean()) - float(stripes.mean())) < 1.0


def test_texture_cell_sets_the_checkerboard_cell(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def checker_cell(texture_cell: int | None) -> int:
        frame = render_synthetic_video(0, 160, 120, 2, np.random.default_rng(5), texture_cell)[0].astype(np.int32)
        # Runs of identical pixels along rows: a pixel or two in the noisy background, a cell in the patch.
        same = np.all(frame[:, 1:] == frame[:, :-1], axis=2)
        flags = ("".join("1" if s else "0" for s in row) for row in same)
        runs = [len(run) + 1 for row in flags for run in row.split("0") if len(run) >= 2]
        return int(np.bincount(runs).argmax())

    assert checker_cell(None) == 6  # 1/20 of the 120 px short side
    assert checker_cell(12) == 12
    with pytest.raises(SystemExit) as exit_info:
        main(["make-synthetic", str(tmp_path), "--texture-cell", "40"])
    assert exit_info.value.code == 2
    assert "`--texture-cell` must be between 2 and a quarter of the short side (30)" in capsys.readouterr().err


def test_ensure_synthetic_dataset_writes_again_for_other_settings(tmp_path: Path) -> None:
    """A dataset written with another texture cell (or without a settings record) is written again."""
    root = tmp_path / "synthetic"
    record = root / "synthetic.json"
    ensure_synthetic_dataset(root, num_train=2, num_val=1)
    assert json.loads(record.read_text())["texture_cell"] is None
    written = record.stat().st_mtime_ns
    ensure_synthetic_dataset(root, num_train=2, num_val=1)  # same settings: kept
    assert record.stat().st_mtime_ns == written
    ensure_synthetic_dataset(root, num_train=2, num_val=1, texture_cell=12)
    assert json.loads(record.read_text())["texture_cell"] == 12
    record.unlink()  # as a dataset from before the record existed
    ensure_synthetic_dataset(root, num_train=2, num_val=1, texture_cell=12)
    assert record.is_file()


def test_make_synthetic_stores_are_the_ones_the_datamodule_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from lightning_multigrid.data.datamodule import MultigridVideoDataModule
    from lightning_multigrid.data.synthetic import SyntheticData

    root = tmp_path / "synthetic"
    main(["make-synthetic", str(root), "--num-train", "8", "--num-val", "4", "--workers", "1",
          "--store-crop-size", "32"])
    out = capsys.readouterr().out
    datamodule = MultigridVideoDataModule(
        synthetic=SyntheticData(str(root), size=(8, 4), format="store"), batch_size=2, num_frames=4, crop_size=32,
        sampling_rate=1, num_workers=0,
    )
    train_store = Path(datamodule.train_manifest)
    assert train_store.name == "train-L46.store" and f"  {train_store} (frame store for crop 32)" in out
    headers = [train_store / "store.json", Path(datamodule.val_manifest) / "store.json"]
    packed_at = [header.stat().st_mtime_ns for header in headers]
    datamodule.prepare_data()
    assert [header.stat().st_mtime_ns for header in headers] == packed_at  # found, not packed again
    datamodule.setup("fit")
    assert datamodule._datasets.train.manifest.format == "store" and len(datamodule._datasets.train) == 8
