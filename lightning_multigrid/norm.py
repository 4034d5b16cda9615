"""MultigridBatchNorm: BatchNorm whose statistics cover a fixed number of clips.

Multigrid changes the per-device batch by up to 8x (32x with the short cycle), but BatchNorm
should keep computing its statistics over about ``bn_base_size`` clips, or accuracy moves with the
schedule (Wu et al., CVPR 2020, Section 3.3). :class:`MultigridBatchNorm` is a drop-in for
``nn.BatchNorm1d/2d/3d`` whose grouping is two plain attributes that may change between any two
steps, without touching parameters, buffers or ``state_dict`` keys:

- ``num_splits = k > 1`` (*split*): statistics per interleaved group of the device's batch;
- ``process_group`` of ``g > 1`` ranks (*sync*): statistics over the union of their batches;
- neither (*plain*): exactly ``nn.BatchNorm``.

The reference implementation (PySlowFast ``SubBatchNorm3d``) bakes the split count into parameter
shapes, so it must rebuild the model and reload a checkpoint at every change; this module does not.

Example::

    model = convert_batchnorm(model)                    # once, before building the optimizer
    apply_bn_plan(model, BNPlan("split", num_splits=4))  # whenever the schedule says so
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.lazy import LazyModuleMixin

from lightning_multigrid.schedule import BNPlan

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = [
    "MultigridBatchNorm",
    "apply_bn_plan",
    "convert_batchnorm",
    "create_sync_groups",
    "get_sync_group",
    "revert_batchnorm",
]


class MultigridBatchNorm(_BatchNorm):
    r"""BatchNorm over fixed-size sub-batches: split the device's batch, or sync across ranks.

    A drop-in for ``nn.BatchNorm1d``, ``nn.BatchNorm2d`` and ``nn.BatchNorm3d``: it takes
    ``(N, C)``, ``(N, C, L)``, ``(N, C, H, W)`` or ``(N, C, T, H, W)`` input (video clips are
    ``(N, C, T, H, W)``) and has the same parameters, buffers and ``state_dict`` keys and shapes
    (``weight``, ``bias``, ``running_mean``, ``running_var``, ``num_batches_tracked``), so a
    checkpoint of the unconverted model loads into the converted one and back. It is a
    ``_BatchNorm`` subclass, so ``isinstance`` checks (e.g. "no weight decay on BatchNorm" rules)
    keep working.

    The grouping is read at every training forward pass from two plain attributes:

    - ``num_splits`` (``k``): when ``k > 1``, the batch is split into ``k`` interleaved groups,
      group ``j`` being samples ``j, j + k, j + 2k, ...`` (as in the paper and the reference
      implementation), and each group is normalised with its own statistics. Any batch size
      works: when ``k`` does not divide ``N`` the groups differ by at most one sample; when
      ``N < k`` only the ``N`` non-empty groups exist, one sample each (statistics over that
      clip's ``T*H*W`` positions). A group must have at least two values per channel, or its
      variance is undefined (``nn.BatchNorm`` raises on such a batch); for ``(N, C)`` input
      (one value per sample) the number of groups is therefore lowered to ``N // 2`` where
      needed, so no group has a single sample and nothing becomes NaN. When ``k`` divides
      ``N`` all groups are normalised by one ``batch_norm`` call, as fast as ``nn.BatchNorm``;
      unequal groups take about 1.6x as long.
    - ``process_group``: when set to a group of ``g > 1`` ranks, statistics are computed over the
      union of the batches of those ranks, with exact gradients (the input gradient includes the
      terms that flow through the shared mean and variance, as in ``nn.SyncBatchNorm``). Works on
      gloo (CPU) and NCCL. Get the group from :func:`get_sync_group`.

    Setting both is an error; setting neither (``num_splits=1``, ``process_group=None``) is
    exactly ``nn.BatchNorm``. :func:`apply_bn_plan` sets both for every layer of a model.

    The grouping applies to every training forward pass, with or without running statistics.
    In evaluation mode it is ignored and the layer is ``nn.BatchNorm``: it normalises
    with the running statistics (or, without them, with the statistics of the whole batch).

    Running statistics: one update per training step with the standard ``momentum``
    (``running = (1 - momentum) * running + momentum * batch_statistic``, or the cumulative
    average when ``momentum=None``), applied to the aggregate over the groups. In split mode,
    with per-group means ``mean_j`` and unbiased variances ``var_j``::

        mean = avg_j mean_j
        var  = avg_j var_j + avg_j (mean_j - mean)^2

    which for ``k = 1`` is ``nn.BatchNorm``'s update. (Ghost-BatchNorm implementations that
    update once per group must rescale ``momentum``; this one does not.) In sync mode the
    statistics are those of the union of the ranks' batches, identical on every rank of the group.

    Args:
        num_features: channels ``C``.
        eps: added to the variance for numerical stability.
        momentum: running-statistics factor, or ``None`` for a cumulative average.
        affine: learn a per-channel ``weight`` and ``bias``.
        track_running_stats: keep running statistics for evaluation.
        num_splits: initial number of groups of the device's batch (``>= 1``).
        process_group: initial group of ranks to sync statistics over, or ``None``.
        device: device of the parameters and buffers.
        dtype: dtype of the parameters and buffers.

    Example::

        bn = MultigridBatchNorm(64)
        bn.num_splits = 4          # 4 groups from the next step on
        y = bn(torch.randn(32, 64, 8, 56, 56))
    """

    num_splits: int
    process_group: ProcessGroup | None

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        num_splits: int = 1,
        process_group: ProcessGroup | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        self.set_grouping(num_splits, process_group)

    @classmethod
    def from_batchnorm(cls, bn: _BatchNorm) -> MultigridBatchNorm:
        """A ``MultigridBatchNorm`` sharing ``bn``'s Parameter and buffer objects.

        Optimizers holding ``bn``'s parameters keep working. ``bn`` itself is remembered (outside
        ``state_dict`` and ``modules()``) so :meth:`to_batchnorm` gives it back.
        """
        # Built on the meta device: every tensor is replaced by bn's own right after.
        new = cls(
            bn.num_features,
            eps=bn.eps,
            momentum=bn.momentum,
            affine=bn.affine,
            track_running_stats=bn.track_running_stats,
            device="meta",
        )
        _move_tensors(bn, new)
        new.train(bn.training)
        # A plain attribute, not a submodule: it must not appear in modules(), parameters() or
        # state_dict(), or the converted model's checkpoint keys would change.
        new.__dict__["_original_bn"] = bn
        return new

    def to_batchnorm(self) -> _BatchNorm:
        """The BatchNorm this layer replaced (or a new any-dimension one), with this layer's tensors.

        The current Parameter and buffer objects are put (back) into it, so changes made since
        the conversion (training, ``.to(device)``, loading a checkpoint) carry over.
        """
        original: _BatchNorm | None = self.__dict__.get("_original_bn")
        if original is None:
            original = _BatchNormXd(
                self.num_features, self.eps, self.momentum, self.affine, self.track_running_stats,
                device="meta",
            )
        _move_tensors(self, original)
        original.train(self.training)
        return original

    def set_grouping(self, num_splits: int = 1, process_group: ProcessGroup | None = None) -> None:
        """Set the grouping used from the next training step on (see the class docstring).

        Raises:
            ValueError: when ``num_splits`` is not an integer ``>= 1``, or both ``num_splits > 1``
                and a ``process_group`` are given.
        """
        _check_grouping(num_splits, process_group)
        self.num_splits = num_splits
        self.process_group = process_group

    @property
    def mode(self) -> Literal["plain", "split", "sync"]:
        """The current grouping: ``"plain"``, ``"split"`` or ``"sync"``."""
        if self.process_group is not None and _group_size(self.process_group) > 1:
            return "sync"
        return "split" if self.num_splits > 1 else "plain"

    def _check_input_dim(self, input: Tensor) -> None:
        if not 2 <= input.dim() <= 5:
            raise ValueError(
                f"MultigridBatchNorm expects (N, C), (N, C, L), (N, C, H, W) or (N, C, T, H, W) "
                f"input, got {input.dim()}D input of shape {tuple(input.shape)}."
            )

    def forward(self, input: Tensor) -> Tensor:
        self._check_input_dim(input)
        if not self.training:
            return super().forward(input)
        _check_grouping(self.num_splits, self.process_group)
        if self.process_group is not None:
            group_size = _group_size(self.process_group)
            if group_size > 1:
                return self._forward_sync(input, self.process_group, group_size)
        num_groups = _num_groups(input, self.num_splits)
        if num_groups == 1:
            return super().forward(input)
        return self._forward_split(input, num_groups)

    def extra_repr(self) -> str:
        grouping = f"num_splits={self.num_splits}"
        if self.process_group is not None:
            grouping += f", sync_group_size={_group_size(self.process_group)}"
        return f"{super().extra_repr()}, {grouping}"

    def _count_step(self) -> float | None:
        """Count a training step; the running-statistics factor, or ``None`` if none are kept.

        Mirrors ``_BatchNorm.forward`` so ``momentum`` and ``num_batches_tracked`` mean the same.
        """
        if not self.track_running_stats or self.running_mean is None or self.running_var is None:
            return None
        factor = 0.0 if self.momentum is None else self.momentum
        if self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        return factor

    @torch.no_grad()
    def _update_running_stats(self, mean: Tensor, var: Tensor, factor: float) -> None:
        assert self.running_mean is not None and self.running_var is not None
        self.running_mean.mul_(1.0 - factor).add_(mean.to(self.running_mean.dtype), alpha=factor)
        self.running_var.mul_(1.0 - factor).add_(var.to(self.running_var.dtype), alpha=factor)

    def _forward_split(self, input: Tensor, num_groups: int) -> Tensor:
        factor = self._count_step()
        track = factor is not None
        n, c = input.shape[:2]
        if _is_channels_last(input):
            # (N, C, *positions) stored as (N, *positions, C) (channels_last_3d, say): normalise
            # the (N, L, C) view and give the output the same layout, with no copy either way.
            # The grouped single batch_norm call below would need a copy into (N/k, k*C, L).
            x_last = input.movedim(1, -1).reshape(n, -1, c)
            y_last, mean_j, var_j = _RaggedSplitBatchNorm.apply(
                x_last, self.weight, self.bias, num_groups, self.eps, True
            )
            if factor is not None:
                self._update_running_stats(*_aggregate(mean_j, var_j), factor)
            return y_last.view(n, *input.shape[2:], c).movedim(-1, 1)
        # Flatten the positions so the group layout below is the same for 2D to 5D input (a view
        # for contiguous input).
        x = input.reshape(n, c, -1).contiguous()
        length = x.shape[2]
        q, r = divmod(n, num_groups)
        if r == 0:
            # Sample i*k + j sits at [i, j]: (N, C, L) -> (N/k, k*C, L) puts interleaved group j
            # in channels j*C .. j*C + C-1, so ONE batch_norm call normalises every group (as
            # fast as nn.BatchNorm, same backward kernel).
            y, means, variances = self._grouped_batch_norm(x.view(q, num_groups * c, length), num_groups, track)
        else:
            # Groups of unequal size (q+1 and q samples) cannot share one batch_norm call; the
            # statistics are combined from per-sample partial ones instead (see
            # _RaggedSplitBatchNorm), which costs no copies of the input.
            y, mean_j, var_j = _RaggedSplitBatchNorm.apply(x, self.weight, self.bias, num_groups, self.eps, False)
            means, variances = (mean_j, var_j) if track else (None, None)
        if factor is not None and means is not None and variances is not None:
            self._update_running_stats(*_aggregate(means, variances), factor)
        return y.reshape(input.shape)

    def _grouped_batch_norm(
        self, x: Tensor, num_groups: int, track: bool
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Normalise ``x`` of shape ``(M, num_groups * C, L)`` per channel block.

        Returns the output and, when ``track``, the per-group means and unbiased variances,
        each ``(num_groups, C)``.
        """
        c = self.num_features
        means: Tensor | None = None
        variances: Tensor | None = None
        if track:
            assert self.running_mean is not None
            # With momentum 1 and zero-initialised buffers, batch_norm writes the batch mean and
            # unbiased variance of each channel into them exactly (1 * stat + 0 * 0), computed in
            # the same pass as the output: no second pass over the input for the statistics.
            means = torch.zeros(num_groups * c, device=x.device, dtype=self.running_mean.dtype)
            variances = torch.zeros_like(means)
        weight = self.weight.repeat(num_groups) if self.weight is not None else None
        bias = self.bias.repeat(num_groups) if self.bias is not None else None
        y = F.batch_norm(x, means, variances, weight, bias, True, 1.0, self.eps)
        if means is not None and variances is not None:
            return y, means.view(num_groups, c), variances.view(num_groups, c)
        return y, None, None

    def _forward_sync(self, input: Tensor, process_group: ProcessGroup, group_size: int) -> Tensor:
        factor = self._count_step()
        y, mean, var = _SyncBatchNormFunction.apply(
            input, self.weight, self.bias, self.eps, process_group, group_size
        )
        if factor is not None:
            self._update_running_stats(mean, var, factor)
        return y


