"""The CPU decode of a clip's JPEG frames: libjpeg-turbo through simplejpeg, one buffer and one resize per clip.

Every reader that decodes JPEG frames in the workers (frame folders, the packed store) calls
:func:`decode_clip_crops`. Per clip:

1. the scale: libjpeg can decode at 1/2, 1/4 or 1/8 of the stored size by scaling the DCT; the
   largest of those that keeps the frame at least the clip's resize target is taken (Pillow's
   ``Image.draft`` rule, so both decoders produce frames of the same size). Other scales
   libjpeg-turbo offers (3/8, 5/8, 3/4, 7/8) were measured slower than a full decode, and are not used;
2. one uint8 ``(K, h, w, 3)`` array for the clip's K distinct frames, each decoded into its slice
   (simplejpeg's ``buffer=``): no per-frame array or image object;
3. one antialiased bilinear resize of the whole clip to the drawn size, rows and columns past the
   crop left out (torch's uint8 kernel, the arithmetic of Pillow's ``BILINEAR`` resize: Pillow
   resizing each frame's crop box gave the same pixels within 2 grey levels, 0.25 on average at
   worst, see ``tests/test_data_jpeg.py``), then the crop is a view.

simplejpeg (libjpeg-turbo called directly) decodes a frame in about half of Pillow's CPU time, with
the same library's arithmetic (identical pixels for YCbCr and greyscale JPEGs). A frame it does
not take is decoded by Pillow, exactly as before: a CMYK or YCCK JPEG (the two convert CMYK to RGB
differently), a frame of another size than the clip's, one with an EXIF segment when the caller
checks orientation, and any frame simplejpeg refuses (it also refuses some that Pillow decodes with
a warning, e.g. extraneous bytes before a marker). So a frame is refused exactly when Pillow
refuses it, with Pillow's words, and never decoded to other pixels than Pillow's.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence

import numpy as np
import simplejpeg
import torch
import torch.nn.functional as F
from PIL import Image, UnidentifiedImageError

from lightning_multigrid.data.clip_params import ClipParams

__all__ = [
    "IMAGE_ERRORS",
    "JpegFrameError",
    "dct_scale",
    "decode_clip_crops",
    "decode_frame_pillow",
    "has_exif",
    "resize_crop",
]

# What every reader of JPEG bytes catches for a file that is not an image, truncated or damaged:
# Pillow's errors, and simplejpeg's (it raises ValueError, here already).
IMAGE_ERRORS = (OSError, SyntaxError, ValueError, UnidentifiedImageError, Image.DecompressionBombError)

# Colour spaces simplejpeg decodes to the same RGB as Pillow; others (CMYK, YCCK) go to Pillow.
_SAME_AS_PILLOW = ("YCbCr", "Gray")

JpegBytes = bytes | bytearray | memoryview
# Called with the opened image and the frame's position when a frame goes through Pillow: raises to refuse it.
FrameCheck = Callable[[Image.Image, int], None]


class JpegFrameError(Exception):
    """Frame ``position`` of a clip does not decode; ``error`` is Pillow's (the words every mode reports)."""

    def __init__(self, position: int, error: BaseException) -> None:
        super().__init__(position, error)
        self.position = position
        self.error = error


