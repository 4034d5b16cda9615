"""A synthetic video dataset that needs both motion and spatial detail: the project's demo data.

Each video shows one textured square moving across a noisy background. The class is the pair
(texture, direction): a fine **checkerboard** or fine **stripes** (same mean colour, so they blur
to the same thing at coarse scales), moving **left, right, up or down** (so one frame is not
enough). A model trained only on coarse grids cannot separate the textures; one trained only on
single frames cannot separate the directions. Appearance is random per video: background colour
and noise, object colours, size, position and speed.

Classes (``num_classes`` takes the first ones; 4 or more need both cues)::

    0 checker_left   1 stripes_left   2 checker_right   3 stripes_right
    4 checker_up     5 stripes_up     6 checker_down    7 stripes_down

Turn horizontal flipping off when training on it: flipping swaps left and right.

Files are real H.264 mp4 (libx264, yuv420p) in ``root/<split>/<class>/<n>.mp4``, with Kinetics
format manifests ``root/train.csv`` and ``root/val.csv`` (``path label``), ``root/classnames.txt`` and
the generator's settings in ``root/synthetic.json``.

Example::

    data = generate_synthetic_dataset("/tmp/synthetic", num_train=240, num_val=60)
    dataset = TrainVideoDataset(data.train_manifest, class_names=data.class_names_file, flip=False)
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Literal

import av
import numpy as np

from lightning_multigrid._checks import check_int
from lightning_multigrid.data.tools.processes import map_in_processes

__all__ = [
    "SYNTHETIC_CLASS_NAMES",
    "SyntheticDataset",
    "SyntheticData",
    "ensure_synthetic_dataset",
    "generate_synthetic_dataset",
    "render_synthetic_video",
    "synthetic_digest",
    "synthetic_files",
    "write_video",
]

SYNTHETIC_CLASS_NAMES: tuple[str, ...] = (
    "checker_left",
    "stripes_left",
    "checker_right",
    "stripes_right",
    "checker_up",
    "stripes_up",
    "checker_down",
    "stripes_down",
)
# (dx, dy) per direction, in the order of SYNTHETIC_CLASS_NAMES // 2.
_DIRECTIONS = ((-1, 0), (1, 0), (0, -1), (0, 1))


@dataclass(frozen=True, slots=True)
class SyntheticDataset:
    """Where :func:`generate_synthetic_dataset` wrote the dataset.

    Attributes:
        root: the dataset directory (manifest paths are relative to it).
        train_manifest: ``root/train.csv``.
        val_manifest: ``root/val.csv``.
        class_names_file: ``root/classnames.txt``.
        class_names: the class names, index order.
        num_train: training videos.
        num_val: validation videos.
    """

    root: Path
    train_manifest: Path
    val_manifest: Path
    class_names_file: Path
    class_names: tuple[str, ...]
    num_train: int
    num_val: int

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


def synthetic_files(root: str | os.PathLike[str]) -> tuple[str, str, str]:
    """The train manifest, val manifest and class-names file of a synthetic dataset in ``root``."""
    base = Path(root)
    return str(base / "train.csv"), str(base / "val.csv"), str(base / "classnames.txt")


def ensure_synthetic_dataset(
    root: str | os.PathLike[str], num_train: int, num_val: int, seed: int = 0, texture_cell: int | None = None
) -> None:
    """Generate the synthetic dataset into ``root`` unless a complete one with these settings is there,
    saying so on stderr (a line before, one with the seconds after).

    The generator writes the manifests last, so their presence means a complete dataset; it also
    records its settings in ``root/synthetic.json``, and a dataset written with other settings (or
    by a version that did not record them) is written again.
    """
    wanted = _settings(num_train, num_val, seed, texture_cell)
    record = Path(root) / _SETTINGS_FILE
    if all(Path(path).is_file() for path in synthetic_files(root)) and record.is_file():
        try:
            if json.loads(record.read_text(encoding="utf-8")) == wanted:
                return
        except ValueError:
            pass  # a damaged record: write the dataset again
    started = _progress(f"writing {num_train + num_val} synthetic videos to {root} ...")
    generate_synthetic_dataset(root, num_train=num_train, num_val=num_val, seed=seed, texture_cell=texture_cell)
    _progress(f"wrote {num_train + num_val} synthetic videos in {time.perf_counter() - started:.1f} s")


def synthetic_store_files(root: str | os.PathLike[str], level: int) -> tuple[str, str]:
    """The train and val frame stores of a synthetic dataset in ``root``, packed with level 0 at ``level`` px."""
    base = Path(root)
    return str(base / f"train-L{level}.store"), str(base / f"val-L{level}.store")


def ensure_synthetic_stores(
    root: str | os.PathLike[str],
    crop_size: int,
    jitter_scales: tuple[int, int] | None = None,
    workers: int | None = None,
) -> tuple[str, str]:
    """Pack the synthetic videos of ``root`` into train and val frame stores for a base crop (``pack-frames``),
    unless stores packed from these videos are there; returns their folders (:func:`synthetic_store_files`:
    where ``SyntheticData(format="store")`` looks for them).

    A store is judged by content, not by file times (a copy made with ``cp -r`` reorders those): it
    records what it was packed from (:func:`synthetic_digest`, the manifest's and the generator's
    settings' bytes), and a store that records another digest, or none, is packed again. A store that
    is complete and current is used as it is, also on a read-only disk (nothing is written). Packing
    is said on stderr (a line before, one with the seconds after). ``workers``: packing processes
    (default the CPU count).
    """
    from lightning_multigrid.data.sources import load_manifest
    from lightning_multigrid.data.store.format import packing_lock, store_digest
    from lightning_multigrid.data.tools.pack import pack_frames, store_levels

    train, val, names = synthetic_files(root)
    stores = synthetic_store_files(root, store_levels(crop_size, jitter_scales)[0])
    started: float | None = None
    for manifest, store in zip((train, val), stores):
        digest = synthetic_digest(root, manifest)
        if store_digest(store) == digest:
            continue  # current: no lock taken, nothing written (a read-only copy works)
        # Checked again holding the packing lock: a run started beside this one finds the store it packed.
        with packing_lock(store):
            if store_digest(store) == digest:
                continue
            if started is None:
                started = _progress(
                    f"packing the synthetic videos of {root} into frame stores for crop {crop_size} ..."
                )
            pack_frames(load_manifest(manifest, class_names=names), store, crop_size=crop_size,
                        jitter_scales=jitter_scales, workers=workers, progress=False, source_digest=digest)
    if started is not None:
        _progress(f"packed the frame stores in {time.perf_counter() - started:.1f} s")
    return stores


def synthetic_digest(root: str | os.PathLike[str], manifest: str | os.PathLike[str]) -> str:
    """What a synthetic split's videos are, as a SHA-256 (hex) of its manifest's bytes and of the generator's
    settings record (``synthetic.json``): the manifest alone is the same for every seed."""
    digest = hashlib.sha256(Path(manifest).read_bytes())
    record = Path(root) / _SETTINGS_FILE
    digest.update(b"\0" + (record.read_bytes() if record.is_file() else b""))
    return digest.hexdigest()


def _progress(line: str) -> float:
    """Say on stderr what a first use of the dataset is doing (minutes on few cores); returns the time now."""
    print(line, file=sys.stderr, flush=True)
    return time.perf_counter()


@dataclass(frozen=True, slots=True)
class SyntheticData:
    """The built-in synthetic dataset, as the DataModule's ``synthetic`` argument: its files stand in
    for the manifests. Checks itself on construction.

    Args:
        path: generate the dataset here on first use (when it holds no ``train.csv``/``val.csv``
            yet) and use it.
        size: ``(train, val)`` videos to generate.
        texture_cell: the checkerboard's cell in pixels (``None``: 6 px, fine detail that the
            coarsest grids blur away; 12 px stays visible on every grid).
        format: ``"mp4"`` trains on the videos; ``"store"`` on them packed once (in
            ``prepare_data``) into frame stores for the run's crop (``pack-frames``), the faster
            path on few CPU cores (docs/data.md).

    Raises:
        ValueError: naming the field (``synthetic.size``, ...), its constraint and its value.
    """

    path: str
    size: tuple[int, int] = (240, 60)
    texture_cell: int | None = None
    format: Literal["mp4", "store"] = "mp4"

    def __post_init__(self) -> None:
        if not isinstance(self.path, (str, os.PathLike)):
            raise ValueError(f"`synthetic.path` must be a folder, got {self.path!r}.")
        size = tuple(self.size)
        if len(size) != 2 or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in size):
            raise ValueError(f"`synthetic.size` must be (train, val) video counts >= 1, got {self.size!r}.")
        object.__setattr__(self, "size", (size[0], size[1]))
        check_texture_cell("synthetic.texture_cell", self.texture_cell)
        if self.format not in ("mp4", "store"):
            raise ValueError(f"`synthetic.format` must be 'mp4' or 'store', got {self.format!r}.")

    def manifests(self, crop_size: int, jitter_scales: tuple[int, int] | None) -> tuple[str, str, str | None]:
        """The ``(train, val, class names)`` files for a base crop; a store holds its own class names (``None``)."""
        from lightning_multigrid.data.tools.pack import store_levels

        train, val, names = synthetic_files(self.path)
        if self.format == "mp4":
            return train, val, names
        return *synthetic_store_files(self.path, store_levels(crop_size, jitter_scales)[0]), None

    def prepare(self, seed: int, crop_size: int, jitter_scales: tuple[int, int] | None) -> None:
        """Generate the videos unless there (:func:`ensure_synthetic_dataset`), and pack them for ``"store"``."""
        ensure_synthetic_dataset(self.path, num_train=self.size[0], num_val=self.size[1], seed=seed,
                                 texture_cell=self.texture_cell)
        if self.format == "store":
            ensure_synthetic_stores(self.path, crop_size, jitter_scales)


_SETTINGS_FILE = "synthetic.json"


def _settings(num_train: int, num_val: int, seed: int, texture_cell: int | None, **others: object) -> dict[str, object]:
    """What ``synthetic.json`` records: the generator's arguments that change the videos."""
    defaults = {"num_classes": 4, "width": 160, "height": 120, "num_frames": 50, "fps": 25.0}
    return {
        "num_train": num_train, "num_val": num_val, "seed": seed, "texture_cell": texture_cell, **defaults, **others
    }


