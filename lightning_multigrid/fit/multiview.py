"""Multi-view evaluation: the predictions of a video's views (clips, crops) averaged per video.

What ``VideoClassifier`` does at the end of a test epoch, over the views every rank gathered; a
plain function of tensors (no Lightning), so it serves a plain PyTorch evaluation loop too.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["VideoPredictions", "aggregate_views"]


class VideoPredictions(NamedTuple):
    """Per-video predictions after averaging views.

    Attributes:
        video_index: ``(V,)`` video indices, ascending.
        probs: ``(V, num_classes)`` view-averaged softmax (single-label) or sigmoid (multi-label).
        labels: ``(V,)`` class indices or ``(V, num_classes)`` multi-hot labels.
        num_views: ``(V,)`` views averaged per video.
    """

    video_index: torch.Tensor
    probs: torch.Tensor
    labels: torch.Tensor
    num_views: torch.Tensor


def aggregate_views(
    index: torch.Tensor,
    probs: torch.Tensor,
    labels: torch.Tensor,
    view: torch.Tensor | None = None,
) -> VideoPredictions:
    """Average the predictions of the views (clips, crops) of each video.

    Args:
        index: ``(N,)`` video index of each view, in any order; any number of views per video.
        probs: ``(N, num_classes)`` per-view probabilities.
        labels: ``(N,)`` or ``(N, num_classes)`` per-view labels; all views of a video must agree.
        view: optional ``(N,)`` view index within the video; views with the same
            ``(index, view)`` are counted once (a distributed sampler repeats samples to pad).

    Returns:
        The per-video predictions, sorted by video index.

    Raises:
        ValueError: when the lengths differ or the views of a video have different labels.
    """
    if not (len(index) == len(probs) == len(labels)) or (view is not None and len(view) != len(index)):
        raise ValueError(
            f"`index`, `probs`, `labels` (and `view`) must have one entry per view, got lengths "
            f"{len(index)}, {len(probs)}, {len(labels)}" + ("" if view is None else f", {len(view)}") + "."
        )
    if view is not None and len(index):
        # Keep the first occurrence of each (video, view) pair.
        pairs, pair_of = torch.unique(torch.stack([index.long(), view.long()], 1), dim=0, return_inverse=True)
        positions = torch.arange(len(index), device=index.device)
        first = torch.full((len(pairs),), len(index), device=index.device, dtype=positions.dtype)
        keep = first.scatter_reduce(0, pair_of, positions, reduce="amin").sort().values
        index, probs, labels = index[keep], probs[keep], labels[keep]
    videos, video_of = torch.unique(index, return_inverse=True)
    sums = torch.zeros(len(videos), *probs.shape[1:], dtype=probs.dtype, device=probs.device)
    sums.index_add_(0, video_of, probs)
    num_views = torch.bincount(video_of, minlength=len(videos))
    video_labels = torch.zeros(len(videos), *labels.shape[1:], dtype=labels.dtype, device=labels.device)
    video_labels[video_of] = labels  # one of the views' labels per video
    if not torch.equal(video_labels[video_of], labels):
        bad = video_of[(video_labels[video_of] != labels).reshape(len(labels), -1).any(1)][0]
        raise ValueError(
            f"The views of video {int(videos[bad])} have different labels: each `index` must name one video."
        )
    shape = (-1,) + (1,) * (probs.dim() - 1)
    return VideoPredictions(videos, sums / num_views.reshape(shape).to(probs.dtype), video_labels, num_views)
