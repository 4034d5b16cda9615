from __future__ import annotations

import torch

from lightning_multigrid.models import slowfast_pathways as public
from lightning_multigrid.models.pathways import slowfast_pathways


def test_slow_takes_every_alpha_th_frame_of_a_clip_and_of_a_batch() -> None:
    clip = torch.arange(10).reshape(1, 10, 1, 1).expand(3, 10, 2, 2)  # (C, T, H, W), frame k holds k
    slow, fast = slowfast_pathways(clip, 4)
    assert fast is clip
    assert slow.shape == (3, 3, 2, 2) and slow[0, :, 0, 0].tolist() == [0, 4, 8]  # ceil(10 / 4) frames
    batch = torch.stack([clip, clip + 100])  # (N, C, T, H, W)
    slow, fast = slowfast_pathways(batch, 4)
    assert fast is batch
    assert slow.shape == (2, 3, 3, 2, 2) and slow[1, 0, :, 0, 0].tolist() == [100, 104, 108]
    assert public is slowfast_pathways
