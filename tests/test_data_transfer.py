"""What happens to a batch on the device (lightning_multigrid/data/transfer.py), without a Trainer."""

from __future__ import annotations

import pytest
import torch

from lightning_multigrid.data.transfer import BatchTransfer, slowfast_pathways


def test_uint8_video_becomes_normalised_float_then_converted() -> None:
    batch = {"video": torch.full((2, 3, 4, 8, 8), 255, dtype=torch.uint8), "label": torch.tensor([0, 1])}
    BatchTransfer(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))(batch, convert=lambda v: v.to(torch.bfloat16))
    assert batch["video"].dtype == torch.bfloat16
    torch.testing.assert_close(batch["video"].float(), torch.ones(2, 3, 4, 8, 8))


def test_slowfast_split_of_a_batch_takes_every_alpha_th_frame() -> None:
    video = torch.arange(8).view(1, 1, 8, 1, 1).expand(2, 3, 8, 2, 2)  # (N, C, T, H, W), frame t holds t
    slow, fast = slowfast_pathways(video, 4)
    assert fast is video
    assert slow.shape == (2, 3, 2, 2, 2) and slow[0, 0, :, 0, 0].tolist() == [0, 4]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mean": (0.5, 0.5)}, "`mean` must have 3 values"),
        ({"std": (0.2, 0.0, 0.2)}, "`std` must be > 0"),
        ({"slowfast_alpha": 0}, "`slowfast_alpha` must be a positive integer or None"),
        ({"strict": "no"}, "`strict` must be True or False"),
    ],
)
def test_bad_settings_raise_naming_them(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        BatchTransfer(**kwargs)