def write_video(
    path: str | os.PathLike[str],
    frames: Iterable[np.ndarray],
    fps: float = 25,
    crf: int = 18,
    preset: str = "veryfast",
    timestamps: Sequence[float] | None = None,
    gop_size: int | None = None,
) -> None:
    """Encode RGB frames to an H.264 mp4 (libx264, yuv420p).

    Args:
        path: the output file.
        frames: uint8 arrays ``(H, W, 3)``, RGB, even ``H`` and ``W``.
        fps: frame rate (of a constant-rate video; the nominal rate with ``timestamps``).
        crf: x264 quality, lower is better (18 keeps 2-pixel textures).
        preset: x264 speed preset.
        timestamps: presentation time of each frame in seconds, increasing, for a
            variable-frame-rate video; default ``i / fps``.
        gop_size: frames between keyframes (x264's default is 250).

    Raises:
        ValueError: on odd frame sizes or a frame of another size than the first.
    """
    container = av.open(str(path), "w")
    try:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001))
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": str(crf), "preset": preset}
        if gop_size is not None:
            stream.codec_context.gop_size = gop_size
        if timestamps is not None:
            time_base = Fraction(1, 1000)
            stream.codec_context.time_base = time_base
            stream.time_base = time_base
        size: tuple[int, int] | None = None
        for i, image in enumerate(frames):
            if size is None:
                height, width = image.shape[:2]
                if height % 2 or width % 2:
                    raise ValueError(f"H.264 yuv420p needs even frame sizes, got {width}x{height}.")
                size = (height, width)
                stream.width, stream.height = width, height
            elif image.shape[:2] != size:
                raise ValueError(f"Frame {i} is {image.shape[1]}x{image.shape[0]}, the first was {size[1]}x{size[0]}.")
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            if timestamps is not None:
                frame.pts = round(timestamps[i] * 1000)
                frame.time_base = Fraction(1, 1000)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    finally:
        container.close()


