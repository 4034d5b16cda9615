"""extract-frames: real H.264 videos to JPEG folders, resumable, bad videos reported, CLI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from lightning_multigrid.cli.commands import main
from lightning_multigrid.data.clip_params import eval_clip_params
from lightning_multigrid.data.decoding.frames import open_frame_folder, read_clip
from lightning_multigrid.data.manifests.entries import VideoEntry
from lightning_multigrid.data.manifests.frames import read_frame_manifest
from lightning_multigrid.data.sources import load_manifest
from lightning_multigrid.data.tools.extract import DONE_FILE, extract_frames, extract_video
from lightning_multigrid.grid import ClipSampling, EvalViews, GridShape

from conftest import VideoFactory


def jpegs(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.endswith(".jpg"))


def assert_frames_are(clip: torch.Tensor, indices: list[int]) -> None:
    """Each frame's mean colour is its source frame's (H.264, YUV->RGB, resize and JPEG drift a few levels)."""
    for t, index in enumerate(indices):
        colour = clip[:, t].float().mean(dim=(1, 2))
        expected = torch.tensor(VideoFactory.frame_colour(index), dtype=torch.float32)
        assert (colour - expected).abs().max() < 6, (t, index, colour)


def test_frames_keep_their_content_order_and_size(videos: VideoFactory, tmp_path: Path) -> None:
    video = videos.coded("v.mp4", num_frames=20, width=64, height=48)
    assert extract_video(str(video), str(tmp_path / "out"), short_side=24) == 20
    folder = open_frame_folder(VideoEntry(str(tmp_path / "out"), (0,)))
    assert (folder.width, folder.height, folder.num_frames) == (32, 24, 20)
    params = eval_clip_params(folder, GridShape(1, 20, 24), ClipSampling(1, (24, 24)), EvalViews(1, 1))
    clip = read_clip(folder, params)
    assert_frames_are(clip, list(range(20)))


def test_short_side_never_upscales(videos: VideoFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The docs' `--short-side 256` on a 64x48 video wrote 341x256 frames (2.8x the disk, no detail).
    video = videos.coded("v.mp4", num_frames=4, width=64, height=48)
    extract_video(str(video), str(tmp_path / "out"), short_side=256)
    folder = open_frame_folder(VideoEntry(str(tmp_path / "out"), (0,)))
    assert (folder.width, folder.height) == (64, 48)
    with pytest.raises(SystemExit):
        main(["extract-frames", "--help"])
    assert "never upscaled" in capsys.readouterr().out


def test_fps_resampling_keeps_every_other_frame(videos: VideoFactory, tmp_path: Path) -> None:
    video = videos.coded("v.mp4", num_frames=24, fps=12)
    assert extract_video(str(video), str(tmp_path / "out"), fps=6) == 12
    folder = open_frame_folder(VideoEntry(str(tmp_path / "out"), (0,)))
    clip = read_clip(folder, eval_clip_params(folder, GridShape(1, 12, 48), ClipSampling(1, (48, 48)), EvalViews(1, 1)))
    assert_frames_are(clip, list(range(0, 24, 2)))


def test_manifest_resume_and_bad_videos(videos: VideoFactory, tmp_path: Path) -> None:
    (tmp_path / "train").mkdir()
    for i in range(3):
        videos.coded(f"train/v{i}.mp4", num_frames=8)
    videos.broken("truncated", "train/broken.mp4")
    (tmp_path / "train.csv").write_text("train/v0.mp4 0\ntrain/broken.mp4 1\ntrain/v1.mp4 1\ntrain/v2.mp4 2\n")
    manifest = load_manifest(tmp_path / "train.csv")
    out = tmp_path / "frames"
    report = extract_frames(manifest, out, workers=2, progress=False)
    assert (report.extracted, report.already_done) == (3, 0)
    assert [f.path for f in report.failures] == [str(tmp_path / "train/broken.mp4")]
    assert "truncated" in str(report.failures[0].error)
    assert report.manifest == out / "train.txt"
    assert report.manifest.read_text() == "train/v0 0 8\ntrain/v1 1 8\ntrain/v2 2 8\n"
    frames = read_frame_manifest(report.manifest)
    assert frames.format == "frames" and [e.num_frames for e in frames.entries] == [8, 8, 8]

    # An interrupted folder (no .done) is redone; finished ones are skipped.
    (out / "train/v1" / DONE_FILE).unlink()
    (out / "train/v1/img_00008.jpg").unlink()
    again = extract_frames(manifest, out, workers=1, progress=False)
    assert (again.extracted, again.already_done, len(again.failures)) == (1, 2, 1)
    assert len(jpegs(out / "train/v1")) == 8


def test_refuses_bad_options_and_frame_manifests(videos: VideoFactory, tmp_path: Path) -> None:
    videos.coded("v.mp4")
    (tmp_path / "m.csv").write_text("v.mp4 0\n")
    manifest = load_manifest(tmp_path / "m.csv")
    for kwargs, match in (({"quality": 0}, "`quality`"), ({"fps": 0.0}, "`fps`"), ({"short_side": 0}, "`short_side`")):
        with pytest.raises(ValueError, match=match):
            extract_frames(manifest, tmp_path / "out", progress=False, **kwargs)  # type: ignore[arg-type]
    report = extract_frames(manifest, tmp_path / "out", progress=False, workers=1)
    with pytest.raises(ValueError, match="already a frame dataset"):
        extract_frames(load_manifest(report.manifest), tmp_path / "out2", progress=False)


def test_cli_extract_frames_then_check_data(videos: VideoFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    videos.coded("a.mp4", num_frames=6)
    videos.broken("random_bytes", "b.mp4")
    (tmp_path / "m.csv").write_text("a.mp4 0\nb.mp4 1\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["extract-frames", str(tmp_path / "m.csv"), str(tmp_path / "out"), "--workers", "1", "--no-progress",
              "--short-side", "24", "--quality", "80"])
    assert exit_info.value.code == 1
    out = capsys.readouterr().out
    assert f"FAILED {tmp_path / 'b.mp4'}" in out and "1 videos extracted, 0 already done, 1 failed" in out
    main(["check-data", str(tmp_path / "out" / "m.txt"), "--workers", "1", "--no-progress"])
    assert "1 of 1 frame folders decode" in capsys.readouterr().out


# ---------------------------------------------------------------------------- safe to re-run


def folder_per_class(videos: VideoFactory, tmp_path: Path, classes: tuple[str, ...] = ("abseiling", "air drumming")) -> Path:
    root = tmp_path / "videos"
    for k, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        videos.coded(f"videos/{name}/v{k}.mp4", num_frames=6)
    return root


def test_output_inside_a_folder_per_class_input_is_not_a_class_on_rerun(
    videos: VideoFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Failure 3: the output folder was listed as a class on the documented resume; labels moved up by one."""
    root = folder_per_class(videos, tmp_path)
    out = root / "frames"
    for _ in range(2):
        main(["extract-frames", str(root), str(out), "--workers", "1", "--no-progress"])
        assert (out / "classnames.txt").read_text() == "abseiling\nair drumming\n"
        assert (out / "videos.txt").read_text() == 'abseiling/v0 0 6\n"air drumming/v1" 1 6\n'
    assert "0 videos extracted, 2 already done" in capsys.readouterr().out
    # Training on (or extracting) the video root: the output is no class.
    assert load_manifest(root).class_names == ("abseiling", "air drumming")
    assert extract_frames(load_manifest(root), out, workers=1, progress=False).already_done == 2
    # A folder inside the root that is no extract-frames output yet is listed as a class: refused.
    (root / "later").mkdir()
    with pytest.raises(ValueError, match="is read as class 'later' of the folder-per-class input"):
        extract_frames(load_manifest(root), root / "later", workers=1, progress=False)


