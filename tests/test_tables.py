from __future__ import annotations

from lightning_multigrid._tables import table_lines


def test_columns_are_as_wide_as_their_widest_cell_and_the_header_is_ruled_off() -> None:
    rows = [("grid", "clips"), ("8 x 16 x 112", "40"), ("1 x 2 x 3", "123456")]
    assert table_lines(rows) == [
        "grid          clips",
        "------------  ------",
        "8 x 16 x 112  40",
        "1 x 2 x 3     123456",
    ]