def render_synthetic_video(
    label: int,
    width: int,
    height: int,
    num_frames: int,
    rng: np.random.Generator,
    texture_cell: int | None = None,
) -> np.ndarray:
    """Frames of one synthetic video of class ``label``, uint8 ``(T, H, W, 3)`` RGB.

    ``texture_cell`` is the checkerboard's cell in pixels (stripes are 3/4 of it); default
    1/20 of the short side.
    """
    texture, direction = label % 2, label // 2
    dx, dy = _DIRECTIONS[direction]
    short = min(width, height)

    background = rng.integers(0, 256, 3).astype(np.float32)
    noise = rng.normal(0.0, 12.0, (height, width, 1)).astype(np.float32)
    canvas = np.clip(background + noise, 0, 255).astype(np.uint8)

    size = int(rng.integers(round(0.4 * short), round(0.55 * short) + 1))
    # Both textures have the same mean and the same dominant spatial frequency (a checker of
    # cell c repeats every c * sqrt(2) along its diagonals; stripes of 3/4 c every 1.5 c), about
    # 8.5 px at 120 px: sharp after the base grid's resize (>= 0.6x, 5 px or more), near the
    # sampling limit after the coarsest grids' (about 0.3x, 2.5 px). Finer patterns (and smaller
    # objects) made the demo's tiny CNN learn too slowly to show anything in a few CPU minutes.
    cell = texture_cell or max(2, round(short / 20))
    yy, xx = np.mgrid[0:size, 0:size]
    if texture == 0:
        pattern = ((yy // cell + xx // cell) % 2).astype(bool)
    else:
        pattern = ((yy // max(2, round(0.75 * cell))) % 2).astype(bool)
    # Two colours of equal mean luminance offset, far from the background on average.
    base = rng.integers(60, 196, 3).astype(np.int32)
    contrast = int(rng.integers(50, 70))
    light = np.clip(base + contrast, 0, 255).astype(np.uint8)
    dark = np.clip(base - contrast, 0, 255).astype(np.uint8)
    patch = np.where(pattern[..., None], light, dark)

    # Speed so the whole path stays inside the frame; start where it fits.
    travel = (width if dx else height) - size
    speed = float(rng.uniform(0.5, 1.0)) * travel / max(num_frames - 1, 1)
    path = speed * (num_frames - 1)
    along = float(rng.uniform(0, travel - path))
    across = int(rng.integers(0, (height if dx else width) - size + 1))
    forward = dx + dy > 0

    video = np.empty((num_frames, height, width, 3), dtype=np.uint8)
    for t in range(num_frames):
        offset = along + (speed * t if forward else path - speed * t)
        position = int(round(offset))
        x, y = (position, across) if dx else (across, position)
        video[t] = canvas
        video[t, y : y + size, x : x + size] = patch
    return video


def generate_synthetic_dataset(
    root: str | os.PathLike[str],
    num_train: int = 240,
    num_val: int = 60,
    num_classes: int = 4,
    width: int = 160,
    height: int = 120,
    num_frames: int = 50,
    fps: float = 25,
    seed: int = 0,
    workers: int | None = None,
    texture_cell: int | None = None,
) -> SyntheticDataset:
    """Write a synthetic dataset of H.264 videos with Kinetics-format manifests.

    Videos are balanced over classes (video ``i`` has class ``i % num_classes``) and the same for
    a given ``seed`` whatever ``workers`` is.

    Args:
        root: output directory (created; existing files are overwritten).
        num_train: training videos.
        num_val: validation videos.
        num_classes: classes, 2 to 8 (see the module docstring; 4 or more need motion and texture).
        width: frame width in pixels, even, at least 32.
        height: frame height in pixels, even, at least 32.
        num_frames: frames per video.
        fps: frames per second.
        seed: seed of every random choice.
        workers: encoding processes; default the CPU count (1 for a few videos).
        texture_cell: checkerboard cell in pixels, at least 2; default 1/20 of the short side,
            which the coarsest multigrid shapes blur away (so they cannot solve the task alone).
            Twice that stays visible on every grid, as most of a natural video's content does.

    Raises:
        ValueError: on out-of-range arguments.
    """
    _check_arguments(
        num_train=num_train, num_val=num_val, num_classes=num_classes, width=width, height=height,
        num_frames=num_frames, fps=fps, workers=workers, texture_cell=texture_cell,
    )

    base = Path(root)
    (base / _SETTINGS_FILE).unlink(missing_ok=True)  # until the new dataset is complete
    names = SYNTHETIC_CLASS_NAMES[:num_classes]
    jobs: list[tuple[str, int, int, int, int, float, int | None, list[int]]] = []
    manifests: dict[str, list[str]] = {"train": [], "val": []}
    for split_id, (split, count) in enumerate((("train", num_train), ("val", num_val))):
        for i in range(count):
            label = i % num_classes
            relative = f"{split}/{names[label]}/{i:05d}.mp4"
            (base / split / names[label]).mkdir(parents=True, exist_ok=True)
            manifests[split].append(f"{relative} {label}\n")
            entropy = [seed, split_id, i]
            jobs.append((str(base / relative), label, width, height, num_frames, fps, texture_cell, entropy))

    _write_all(jobs, workers)

    base.mkdir(parents=True, exist_ok=True)
    (base / "train.csv").write_text("".join(manifests["train"]), encoding="utf-8")
    (base / "val.csv").write_text("".join(manifests["val"]), encoding="utf-8")
    (base / "classnames.txt").write_text("".join(f"{n}\n" for n in names), encoding="utf-8")
    settings = _settings(
        num_train, num_val, seed, texture_cell, num_classes=num_classes, width=width, height=height,
        num_frames=num_frames, fps=float(fps),
    )
    (base / _SETTINGS_FILE).write_text(json.dumps(settings, indent=1) + "\n", encoding="utf-8")
    return SyntheticDataset(
        root=base,
        train_manifest=base / "train.csv",
        val_manifest=base / "val.csv",
        class_names_file=base / "classnames.txt",
        class_names=names,
        num_train=num_train,
        num_val=num_val,
    )


def _check_arguments(
    *,
    num_train: int,
    num_val: int,
    num_classes: int,
    width: int,
    height: int,
    num_frames: int,
    fps: float,
    workers: int | None,
    texture_cell: int | None,
) -> None:
    """Raise ``ValueError`` on an argument of :func:`generate_synthetic_dataset` out of range."""
    for name, value, low in (("num_train", num_train, 1), ("num_val", num_val, 0), ("num_frames", num_frames, 2)):
        check_int(name, value, low)
    if not 2 <= num_classes <= len(SYNTHETIC_CLASS_NAMES):
        raise ValueError(f"`num_classes` must be in [2, {len(SYNTHETIC_CLASS_NAMES)}], got {num_classes!r}.")
    for name, value in (("width", width), ("height", height)):
        if value < 32 or value % 2:
            raise ValueError(f"`{name}` must be an even number of pixels >= 32 (H.264 yuv420p), got {value!r}.")
    if not fps > 0:
        raise ValueError(f"`fps` must be > 0, got {fps!r}.")
    if workers is not None and workers < 1:
        raise ValueError(f"`workers` must be >= 1, got {workers!r}.")
    check_texture_cell("texture_cell", texture_cell, width, height)


def check_texture_cell(name: str, texture_cell: int | None, width: int = 160, height: int = 120) -> None:
    """Raise ``ValueError`` unless ``texture_cell`` is ``None`` or 2 to a quarter of the short side
    (default: the built-in dataset's 160x120 videos)."""
    if texture_cell is not None and not 2 <= texture_cell <= min(width, height) // 4:
        raise ValueError(
            f"`{name}` must be between 2 and a quarter of the short side ({min(width, height) // 4}) "
            f"pixels, got {texture_cell!r}."
        )


def _write_all(jobs: list[tuple[str, int, int, int, int, float, int | None, list[int]]], workers: int | None) -> None:
    """Encode the videos of ``jobs``, in a process pool unless there are only a few."""
    for _ in map_in_processes(_write_one, jobs, 1 if len(jobs) < 8 else workers, chunksize=None):
        pass


def _write_one(job: tuple[str, int, int, int, int, float, int | None, list[int]]) -> None:
    path, label, width, height, num_frames, fps, texture_cell, entropy = job
    rng = np.random.default_rng(np.random.SeedSequence(entropy))
    write_video(path, render_synthetic_video(label, width, height, num_frames, rng, texture_cell), fps=fps)
