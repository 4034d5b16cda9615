"""Read clips from folders of JPEG frames at a cost that follows the grid.

A clip opens only its sampled frames. libjpeg can decode a JPEG at 1/2, 1/4 or 1/8 of its size by
scaling the DCT, for less work than a full decode: a coarse grid (a small crop from a small short
side) is decoded at reduced size, then the clip is resized to the exact target in one call and
cropped (:func:`~lightning_multigrid.data.decoding.jpeg.decode_clip_crops`: simplejpeg, Pillow for
the frames simplejpeg does not decode as Pillow would). Decoding cost therefore falls with the grid,
as the model's does; an mp4 decoder must run from the keyframe through the clip's whole span
whatever the grid.

Which files of a folder are frames, and their numbers, is the folder's filename template
(:mod:`lightning_multigrid.data.decoding.frame_names`): optical flow, thumbnails and other files are never
read as frames, and a gap in the numbers makes a bad video unless gaps are allowed.

For decoding on the GPU the workers only read the JPEG bytes (:func:`read_encoded_clip`); see
:mod:`lightning_multigrid.data.decoding.device`.

One rule for every mode (workers, device, ``check-data``), whatever the decoder:

- bytes after a JPEG's end marker (camera trailers, a phone's motion-photo video) are ignored, as
  libjpeg ignores them; the device gets each frame's bytes up to its end marker;
- a frame with an EXIF orientation other than "normal" is refused: Pillow ignores the tag while
  torchcodec's decoder applies it (the same frame would come out turned on the device), so frames
  must be stored upright.

Example::

    folder = open_frame_folder(VideoEntry("frames/abseiling/x", (0,)))
    params = eval_clip_params(folder, GridShape(8, 16, 112), ClipSampling(sampling_rate=4), EvalViews())
    clip = read_clip(folder, params)   # uint8 (3, 16, 112, 112)
"""

from __future__ import annotations

import io
import os
import re
from typing import IO

import torch
from PIL import Image

from lightning_multigrid.data.clip_params import ClipParams, assemble_clip, check_clip_params, distinct_frames
from lightning_multigrid.data.decoding.errors import VideoDecodeError, describe_error, refuse_still_picture
from lightning_multigrid.data.decoding.frame_names import DEFAULT_LAYOUT, FrameLayout, FrameNameError, select_frames
from lightning_multigrid.data.decoding.jpeg import IMAGE_ERRORS, JpegFrameError, decode_clip_crops
from lightning_multigrid.data.decoding.metadata import FrameFolder
from lightning_multigrid.data.manifests.entries import VideoEntry

__all__ = [
    "IMAGE_ERRORS",
    "JPEG_EXTENSIONS",
    "EncodedClip",
    "FrameFolder",
    "FrameLayout",
    "check_frame_folder",
    "load_checked_frame",
    "jpeg_end",
    "open_frame_folder",
    "read_clip",
    "read_encoded_clip",
]

JPEG_EXTENSIONS: tuple[str, ...] = (".jpg", ".jpeg")

_NUMBERED = re.compile(r"^(.*?)(\d+)(\D*)$")
# After a scan's entropy-coded data: the next marker (0xFF not followed by a stuffed 0x00, a
# restart marker or a fill byte).
_NEXT_MARKER = re.compile(rb"\xff(?![\x00\xd0-\xd7\xff])")
_EXIF_ORIENTATION = 0x0112
_ORIENTATIONS = {
    2: "mirrored",
    3: "turned 180 degrees",
    4: "mirrored upside down",
    5: "mirrored and turned 90 degrees",
    6: "turned 90 degrees clockwise",
    7: "mirrored and turned 90 degrees",
    8: "turned 90 degrees counter-clockwise",
}


