"""The device decoder's JPEG library: torchcodec when it loads, torchvision otherwise, same pixels."""

from __future__ import annotations

import io
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.utils._python_dispatch
from PIL import Image, ImageOps

from lightning_multigrid.data.clip_params import ClipRequest
from lightning_multigrid.data.dataset import TrainVideoDataset
from lightning_multigrid.data.decoding import device as device_decode
from lightning_multigrid.data.decoding.device import decode_clips, decode_jpegs, jpeg_decoder
from lightning_multigrid.data.decoding.frames import EncodedClip
from lightning_multigrid.data.reader_settings import ReaderSettings

from conftest import FrameFactory

torchcodec_loads = True
try:
    import torchcodec.decoders  # noqa: F401
except Exception:  # a torchcodec built for another torch fails with OSError or RuntimeError
    torchcodec_loads = False


@pytest.fixture
def fresh_decoder() -> Iterator[None]:
    """The decoder is chosen once per process: choose it again in this test, and after it."""
    device_decode._decoder.cache_clear()
    yield
    device_decode._decoder.cache_clear()


def hide_torchcodec(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a machine without torchcodec (``None`` in sys.modules makes its import fail); undone after the test."""
    for name in [n for n in sys.modules if n == "torchcodec" or n.startswith("torchcodec.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torchcodec", None)
    device_decode._decoder.cache_clear()


def jpeg_bytes(seed: int, quality: int) -> torch.Tensor:
    image = (np.random.default_rng(seed).random((48, 64, 3)) * 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "JPEG", quality=quality)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def encoded_clips(tmp_path: Path, frames: FrameFactory) -> list[EncodedClip]:
    for i in range(2):
        frames.smooth(f"v{i}", num_frames=12, width=160, height=120, seed=i)
    (tmp_path / "m.txt").write_text("v0 0\nv1 1\n")
    dataset = TrainVideoDataset(tmp_path / "m.txt", ReaderSettings(frame_decode="device"))
    return [dataset[ClipRequest(i % 2, 8, 56, (1.0, 1.5), (60, 75), seed=i)]["video"] for i in range(4)]


def test_decodes_like_pillow(fresh_decoder: None) -> None:
    data = [jpeg_bytes(seed, quality) for seed, quality in enumerate((75, 90, 95))]
    for image, jpeg in zip(decode_jpegs(data, "cpu"), data):
        expected = np.asarray(Image.open(io.BytesIO(jpeg.numpy().tobytes())).convert("RGB"))
        assert image.dtype == torch.uint8 and image.shape == (3, 48, 64)
        assert torch.equal(image, torch.from_numpy(expected.copy()).permute(2, 0, 1))


def test_a_large_cpu_batch_is_decoded_by_several_threads_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    data = [jpeg_bytes(seed, 90) for seed in range(96)]
    monkeypatch.setattr(device_decode, "CPU_DECODE_THREADS", 1)
    one_thread = decode_jpegs(data, "cpu")
    monkeypatch.setattr(device_decode, "CPU_DECODE_THREADS", 3)
    threads: set[str] = set()
    decode = device_decode._decoder()[1]

    def recording(files: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        import threading

        threads.add(threading.current_thread().name)
        return decode(files, device)

    monkeypatch.setattr(device_decode, "_decoder", lambda: ("recording", recording))
    split = decode_jpegs(data, "cpu")
    assert threads and all(name.startswith("multigrid-jpeg") for name in threads)  # not in the calling thread
    assert len(split) == len(one_thread) and all(torch.equal(a, b) for a, b in zip(split, one_thread))


@pytest.mark.skipif(not torchcodec_loads, reason="torchcodec is not installed or does not load with this torch")
def test_torchcodec_is_used_when_it_loads(fresh_decoder: None) -> None:
    assert jpeg_decoder() == "torchcodec"


def test_torchvision_is_the_fallback_and_gives_the_same_clips(
    tmp_path: Path, frames: FrameFactory, monkeypatch: pytest.MonkeyPatch, fresh_decoder: None
) -> None:
    clips = encoded_clips(tmp_path, frames)
    default = decode_clips(clips, "cpu")  # torchcodec where it loads
    hide_torchcodec(monkeypatch)
    assert jpeg_decoder() == "torchvision"
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # torchvision 0.29's deprecation is not the user's
        fallback = decode_clips(clips, "cpu")
    assert fallback.shape == (4, 3, 8, 56, 56)
    assert torch.equal(fallback, default)


def exif_rotated_jpeg() -> tuple[torch.Tensor, np.ndarray]:
    """A 60x40 JPEG whose EXIF orientation tag (6) says: rotate 90 degrees clockwise to view; and its upright pixels."""
    image = np.zeros((40, 60, 3), dtype=np.uint8)
    image[:10, :20] = 255  # a white corner, top left as stored
    exif = Image.Exif()
    exif[0x0112] = 6
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "JPEG", quality=95, exif=exif.tobytes())
    upright = np.array(ImageOps.exif_transpose(Image.open(io.BytesIO(buffer.getvalue()))))  # PIL: the viewer's pixels
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8), upright


@pytest.mark.parametrize("library", ["torchcodec", "torchvision"])
def test_an_exif_tagged_frame_is_turned_upright_by_either_decoder(
    library: str, monkeypatch: pytest.MonkeyPatch, fresh_decoder: None
) -> None:
    if library == "torchvision":
        hide_torchcodec(monkeypatch)
    elif not torchcodec_loads:
        pytest.skip("torchcodec does not load here")
    data, upright = exif_rotated_jpeg()
    assert jpeg_decoder() == library
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        (decoded,) = decode_jpegs([data], "cpu")
    assert decoded.shape == (3, 60, 40)  # turned: 60 high, 40 wide
    assert (decoded.permute(1, 2, 0).float() - torch.from_numpy(upright).float()).abs().mean() < 2


# ---------------------------------------------------------------------------- the batched crop-resize-flip


def textured_folders(tmp_path: Path, sizes: list[tuple[int, int]]) -> Path:
    """Frame folders of mixed sizes with fine texture (camera-like detail, where resampling filters
    differ), stored as JPEG with 4:2:2 chroma, as cameras and many extracted datasets write them."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for i, (width, height) in enumerate(sizes):
        checker = ((np.arange(width) // 3 + np.arange(height)[:, None] // 3) % 2)[..., None]
        folder = tmp_path / f"t{i}"
        folder.mkdir()
        for k, frame in enumerate(FrameFactory.smooth_frames(10, width, height, seed=i)):
            textured = np.clip(frame + rng.normal(0, 25, frame.shape) * checker, 0, 255).astype(np.uint8)
            Image.fromarray(textured).save(folder / f"img_{k + 1:05d}.jpg", quality=90, subsampling=1)
    manifest = tmp_path / "textured.txt"
    manifest.write_text("".join(f"t{i} {i}\n" for i in range(len(sizes))))
    return manifest


@pytest.mark.parametrize(
    ("crop", "scales", "sizes"),
    [
        (112, (128, 160), [(212, 160), (160, 212), (340, 256)]),  # mixed aspect ratios and sizes in one batch
        (56, (64, 160), [(212, 160), (160, 212), (340, 256)]),
        (32, (36, 46), [(640, 480), (480, 640), (340, 256)]),  # shrunk 7-14x: where box filters differ most
    ],
)
def test_batched_crop_resize_matches_the_per_clip_resize(
    tmp_path: Path, crop: int, scales: tuple[int, int], sizes: list[tuple[int, int]]
) -> None:
    """The whole batch's resize against the exact antialiased resize, clip by clip.

    Tolerance: at most 1 grey level (float rounding), on average under 0.01: the batched path
    computes torch's own antialiased weights. The roi_align box filter it replaced differed by
    4.4 on average at crop 32 and 2.4 at crop 112 on these frames.
    """
    dataset = TrainVideoDataset(textured_folders(tmp_path, sizes), ReaderSettings(frame_decode="device"))
    # Strides past the 10 frames' end: clips repeat their last frames (decoded once, placed twice).
    clips = [dataset[ClipRequest(i % 3, 8, crop, (1.0, 2.0), scales, seed=i)]["video"] for i in range(9)]
    assert {c.params.flip for c in clips} == {False, True}
    assert any(len(c.jpegs) < len(c.order) for c in clips)
    images = decode_jpegs([torch.frombuffer(jpeg, dtype=torch.uint8) for c in clips for jpeg in c.jpegs], "cpu")
    batched = device_decode.crop_resize_flip(images, clips)
    reference = device_decode.crop_resize_flip_per_clip(images, clips)
    assert batched.shape == reference.shape == (9, 3, 8, crop, crop) and batched.dtype == torch.uint8
    difference = (batched.float() - reference.float()).abs()
    assert difference.max() <= 1, difference.max()
    assert difference.mean() <= 0.01, difference.mean()
    assert torch.equal(decode_clips(clips, "cpu"), batched)  # what decoding uses


def random_clips(
    num_clips: int, num_frames: int, crop: int, scales: tuple[int, int], sizes: list[tuple[int, int]], seed: int = 0
) -> tuple[list[torch.Tensor], list[EncodedClip]]:
    """Decoded frames (random texture, sizes cycling over ``sizes`` as (width, height)) and clips drawn as
    training draws them: short side in ``scales``, any crop corner, flips; some clips repeat a frame."""
    from lightning_multigrid.data.clip_params import ClipParams

    rng = np.random.default_rng(seed)
    images, clips = [], []
    for i in range(num_clips):
        width, height = sizes[i % len(sizes)]
        short = int(rng.integers(scales[0], scales[1] + 1))
        resize_w, resize_h = (round(width * short / height), short) if width >= height else (short, round(height * short / width))
        distinct = num_frames - int(rng.integers(0, 2))  # a clip past its video's end repeats its last frame
        order = tuple(min(k, distinct - 1) for k in range(num_frames))
        params = ClipParams(
            order, resize_w, resize_h, int(rng.integers(0, resize_w - crop + 1)), int(rng.integers(0, resize_h - crop + 1)),
            crop, bool(rng.integers(0, 2)),
        )
        images.extend(torch.from_numpy(rng.integers(0, 256, (3, height, width), dtype=np.uint8)) for _ in range(distinct))
        clips.append(EncodedClip([bytearray() for _ in range(distinct)], order, params))
    return images, clips


@pytest.mark.parametrize("chunk_bytes", [1, 1 << 40])  # clip by clip / the whole batch at once (as on a GPU)
@pytest.mark.parametrize(
    ("crop", "scales", "sizes"),
    [
        (56, (60, 90), [(106, 80), (80, 106), (212, 160)]),  # upscaled and shrunk
        (8, (8, 12), [(30, 12), (24, 12)]),  # frames shorter than a band: rows and columns read bands of different lengths
    ],
)
def test_a_large_batch_of_mixed_sizes_matches_the_per_clip_resize(
    monkeypatch: pytest.MonkeyPatch, chunk_bytes: int, crop: int, scales: tuple[int, int], sizes: list[tuple[int, int]]
) -> None:
    """A coarse-grid-like batch (48 clips, three frame sizes, flips, repeated frames) against the
    reference, resized in CPU chunks of one clip and in one piece."""
    monkeypatch.setattr(device_decode, "CPU_CHUNK_BYTES", chunk_bytes)
    images, clips = random_clips(48, 4, crop, scales, sizes)
    batched = device_decode.crop_resize_flip(images, clips)
    reference = device_decode.crop_resize_flip_per_clip(images, clips)
    assert batched.shape == reference.shape == (48, 3, 4, crop, crop)
    difference = (batched.float() - reference.float()).abs()
    assert difference.max() <= 1 and difference.mean() <= 0.01, (difference.max(), difference.mean())


class OpCounter(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the aten operations run inside it (each a kernel launch on a GPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.count += 1
        return func(*args, **(kwargs or {}))


def count_ops(function: Callable[[], object]) -> int:
    with OpCounter() as counter:
        function()
    return counter.count


def test_the_batch_is_resized_in_a_fixed_number_of_operations(monkeypatch: pytest.MonkeyPatch) -> None:
    """The resize weights of a whole batch, and (on one piece, as on a GPU) the whole crop-resize-flip,
    take as many tensor operations for 4 clips as for 64: nothing runs per clip or per frame."""
    monkeypatch.setattr(device_decode, "CPU_CHUNK_BYTES", 1 << 40)
    counts = {}
    for num_clips in (4, 64):
        images, clips = random_clips(num_clips, 4, 32, (36, 48), [(64, 48)], seed=num_clips)
        table = torch.tensor([(48, 64, c.params.resize_height, c.params.resize_width, c.params.crop_y, c.params.crop_x,
                               int(c.params.flip)) for c in clips], dtype=torch.float64)
        weights = count_ops(lambda: device_decode.band_resize_weights(table[:, 1], table[:, 3], table[:, 5], 32, 20, table[:, 6] > 0))  # noqa: B023
        whole = count_ops(lambda: device_decode.crop_resize_flip(images, clips))  # noqa: B023
        counts[num_clips] = (weights, whole)
        reference = count_ops(lambda: device_decode.crop_resize_flip_per_clip(images, clips))  # noqa: B023
    assert counts[4] == counts[64], counts
    assert counts[64][1] * 4 < reference, (counts, reference)  # the reference's grow with the clips


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_batched_resize_on_the_gpu_matches_the_per_clip_resize() -> None:
    """On CUDA the whole batch goes in one piece (no CPU chunks): a coarsest-like batch of mixed sizes."""
    images, clips = random_clips(128, 4, 56, (64, 80), [(212, 160), (106, 80), (160, 212)])
    images = [image.cuda() for image in images]
    batched = device_decode.crop_resize_flip(images, clips)
    reference = device_decode.crop_resize_flip_per_clip(images, clips)
    assert batched.device.type == "cuda" and batched.shape == reference.shape == (128, 3, 4, 56, 56)
    difference = (batched.float() - reference.float()).abs()
    assert difference.max() <= 1 and difference.mean() <= 0.01, (difference.max(), difference.mean())
