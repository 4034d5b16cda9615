"""The CPU JPEG decode (data/decoding/jpeg.py): simplejpeg against Pillow, the path it replaced.

The reference is Pillow as the workers used it before: ``Image.draft`` (libjpeg's DCT scaling) to
the clip's resize target, then each frame's crop box resized with ``BILINEAR``. Measured on real
JPEGs (camera-like noise and smooth gradients, quality 90, 4 sizes, 60 clips each, every DCT scale):
the decoded frames are identical at every scale; after the resize and crop, pixels differ by at
most 2 grey levels, 0.23 on average at worst (torch's antialiased uint8 resize of the whole clip
against Pillow's per-frame box resize).
"""

from __future__ import annotations

import io
import random
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
import torch
import torch.nn.functional as F
from PIL import Image

from lightning_multigrid.data.clip_params import ClipParams, ClipRequest, resized_size, sample_clip_params
from lightning_multigrid.data.decoding.errors import VideoDecodeError
from lightning_multigrid.data.decoding.frames import open_frame_folder, read_clip
from lightning_multigrid.data.decoding.jpeg import JpegFrameError, dct_scale, decode_clip_crops, has_exif, resize_crop
from lightning_multigrid.data.manifests.entries import VideoEntry
from lightning_multigrid.data.sources import load_manifest
from lightning_multigrid.data.store.reader import PackedFrameReader
from lightning_multigrid.data.tools.pack import pack_frames

from conftest import FrameFactory

MAX_DIFFERENCE = 2  # grey levels, any pixel
MEAN_DIFFERENCE = 0.25  # grey levels, per clip


def pillow_crop(jpeg: bytes, params: ClipParams) -> np.ndarray:
    """The Pillow path: reduced-size decode (``draft``), then the crop box resized (``BILINEAR``)."""
    with Image.open(io.BytesIO(jpeg)) as image:
        image.draft("RGB", (params.resize_width, params.resize_height))
        scale_x, scale_y = image.width / params.resize_width, image.height / params.resize_height
        x, y, crop = params.crop_x, params.crop_y, params.crop_size
        box = (x * scale_x, y * scale_y, (x + crop) * scale_x, (y + crop) * scale_y)
        return np.asarray(image.convert("RGB").resize((crop, crop), Image.Resampling.BILINEAR, box=box))


def encode(frame: np.ndarray | Image.Image, quality: int = 90, **options: object) -> bytes:
    buffer = io.BytesIO()
    image = frame if isinstance(frame, Image.Image) else Image.fromarray(frame)
    image.save(buffer, "JPEG", quality=quality, **options)
    return buffer.getvalue()


