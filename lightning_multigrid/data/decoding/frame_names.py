"""Which files of a frame folder are a video's frames, and their numbers: the filename template.

Frame datasets name their frames by a template, one per layout in the field:

- mmaction2 rawframes: ``img_{:05d}.jpg`` (its ``filename_tmpl`` default), beside optical flow
  ``flow_x_{:05d}.jpg`` / ``flow_y_{:05d}.jpg`` in the same folder;
- PySlowFast / Something-Something: ``{video}_{:06d}.jpg``;
- Charades: ``{video}-{:06d}.jpg``;

where ``{video}`` is the folder's name. A frame is a file whose name the template formats exactly
(``img_00007.jpg`` for 7; not ``img_7.jpg``, not ``flow_x_00007.jpg``, not ``img_00007.png``);
every other file is ignored. Frame numbers are read from the names: frames 1, 2, 4 have a gap (3
is missing), which makes the video bad unless gaps are allowed (:class:`FrameLayout`).

Without a template each folder's is detected: mmaction2's when any file matches it, else
PySlowFast's or Charades', else the one numbered pattern the folder's JPEGs share. A folder whose
JPEGs follow several patterns, none of them known, is an error naming them: give the template.

Pure Python (no PIL, no torch)::

    layout = FrameLayout("{video}-{:06d}.jpg")
    select_frames("data/46GP8", os.listdir("data/46GP8"), layout)   # FrameList(...)
"""

from __future__ import annotations

import os
import re
import string
from collections.abc import Iterable
from dataclasses import dataclass

from lightning_multigrid._checks import check_bool

__all__ = ["DEFAULT_LAYOUT", "DEFAULT_TEMPLATE", "KNOWN_TEMPLATES", "FrameLayout", "FrameList", "FrameNameError", "select_frames"]

DEFAULT_TEMPLATE = "img_{:05d}.jpg"
KNOWN_TEMPLATES: tuple[str, ...] = (DEFAULT_TEMPLATE, "{video}_{:06d}.jpg", "{video}-{:06d}.jpg")
_JPEG_SUFFIXES = (".jpg", ".jpeg")
_NUMBERED_JPEG = re.compile(r"^(.*?)(\d+)(\.jpe?g)$", re.IGNORECASE)
_WIDTH = re.compile(r"^(?:0(\d+))?d?$")


class FrameNameError(ValueError):
    """A folder's frames cannot be told apart from its other files, or a frame is missing."""


@dataclass(frozen=True, slots=True)
class FrameLayout:
    """How frame files are named, and whether frame numbers may skip.

    Attributes:
        filename_tmpl: the frames' file names, a format string with one integer field (the frame
            number, e.g. ``{:05d}``) and optionally ``{video}`` (the folder's name); ``None``
            detects each folder's (see the module docstring).
        allow_gaps: read a folder whose frame numbers skip (1, 2, 4, ...) as consecutive frames;
            by default such a folder is a bad video.

    Raises:
        ValueError: on a template without exactly one zero-padded integer field, with a field
            other than ``{video}``, or naming another file type than JPEG.
    """

    filename_tmpl: str | None = None
    allow_gaps: bool = False

    def __post_init__(self) -> None:
        if self.filename_tmpl is not None:
            _Template.parse(self.filename_tmpl, "video")
        check_bool("allow_frame_gaps", self.allow_gaps)

    def check_applies(self, manifest_format: str, source: str) -> None:
        """Refuse a layout set for a manifest of video files: it describes frame folders. A packed frame
        store passes: its frames were chosen when it was packed, and the layout may be for another split."""
        if (self.filename_tmpl is not None or self.allow_gaps) and manifest_format == "video":
            raise ValueError(
                f"`filename_tmpl` and `allow_frame_gaps` describe frame folders, but {source} lists video files: "
                "leave them unset."
            )


DEFAULT_LAYOUT = FrameLayout()  # detect each folder's template; gaps make a bad video


@dataclass(frozen=True, slots=True)
class FrameList:
    """A folder's frames: their file names in frame order and the template they follow.

    Attributes:
        names: file names (no folder), in frame-number order.
        template: the template, ``{video}`` filled in.
        pattern: ``(prefix, minimum digits, first number, suffix)`` when the numbers are
            consecutive (names are then not needed to find a frame), else ``None``.
    """

    names: tuple[str, ...]
    template: str
    pattern: tuple[str, int, int, str] | None


@dataclass(frozen=True, slots=True)
class _Template:
    prefix: str
    digits: int  # minimum width, zero-padded
    suffix: str

    @classmethod
    def parse(cls, template: str, video: str) -> _Template:
        prefix: list[str] = []
        number: tuple[str, str] | None = None
        suffix: list[str] = []
        try:
            fields = list(string.Formatter().parse(template))
        except ValueError as error:
            raise ValueError(f"`filename_tmpl` {template!r} is not a format string ({error}).") from None
        for literal, name, spec, _ in fields:
            (suffix if number else prefix).append(literal)
            if name == "video":
                (suffix if number else prefix).append(video)
            elif name is not None:
                if number is not None or name not in ("", "0") or _WIDTH.match(spec or "") is None:
                    raise ValueError(
                        f"`filename_tmpl` {template!r} must hold one frame-number field like `{{:05d}}` "
                        "(zero-padded integer) and optionally `{{video}}`, e.g. 'img_{{:05d}}.jpg'."
                    )
                number = (name, spec or "")
        if number is None:
            raise ValueError(f"`filename_tmpl` {template!r} has no frame-number field: write it like 'img_{{:05d}}.jpg'.")
        if not "".join(suffix).lower().endswith(_JPEG_SUFFIXES):
            raise ValueError(f"`filename_tmpl` {template!r} must name JPEG files (.jpg or .jpeg): frames are JPEGs.")
        width = _WIDTH.match(number[1])
        digits = int(width.group(1)) if width and width.group(1) else 1
        return cls("".join(prefix), digits, "".join(suffix))

    def number_of(self, name: str) -> int | None:
        """The frame number of ``name``, or ``None`` when the template does not format to it."""
        if not (name.startswith(self.prefix) and name.endswith(self.suffix)):
            return None
        middle = name[len(self.prefix) : len(name) - len(self.suffix)]
        if not middle.isdigit() or middle != f"{int(middle):0{self.digits}d}":
            return None
        return int(middle)

    @property
    def text(self) -> str:
        return f"{self.prefix}{{:0{self.digits}d}}{self.suffix}" if self.digits > 1 else f"{self.prefix}{{:d}}{self.suffix}"


