"""Argument checks shared by every layer (pure Python: the schedule imports it too)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "FIGURE_SUFFIXES", "as_flags",
    "check_bool", "check_instance", "check_int", "check_output_file", "check_positive_int", "check_positive_number",
    "check_value", "is_number", "plain_value",
]


def as_flags(message: str, parser: argparse.ArgumentParser) -> str:
    """``message`` with each `python_name` that is one of ``parser``'s options written as its flag.

    The library's messages name its Python arguments (`filename_tmpl`, `max_epochs`); a command-line
    user typed the flag (`--filename-tmpl`, `--max-epochs`).
    """
    flags = {action.dest: max(action.option_strings, key=len) for action in parser._actions if action.option_strings}
    return re.sub(r"`(\w+)`", lambda name: f"`{flags.get(name[1], name[1])}`", message)


def check_positive_int(name: str, value: Any, allow_none: bool = False) -> Any:
    """Return ``value`` if it is a positive ``int`` (not a ``bool``), or ``None`` when allowed, else raise naming ``name``.

    Raises:
        ValueError: ``"`name` must be a positive integer, got value."``
    """
    if allow_none and value is None:
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"`{name}` must be a positive integer{' or None' if allow_none else ''}, got {value!r}.")
    return value


def check_int(name: str, value: Any, minimum: int) -> int:
    """Return ``value`` if it is an ``int`` (not a ``bool``) ``>= minimum``, else raise naming ``name``.

    Raises:
        ValueError: ``"`name` must be an integer >= minimum, got value."``
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}, got {value!r}.")
    return value


def check_bool(name: str, value: Any, allow_none: bool = False) -> Any:
    """Return ``value`` if it is ``True`` or ``False`` (or ``None`` when allowed), else raise naming ``name``.

    A string such as ``"false"`` or a number would silently count as true.

    Raises:
        ValueError: ``"`name` must be True or False, got value."``
    """
    if not (isinstance(value, bool) or (allow_none and value is None)):
        raise ValueError(f"`{name}` must be True or False{' or None' if allow_none else ''}, got {value!r}.")
    return value


def check_instance(name: str, value: Any, kind: type, allow_none: bool = False) -> Any:
    """Return ``value`` if it is a ``kind`` (or ``None`` when allowed), else raise naming ``name``.

    For arguments that take a value whole, such as a grid value or the DataModule's ``reader_settings``.

    Raises:
        TypeError: ``"`name` must be a Kind, got value."``
    """
    if not (isinstance(value, kind) or (allow_none and value is None)):
        raise TypeError(f"`{name}` must be a {kind.__name__}{' or None' if allow_none else ''}, got {value!r}.")
    return value


def check_value(name: str, value: Any, kind: type, allow_none: bool = False) -> Any:
    """Return ``value`` if it is a ``kind`` (or ``None`` when allowed); a mapping of ``kind``'s fields is built into one.

    For arguments that take a frozen value whole (``reader_settings``, ``eval_views``): a checkpoint's
    hyper-parameters hold them as :func:`plain_value` wrote them, and ``load_from_checkpoint`` passes
    that mapping back.

    Raises:
        TypeError: ``"`name` must be a Kind, got value."``
        ValueError: from ``kind`` itself, naming the field, when the mapping holds a bad value.
    """
    if isinstance(value, Mapping) and dataclasses.is_dataclass(kind):
        return kind(**value)
    return check_instance(name, value, kind, allow_none)


def plain_value(value: Any) -> Any:
    """``value`` as torch's weights-only loader reads it without this package imported: a frozen
    value (dataclass) becomes a dict of its constructor's fields, a path a string; lists, tuples and
    dicts are converted item by item. What checkpoints store of a constructor's arguments."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain_value(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, Mapping):
        return {key: plain_value(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        items = [plain_value(item) for item in value]
        return tuple(items) if isinstance(value, tuple) else items  # a NamedTuple: a plain tuple
    return value


def is_number(value: object) -> bool:
    """An ``int`` or ``float``, not a ``bool``."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_positive_number(name: str, value: Any) -> Any:
    """Return ``value`` if it is a finite number > 0 (not a ``bool``), else raise naming ``name``.

    Raises:
        ValueError: ``"`name` must be a positive number, got value."``
    """
    if not is_number(value) or not value > 0 or math.isinf(value):
        raise ValueError(f"`{name}` must be a positive number, got {value!r}.")
    return value


FIGURE_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg")


def check_output_file(option: str, path: str, figure: bool = False, creates_folder: bool = False) -> None:
    """Refuse, before any work, an output file that could not be written at the end.

    ``creates_folder``: the writer makes missing folders, so the nearest existing one must be writable.
    """
    file = Path(path)
    if figure and file.suffix.lower() not in FIGURE_SUFFIXES:
        raise ValueError(
            f"`{option}` {path}: cannot write a figure as {file.suffix or 'a file without extension'!r}; "
            f"name it with one of {', '.join(FIGURE_SUFFIXES)}."
        )
    if file.is_dir():
        raise ValueError(f"`{option}` {path} is a folder: pass a file name.")
    parent = file.absolute().parent
    folder = parent if not creates_folder else next(p for p in (parent, *parent.parents) if p.exists())
    if not folder.is_dir():
        raise ValueError(f"`{option}` {path}: its folder {file.parent} does not exist; create it or pass another path.")
    if not os.access(folder, os.W_OK) or (file.exists() and not os.access(file, os.W_OK)):
        raise ValueError(f"`{option}` {path} cannot be written (permission denied); pass another path.")