def noisy_frames(width: int, height: int, count: int, seed: int = 0) -> list[np.ndarray]:
    """Blocky noise over a gradient: JPEG's hard case (much entropy-coded detail)."""
    rng = np.random.default_rng(seed)
    base = np.kron(rng.normal(0, 1, (height // 4 + 1, width // 4 + 1, 3)), np.ones((4, 4, 1)))[:height, :width]
    ramp = np.linspace(40, 200, width)[None, :, None]
    return [(ramp + 40 * base + 3 * t).clip(0, 255).astype(np.uint8) for t in range(count)]


def random_params(width: int, height: int, rng: random.Random) -> ClipParams:
    crop = rng.choice([8, 16, 40]) if min(width, height) < 100 else rng.choice([24, 56, 112])
    short = rng.randint(crop, min(width, height) * 5 // 4)  # down to 1/8 scale, and some upscaling
    resize_width, resize_height = resized_size(width, height, short)
    return ClipParams((0,), resize_width, resize_height, rng.randint(0, resize_width - crop),
                      rng.randint(0, resize_height - crop), crop)


@pytest.mark.parametrize("width,height", [(213, 160), (340, 256), (160, 213), (64, 48)])
def test_same_pixels_as_the_pillow_path_within_resampling(width: int, height: int) -> None:
    rng = random.Random(width)
    for kind, frames in (("noisy", noisy_frames(width, height, 3)),
                         ("smooth", FrameFactory.smooth_frames(3, width, height))):
        jpegs = [encode(f) for f in frames]
        scales = set()
        for _ in range(30):
            params = random_params(width, height, rng)
            scales.add(dct_scale(width, height, params.resize_width, params.resize_height))
            got = decode_clip_crops(jpegs, params, width, height).astype(int)
            expected = np.stack([pillow_crop(j, params) for j in jpegs]).astype(int)
            assert got.shape == expected.shape == (3, params.crop_size, params.crop_size, 3)
            difference = np.abs(got - expected)
            assert difference.max() <= MAX_DIFFERENCE, (kind, params)
            assert difference.mean() <= MEAN_DIFFERENCE, (kind, params)
        assert {1, 2} <= scales  # full and reduced-size decodes both compared


@pytest.mark.parametrize("scale", [1, 2, 4, 8])
def test_decoded_frames_are_pillows_at_every_dct_scale(scale: int) -> None:
    """Same library, same settings: the reduced-size decode itself is identical, only the resize differs."""
    width, height = 213, 160
    jpeg = encode(noisy_frames(width, height, 1)[0])
    target = (width // scale, height // scale)
    assert dct_scale(width, height, *target) == scale
    with Image.open(io.BytesIO(jpeg)) as image:
        image.draft("RGB", target)
        expected = np.asarray(image.convert("RGB"))
    got = simplejpeg.decode_jpeg(jpeg, "RGB", min_height=-(-height // scale), min_width=-(-width // scale))
    assert got.shape == expected.shape == (-(-height // scale), -(-width // scale), 3)
    assert np.array_equal(got, expected)


def test_dct_scale_is_pillows_draft_rule() -> None:
    # min(width // target_width, height // target_height), rounded down to 1, 2, 4 or 8.
    assert dct_scale(213, 160, 213, 160) == 1
    assert dct_scale(213, 160, 107, 80) == 1  # 213 // 107 = 1: the 1/2 scale would be 107 wide only by rounding up
    assert dct_scale(213, 160, 106, 80) == 2
    assert dct_scale(340, 256, 85, 64) == 4
    assert dct_scale(340, 256, 42, 32) == 8
    assert dct_scale(340, 256, 20, 15) == 8  # 1/8 is libjpeg's smallest
    assert dct_scale(64, 48, 100, 75) == 1  # upscaling


def test_frames_simplejpeg_does_not_decode_as_pillow_are_pillows_exactly() -> None:
    """CMYK (the two convert to RGB differently) and a JPEG simplejpeg refuses but Pillow decodes
    (extraneous bytes before a marker) come out as the Pillow path's pixels, to the bit."""
    frame = noisy_frames(64, 48, 1)[0]
    cmyk = encode(Image.fromarray(frame).convert("CMYK"))
    plain = encode(frame)
    extraneous = plain[:200] + b"\x00\x00" + plain[200:]
    with pytest.raises(ValueError):
        simplejpeg.decode_jpeg(extraneous)
    assert simplejpeg.decode_jpeg_header(cmyk)[2] == "CMYK"
    params = ClipParams((0,), 64, 48, 10, 8, 32)  # no resize: the decoder's pixels themselves
    for jpeg in (cmyk, extraneous):
        assert np.array_equal(decode_clip_crops([jpeg], params, 64, 48)[0], pillow_crop(jpeg, params))


def test_a_frame_pillow_cannot_decode_is_named_by_position() -> None:
    frames = [encode(f) for f in noisy_frames(64, 48, 3)]
    truncated = frames[1][: len(frames[1]) // 2]
    params = ClipParams((0,), 64, 48, 0, 0, 32)
    with pytest.raises(JpegFrameError) as error:
        decode_clip_crops([frames[0], truncated, frames[2]], params, 64, 48)
    assert error.value.position == 1 and isinstance(error.value.error, OSError)
    assert "truncated" in str(error.value.error)  # Pillow's words, as before
    with pytest.raises(JpegFrameError) as error:
        decode_clip_crops([frames[0], encode(noisy_frames(80, 48, 1)[0])], params, 64, 48)  # another size
    assert error.value.position == 1


def test_has_exif_finds_the_segment_pillow_reads() -> None:
    frame = noisy_frames(64, 48, 1)[0]
    exif = Image.Exif()
    exif[0x0112] = 6
    tagged = encode(frame, exif=exif.tobytes())
    assert has_exif(tagged) and "exif" in Image.open(io.BytesIO(tagged)).info
    assert not has_exif(encode(frame)) and "exif" not in Image.open(io.BytesIO(encode(frame))).info


def test_an_exif_rotated_frame_is_still_refused_by_name(tmp_path: Path, frames: FrameFactory) -> None:
    folder = frames.smooth("v", num_frames=4, width=64, height=48)
    exif = Image.Exif()
    exif[0x0112] = 6
    (folder / "img_00002.jpg").write_bytes(encode(FrameFactory.smooth_frames(2, 64, 48)[1], exif=exif.tobytes()))
    video = open_frame_folder(VideoEntry(str(folder), (0,)))
    params = ClipParams((0, 1, 2, 3), 64, 48, 0, 0, 32)
    with pytest.raises(VideoDecodeError, match=r"img_00002\.jpg has EXIF orientation 6"):
        read_clip(video, params)
    exif[0x0112] = 1  # "as stored": decoded as any frame
    (folder / "img_00002.jpg").write_bytes(encode(FrameFactory.smooth_frames(2, 64, 48)[1], exif=exif.tobytes()))
    assert read_clip(video, params).shape == (3, 4, 32, 32)


def test_readers_give_the_pillow_paths_clips_from_the_same_seeds(tmp_path: Path, frames: FrameFactory) -> None:
    """Frame folders and the store (levels 160 and 113), coarse and base grids: each clip is the Pillow
    path's on the same frame bytes, within the resampling tolerance."""
    for k in range(2):
        frames.write(f"v{k}", noisy_frames(320, 240, 12, seed=k), quality=90)
    (tmp_path / "m.txt").write_text("v0 0\nv1 1\n")
    manifest = load_manifest(tmp_path / "m.txt")
    store = PackedFrameReader(pack_frames(manifest, tmp_path / "s.store", crop_size=112, levels=2, workers=1,
                                          progress=False).store)
    store_entries = load_manifest(store.store.path).entries
    for crop, scales in ((112, (128, 160)), (56, (64, 160)), (40, (40, 320))):
        for seed in range(4):
            index = seed % 2
            req = ClipRequest(index, 4, crop, (1.0, 3.0), scales, seed=seed)
            folder = open_frame_folder(manifest.entries[index])
            params = sample_clip_params(req, folder)
            expected = [pillow_crop(Path(folder.frame_path(i)).read_bytes(), params) for i in params.frame_indices]
            assert_clip_close(read_clip(folder, params), expected, params.flip)
            level = store.level_for(index, params)
            jpegs = store.store.frame_bytes(index, level, sorted(set(params.frame_indices)))
            by_frame = dict(zip(sorted(set(params.frame_indices)), jpegs))
            expected = [pillow_crop(bytes(by_frame[i]), params) for i in params.frame_indices]
            assert_clip_close(store.read(store_entries[index], params), expected, params.flip)


def assert_clip_close(clip: object, frames: list[np.ndarray], flip: bool) -> None:
    assert isinstance(clip, torch.Tensor)
    expected = np.stack(frames)[:, :, ::-1] if flip else np.stack(frames)
    difference = np.abs(clip.permute(1, 2, 3, 0).numpy().astype(int) - expected.astype(int))
    assert difference.max() <= MAX_DIFFERENCE and difference.mean() <= MEAN_DIFFERENCE


@pytest.mark.parametrize("width,height", [(64, 48), (213, 160)])
def test_the_resize_past_the_crop_left_out_gives_the_whole_frames_pixels(width: int, height: int) -> None:
    """``resize_crop`` resizes only up to the crop's far edges: the crop is the whole frame's resize, to the bit,
    also where a kept side would keep its length (torch copies such a side) and when upscaling."""
    frames = np.random.default_rng(0).integers(0, 256, (2, height, width, 3), dtype=np.uint8)
    rng = random.Random(1)
    for _ in range(200):
        params = random_params(width, height, rng)
        whole = F.interpolate(torch.from_numpy(frames).permute(0, 3, 1, 2), size=(params.resize_height, params.resize_width),
                              mode="bilinear", antialias=True)
        y, x, crop = params.crop_y, params.crop_x, params.crop_size
        expected = whole.permute(0, 2, 3, 1).numpy()[:, y : y + crop, x : x + crop]
        assert np.array_equal(resize_crop(frames, params), expected), params