def open_frame_folder(entry: VideoEntry, layout: FrameLayout = DEFAULT_LAYOUT) -> FrameFolder:
    """List a video's frames (from the manifest, or the folder's files that ``layout`` names) and read their size.

    Args:
        entry: the video: a folder, or (frame-list CSV) its listed frame files.
        layout: which files of a folder are frames (see :mod:`lightning_multigrid.data.decoding.frame_names`).

    Raises:
        VideoDecodeError: when the folder does not exist, cannot be listed or holds no frames or one
            (a still picture: :func:`~lightning_multigrid.data.decoding.errors.refuse_still_picture`), when
            its frame numbers skip (unless ``layout.allow_gaps``) or its files mix name patterns
            without a template, when it holds fewer frames than the manifest's ``num_frames`` or
            a listed frame is missing, or when the first frame is not a readable JPEG.
    """
    folder = entry.path
    if entry.frame_paths:
        names = list(entry.frame_paths)
    else:
        names = _list_frames(entry, layout)
    refuse_still_picture(folder, len(names), "the frame folder" if not entry.frame_paths else "its frame list")
    width, height = _jpeg_size(names[0], folder)
    pattern = _pattern_of(folder, names)
    return FrameFolder(folder, width, height, len(names), pattern, () if pattern else tuple(names))


def _list_frames(entry: VideoEntry, layout: FrameLayout) -> list[str]:
    folder = entry.path
    if not os.path.isdir(folder):
        raise VideoDecodeError(folder, "the frame folder does not exist")
    try:
        files = os.listdir(folder)
    except OSError as error:  # permissions, a folder removed meanwhile, a broken mount
        raise VideoDecodeError(folder, f"the frame folder cannot be listed ({describe_error(error)})") from None
    try:
        frames = select_frames(folder, files, layout)
    except FrameNameError as error:
        raise VideoDecodeError(folder, str(error)) from None
    if entry.num_frames is not None and len(frames.names) < entry.num_frames:
        raise VideoDecodeError(
            folder,
            f"the manifest lists {entry.num_frames} frames but the folder holds {len(frames.names)} named like "
            f"{frames.template!r}: frames are missing (extract the video again, or fix the manifest's frame count)",
        )
    return [os.path.join(folder, n) for n in frames.names]


def read_clip(folder: FrameFolder, params: ClipParams) -> torch.Tensor:
    """Decode the frames of ``params`` at reduced size where the grid allows, resized, cropped, flipped.

    Returns:
        uint8 tensor ``(3, len(params.frame_indices), crop_size, crop_size)``, RGB.

    Raises:
        VideoDecodeError: when a sampled frame is missing, not a JPEG, damaged, or of another
            size than the first frame.
    """
    check_clip_params(params, folder.num_frames, folder.path)
    wanted, order = distinct_frames(params)
    paths = [folder.frame_path(index) for index in wanted]
    jpegs = [_read_frame(path, folder) for path in paths]

    def check(image: Image.Image, position: int) -> None:
        _check_frame(image, paths[position], folder)

    try:
        frames = decode_clip_crops(jpegs, params, folder.width, folder.height, check, paths)
    except JpegFrameError as error:
        path = paths[error.position]
        raise VideoDecodeError(folder.path, f"frame {path} cannot be decoded ({describe_error(error.error)})") from None
    return torch.from_numpy(assemble_clip(frames, order, params.flip))


def _read_frame(path: str, folder: FrameFolder) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except FileNotFoundError:
        raise VideoDecodeError(folder.path, f"frame {path} is missing") from None
    except OSError as error:
        raise VideoDecodeError(folder.path, f"frame {path} cannot be decoded ({describe_error(error)})") from None


