"""The SlowFast input: one clip split into ``[slow, fast]`` pathways, for single clips and batches."""

from __future__ import annotations

import torch

__all__ = ["slowfast_pathways"]


def slowfast_pathways(video: torch.Tensor, alpha: int) -> list[torch.Tensor]:
    """SlowFast input ``[slow, fast]``: slow takes every ``alpha``-th frame, fast is the clip itself.

    Works on a clip ``(C, T, H, W)`` and on a batch ``(N, C, T, H, W)``: frames are dim -3. Slow
    has ``ceil(T / alpha)`` frames, starting with the first (a view, not a copy).
    """
    return [video[..., ::alpha, :, :], video]
