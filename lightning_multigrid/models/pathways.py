"""The SlowFast input: one clip split into ``[slow, fast]`` pathways, for single clips and batches,
and the check that the data and the model split it alike."""

from __future__ import annotations

import torch

__all__ = ["check_slowfast_alpha", "slowfast_pathways"]


def slowfast_pathways(video: torch.Tensor, alpha: int) -> list[torch.Tensor]:
    """SlowFast input ``[slow, fast]``: slow takes every ``alpha``-th frame, fast is the clip itself.

    Works on a clip ``(C, T, H, W)`` and on a batch ``(N, C, T, H, W)``: frames are dim -3. Slow
    has ``ceil(T / alpha)`` frames, starting with the first (a view, not a copy).
    """
    return [video[..., ::alpha, :, :], video]


def check_slowfast_alpha(data_alpha: int | None, model_alpha: int | None, *, model_takes_one_clip: bool) -> None:
    """Refuse data split into ``[slow, fast]`` otherwise than the model expects, before the first step.

    A DataModule that splits (``data_alpha`` set) hands the model the pathways as they are: a
    model with another ``slowfast_alpha`` then trains silently with the data's, and a one-pathway
    model fails at step 0 on a list. Data that does not split is always fine: a two-pathway model
    splits the clip itself.

    Args:
        data_alpha: the DataModule's ``slowfast_alpha`` (``None``: one clip).
        model_alpha: the model's ``slowfast_alpha`` (``None``: it splits nothing).
        model_takes_one_clip: whether a model without ``slowfast_alpha`` takes a single clip (a
            named one-pathway backbone) rather than whatever the data gives (a module of the user's).

    Raises:
        ValueError: naming both values and the fix.
    """
    if data_alpha is None or data_alpha == model_alpha:
        return
    if model_alpha is not None:
        raise ValueError(
            f"The DataModule's `slowfast_alpha`={data_alpha} splits clips into [slow, fast] with every {data_alpha}th "
            f"frame slow, but the model's `slowfast_alpha` is {model_alpha}: set both to the same value "
            f"(data.slowfast_alpha and model.slowfast_alpha), or unset the DataModule's and let the model split clips."
        )
    if model_takes_one_clip:
        raise ValueError(
            f"The DataModule's `slowfast_alpha`={data_alpha} splits clips into [slow, fast], but the model takes one "
            "clip (one-pathway backbone, `slowfast_alpha` unset): unset the DataModule's `slowfast_alpha`, or choose "
            f"a two-pathway backbone with `slowfast_alpha`={data_alpha}."
        )
