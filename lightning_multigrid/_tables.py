"""Plain-text tables for the command line: one formatter for every table the package prints (no torch)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["table_lines"]


def table_lines(rows: Sequence[Sequence[str]]) -> list[str]:
    """The lines of a left-aligned table: ``rows[0]`` is the header, ruled off with dashes.

    Columns are as wide as their widest cell and two spaces apart; trailing spaces are dropped.

    Example::

        table_lines([("grid", "clips"), ("8 x 16 x 112", "40")])
        # ['grid          clips', '------------  -----', '8 x 16 x 112  40']
    """
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines
