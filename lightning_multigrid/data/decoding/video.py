"""Decode clips with PyAV straight to the grid a training iteration asks for.

Multigrid batches are up to 8x larger than the baseline's, of smaller clips; a decoder that
converts every frame of the span to full-size RGB and resizes afterwards (pytorchvideo's PyAV path)
spends most of its time on pixels the model never sees. Here a clip is read as:

1. seek to the keyframe before the clip's first frame, decode only up to its last frame;
2. convert to RGB **only the sampled frames**, with the resize done inside the same swscale
   call (``frame.to_ndarray(width=, height=)``), so a 4x smaller target costs 16x fewer pixels;
3. crop as array views, then order and flip the frames into the ``(C, T, H, W)`` uint8 output
   (:func:`~lightning_multigrid.data.clip_params.assemble_clip`, shared with the frame reader).

Frame indices are mapped through each frame's presentation timestamp (from a one-off demux of the
packets; only the first frame is decoded, for its display matrix), so variable-frame-rate files and
B-frame reordering are handled. A seek is trusted only when the first frame it decodes is one of
the keyframes the probe listed, at or before the clip: MPEG program streams (``.mpg``) label the
frames after a seek with shifted timestamps, and MPEG transport streams (``.m2ts``) land past the
keyframe asked for, so the reader then steps back a keyframe, and finally decodes from the start.

Frames come out as players show them (:class:`~lightning_multigrid.data.decoding.metadata.VideoMetadata`):
anamorphic frames stretched to square pixels (inside the same swscale call as the resize) and
phone videos turned upright by their display matrix; a mirroring or oblique display matrix is
refused (that geometry is :mod:`~lightning_multigrid.data.decoding.display`'s). Still images saved
with a video name, single-frame files and Matroska/WebM files cut short (their header declares more
video than their packets hold) are refused by name. The
datasets' :class:`~lightning_multigrid.data.decoding.readers.VideoFileReader` probes each path once
per process (its :class:`~lightning_multigrid.data.decoding.metadata.MetadataCache`: each
DataLoader worker fills its own copy); metadata can be precomputed into a JSON file
(``lightning-multigrid check-data --write-metadata``).

Example::

    with VideoReader("clip.mp4") as video:
        params = eval_clip_params(video.metadata, num_frames=16, sampling_rate=4, short_side=128, crop_size=112)
        clip = video.read(params)      # uint8 tensor (3, 16, 112, 112)
"""

from __future__ import annotations

import bisect
import itertools
import os
from collections.abc import Iterator
from fractions import Fraction
from types import TracebackType
from typing import Literal

import av
import numpy as np
import torch
from av.video.reformatter import VideoReformatter

from lightning_multigrid.data.clip_params import ClipParams, assemble_clip, check_clip_params, distinct_frames
from lightning_multigrid.data.decoding.display import (
    display_rotation,
    displayed_size,
    pixel_aspect,
    stored_size,
    upright,
)
from lightning_multigrid.data.decoding.errors import VideoDecodeError, describe_error, refuse_still_picture
from lightning_multigrid.data.decoding.metadata import FrameTimestamps, VideoMetadata, file_stamp

__all__ = ["Interpolation", "VideoReader", "decoder_threads_per_worker", "probe_video"]

Interpolation = Literal["FAST_BILINEAR", "BILINEAR", "BICUBIC", "AREA", "POINT"]