def dct_scale(width: int, height: int, resize_width: int, resize_height: int) -> int:
    """The DCT scale denominator (1, 2, 4 or 8) to decode a ``width x height`` JPEG at for a resize to
    ``resize_width x resize_height``: the largest that keeps both sides at least the target (Pillow's
    ``Image.draft`` rule). The decoded frame is ``ceil(width / scale) x ceil(height / scale)``."""
    fits = min(width // resize_width, height // resize_height)
    for scale in (8, 4, 2):
        if fits >= scale:
            return scale
    return 1


def decode_clip_crops(
    jpegs: Sequence[JpegBytes],
    params: ClipParams,
    width: int,
    height: int,
    check: FrameCheck | None = None,
    paths: Sequence[str] | None = None,
) -> np.ndarray:
    """Decode a clip's distinct frames, each resized to the drawn size and cropped to the drawn box.

    Args:
        jpegs: each frame's JPEG bytes (frames of one video: one size).
        params: the resize, crop box and crop size (frame order and flip are the caller's).
        width: the frames' stored width in pixels (a frame of another size goes through Pillow, and is
            refused: by ``check``, or for decoding to another size).
        height: the frames' stored height.
        check: refuses a frame that goes through Pillow (see the module docstring) by raising; when
            given, a frame with an EXIF segment also goes through Pillow, so ``check`` sees its
            orientation. ``None``: no check (the packed store checked its frames when packing).
        paths: the frames' files, if they are files: Pillow opens a frame it decodes from its file,
            so its messages name the file.

    Returns:
        uint8 ``(len(jpegs), crop_size, crop_size, 3)``, RGB.

    Raises:
        JpegFrameError: naming the position of the first frame Pillow cannot decode.
    """
    scale = dct_scale(width, height, params.resize_width, params.resize_height)
    decoded_h, decoded_w = -(-height // scale), -(-width // scale)
    frames = np.empty((len(jpegs), decoded_h, decoded_w, 3), dtype=np.uint8)
    for k, jpeg in enumerate(jpegs):
        if not _decode_simplejpeg(jpeg, frames[k], width, height, check is not None):
            source = jpeg if paths is None else paths[k]
            frames[k] = decode_frame_pillow(source, k, params, frames.shape[1:3], check)
    return resize_crop(frames, params)


def resize_crop(frames: np.ndarray, params: ClipParams) -> np.ndarray:
    """``(K, h, w, 3)`` uint8 frames resized to ``params``' drawn size (antialiased bilinear, as Pillow's
    ``BILINEAR``) and cropped to its box: ``(K, crop_size, crop_size, 3)``, a view."""
    x, y, crop = params.crop_x, params.crop_y, params.crop_size
    height, width = frames.shape[1:3]
    if (height, width) != (params.resize_height, params.resize_width):
        # Rows and columns past the crop's far edges (and its filter's reach) are left out of the resize: given
        # the scale rather than the size, torch maps every kept output pixel to the same input position, so
        # those pixels come out the same as from the whole frame, for less work.
        rows, scale_y = _kept_extent(height, params.resize_height, y + crop)
        columns, scale_x = _kept_extent(width, params.resize_width, x + crop)
        # (K, 3, h, w) in channels-last memory: the layout torch's uint8 antialiased kernel runs on.
        clip = torch.from_numpy(frames[:, :rows, :columns]).permute(0, 3, 1, 2)
        resized = F.interpolate(
            clip, scale_factor=(scale_y, scale_x), mode="bilinear", antialias=True, align_corners=False,
            recompute_scale_factor=False,
        )
        frames = resized.permute(0, 2, 3, 1).numpy()
    return frames[:, y : y + crop, x : x + crop]


def _kept_extent(size: int, resized: int, needed: int) -> tuple[int, float]:
    """``(kept, scale)``: the input pixels along one side that the first ``needed`` of ``resized`` output pixels
    read (the bilinear filter reaches ``max(1, size / resized)`` input pixels either side of a centre; the whole
    side where the kept part would resize to its own length, which torch copies), and the scale factor
    ``resized / size`` for torch, nudged up where rounding would give fewer than ``needed`` outputs."""
    step = size / resized
    kept = min(size, math.ceil((needed + 1) * max(step, 1.0)) + 2)
    scale = resized / size
    if math.floor(kept * scale) == kept:
        kept = size  # torch copies a side whose output size equals its input size, whatever the scale
    while math.floor(kept * scale) < needed:  # torch's output size, floor(input * scale): one float ulp short
        scale = math.nextafter(scale, math.inf)
    return kept, scale


def _decode_simplejpeg(jpeg: JpegBytes, out: np.ndarray, width: int, height: int, exif_matters: bool) -> bool:
    """Decode into ``out`` when simplejpeg decodes this frame as Pillow would; ``False`` leaves it to Pillow."""
    try:
        stored_h, stored_w, colorspace, _ = simplejpeg.decode_jpeg_header(jpeg)
    except ValueError:
        return False
    if (stored_w, stored_h) != (width, height) or colorspace not in _SAME_AS_PILLOW or (exif_matters and has_exif(jpeg)):
        return False
    try:
        simplejpeg.decode_jpeg(jpeg, "RGB", min_height=out.shape[0], min_width=out.shape[1], buffer=out)
    except ValueError:
        return False
    return True


def decode_frame_pillow(
    source: JpegBytes | str, position: int, params: ClipParams, decoded_size: tuple[int, int], check: FrameCheck | None = None
) -> np.ndarray:
    """Frame ``position`` of a clip (its bytes or its file) decoded by Pillow, at reduced size for
    ``params`` (``draft``): uint8 ``(h, w, 3)``.

    Raises:
        JpegFrameError: when Pillow cannot decode it, or it decodes to another size than ``decoded_size``
            ``(height, width)`` (the clip's other frames').
    """
    decoded_height, decoded_width = decoded_size
    try:
        with Image.open(source if isinstance(source, str) else io.BytesIO(source)) as image:
            if check is not None:
                check(image, position)
            image.draft("RGB", (params.resize_width, params.resize_height))
            rgb = image if image.mode == "RGB" else image.convert("RGB")
            pixels = np.asarray(rgb)
    except IMAGE_ERRORS as error:
        raise JpegFrameError(position, error) from None
    if pixels.shape != (decoded_height, decoded_width, 3):
        size = f"{pixels.shape[1]}x{pixels.shape[0]}"
        raise JpegFrameError(position, ValueError(f"decodes to {size}, not {decoded_width}x{decoded_height}"))
    return pixels


def has_exif(jpeg: JpegBytes) -> bool:
    """Whether the JPEG carries an EXIF segment (an APP1 starting ``Exif\\0\\0``, where Pillow reads
    ``info["exif"]`` from): its markers are walked up to the start of the scan."""
    data = memoryview(jpeg)
    pos, size = 2, len(data)
    while pos + 4 <= size and data[pos] == 0xFF:
        marker = data[pos + 1]
        if marker == 0xDA:  # start of scan: no more header segments
            return False
        length = (data[pos + 2] << 8) | data[pos + 3]
        if marker == 0xE1 and bytes(data[pos + 4 : pos + 10]) == b"Exif\x00\x00":
            return True
        pos += 2 + length
    return False
