"""The :class:`MultigridBatchNorm` layer: plain, split or synced statistics, chosen per step by two
plain attributes (the package docstring says why multigrid needs it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm

from lightning_multigrid._checks import check_int
from lightning_multigrid.norm.functional import (
    RaggedSplitBatchNorm,
    SyncBatchNorm,
    aggregate,
    is_channels_last,
    num_groups_for,
)
from lightning_multigrid.norm.groups import group_size_of

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["MultigridBatchNorm"]


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
        check_grouping(num_splits, process_group)
        self.num_splits = num_splits
        self.process_group = process_group

    @property
    def mode(self) -> Literal["plain", "split", "sync"]:
        """The current grouping: ``"plain"``, ``"split"`` or ``"sync"``."""
        if self.process_group is not None and group_size_of(self.process_group) > 1:
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
        check_grouping(self.num_splits, self.process_group)
        if self.process_group is not None:
            group_size = group_size_of(self.process_group)
            if group_size > 1:
                return self._forward_sync(input, self.process_group, group_size)
        num_groups = num_groups_for(input, self.num_splits)
        if num_groups == 1:
            return super().forward(input)
        return self._forward_split(input, num_groups)

    def extra_repr(self) -> str:
        grouping = f"num_splits={self.num_splits}"
        if self.process_group is not None:
            grouping += f", sync_group_size={group_size_of(self.process_group)}"
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
        if is_channels_last(input):
            # (N, C, *positions) stored as (N, *positions, C) (channels_last_3d, say): normalise
            # the (N, L, C) view and give the output the same layout, with no copy either way.
            # The grouped single batch_norm call below would need a copy into (N/k, k*C, L).
            x_last = input.movedim(1, -1).reshape(n, -1, c)
            y_last, mean_j, var_j = RaggedSplitBatchNorm.apply(
                x_last, self.weight, self.bias, num_groups, self.eps, True
            )
            if factor is not None:
                self._update_running_stats(*aggregate(mean_j, var_j), factor)
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
            # RaggedSplitBatchNorm), which costs no copies of the input.
            y, mean_j, var_j = RaggedSplitBatchNorm.apply(x, self.weight, self.bias, num_groups, self.eps, False)
            means, variances = (mean_j, var_j) if track else (None, None)
        if factor is not None and means is not None and variances is not None:
            self._update_running_stats(*aggregate(means, variances), factor)
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
        y, mean, var = SyncBatchNorm.apply(
            input, self.weight, self.bias, self.eps, process_group, group_size
        )
        if factor is not None:
            self._update_running_stats(mean, var, factor)
        return y


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


def check_grouping(num_splits: Any, process_group: Any) -> None:
    """Raise unless the grouping is one of plain, split (``num_splits > 1``) or sync (a group)."""
    check_int("num_splits", num_splits, 1)
    if num_splits > 1 and process_group is not None:
        raise ValueError(
            f"`num_splits`={num_splits} and a `process_group` were both set: a layer either "
            "splits its batch or syncs across ranks. Set `num_splits=1` or `process_group=None`."
        )
