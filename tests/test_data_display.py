"""Display geometry: the size players show, the stored size behind it, and turning a frame upright.

The decoders' use of it (rotated phone videos, anamorphic DVDs, a mirroring matrix refused) is
tested on real files in test_data_field_videos.py; these are the sizes with the arithmetic written out.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from lightning_multigrid.data.decoding.display import displayed_size, stored_size, upright


@pytest.mark.parametrize(
    ("stored", "aspect", "rotation", "shown"),
    [
        ((640, 360), Fraction(1), 0, (640, 360)),
        ((640, 360), Fraction(1), 90, (360, 640)),  # a phone video filmed upright
        ((640, 360), Fraction(1), 180, (640, 360)),
        ((720, 480), Fraction(32, 27), 0, (853, 480)),  # NTSC DVD 16:9: 720 * 32/27 = 853.3
        ((720, 480), Fraction(32, 27), 270, (480, 853)),  # stretched square, then turned
        ((1, 8), Fraction(1, 4), 0, (1, 8)),  # never narrower than a pixel
    ],
)
def test_displayed_size_stretches_pixels_square_then_turns(stored, aspect, rotation, shown) -> None:
    assert displayed_size(*stored, aspect, rotation) == shown
    # The stored frame that shows at a displayed size undoes the turn (the stretch is the resize's).
    assert stored_size(*shown, rotation) == ((shown[1], shown[0]) if rotation in (90, 270) else shown)


def test_upright_turns_clockwise_as_players_do() -> None:
    image = np.arange(6).reshape(2, 3, 1)  # (H, W, C): rows [0 1 2], [3 4 5]
    assert upright(image, 0) is image
    assert upright(image, 90)[..., 0].tolist() == [[3, 0], [4, 1], [5, 2]]
    assert upright(image, 180)[..., 0].tolist() == [[5, 4, 3], [2, 1, 0]]
    assert upright(image, 270)[..., 0].tolist() == [[2, 5], [1, 4], [0, 3]]