class VideoReader:
    """An open video file: metadata, and clips decoded to the requested size.

    Args:
        path: the video file.
        metadata: the video's metadata if already known (skips the probe).
        interpolation: swscale filter for the resize; bilinear in swscale widens its filter
            when shrinking, so it does not alias.
        threads: decoder threads (frame and slice threading above 1). DataLoader workers
            already decode in parallel, so each should take its share of the cores, not all of
            them (:func:`decoder_threads_per_worker`).

    Raises:
        VideoDecodeError: when the file is missing, empty, not a video, has no video stream, no
            decoder for it or no frames.
    """

    def __init__(
        self,
        path: str,
        metadata: VideoMetadata | None = None,
        interpolation: Interpolation = "BILINEAR",
        threads: int = 1,
    ) -> None:
        if threads < 1:
            raise ValueError(f"`threads` must be >= 1, got {threads!r}.")
        self.path = str(path)
        self.interpolation = interpolation
        if not os.path.exists(self.path):
            raise VideoDecodeError(self.path, "the file does not exist")
        if os.path.isfile(self.path) and os.path.getsize(self.path) == 0:
            raise VideoDecodeError(self.path, "the file is empty (0 bytes)")
        # Before opening: a file replaced while it is probed then looks stale, never fresh.
        self._stamp = file_stamp(self.path) if os.path.isfile(self.path) else None
        # One swscale context per reader, single-threaded: creating one per frame (what
        # frame.to_ndarray does) with automatic threads costs 5-10x the conversion itself.
        self._reformatter = VideoReformatter()
        try:
            self._container = av.open(self.path)
        except (av.FFmpegError, OSError) as error:
            raise VideoDecodeError(self.path, f"not a readable video container ({describe_error(error)})") from None
        try:
            if not self._container.streams.video:
                kinds = sorted(str(s.type) for s in self._container.streams)
                raise VideoDecodeError(self.path, f"no video stream (streams: {', '.join(kinds) or 'none'})")
            self._stream = self._container.streams.video[0]
            if self._stream.codec_context is None:  # an unknown codec or a damaged sample description
                raise VideoDecodeError(self.path, "the video stream has no decoder (unknown codec or damaged header)")
            _refuse_still_image(self.path, self._container.format.name, self._stream.codec_context.name)
            # FFmpeg's default (slice threads, one per core) gives each of N workers all the cores.
            self._stream.thread_type = "AUTO" if threads > 1 else "SLICE"
            self._stream.codec_context.thread_count = threads
            self.metadata = metadata if metadata is not None else self._probe()
        except BaseException:
            self._container.close()
            raise

    def __enter__(self) -> VideoReader:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._container.close()

    def read(self, params: ClipParams) -> torch.Tensor:
        """Decode the frames of ``params``, resized, cropped and flipped.

        Returns:
            uint8 tensor ``(3, len(params.frame_indices), crop_size, crop_size)``, RGB.

        Raises:
            VideoDecodeError: when decoding fails or stops before the clip's last frame.
            ValueError: when ``params`` do not fit this video (frame index or crop out of range).
        """
        meta = self.metadata
        check_clip_params(params, meta.num_frames, self.path)
        wanted, order = distinct_frames(params)
        wanted_pts = [meta.timestamps[i] for i in wanted]
        crop = params.crop_size
        frames = np.empty((len(wanted), crop, crop, 3), dtype=np.uint8)
        # Seek to the last keyframe at or before the first wanted frame. A seek that lands late,
        # decodes nothing, labels frames with timestamps the probe never saw or fails is not
        # trusted: step back a keyframe, then decode from the start, whose result stands.
        k = bisect.bisect_right(meta.keyframe_pts, wanted_pts[0]) - 1
        targets = [meta.keyframe_pts[i] for i in (k, k - 1) if i >= 0] + [None]
        found = 0
        for target in targets:
            try:
                found = self._decode_into(frames, wanted_pts, params, target)
            except (av.FFmpegError, OSError) as error:
                if target is None:
                    raise VideoDecodeError(self.path, f"decoding failed ({describe_error(error)})") from None
                continue
            if found == len(wanted):
                break
        if found < len(wanted):
            found = max(found, 0)
            raise VideoDecodeError(
                self.path,
                f"decoding stopped after {found} of the {len(wanted)} frames the clip needs "
                f"(frame {wanted[found]} of {meta.num_frames} never came): the file is probably truncated",
            )
        return torch.from_numpy(assemble_clip(frames, order, params.flip))

    def decode_rgb(self) -> np.ndarray:
        """Every frame :attr:`metadata` lists, at its displayed size and upright: uint8 RGB
        ``(num_frames, height, width, 3)``.

        Frame ``i`` is the one shown at ``metadata.timestamps[i]``, picked as :meth:`read` picks it:
        a frame the decoder drops yields its predecessor.

        Raises:
            VideoDecodeError: when decoding fails or stops before the last frame.
        """
        timestamps = self.metadata.timestamps
        frames: list[np.ndarray] = []
        previous: av.VideoFrame | None = None
        width, height = self.metadata.width, self.metadata.height
        try:
            self._container.seek(0)  # whole-file seek: to the very first packet
            for frame in self._container.decode(self._stream):
                pts = frame.pts if frame.pts is not None else frame.dts
                if pts is None:
                    raise VideoDecodeError(self.path, "a decoded frame has no timestamp")
                while len(frames) < len(timestamps) and timestamps[len(frames)] < pts:
                    frames.append(self.displayed((previous if previous is not None else frame), width, height))
                if len(frames) < len(timestamps) and timestamps[len(frames)] == pts:
                    frames.append(self.displayed(frame, width, height))
                previous = frame
        except (av.FFmpegError, OSError) as error:
            raise VideoDecodeError(self.path, f"decoding failed ({describe_error(error)})") from None
        if len(frames) < len(timestamps):
            raise VideoDecodeError(
                self.path,
                f"decoding stopped after {len(frames)} of its {len(timestamps)} frames: the file is probably truncated",
            )
        return np.stack(frames)

    def displayed(
        self, frame: av.VideoFrame, width: int, height: int, interpolation: Interpolation | None = None
    ) -> np.ndarray:
        """A decoded frame as players show it, resized to ``width x height`` (displayed pixels):
        uint8 RGB ``(height, width, 3)``.

        The resize to the displayed size happens inside the YUV -> RGB conversion (one swscale
        pass), which also stretches anamorphic pixels square; a rotated video is then turned
        upright (an array view).
        """
        rotation = self.metadata.rotation
        stored_width, stored_height = stored_size(width, height, rotation)
        image = self._reformatter.reformat(
            frame,
            width=stored_width,
            height=stored_height,
            format="rgb24",
            interpolation=interpolation or self.interpolation,
            threads=1,
        ).to_ndarray()
        return upright(image, rotation)

    def decode_all(self) -> int:
        """Decode every frame (no conversion), to check the file; returns the frame count.

        Raises:
            VideoDecodeError: when decoding fails.
        """
        try:
            self._container.seek(0, stream=self._stream, backward=True, any_frame=False)
            return sum(1 for _ in self._container.decode(self._stream))
        except (av.FFmpegError, OSError) as error:
            raise VideoDecodeError(self.path, f"decoding failed ({describe_error(error)})") from None

    def _decode_into(
        self, out: np.ndarray, wanted_pts: list[int], params: ClipParams, seek_pts: int | None
    ) -> int:
        """Fill ``out[k]`` with the frame shown at ``wanted_pts[k]``; returns how many were filled.

        The frame shown at a timestamp is the last one whose timestamp is not after it, so a
        frame the index lists but the decoder drops (edit lists, damage) yields its predecessor.
        Decoding starts at the keyframe at or before ``seek_pts``, or at the start for ``None``.
        Returns -1 when the seek cannot be trusted: its first keyframe is not one the probe listed
        at or before the first wanted timestamp (it landed late, or labelled its frames with other
        timestamps than a decode from the start does), or a frame the clip would use comes before
        any keyframe. Frames shown before the first keyframe (an open GOP's leading B-frames) are
        dropped: they may reference frames the seek skipped.
        """
        if seek_pts is None:
            self._container.seek(0)  # whole-file seek: to the very first packet
        else:
            self._container.seek(seek_pts, stream=self._stream, backward=True, any_frame=False)

        x, y, crop = params.crop_x, params.crop_y, params.crop_size
        width, height = params.resize_width, params.resize_height

        def convert(frame: av.VideoFrame, k: int) -> None:
            out[k] = self.displayed(frame, width, height)[y : y + crop, x : x + crop]

        k = 0
        previous: av.VideoFrame | None = None
        frames: Iterator[av.VideoFrame] = self._frames(set(wanted_pts))
        if seek_pts is not None:
            keyframe = self._vouching_keyframe(frames, wanted_pts[0])
            if keyframe is None:
                return -1
            frames = itertools.chain([keyframe], frames)
        for frame in frames:
            pts = frame.pts if frame.pts is not None else frame.dts  # as the probe does for packets
            if pts is None:
                raise VideoDecodeError(self.path, "a decoded frame has no timestamp")
            while k < len(wanted_pts) and wanted_pts[k] < pts:
                convert(previous if previous is not None else frame, k)
                k += 1
            if k < len(wanted_pts) and wanted_pts[k] == pts:
                convert(frame, k)
                k += 1
            if k == len(wanted_pts):
                break
            previous = frame
        return k

    def _vouching_keyframe(self, frames: Iterator[av.VideoFrame], first_wanted: int) -> av.VideoFrame | None:
        """Consume ``frames`` up to a seek's first keyframe and return it when it is one the probe
        listed, not after the clip; else ``None`` (so is a frame the clip would use before any
        keyframe, or one without a timestamp).
        """
        keyframes = self.metadata.keyframe_pts
        for frame in frames:
            pts = frame.pts if frame.pts is not None else frame.dts
            if pts is None or (not frame.key_frame and pts >= first_wanted):
                return None
            if frame.key_frame:
                i = bisect.bisect_left(keyframes, pts)
                listed = pts <= first_wanted and i < len(keyframes) and keyframes[i] == pts
                return frame if listed else None
            # else: a leading frame of an open GOP, shown before its keyframe: dropped
        return None

    def _frames(self, wanted_pts: set[int]) -> Iterator[av.VideoFrame]:
        """Decoded frames from the current position; frames nobody wants are decoded only if referenced.

        Skipping non-reference frames (B-frames, typically) that are not sampled saves about a
        third of the decoding; a sampled frame's packet is always decoded in full.
        """
        context = self._stream.codec_context
        try:
            for packet in self._container.demux(self._stream):
                wanted = packet.pts is None or packet.pts in wanted_pts
                context.skip_frame = "DEFAULT" if wanted else "NONREF"
                yield from packet.decode()
        finally:
            context.skip_frame = "DEFAULT"

    def _read_packets(self) -> tuple[list[int], set[int], int]:
        """The packets' timestamps (in file order), the keyframes' and the number of packets (pre-roll included)."""
        pts_list: list[int] = []
        keyframes: set[int] = set()
        packets = 0
        try:
            for packet in self._container.demux(self._stream):
                if packet.size == 0:
                    continue  # end-of-stream marker
                packets += 1
                if packet.is_discard:
                    continue  # pre-roll the decoder drops (edit lists)
                pts = packet.pts if packet.pts is not None else packet.dts
                if pts is None:
                    continue
                pts_list.append(pts)
                if packet.is_keyframe:
                    keyframes.add(pts)
        except (av.FFmpegError, OSError) as error:
            raise VideoDecodeError(
                self.path, f"reading packets failed after {packets} frames ({describe_error(error)})"
            ) from None
        return pts_list, keyframes, packets

    def _probe(self) -> VideoMetadata:
        """Timestamps and keyframes from the packets, and the display geometry from the first frame."""
        stream = self._stream
        pts_list, keyframes, packets = self._read_packets()
        if not pts_list:
            raise VideoDecodeError(self.path, "the video stream has no frames")
        if stream.frames and packets < stream.frames:
            # The demuxer stops quietly at the end of a cut file; the container's index knows better.
            raise VideoDecodeError(
                self.path,
                f"the file is truncated: its index lists {stream.frames} frames, only {packets} are in the file",
            )
        refuse_still_picture(self.path, len(pts_list), "its video stream")
        width, height = stream.codec_context.width, stream.codec_context.height
        if width <= 0 or height <= 0:
            raise VideoDecodeError(self.path, f"the video stream has no frame size ({width}x{height})")
        pts_list = sorted(set(pts_list))
        timestamps = FrameTimestamps.from_sorted(pts_list)
        time_base = stream.time_base or Fraction(1, 1)
        last = timestamps.last_step()
        if not last:
            rate = stream.average_rate or stream.guessed_rate
            last = round(1 / (rate * time_base)) if rate else 0
        duration = float((pts_list[-1] - pts_list[0] + last) * time_base)
        self._check_declared_duration(float((pts_list[-1] + last) * time_base), float(last * time_base))
        fps = len(pts_list) / duration if duration > 0 else float(stream.average_rate or 0)
        rotation = self._rotation()
        aspect = pixel_aspect(stream)
        shown_width, shown_height = displayed_size(width, height, aspect, rotation)
        return VideoMetadata(
            width=shown_width,
            height=shown_height,
            num_frames=len(pts_list),
            fps=fps,
            duration=duration,
            time_base=Fraction(time_base),
            timestamps=timestamps,
            keyframe_pts=tuple(sorted(keyframes)),
            rotation=rotation,
            pixel_aspect=aspect,
            file_size=None if self._stamp is None else self._stamp[0],
            file_mtime_ns=None if self._stamp is None else self._stamp[1],
        )

    def _check_declared_duration(self, end: float, frame_seconds: float) -> None:
        """Refuse a file whose header declares more video than its packets hold (a cut Matroska/WebM).

        Matroska has no frame index to compare with (MP4 and AVI do, above); its header declares
        the duration. Formats whose duration FFmpeg estimates from the packets themselves (MPEG
        transport and program streams) are consistent when cut, and not checked.
        """
        declared = _declared_seconds(self._container, self._stream)
        if declared is None or declared <= 0:
            return
        start = float((self._stream.start_time or 0) * (self._stream.time_base or 0))
        missing = declared - (end - start)
        if missing > max(0.5, 2 * frame_seconds):
            raise VideoDecodeError(
                self.path,
                f"the file is truncated: its header declares {declared:.2f} s of video, its frames end at "
                f"{end - start:.2f} s ({100 * (end - start) / declared:.0f}%): the rest of the file is missing "
                "(an interrupted download or copy)",
            )

    def _rotation(self) -> int:
        """Degrees clockwise a player turns the frames, from the first frame's display matrix.

        FFmpeg hands the container's display matrix (MP4's track matrix, Matroska's projection)
        to every decoded frame; the stream itself does not expose it to PyAV, so one frame is decoded.
        """
        try:
            self._container.seek(0)
            frame = next(iter(self._container.decode(self._stream)), None)
        except (av.FFmpegError, OSError) as error:
            raise VideoDecodeError(self.path, f"its first frame cannot be decoded ({describe_error(error)})") from None
        if frame is None:
            raise VideoDecodeError(self.path, "no frame can be decoded")
        return display_rotation(self.path, frame)


