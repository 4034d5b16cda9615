"""What a bad file is, in words: the decode error every reader raises, without importing a decoder.

The frame reader, the device decode and the tools raise or describe errors without pulling in
PyAV; the same words name a file in training, in device decode and in ``check-data``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MIN_FRAMES", "VideoDecodeError", "describe_error", "refuse_still_picture", "unreadable"]

MIN_FRAMES = 2  # a video of fewer frames is a still picture: every clip would repeat its one frame


class VideoDecodeError(RuntimeError):
    """A video cannot be opened or decoded.

    Attributes:
        path: the file.
        reason: what went wrong, in words.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"Cannot decode video {path}: {reason}")
        self.path = path
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        # Exceptions cross process boundaries (DataLoader workers, check-data's pool) by pickling.
        return (type(self), (self.path, self.reason))


def describe_error(error: BaseException) -> str:
    """``"Kind: message"`` of an exception, or its kind alone when it has no message."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def unreadable(error: OSError) -> str:
    """The skip reason of a file the system will not read (permissions, a file gone meanwhile):
    the same words in training and in ``check-data``."""
    return f"cannot be read ({describe_error(error)})"


def refuse_still_picture(path: str, num_frames: int, holder: str) -> None:
    """The one rule for how many frames make a video, for video files, frame folders and stores alike.

    Args:
        path: the video, for the message.
        num_frames: frames it holds.
        holder: what holds the frames, in words (``"its video stream"``, ``"the frame folder"``).

    Raises:
        VideoDecodeError: when it holds fewer than :data:`MIN_FRAMES`.
    """
    if num_frames < MIN_FRAMES:
        raise VideoDecodeError(
            path, f"not a video: {holder} holds a single frame (a still picture; every clip would repeat it)"
        )