def _group_sum(values: Tensor, num_groups: int) -> Tensor:
    """Sum ``(N, C)`` per-sample values over interleaved groups (sample ``n`` in group
    ``n % num_groups``): ``(num_groups, C)``. Zero-padding to whole rows keeps it deterministic
    (unlike ``index_add_``, which uses atomics on CUDA)."""
    n, c = values.shape
    pad = -n % num_groups
    if pad:
        values = torch.cat([values, values.new_zeros(pad, c)])
    return values.view(-1, num_groups, c).sum(0)


@torch.no_grad()
def _aggregate(means: Tensor, variances: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and variance over the groups from per-group ``(num_groups, C)`` ones (class docstring)."""
    mean = means.mean(0)
    return mean, variances.mean(0) + (means - mean).pow(2).mean(0)


def _is_channels_last(input: Tensor) -> bool:
    """Whether ``(N, C, ...)`` input is stored channels-last (``(N, ..., C)`` contiguous), not NC..."""
    return input.dim() >= 3 and not input.is_contiguous() and input.movedim(1, -1).is_contiguous()


def _per_sample(values: Tensor, n: int, position_dim: int = 2) -> Tensor:
    """Broadcast per-group ``(num_groups, C)`` values to the ``n`` samples: ``(n, C, 1)``, or
    ``(n, 1, C)`` with ``position_dim=1``."""
    num_groups = values.shape[0]
    return values.repeat(-(-n // num_groups), 1)[:n].unsqueeze(position_dim)


class _RaggedSplitBatchNorm(torch.autograd.Function):
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
        samples = _group_sum(torch.ones(n, 1, device=x.device, dtype=stats_dtype), num_groups)  # (k, 1)
        mean = _group_sum(sample_mean, num_groups) / samples
        deviation = (sample_mean - _per_sample(mean, n).squeeze(2)).pow(2)
        var = _group_sum(sample_var + deviation, num_groups) / samples  # biased, (k, C)
        invstd = torch.rsqrt(var + eps)
        scale = invstd if weight is None else invstd * weight.to(stats_dtype)
        shift = -mean * scale if bias is None else bias.to(stats_dtype) - mean * scale
        y = torch.addcmul(
            _per_sample(shift, n, position_dim).to(x.dtype), x, _per_sample(scale, n, position_dim).to(x.dtype)
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
        sum_dy = _group_sum(dy.sum(position_dim).to(stats_dtype), num_groups)  # (k, C)
        # Sum over positions of dy * x without a full-size temporary (a batched dot product);
        # subtracting mean * sum(dy) afterwards loses float32 digits only when |mean| is many
        # times the standard deviation, which BatchNorm inputs after a conv rarely are.
        equation = "nlc,nlc->nc" if position_dim == 1 else "ncl,ncl->nc"
        sum_dy_x = _group_sum(torch.einsum(equation, dy, x).to(stats_dtype), num_groups)
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
                _per_sample(d, n, position_dim).to(x.dtype), x, _per_sample(b, n, position_dim).to(x.dtype)
            )
            grad_input.addcmul_(dy, _per_sample(a, n, position_dim).to(x.dtype))
        return grad_input, grad_weight, grad_bias, None, None, None


class _BatchNormXd(_BatchNorm):
    """Plain BatchNorm for 2D to 5D input: what :meth:`MultigridBatchNorm.to_batchnorm` gives a
    layer that was not converted from an existing BatchNorm (its input rank is unknown)."""

    def _check_input_dim(self, input: Tensor) -> None:
        if not 2 <= input.dim() <= 5:
            raise ValueError(f"BatchNorm expects 2D to 5D input, got {input.dim()}D input.")


def _move_tensors(source: _BatchNorm, target: _BatchNorm) -> None:
    """Put ``source``'s Parameter and buffer objects (not copies) into ``target``."""
    for name in ("weight", "bias"):
        setattr(target, name, getattr(source, name))
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        setattr(target, name, getattr(source, name))


def _check_grouping(num_splits: Any, process_group: Any) -> None:
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1:
        raise ValueError(f"`num_splits` must be an integer >= 1, got {num_splits!r}.")
    if num_splits > 1 and process_group is not None:
        raise ValueError(
            f"`num_splits`={num_splits} and a `process_group` were both set: a layer either "
            "splits its batch or syncs across ranks. Set `num_splits=1` or `process_group=None`."
        )


def _num_groups(input: Tensor, num_splits: int) -> int:
    """Groups actually formed for ``input``: never empty, never one value per channel."""
    if num_splits == 1:
        return 1
    n = input.shape[0]
    values_per_sample = math.prod(input.shape[2:])
    # A group needs at least two values per channel for a variance; with one value per sample
    # ((N, C) input) that means at least two samples per group.
    min_samples = 2 if values_per_sample == 1 else 1
    return max(1, min(num_splits, n // min_samples))


def _group_size(process_group: ProcessGroup) -> int:
    return dist.get_world_size(process_group)


class _SyncBatchNormFunction(torch.autograd.Function):
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


# Process groups per sync group size, valid for one default ("world") process group.
_SYNC_GROUPS: dict[int, Any] = {}
_SYNC_GROUPS_WORLD: list[Any] = [None]


def get_sync_group(group_size: int) -> ProcessGroup | None:
    """This rank's process group of ``group_size`` consecutive ranks (created once, then cached).

    Ranks ``[0, g)``, ``[g, 2g)``, ... form the groups. The first call for a ``group_size`` is a
    collective (``torch.distributed.new_group`` must run on every rank, in the same order):
    call it on all ranks at the same point, or create every size up front with
    :func:`create_sync_groups`. Later calls only look the group up. The cache is dropped when the
    default process group changes (``destroy_process_group`` and a new ``init_process_group``).

    Args:
        group_size: ranks per group; ``1`` means no sync and returns ``None``.

    Raises:
        ValueError: when ``group_size`` is not a positive integer, ``torch.distributed`` is not
            initialised or has one rank (and ``group_size > 1``), or ``group_size`` does not
            divide the world size.
    """
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"`group_size` must be an integer >= 1, got {group_size!r}.")
    if group_size == 1:
        return None
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            f"BatchNorm sync over `group_size`={group_size} ranks needs torch.distributed, which is "
            "not initialised. Run with several processes (e.g. Trainer(strategy='ddp', devices=N)) "
            "or use a plan without sync (`BNPlan('plain')` or `BNPlan('split', num_splits=k)`)."
        )
    world_size = dist.get_world_size()
    if world_size == 1:
        raise ValueError(
            f"BatchNorm sync over `group_size`={group_size} ranks, but torch.distributed has a "
            "single rank. Run with several processes or use a plan without sync (`BNPlan('plain')` "
            "or `BNPlan('split', num_splits=k)`)."
        )
    if world_size % group_size:
        raise ValueError(
            f"BatchNorm sync over `group_size`={group_size} ranks needs a world size that is a "
            f"multiple of it, got world size {world_size}. Choose a group size that divides the "
            "number of ranks (the multigrid schedule does, when built with the right `devices`)."
        )
    world = dist.group.WORLD
    if _SYNC_GROUPS_WORLD[0] is not world:
        _SYNC_GROUPS.clear()
        _SYNC_GROUPS_WORLD[0] = world
    if group_size not in _SYNC_GROUPS:
        if group_size == world_size:
            _SYNC_GROUPS[group_size] = world
        else:
            rank = dist.get_rank()
            mine = None
            for start in range(0, world_size, group_size):
                ranks = list(range(start, start + group_size))
                group = dist.new_group(ranks)
                if rank in ranks:
                    mine = group
            _SYNC_GROUPS[group_size] = mine
    return _SYNC_GROUPS[group_size]


def create_sync_groups(group_sizes: Iterable[int]) -> None:
    """Create the process groups for every size in ``group_sizes`` (collective, all ranks).

    Sizes are created in increasing order, so the same call on every rank creates them in the
    same order whatever order they are given in. Sizes already created are skipped.

    Raises:
        ValueError: as :func:`get_sync_group`.
    """
    for group_size in sorted(set(group_sizes)):
        get_sync_group(group_size)


def apply_bn_plan(module: nn.Module, plan: BNPlan) -> int:
    """Set the grouping of every :class:`MultigridBatchNorm` in ``module`` from ``plan``.

    ``plain``: ``nn.BatchNorm``; ``split``: ``plan.num_splits`` interleaved groups of the device's
    batch; ``sync``: the batches of ``plan.group_size`` consecutive ranks (the process group comes
    from :func:`get_sync_group`; its first use for a size is a collective, so call this on every
    rank, or create the groups beforehand with :func:`create_sync_groups`).

    Returns:
        How many layers were configured (0 when the model has not been converted).

    Raises:
        ValueError: when the plan is invalid, or asks for sync over more than one rank while
            ``torch.distributed`` is not initialised or has a single rank.
    """
    if plan.mode == "plain":
        num_splits, process_group = 1, None
    elif plan.mode == "split":
        num_splits, process_group = plan.num_splits, None
    elif plan.mode == "sync":
        num_splits, process_group = 1, get_sync_group(plan.group_size)
    else:
        raise ValueError(f"`plan.mode` must be 'plain', 'split' or 'sync', got {plan.mode!r}.")
    _check_grouping(num_splits, process_group)
    count = 0
    for layer in module.modules():
        if isinstance(layer, MultigridBatchNorm):
            layer.set_grouping(num_splits, process_group)
            count += 1
    return count


def convert_batchnorm(module: nn.Module, exclude: Iterable[str] | str | None = None) -> nn.Module:
    """Replace every BatchNorm layer of ``module`` with a :class:`MultigridBatchNorm`.

    Converted: ``nn.BatchNorm1d/2d/3d``, other ``_BatchNorm`` subclasses that keep its
    ``forward`` (e.g. Lightning's reverted sync layers), and ``nn.SyncBatchNorm`` (whose
    whole-group sync would defeat the fixed statistics size; :func:`revert_batchnorm` restores it
    with its process group). The new layers share the old ones' Parameter and buffer objects, so
    optimizers built before keep working and ``state_dict`` keys and shapes do not change.
    Forward hooks on the old layers are not carried over.

    Left alone: other norms (``LayerNorm``, ``GroupNorm``, ``InstanceNorm*``: their statistics
    do not depend on the batch), layers already converted, and ``_BatchNorm`` subclasses with
    their own ``forward`` (their behaviour cannot be reproduced; a warning names them).

    Args:
        module: the model, changed in place; if it is itself a BatchNorm, the replacement is
            returned.
        exclude: qualified names (as in ``module.named_modules()``, e.g. ``"head.norm"``) of
            modules to leave alone, with everything inside them; a single string is one name.

    Returns:
        ``module`` (or its replacement).

    Raises:
        ValueError: when a name in ``exclude`` is not a module of ``module``, or a lazy
            BatchNorm has not been initialised by a forward pass yet.
    """
    excluded = _excluded_names(module, exclude)

    def convert(layer: nn.Module, name: str) -> nn.Module:
        if name in excluded:
            return layer
        new = layer
        if isinstance(layer, _BatchNorm) and not isinstance(layer, MultigridBatchNorm):
            if isinstance(layer, LazyModuleMixin) and layer.has_uninitialized_params():
                raise ValueError(
                    f"`{name or type(layer).__name__}` is a lazy BatchNorm that has not seen "
                    "input yet. Run one forward pass before `convert_batchnorm`."
                )
            if _keeps_batchnorm_forward(layer):
                new = MultigridBatchNorm.from_batchnorm(layer)
            else:
                warnings.warn(
                    f"`{name or type(layer).__name__}` ({type(layer).__name__}) has its own "
                    "forward(): left as is, so it does not follow the multigrid BatchNorm plan. "
                    "Pass its name in `exclude` to silence this.",
                    UserWarning,
                    stacklevel=3,
                )
        for child_name, child in layer.named_children():
            converted = convert(child, f"{name}.{child_name}" if name else child_name)
            if converted is not child or new is not layer:
                new.add_module(child_name, converted)
        return new

    return convert(module, "")


def revert_batchnorm(module: nn.Module) -> nn.Module:
    """Undo :func:`convert_batchnorm`: every :class:`MultigridBatchNorm` becomes the layer it replaced.

    The restored layers get the current Parameter and buffer objects, so training progress and
    ``state_dict`` keys carry over. A ``MultigridBatchNorm`` built directly (not converted)
    becomes a plain BatchNorm that accepts 2D to 5D input.

    Args:
        module: the model, changed in place; if it is itself a ``MultigridBatchNorm``, the
            replacement is returned.

    Returns:
        ``module`` (or its replacement).
    """
    new = module.to_batchnorm() if isinstance(module, MultigridBatchNorm) else module
    for name, child in module.named_children():
        reverted = revert_batchnorm(child)
        if reverted is not child or new is not module:
            new.add_module(name, reverted)
    return new


def _keeps_batchnorm_forward(layer: _BatchNorm) -> bool:
    forward = type(layer).forward
    return forward is _BatchNorm.forward or forward is nn.SyncBatchNorm.forward


def _excluded_names(module: nn.Module, exclude: Iterable[str] | str | None) -> set[str]:
    if exclude is None:
        return set()
    names = {exclude} if isinstance(exclude, str) else set(exclude)
    if not all(isinstance(name, str) for name in names):
        raise TypeError(f"`exclude` must be module names (strings), got {sorted(map(repr, names))}.")
    unknown = names - {name for name, _ in module.named_modules()}
    if unknown:
        raise ValueError(
            f"`exclude` names modules that are not in the model: {sorted(unknown)}. Use qualified "
            "names as listed by `model.named_modules()`, e.g. 'blocks.5.norm'."
        )
    return names
