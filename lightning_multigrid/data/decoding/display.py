"""A video frame as players show it: turned by its display matrix, its pixels stretched square.

Phone videos store their frames sideways with a display matrix that turns them upright; anamorphic
video stores non-square pixels (the pixel aspect). Training, ``extract-frames``, ``pack-frames`` and
``check-data`` all read frames at the **displayed** size, upright: this module owns that geometry,
the stored frame size that shows as a displayed size, and the one conversion of a decoded frame to
displayed RGB for whole-file decodes. The clip reader
(:class:`~lightning_multigrid.data.decoding.video.VideoReader`) converts with its own swscale context
and the same geometry.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import av
import numpy as np
from av.sidedata.sidedata import Type as SideDataType

from lightning_multigrid.data.decoding.errors import VideoDecodeError
from lightning_multigrid.data.decoding.metadata import VideoMetadata

__all__ = ["display_rotation", "displayed_rgb", "displayed_size", "pixel_aspect", "stored_size", "upright"]

DISPLAYMATRIX = SideDataType.DISPLAYMATRIX


def display_rotation(path: str, frame: av.VideoFrame) -> int:
    """Degrees clockwise (0, 90, 180, 270) a player turns ``frame``, from its display matrix.

    Raises:
        VideoDecodeError: when the matrix mirrors the picture or turns it by other than a right angle.
    """
    side_data: Any = frame.side_data  # a SideDataContainer (PyAV's stubs call it SideData)
    if DISPLAYMATRIX not in side_data:
        return 0
    # Nine native int32 (16.16 fixed point): a b u / c d v / x y w; a mirror has a negative determinant.
    a, b, _, c, d = np.frombuffer(bytes(side_data[DISPLAYMATRIX]), dtype=np.int32, count=5).tolist()
    clockwise = -frame.rotation % 360  # PyAV gives the counter-clockwise angle
    if a * d - b * c <= 0 or clockwise % 90:
        raise VideoDecodeError(
            path,
            f"its display matrix mirrors the picture or turns it by {clockwise} degrees (not a right angle): "
            "not supported; re-encode it upright (e.g. `ffmpeg -i IN -vf transpose=... OUT`)",
        )
    return clockwise


def pixel_aspect(stream: av.video.stream.VideoStream) -> Fraction:
    """The stored pixels' aspect: the container's when it sets one (as FFmpeg's players prefer), else the codec's."""
    for ratio in (stream.sample_aspect_ratio, stream.codec_context.sample_aspect_ratio):
        if ratio is not None and ratio > 0:
            return Fraction(ratio)
    return Fraction(1)


def displayed_size(width: int, height: int, aspect: Fraction, rotation: int) -> tuple[int, int]:
    """The ``(width, height)`` a player shows for stored ``width x height`` frames of pixel aspect
    ``aspect``, turned ``rotation`` degrees: pixels stretched square in width, then turned."""
    shown_width = max(1, round(width * aspect))
    return (height, shown_width) if rotation in (90, 270) else (shown_width, height)


def stored_size(width: int, height: int, rotation: int) -> tuple[int, int]:
    """The stored frame's ``(width, height)`` that shows as ``width x height`` once turned ``rotation`` degrees."""
    return (height, width) if rotation in (90, 270) else (width, height)


def upright(image: np.ndarray, rotation: int) -> np.ndarray:
    """A stored ``(H, W, C)`` image turned ``rotation`` degrees clockwise, as players show it (a view)."""
    return image if rotation == 0 else np.rot90(image, k=-(rotation // 90))


def displayed_rgb(frame: av.VideoFrame, metadata: VideoMetadata, width: int, height: int) -> np.ndarray:
    """A decoded frame as players show it at ``width x height`` displayed pixels: uint8 RGB
    ``(height, width, 3)``, anamorphic pixels stretched square in the conversion, then turned upright.
    For whole-file decodes (``extract-frames``, ``pack-frames``); clip reads use
    :meth:`~lightning_multigrid.data.decoding.video.VideoReader.displayed`."""
    stored_width, stored_height = stored_size(width, height, metadata.rotation)
    image = frame.to_ndarray(width=stored_width, height=stored_height, format="rgb24")
    return np.ascontiguousarray(upright(image, metadata.rotation))
