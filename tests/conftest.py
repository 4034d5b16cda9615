"""Shared fixtures: real H.264 videos written with PyAV into temporary directories.

- ``synthetic_dataset`` (session): a small synthetic dataset (16 train / 8 val videos, 4 classes,
  64x48, 24 frames at 12 fps) with ``train.csv``, ``val.csv`` and ``classnames.txt``; a
  :class:`~lightning_multigrid.data.synthetic.SyntheticDataset`. Read-only: do not write into it.
- ``videos`` (function): a :class:`VideoFactory` writing videos whose frame ``i`` is coded in its
  colour (``VideoFactory.frame_index`` reads it back), and every kind of broken file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import av
import numpy as np
import pytest
import torch

from lightning_multigrid.data.synthetic import SyntheticDataset, generate_synthetic_dataset, write_video

# The suite runs on 2 cores beside DataLoader workers and DDP processes: one intra-op thread per
# process keeps it from oversubscribing them.
torch.set_num_threads(1)

BrokenKind = Literal[
    "missing", "empty", "truncated", "random_bytes", "audio_only", "zero_frames", "no_video_track", "unknown_codec"
]
BROKEN_KINDS: tuple[BrokenKind, ...] = (
    "missing",
    "empty",
    "truncated",
    "random_bytes",
    "audio_only",
    "zero_frames",
    "no_video_track",
    "unknown_codec",
)


class VideoFactory:
    """Writes test videos into one directory.

    Frame ``i`` of :meth:`coded` is a flat colour: red ``16 + 8 * (i % 28)``, green
    ``16 + 8 * (i // 28)``, blue 128, so H.264's small errors never change the index read back.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @staticmethod
    def frame_colour(index: int) -> tuple[int, int, int]:
        return 16 + 8 * (index % 28), 16 + 8 * (index // 28), 128

    @staticmethod
    def frame_index(image: np.ndarray) -> int:
        """The index coded in a frame, from its mean colour; ``image`` is ``(H, W, 3)`` or ``(3, H, W)``."""
        pixels = image if image.shape[-1] == 3 else np.moveaxis(image, 0, -1)
        red, green = pixels[..., 0].mean(), pixels[..., 1].mean()
        return round((red - 16) / 8) + 28 * round((green - 16) / 8)

    def coded(
        self,
        name: str = "video.mp4",
        num_frames: int = 24,
        width: int = 64,
        height: int = 48,
        fps: float = 12,
        timestamps: Sequence[float] | None = None,
    ) -> Path:
        """A video whose frames carry their index; ``timestamps`` (seconds) make it variable-rate."""
        if num_frames > 28 * 28:
            raise ValueError("frame-coded test videos hold at most 784 frames")
        path = self.directory / name
        frames = (np.full((height, width, 3), self.frame_colour(i), dtype=np.uint8) for i in range(num_frames))
        write_video(path, frames, fps=fps, timestamps=timestamps)
        return path

    def broken(self, kind: BrokenKind, name: str | None = None) -> Path:
        """A bad file of one kind (``missing`` returns a path that does not exist)."""
        suffix = ".avi" if kind == "zero_frames" else ".mp4"
        path = self.directory / (name or f"{kind}{suffix}")
        if kind == "missing":
            return path
        if kind == "empty":
            path.write_bytes(b"")
        elif kind == "truncated":
            _write_truncated(path)
        elif kind == "random_bytes":
            path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
        elif kind == "audio_only":
            _write_audio_only(path)
        elif kind in ("zero_frames", "no_video_track"):
            _write_without_frames(path, kind)
        elif kind == "unknown_codec":
            # A damaged sample description: the container opens, its video stream has no decoder.
            data = self.coded(f"{path.stem}_source.mp4", num_frames=12).read_bytes()
            path.write_bytes(data.replace(b"avc1", b"zzzz"))
        else:
            raise ValueError(f"unknown kind {kind!r}")
        return path


def _write_truncated(path: Path) -> None:
    # moov at the front, so the container opens and the missing half shows only later.
    container = av.open(str(path), "w", options={"movflags": "faststart"})
    stream = container.add_stream("libx264", rate=12)
    stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
    rng = np.random.default_rng(0)
    for _ in range(24):
        image = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
        for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
            container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)
    container.close()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _write_audio_only(path: Path) -> None:
    container = av.open(str(path), "w")
    stream = container.add_stream("aac", rate=16000)
    for i in range(8):
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        frame.sample_rate, frame.pts = 16000, i * 1024
        for packet in stream.encode(frame):
            container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)
    container.close()


def _write_without_frames(path: Path, kind: BrokenKind) -> None:
    # AVI keeps a video stream with no frames; MP4 drops an empty track altogether.
    container = av.open(str(path), "w")
    stream = container.add_stream("mpeg4" if kind == "zero_frames" else "libx264", rate=12)
    stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
    container.start_encoding()
    container.close()


@pytest.fixture
def videos(tmp_path: Path) -> VideoFactory:
    """Test videos and broken files in this test's ``tmp_path``."""
    return VideoFactory(tmp_path)