class EncodedClip:
    """A clip's JPEG bytes and its parameters, for decoding on the training device.

    A plain class on purpose: Lightning moves tensors (and dataclass fields) to the device, but
    the JPEG decoder reads its input from host memory, so the bytes must cross the transfer
    untouched.

    Attributes:
        jpegs: the bytes of each distinct sampled frame, in frame order.
        order: for each output frame, its position in ``jpegs``.
        params: resize, crop and flip to apply after decoding.
        video: the video's name (:attr:`VideoEntry.name`), for skips and messages.
        frame_paths: the file of each of ``jpegs``, for messages.
    """

    __slots__ = ("frame_paths", "jpegs", "order", "params", "video")

    def __init__(
        self,
        jpegs: list[bytearray],
        order: tuple[int, ...],
        params: ClipParams,
        video: str = "",
        frame_paths: tuple[str, ...] = (),
    ) -> None:
        self.jpegs = jpegs
        self.order = order
        self.params = params
        self.video = video
        self.frame_paths = frame_paths

    def __getstate__(self) -> tuple[list[bytearray], tuple[int, ...], ClipParams, str, tuple[str, ...]]:
        return self.jpegs, self.order, self.params, self.video, self.frame_paths

    def __setstate__(self, state: tuple[list[bytearray], tuple[int, ...], ClipParams, str, tuple[str, ...]]) -> None:
        self.jpegs, self.order, self.params, self.video, self.frame_paths = state


def read_encoded_clip(folder: FrameFolder, params: ClipParams, video: str | None = None) -> EncodedClip:
    """Read (not decode) the JPEG bytes of the sampled frames; headers are checked here.

    The header check (a JPEG of the folder's frame size, stored upright, with its end marker)
    catches missing, non-JPEG, resized, EXIF-oriented and truncated frames in the worker, where the
    clip can still be replaced. Bytes after the end marker are dropped here.
    Damage inside the compressed data shows only when the device decodes it
    (:func:`~lightning_multigrid.data.decoding.device.decode_clips` finds, names and replaces it).

    Args:
        folder: the video's frames.
        params: the clip's drawn parameters.
        video: the video's name for messages (default the folder).

    Raises:
        VideoDecodeError: as :func:`read_clip`, for what the header shows.
    """
    check_clip_params(params, folder.num_frames, folder.path)
    wanted, order = distinct_frames(params)
    jpegs = []
    for index in wanted:
        path = folder.frame_path(index)
        try:
            with open(path, "rb") as file:
                data = bytearray(file.read())
        except OSError as error:
            raise VideoDecodeError(folder.path, f"frame {path} cannot be read ({error.strerror or error})") from None
        size = _jpeg_size_of(io.BytesIO(data), path, folder.path)
        if size != (folder.width, folder.height):
            raise VideoDecodeError(folder.path, _size_message(path, size, folder))
        end = jpeg_end(data)
        if end is None:
            raise VideoDecodeError(folder.path, f"frame {path} is truncated (no JPEG end marker after its image data)")
        del data[end:]  # bytes after the end marker are ignored, as libjpeg ignores them
        jpegs.append(data)
    paths = tuple(folder.frame_path(i) for i in wanted)
    return EncodedClip(jpegs, order, params, video or folder.path, paths)


def check_frame_folder(entry: VideoEntry, layout: FrameLayout = DEFAULT_LAYOUT) -> FrameFolder:
    """Decode every frame of a frame folder in full, as ``check-data`` does for videos.

    Frames are the ones training reads: the same listing (``layout``) and the same checks.

    Raises:
        VideoDecodeError: naming the first bad frame, or as :func:`open_frame_folder`.
    """
    folder = open_frame_folder(entry, layout)
    for index in range(folder.num_frames):
        load_checked_frame(folder, index).close()
    return folder


def load_checked_frame(folder: FrameFolder, index: int) -> Image.Image:
    """Frame ``index`` decoded in full and checked as :func:`check_frame_folder` checks it (a JPEG of the
    folder's frame size that decodes to its end); the caller closes it.

    Raises:
        VideoDecodeError: naming the frame.
    """
    path = folder.frame_path(index)
    try:
        image = Image.open(path)
        try:
            _check_frame(image, path, folder)
            image.load()
        except BaseException:
            image.close()
            raise
    except FileNotFoundError:
        raise VideoDecodeError(folder.path, f"frame {path} is missing") from None
    except IMAGE_ERRORS as error:
        raise VideoDecodeError(folder.path, f"frame {path} cannot be decoded ({describe_error(error)})") from None
    return image