def test_class_names_with_spaces_round_trip(videos: VideoFactory, tmp_path: Path) -> None:
    """Failure 12: `air drumming/` was extracted, then writing the manifest failed, on every re-run."""
    root = folder_per_class(videos, tmp_path)
    report = extract_frames(load_manifest(root), tmp_path / "out", workers=1, progress=False)
    frames = load_manifest(report.manifest, class_names=tmp_path / "out" / "classnames.txt")
    assert [(Path(e.path).parent.name, e.labels, e.num_frames) for e in frames.entries] == [
        ("abseiling", (0,), 6), ("air drumming", (1,), 6)
    ]
    assert frames.class_names == ("abseiling", "air drumming")
    assert all(open_frame_folder(e).num_frames == 6 for e in frames.entries)


def test_a_folder_extracted_with_other_settings_is_redone(videos: VideoFactory, tmp_path: Path) -> None:
    """Failure 5: earlier folders counted as done, so one manifest mixed sizes and frame rates."""
    for name in ("a", "b"):
        videos.coded(f"{name}.mp4", num_frames=12, fps=12)
    (tmp_path / "m.csv").write_text("a.mp4 0\nb.mp4 1\n")
    manifest = load_manifest(tmp_path / "m.csv")
    out = tmp_path / "out"
    extract_frames(manifest, out, short_side=24, workers=1, progress=False)
    (out / "b" / DONE_FILE).unlink()  # b was interrupted
    again = extract_frames(manifest, out, short_side=32, fps=6, workers=1, progress=False)
    assert (again.extracted, again.redone, again.already_done) == (2, 1, 0)
    sizes = {(f.width, f.height, f.num_frames) for f in (open_frame_folder(e) for e in load_manifest(again.manifest).entries)}
    assert sizes == {(43, 32, 6)}
    same = extract_frames(manifest, out, short_side=32, fps=6, workers=1, progress=False)
    assert (same.extracted, same.already_done) == (0, 2)


