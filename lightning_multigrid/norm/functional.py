"""The autograd functions behind :class:`~lightning_multigrid.norm.MultigridBatchNorm`.

Split BatchNorm over interleaved groups of unequal size, and BatchNorm synchronised over a process
group, each with an exact closed-form backward; plus the small tensor helpers they share.
Layouts: ``(N, C, L)`` (positions flattened) or ``(N, L, C)`` for channels-last input.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd.function import once_differentiable

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = [
    "RaggedSplitBatchNorm",
    "SyncBatchNorm",
    "aggregate",
    "group_sum",
    "is_channels_last",
    "num_groups_for",
    "per_sample",
]


def group_sum(values: Tensor, num_groups: int) -> Tensor:
    """Sum ``(N, C)`` per-sample values over interleaved groups (sample ``n`` in group
    ``n % num_groups``): ``(num_groups, C)``. Zero-padding to whole rows keeps it deterministic
    (unlike ``index_add_``, which uses atomics on CUDA)."""
    n, c = values.shape
    pad = -n % num_groups
    if pad:
        values = torch.cat([values, values.new_zeros(pad, c)])
    return values.view(-1, num_groups, c).sum(0)


@torch.no_grad()
def aggregate(means: Tensor, variances: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and variance over the groups from per-group ``(num_groups, C)`` ones (class docstring)."""
    mean = means.mean(0)
    return mean, variances.mean(0) + (means - mean).pow(2).mean(0)


def is_channels_last(input: Tensor) -> bool:
    """Whether ``(N, C, ...)`` input is stored channels-last (``(N, ..., C)`` contiguous), not NC..."""
    return input.dim() >= 3 and not input.is_contiguous() and input.movedim(1, -1).is_contiguous()