def _check_frame(image: Image.Image, path: str, folder: FrameFolder) -> None:
    """A frame must be an upright JPEG of the folder's frame size."""
    if image.format != "JPEG":
        raise VideoDecodeError(folder.path, f"frame {path} is not a JPEG ({image.format})")
    _check_upright(image, path, folder.path)
    if image.size != (folder.width, folder.height):
        raise VideoDecodeError(folder.path, _size_message(path, image.size, folder))


def _check_upright(image: Image.Image, path: str, folder: str) -> None:
    """Refuse a JPEG whose EXIF orientation asks viewers to turn or mirror it (values as Pillow's
    ``ImageOps.exif_transpose``: 1 and unknown values mean "as stored")."""
    if "exif" not in image.info:
        return
    orientation = image.getexif().get(_EXIF_ORIENTATION, 1)
    if orientation in _ORIENTATIONS:
        raise VideoDecodeError(
            folder,
            f"frame {path} has EXIF orientation {orientation} ({_ORIENTATIONS[orientation]} for display): "
            "frames must be stored upright, as decoders disagree on the tag (Pillow ignores it, the device "
            "decode applies it); turn the frames upright (e.g. `exiftran -ai *.jpg` or `mogrify -auto-orient "
            "*.jpg`) or extract them again",
        )


def jpeg_end(data: bytes | bytearray) -> int | None:
    """The offset just past the end marker (EOI) that ends a JPEG's image data, or ``None``
    when the data stops before it (a truncated or damaged file).

    The markers are walked from the start, so an end marker inside a thumbnail (EXIF) or the
    bytes after the image (a trailer) are not mistaken for the end.
    """
    if data[:2] != b"\xff\xd8":
        return None
    pos, size = 2, len(data)
    while pos + 2 <= size:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # a fill byte before a marker
            pos += 1
        elif marker == 0xD9:
            return pos + 2
        elif 0xD0 <= marker <= 0xD7 or marker == 0x01:  # markers without a length
            pos += 2
        else:
            pos += 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
            if marker == 0xDA:  # start of scan: skip its entropy-coded data
                match = _NEXT_MARKER.search(data, pos)
                if match is None:
                    return None
                pos = match.start()
    return None


def _jpeg_size(path: str, folder: str) -> tuple[int, int]:
    try:
        with open(path, "rb") as file:
            return _jpeg_size_of(file, path, folder)
    except FileNotFoundError:
        raise VideoDecodeError(folder, f"frame {path} is missing") from None
    except OSError as error:
        raise VideoDecodeError(folder, f"frame {path} cannot be read ({describe_error(error)})") from None


def _jpeg_size_of(file: IO[bytes], path: str, folder: str) -> tuple[int, int]:
    """The size from the JPEG header (PIL reads the header only); a non-JPEG or an EXIF-oriented JPEG raises."""
    try:
        with Image.open(file) as image:
            if image.format != "JPEG":
                raise VideoDecodeError(folder, f"frame {path} is not a JPEG ({image.format})")
            _check_upright(image, path, folder)
            return image.size
    except IMAGE_ERRORS as error:
        raise VideoDecodeError(folder, f"frame {path} is not a readable JPEG ({describe_error(error)})") from None


def _pattern_of(folder: str, paths: list[str]) -> tuple[str, int, int, str] | None:
    """``(prefix, digits, first, suffix)`` when the files are consecutive numbers in ``folder``."""
    first_name = os.path.basename(paths[0])
    stem, extension = os.path.splitext(first_name)
    match = _NUMBERED.match(stem)
    if match is None or any(os.path.dirname(p) != folder for p in paths):
        return None
    prefix, number, rest = match.groups()
    digits = len(number)  # a minimum width: unpadded names start at one digit
    pattern = (prefix, digits, int(number), rest + extension)
    expected = (f"{prefix}{pattern[2] + i:0{digits}d}{pattern[3]}" for i in range(len(paths)))
    if all(os.path.basename(p) == e for p, e in zip(paths, expected)):
        return pattern
    return None


def _size_message(path: str, size: tuple[int, int], folder: FrameFolder) -> str:
    return (
        f"frame {path} is {size[0]}x{size[1]}, the folder's first frame {folder.width}x{folder.height}: "
        "frames of one video must share a size"
    )