_STILL_IMAGE_DEMUXERS = ("image2",)


def _refuse_still_image(path: str, demuxer: str, codec: str) -> None:
    """A JPEG or PNG saved as ``.mp4`` opens as a one-frame 'video' (FFmpeg's image demuxers): refuse it."""
    if demuxer.endswith("_pipe") or demuxer in _STILL_IMAGE_DEMUXERS:
        raise VideoDecodeError(
            path,
            f"not a video: a still image ({codec}, read by FFmpeg's {demuxer} demuxer) with a video file name; "
            "leave it out of the manifest, or make a video of it",
        )


def _declared_seconds(container: av.container.InputContainer, stream: av.video.stream.VideoStream) -> float | None:
    """The video's duration as the header declares it: Matroska's per-track ``DURATION`` tag (ffmpeg and
    mkvmerge write it), or its segment duration when the file holds only the video; else ``None``."""
    tag = stream.metadata.get("DURATION")
    if tag:
        try:
            hours, minutes, seconds = tag.split(":")
            return int(hours) * 3600 + int(minutes) * 60 + float(seconds)
        except ValueError:
            return None
    if "matroska" in container.format.name and len(container.streams) == 1 and container.duration:
        return container.duration / av.time_base
    return None


def decoder_threads_per_worker() -> int:
    """This process's share of the cores: ``cores // DataLoader workers`` in a worker, else all cores."""
    from torch.utils.data import get_worker_info

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    info = get_worker_info()
    return max(1, cores // info.num_workers) if info is not None else max(1, cores)


def probe_video(path: str | os.PathLike[str]) -> VideoMetadata:
    """Read a video's metadata (no frame is decoded).

    Raises:
        VideoDecodeError: as :class:`VideoReader`.
    """
    with VideoReader(str(path)) as video:
        return video.metadata