def test_never_writes_over_its_input_and_refuses_before_work(videos: VideoFactory, tmp_path: Path) -> None:
    """Failure 11: extracting into the input manifest's own folder overwrote the input manifest."""
    videos.coded("a.mp4", num_frames=6)
    (tmp_path / "train.txt").write_text("a.mp4 0\n")
    manifest = load_manifest(tmp_path / "train.txt")
    with pytest.raises(ValueError, match=r"overwrite the input manifest .*train.txt: pass another `output_dir` or `manifest_name`"):
        extract_frames(manifest, tmp_path, workers=1, progress=False)
    assert (tmp_path / "train.txt").read_text() == "a.mp4 0\n" and not (tmp_path / "a").exists()
    report = extract_frames(manifest, tmp_path, manifest_name="train_frames.txt", workers=1, progress=False)
    assert report.manifest.read_text() == "a 0 6\n"
    with pytest.raises(ValueError, match="`manifest_name` must be a file name"):
        extract_frames(manifest, tmp_path / "o", manifest_name="sub/x.txt", workers=1, progress=False)
    for kwargs, match in (({"quality": 90.5}, "`quality`"), ({"short_side": 24.0}, "`short_side`"), ({"workers": -1}, "`workers`")):
        with pytest.raises(ValueError, match=match):
            extract_frames(manifest, tmp_path / "o", progress=False, **kwargs)  # type: ignore[arg-type]
    assert not (tmp_path / "o").exists()


def test_an_interrupted_run_leaves_no_worker_process(videos: VideoFactory, tmp_path: Path) -> None:
    """Failure 14: killing extract-frames left its pool workers running (writing, then hanging)."""
    import signal
    import subprocess
    import sys
    import time

    for i in range(6):
        videos.coded(f"v{i}.mp4", num_frames=200)
    (tmp_path / "m.csv").write_text("".join(f"v{i}.mp4 {i % 2}\n" for i in range(6)))
    command = [sys.executable, "-m", "lightning_multigrid.cli", "extract-frames", str(tmp_path / "m.csv"),
               str(tmp_path / "out"), "--workers", "2", "--no-progress"]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.Popen(command, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not list((tmp_path / "out").glob("v*/img_00001.jpg")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    time.sleep(0.5)
    try:
        os.killpg(proc.pid, 0)  # anything left of the run's process group?
        left = True
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        left = False
    assert not left, "worker processes outlived the interrupted run"
    assert proc.returncode != 0
    assert len(list((tmp_path / "out").glob(f"v*/{DONE_FILE}"))) < 6