@pytest.fixture(scope="session")
def synthetic_dataset(tmp_path_factory: pytest.TempPathFactory) -> SyntheticDataset:
    """A small synthetic dataset shared by the session (about a second to write)."""
    return generate_synthetic_dataset(
        tmp_path_factory.mktemp("synthetic"),
        num_train=16,
        num_val=8,
        num_classes=4,
        width=64,
        height=48,
        num_frames=24,
        fps=12,
        seed=0,
        workers=1,
    )


def run_ddp_script(args: Sequence[str], cwd: Path, timeout_s: float) -> None:
    """Run ``python *args`` as a fresh 2-process DDP launch; fail the test on error or hang.

    The script runs in its own session (rank 1 is rank 0's child), so a hang is killed with both
    ranks after ``timeout_s``. Rendezvous variables an earlier test left in this process are
    dropped, and ``cwd`` keeps the package coming from the installed distribution.
    """
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for name in ("LOCAL_RANK", "NODE_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    proc = subprocess.Popen(
        [sys.executable, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"the 2-process DDP run did not finish within {timeout_s} s (hang?):\n{output[-6000:]}")
    assert proc.returncode == 0, f"the DDP run failed (exit {proc.returncode}):\n{output[-6000:]}"


FrameBrokenKind = Literal["missing_folder", "empty_folder", "missing_frames", "random_bytes", "not_jpeg", "truncated"]
FRAME_BROKEN_KINDS: tuple[FrameBrokenKind, ...] = (
    "missing_folder",
    "empty_folder",
    "missing_frames",
    "random_bytes",
    "not_jpeg",
    "truncated",
)


class FrameFactory:
    """Writes frame datasets (a folder of real JPEG frames per video, with PIL) into one directory.

    :meth:`coded` frames carry their index in their colour, as :class:`VideoFactory`'s do
    (``VideoFactory.frame_index`` reads it back); :meth:`smooth` frames are smooth gradients
    with soft blobs, on which JPEG and resampling errors stay small.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def write(self, name: str, frames: Sequence[np.ndarray], pattern: str = "img_{:05d}.jpg", quality: int = 95) -> Path:
        from PIL import Image

        folder = self.directory / name
        folder.mkdir(parents=True, exist_ok=True)
        for i, frame in enumerate(frames):
            Image.fromarray(frame).save(folder / pattern.format(i + 1), quality=quality)
        return folder

    def coded(self, name: str = "video", num_frames: int = 24, width: int = 64, height: int = 48, **kwargs: str) -> Path:
        frames = [np.full((height, width, 3), VideoFactory.frame_colour(i), dtype=np.uint8) for i in range(num_frames)]
        return self.write(name, frames, **kwargs)  # type: ignore[arg-type]

    @staticmethod
    def smooth_frames(num_frames: int, width: int, height: int, seed: int = 0) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
        frames = []
        centres = rng.uniform(0, 1, (3, 2)) * (width, height)
        for t in range(num_frames):
            image = np.stack([xx / width * 180, yy / height * 180, (xx + yy) / (width + height) * 120 + 2 * t], -1)
            for k, (cx, cy) in enumerate(centres):
                blob = np.exp(-(((xx - cx - 2 * t) ** 2 + (yy - cy) ** 2) / (2 * (width / 8) ** 2)))
                image[..., k] += 70 * blob
            frames.append(image.clip(0, 255).astype(np.uint8))
        return frames

    def smooth(self, name: str = "smooth", num_frames: int = 16, width: int = 160, height: int = 120, seed: int = 0) -> Path:
        return self.write(name, self.smooth_frames(num_frames, width, height, seed))

    def broken(self, kind: FrameBrokenKind, name: str | None = None) -> tuple[Path, int | None]:
        """A bad frame folder of one kind and the frame count its manifest line claims."""
        folder = self.directory / (name or kind)
        if kind == "missing_folder":
            return folder, None
        if kind == "empty_folder":
            folder.mkdir(parents=True)
            return folder, None
        self.coded(folder.name, num_frames=12)
        if kind == "missing_frames":
            return folder, 24
        bad = folder / "img_00003.jpg"
        if kind == "random_bytes":
            bad.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
        elif kind == "not_jpeg":
            from PIL import Image

            Image.fromarray(np.zeros((48, 64, 3), np.uint8)).save(bad, format="PNG")
        elif kind == "truncated":
            data = bad.read_bytes()
            bad.write_bytes(data[: len(data) // 2])
        else:
            raise ValueError(f"unknown kind {kind!r}")
        return folder, 12


@pytest.fixture
def frames(tmp_path: Path) -> FrameFactory:
    """Frame folders (real JPEGs) and broken ones in this test's ``tmp_path``."""
    return FrameFactory(tmp_path)


@pytest.fixture(scope="session")
def synthetic_frames(synthetic_dataset: SyntheticDataset, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``synthetic_dataset`` extracted to a frame dataset: ``(train manifest, val manifest)``. Read-only."""
    from lightning_multigrid.data.sources import load_manifest
    from lightning_multigrid.data.tools.extract import extract_frames

    out = tmp_path_factory.mktemp("synthetic_frames")
    manifests = []
    for source in (synthetic_dataset.train_manifest, synthetic_dataset.val_manifest):
        manifest = load_manifest(source, class_names=synthetic_dataset.class_names_file)
        manifests.append(extract_frames(manifest, out, workers=1, progress=False).manifest)
    return manifests[0], manifests[1]
