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
packets, no decoding), so variable-frame-rate files and B-frame reordering are handled. The
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
from lightning_multigrid.data.decoding.errors import VideoDecodeError, describe_error
from lightning_multigrid.data.decoding.metadata import FrameTimestamps, VideoMetadata

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
        # Seek to the last keyframe at or before the first wanted frame. Containers that seek by
        # decoding time can land one keyframe late: then step back a keyframe, then the start.
        k = bisect.bisect_right(meta.keyframe_pts, wanted_pts[0]) - 1
        targets = [meta.keyframe_pts[i] for i in (k, k - 1) if i >= 0] + [None]
        try:
            for target in targets:
                found = self._decode_into(frames, wanted_pts, params, target)
                if found >= 0:
                    break
        except (av.FFmpegError, OSError) as error:
            raise VideoDecodeError(self.path, f"decoding failed ({describe_error(error)})") from None
        if found < len(wanted):
            raise VideoDecodeError(
                self.path,
                f"decoding stopped after {found} of the {len(wanted)} frames the clip needs "
                f"(frame {wanted[found]} of {meta.num_frames} never came): the file is probably truncated",
            )
        return torch.from_numpy(assemble_clip(frames, order, params.flip))

    def decode_rgb(self) -> np.ndarray:
        """Every frame :attr:`metadata` lists, full size: uint8 RGB ``(num_frames, height, width, 3)``.

        Frame ``i`` is the one shown at ``metadata.timestamps[i]``, picked as :meth:`read` picks it:
        a frame the decoder drops yields its predecessor.

        Raises:
            VideoDecodeError: when decoding fails or stops before the last frame.
        """
        timestamps = self.metadata.timestamps
        frames: list[np.ndarray] = []
        previous: av.VideoFrame | None = None
        try:
            self._container.seek(0)  # whole-file seek: to the very first packet
            for frame in self._container.decode(self._stream):
                pts = frame.pts if frame.pts is not None else frame.dts
                if pts is None:
                    raise VideoDecodeError(self.path, "a decoded frame has no timestamp")
                while len(frames) < len(timestamps) and timestamps[len(frames)] < pts:
                    frames.append((previous if previous is not None else frame).to_ndarray(format="rgb24"))
                if len(frames) < len(timestamps) and timestamps[len(frames)] == pts:
                    frames.append(frame.to_ndarray(format="rgb24"))
                previous = frame
        except (av.FFmpegError, OSError) as error:
            raise VideoDecodeError(self.path, f"decoding failed ({describe_error(error)})") from None
        if len(frames) < len(timestamps):
            raise VideoDecodeError(
                self.path,
                f"decoding stopped after {len(frames)} of its {len(timestamps)} frames: the file is probably truncated",
            )
        return np.stack(frames)

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
        Returns -1 when the seek landed past the first wanted timestamp.
        """
        if seek_pts is None:
            self._container.seek(0)  # whole-file seek: to the very first packet
        else:
            self._container.seek(seek_pts, stream=self._stream, backward=True, any_frame=False)

        x, y, crop = params.crop_x, params.crop_y, params.crop_size
        width, height, interpolation = params.resize_width, params.resize_height, self.interpolation
        reformat = self._reformatter.reformat

        def convert(frame: av.VideoFrame, k: int) -> None:
            # The resize happens inside the YUV -> RGB conversion (one swscale pass).
            image = reformat(frame, width=width, height=height, format="rgb24", interpolation=interpolation, threads=1)
            out[k] = image.to_ndarray()[y : y + crop, x : x + crop]

        k = 0
        previous: av.VideoFrame | None = None
        first = True
        for frame in self._frames(set(wanted_pts)):
            pts = frame.pts if frame.pts is not None else frame.dts  # as the probe does for packets
            if first and pts is not None and pts > wanted_pts[0] and seek_pts is not None:
                return -1
            first = False
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
        """Timestamps and keyframes from the packets; only the headers are read, nothing decoded."""
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
        fps = len(pts_list) / duration if duration > 0 else float(stream.average_rate or 0)
        return VideoMetadata(
            width=width,
            height=height,
            num_frames=len(pts_list),
            fps=fps,
            duration=duration,
            time_base=Fraction(time_base),
            timestamps=timestamps,
            keyframe_pts=tuple(sorted(keyframes)),
        )


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