def select_frames(folder: str, names: Iterable[str], layout: FrameLayout) -> FrameList:
    """The frames among a folder's file ``names``, in frame order.

    Raises:
        FrameNameError: when no file is a frame, when the folder mixes name patterns and no
            template is given, when frames are named with another ending or padding than the
            template's (``img_00002.jpeg`` beside ``img_00001.jpg``: never a gap, even with
            ``layout.allow_gaps``), or when frame numbers skip and ``layout.allow_gaps`` is off.
    """
    files = sorted(names)
    template = _template_of(folder, files, layout)
    numbered = sorted((n, name) for name in files if (n := template.number_of(name)) is not None)
    if not numbered:
        raise FrameNameError(
            f"the frame folder holds no frame named like {template.text!r} "
            f"({_describe_files(files)}): pass `filename_tmpl` with the frames' names"
        )
    numbers = [n for n, _ in numbered]
    _check_other_endings(files, template, set(numbers))
    first = numbers[0]
    consecutive = numbers[-1] - first + 1 == len(numbers)
    if not consecutive and not layout.allow_gaps:
        raise FrameNameError(_gap_message(numbers, template.text))
    pattern = (template.prefix, template.digits, first, template.suffix) if consecutive else None
    return FrameList(tuple(name for _, name in numbered), template.text, pattern)


def _template_of(folder: str, files: list[str], layout: FrameLayout) -> _Template:
    video = os.path.basename(os.path.normpath(folder))
    if layout.filename_tmpl is not None:
        return _Template.parse(layout.filename_tmpl, video)
    for known in KNOWN_TEMPLATES:
        template = _Template.parse(known, video)
        if any(template.number_of(name) is not None for name in files):
            return template
    groups: dict[tuple[str, str], int] = {}
    for name in files:
        match = _NUMBERED_JPEG.match(name)
        if match:
            key = (match.group(1), match.group(3))
            groups[key] = groups.get(key, 0) + 1
    if len(groups) > 1:
        found = ", ".join(f"'{p}<number>{s}' ({count} files)" for (p, s), count in sorted(groups.items()))
        raise FrameNameError(
            f"the frame folder mixes file name patterns {found}: pass `filename_tmpl` (e.g. 'img_{{:05d}}.jpg', "
            "'{video}_{:06d}.jpg') to say which files are the frames"
        )
    if not groups:
        raise FrameNameError(
            f"the frame folder holds no numbered JPEG frames ({_describe_files(files)}); "
            f"frames are named like {DEFAULT_TEMPLATE!r} (or pass `filename_tmpl`)"
        )
    (prefix, suffix), _ = groups.popitem()
    # Zero-padded to the narrowest width seen: 1.jpg .. 12.jpg is unpadded, 0001 .. 10000 four digits.
    digits = min(len(m.group(2)) for name in files if (m := _NUMBERED_JPEG.match(name)) and m.group(1) == prefix)
    return _Template(prefix, digits, suffix)


def _check_other_endings(files: list[str], template: _Template, numbers: set[int]) -> None:
    """Refuse frames the template does not name only by their ending or padding (``.jpeg`` beside
    ``.jpg``): read as a gap, or as consecutive frames with ``allow_gaps``, half the video is lost."""
    others = sorted(
        (int(match.group(2)), name)
        for name in files
        if (match := _NUMBERED_JPEG.match(name)) and match.group(1) == template.prefix
        and template.number_of(name) is None and int(match.group(2)) not in numbers
    )
    if others:
        shown = ", ".join(name for _, name in others[:3]) + (", ..." if len(others) > 3 else "")
        raise FrameNameError(
            f"{len(others)} frames are named otherwise than the other {len(numbers)} ({template.text!r}): {shown}. "
            "The folder mixes file endings (.jpg and .jpeg) or zero-padding: rename its frames to one pattern "
            "(or extract the video again)"
        )


def _gap_message(numbers: list[int], template: str) -> str:
    present = set(numbers)
    missing = [n for n in range(numbers[0], numbers[-1] + 1) if n not in present]
    runs: list[str] = []
    start = previous = missing[0]
    for n in [*missing[1:], None]:
        if n is not None and n == previous + 1:
            previous = n
            continue
        runs.append(str(start) if start == previous else f"{start}-{previous}")
        if n is not None:
            start = previous = n
    shown = ", ".join(runs[:5]) + (", ..." if len(runs) > 5 else "")
    which = f"frame {shown} is" if len(missing) == 1 else f"frames {shown} are"
    return (
        f"{which} missing between frames {numbers[0]} and {numbers[-1]} (named {template!r}): "
        "extract the video again, or pass `allow_frame_gaps=True` to read the frames there are as consecutive"
    )


def _describe_files(files: list[str]) -> str:
    if not files:
        return "it is empty"
    shown = ", ".join(files[:3]) + (", ..." if len(files) > 3 else "")
    return f"{len(files)} files: {shown}"