def per_sample(values: Tensor, n: int, position_dim: int = 2) -> Tensor:
    """Broadcast per-group ``(num_groups, C)`` values to the ``n`` samples: ``(n, C, 1)``, or
    ``(n, 1, C)`` with ``position_dim=1``."""
    num_groups = values.shape[0]
    return values.repeat(-(-n // num_groups), 1)[:n].unsqueeze(position_dim)


class RaggedSplitBatchNorm(torch.autograd.Function):
    """Split BatchNorm over interleaved groups of unequal size, for ``(N, C, L)`` input, or
    ``(N, L, C)`` input with ``channels_last=True`` (output in the input's layout).

    Forward: per-sample means and variances in one numerically stable pass, combined exactly
    per group (Chan et al.'s parallel formula); the output is then ``x * scale + shift`` with
    per-sample, per-channel ``scale`` and ``shift``, the same form as PyTorch's CPU BatchNorm
    kernel. Backward: the closed-form BatchNorm gradient per group, from per-sample sums of
    ``dy`` and ``dy * x``. About 1.6x ``nn.BatchNorm`` on CPU (the stable per-sample variance
    pass is the cost; sums of squares would be faster but lose precision in float32), where
    slicing and regrouping the input for two ``batch_norm`` calls cost about 3x.
    Returns the output and the per-group means and unbiased variances, ``(num_groups, C)``.
    """

    @staticmethod
    def forward(
        ctx: Any,
        x: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        num_groups: int,
        eps: float,
        channels_last: bool,
    ) -> tuple[Tensor, Tensor, Tensor]:
        position_dim = 1 if channels_last else 2
        n, length = x.shape[0], x.shape[position_dim]
        stats_dtype = torch.promote_types(x.dtype, torch.float32)
        sample_var, sample_mean = torch.var_mean(x.to(stats_dtype), dim=position_dim, correction=0)  # (N, C)
        samples = group_sum(torch.ones(n, 1, device=x.device, dtype=stats_dtype), num_groups)  # (k, 1)
        mean = group_sum(sample_mean, num_groups) / samples
        deviation = (sample_mean - per_sample(mean, n).squeeze(2)).pow(2)
        var = group_sum(sample_var + deviation, num_groups) / samples  # biased, (k, C)
        invstd = torch.rsqrt(var + eps)
        scale = invstd if weight is None else invstd * weight.to(stats_dtype)
        shift = -mean * scale if bias is None else bias.to(stats_dtype) - mean * scale
        y = torch.addcmul(
            per_sample(shift, n, position_dim).to(x.dtype), x, per_sample(scale, n, position_dim).to(x.dtype)
        )
        values = samples * length
        ctx.save_for_backward(x, weight, mean, invstd, values)
        ctx.num_groups = num_groups
        ctx.position_dim = position_dim
        unbiased_var = var * values / (values - 1)
        ctx.mark_non_differentiable(mean, unbiased_var)
        return y, mean, unbiased_var

    @staticmethod
    @once_differentiable
    def backward(
        ctx: Any, grad_output: Tensor, _grad_mean: Tensor | None, _grad_var: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        x, weight, mean, invstd, values = ctx.saved_tensors
        n = x.shape[0]
        num_groups = ctx.num_groups
        position_dim = ctx.position_dim
        stats_dtype = mean.dtype
        dy = grad_output
        sum_dy = group_sum(dy.sum(position_dim).to(stats_dtype), num_groups)  # (k, C)
        # Sum over positions of dy * x without a full-size temporary (a batched dot product);
        # subtracting mean * sum(dy) afterwards loses float32 digits only when |mean| is many
        # times the standard deviation, which BatchNorm inputs after a conv rarely are.
        equation = "nlc,nlc->nc" if position_dim == 1 else "ncl,ncl->nc"
        sum_dy_x = group_sum(torch.einsum(equation, dy, x).to(stats_dtype), num_groups)
        sum_dy_xmu = sum_dy_x - mean * sum_dy
        grad_weight = (sum_dy_xmu * invstd).sum(0).to(weight.dtype) if ctx.needs_input_grad[1] else None
        grad_bias = sum_dy.sum(0).to(weight.dtype) if ctx.needs_input_grad[2] else None
        grad_input = None
        if ctx.needs_input_grad[0]:
            # dx = a * dy + b * x + d per group (closed-form BatchNorm gradient, expanded).
            a = invstd if weight is None else invstd * weight.to(stats_dtype)
            b = -a * invstd.pow(2) * sum_dy_xmu / values
            d = -a * sum_dy / values - mean * b
            grad_input = torch.addcmul(
                per_sample(d, n, position_dim).to(x.dtype), x, per_sample(b, n, position_dim).to(x.dtype)
            )
            grad_input.addcmul_(dy, per_sample(a, n, position_dim).to(x.dtype))
        return grad_input, grad_weight, grad_bias, None, None, None


def num_groups_for(input: Tensor, num_splits: int) -> int:
    """Groups actually formed for ``input``: never empty, never one value per channel."""
    if num_splits == 1:
        return 1
    n = input.shape[0]
    values_per_sample = math.prod(input.shape[2:])
    # A group needs at least two values per channel for a variance; with one value per sample
    # ((N, C) input) that means at least two samples per group.
    min_samples = 2 if values_per_sample == 1 else 1
    return max(1, min(num_splits, n // min_samples))


class SyncBatchNorm(torch.autograd.Function):
    """BatchNorm with statistics over the union of the batches of a process group.

    Forward: each rank computes its per-channel mean and (biased) variance in one numerically
    stable pass, the ranks all-gather ``(mean, var, count)`` and combine them exactly (Chan et
    al.'s parallel formula; all-reducing raw sums of squares instead would lose precision in
    float32 when the mean is large relative to the spread). Backward: the ranks all-reduce the
    per-channel sums of ``dy`` and ``dy * (x - mean)``, the terms through which each rank's loss
    depends on every rank's input. ``weight`` and ``bias`` get their local gradient only: DDP
    averages parameter gradients itself.
    """

    @staticmethod
    def forward(
        ctx: Any,
        x: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        eps: float,
        process_group: ProcessGroup,
        group_size: int,
    ) -> tuple[Tensor, Tensor, Tensor]:
        c = x.shape[1]
        reduce_dims = [0, *range(2, x.dim())]
        stats_dtype = torch.promote_types(x.dtype, torch.float32)
        xs = x.to(stats_dtype)
        count = x.numel() // c if c else 0
        if count > 0:
            var, mean = torch.var_mean(xs, dim=reduce_dims, correction=0)
        else:
            mean = var = torch.zeros(c, device=x.device, dtype=stats_dtype)
        local = torch.cat([mean, var, mean.new_full((1,), float(count))])
        gathered = [torch.empty_like(local) for _ in range(group_size)]
        dist.all_gather(gathered, local, group=process_group)
        stats = torch.stack(gathered)  # (g, 2C + 1), in rank order: identical on every rank
        means, variances, counts = stats[:, :c], stats[:, c : 2 * c], stats[:, 2 * c :]
        total = counts.sum()
        # Only a rank whose own batch is tiny pays for the host sync of this check; the
        # total is the same on every rank, so either all raise or none does (no hang).
        if count < 2 and total.item() < 2:
            raise ValueError(
                f"Expected more than 1 value per channel when training, got {int(total.item())} "
                f"over the {group_size} ranks of the BatchNorm sync group (input {tuple(x.shape)})."
            )
        global_mean = (counts * means).sum(0) / total
        global_var = (counts * (variances + (means - global_mean).pow(2))).sum(0) / total
        invstd = torch.rsqrt(global_var + eps)
        # y = x * scale + shift in one fused pass. Not F.batch_norm: under mixed precision x is
        # half while the statistics are float32 and weight/bias are the model's dtype, a mix
        # batch_norm refuses (CPU: "mixed dtype", CUDA: "Expected tensor ... same type").
        # The per-channel factors are float32, cast to x's dtype once; x keeps its memory format.
        shape = [1, c] + [1] * (x.dim() - 2)
        scale = invstd if weight is None else invstd * weight.to(stats_dtype)
        shift = -global_mean * scale if bias is None else bias.to(stats_dtype) - global_mean * scale
        y = torch.addcmul(shift.view(shape).to(x.dtype), x, scale.view(shape).to(x.dtype))
        unbiased_var = global_var * (total / (total - 1))
        ctx.save_for_backward(x, weight, global_mean, invstd, total)
        ctx.process_group = process_group
        ctx.mark_non_differentiable(global_mean, unbiased_var)
        return y, global_mean, unbiased_var

    @staticmethod
    @once_differentiable
    def backward(
        ctx: Any, grad_output: Tensor, _grad_mean: Tensor | None, _grad_var: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        x, weight, mean, invstd, total = ctx.saved_tensors
        c = x.shape[1]
        reduce_dims = [0, *range(2, x.dim())]
        shape = [1, c] + [1] * (x.dim() - 2)
        stats_dtype = mean.dtype
        dy = grad_output.to(stats_dtype)
        xmu = x.to(stats_dtype) - mean.view(shape)
        sum_dy = dy.sum(reduce_dims)
        sum_dy_xmu = (dy * xmu).sum(reduce_dims)
        grad_weight = (sum_dy_xmu * invstd).to(weight.dtype) if ctx.needs_input_grad[1] else None
        grad_bias = sum_dy.to(weight.dtype) if ctx.needs_input_grad[2] else None
        # Always all-reduce, even when this rank needs no input gradient: a collective skipped
        # on one rank only would hang the others.
        sums = torch.cat([sum_dy, sum_dy_xmu])
        dist.all_reduce(sums, group=ctx.process_group)
        grad_input = None
        if ctx.needs_input_grad[0]:
            mean_dy = (sums[:c] / total).view(shape)
            mean_dy_xmu = (sums[c:] / total).view(shape)
            scale = invstd if weight is None else invstd * weight.to(stats_dtype)
            grad_input = (dy - mean_dy - xmu * (invstd.pow(2).view(shape) * mean_dy_xmu)) * scale.view(shape)
            grad_input = grad_input.to(x.dtype)
        return grad_input, grad_weight, grad_bias, None, None, None
