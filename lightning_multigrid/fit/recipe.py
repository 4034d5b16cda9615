"""The optimisation of the multigrid paper's baselines, as ``VideoClassifier`` builds it: one value.

SGD with momentum (or AdamW, the usual choice for transformers), weight decay on weights only,
linear warm-up, then step decay per epoch. :class:`OptimizerRecipe` holds ``VideoClassifier``'s
optimisation options, checks them once, and builds the optimizer and the LR scheduler; the module
keeps them flat in its signature (LightningCLI's ``--model.lr``) and in its hyper-parameters.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, fields
from typing import Any, Literal

import torch
from torch import nn
from torch.optim.lr_scheduler import LinearLR, LRScheduler, MultiStepLR, SequentialLR

from lightning_multigrid._checks import check_int, check_positive_number
from lightning_multigrid.schedule.config import check_milestones

__all__ = ["NO_DECAY_NAMES", "OPTIMIZERS", "OptimizerRecipe", "check_same_optimizer", "decays"]

# Optimizers that `VideoClassifier(optimizer=...)` builds.
OPTIMIZERS = ("sgd", "adamw")
# Parameters that get no weight decay whatever their shape: transformers' position tables (Swin's
# relative-position bias, MViT's positional embeddings and relative-position tables, torchvision's
# `pos_encoding.*` and the reference code's `pos_embed*`, `rel_pos_*`) and class tokens.
NO_DECAY_NAMES = ("relative_position_bias_table", "pos_embed", "rel_pos_", "pos_encoding.", "cls_token", "class_token")
# What each optimizer keeps per parameter (for the message of check_same_optimizer).
_OPTIMIZER_STATE = {"sgd": "momentum buffers", "adamw": "step counts and moment estimates"}


@dataclass(frozen=True, slots=True)
class OptimizerRecipe:
    """``VideoClassifier``'s optimisation options (its arguments of the same names describe each).

    Raises:
        ValueError: naming the option, its constraint and its value.
    """

    lr: float
    optimizer: Literal["sgd", "adamw"]
    momentum: float
    nesterov: bool
    weight_decay: float
    warmup_epochs: int
    warmup_start_factor: float
    milestones: Sequence[int]  # a tuple once built
    gamma: float
    backbone_lr_factor: float

    def __post_init__(self) -> None:
        check_int("warmup_epochs", self.warmup_epochs, 0)
        if not isinstance(self.optimizer, str) or self.optimizer not in OPTIMIZERS:
            raise ValueError(f"`optimizer` must be one of {', '.join(map(repr, OPTIMIZERS))}, got {self.optimizer!r}.")
        check_positive_number("lr", self.lr)
        check_positive_number("gamma", self.gamma)
        for name in ("momentum", "weight_decay"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"`{name}` must be a number >= 0, got {value!r}.")
        if self.nesterov and self.optimizer == "sgd" and self.momentum <= 0:
            raise ValueError(
                f"`nesterov=True` needs `momentum` > 0, got momentum={self.momentum!r}: set a momentum or `nesterov=False`."
            )
        factor = self.warmup_start_factor
        if not isinstance(factor, (int, float)) or not 0 < factor <= 1:
            raise ValueError(f"`warmup_start_factor` must be in (0, 1], got {factor!r}.")
        factor = self.backbone_lr_factor
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
            raise ValueError(
                f"`backbone_lr_factor` must be a number > 0, got {factor!r} (to freeze the backbone, "
                "set `requires_grad=False` on its parameters)."
            )
        milestones = tuple(self.milestones)
        check_milestones(milestones)  # the schedule's rule; and after the warm-up, which the scheduler runs first
        if milestones and milestones[0] <= self.warmup_epochs:
            raise ValueError(
                f"`milestones` must come after the warm-up: the first is {milestones[0]} but `warmup_epochs`="
                f"{self.warmup_epochs}. Move the milestones later or shorten the warm-up."
            )
        object.__setattr__(self, "milestones", milestones)

    @classmethod
    def from_hparams(cls, hparams: Mapping[str, Any]) -> OptimizerRecipe:
        """The recipe of a module's hyper-parameters (as Lightning's LR finder leaves them)."""
        return cls(**{f.name: hparams[f.name] for f in fields(cls)})

    def parameter_groups(self, named_parameters: Iterable[tuple[str, nn.Parameter]], head: Set[str]) -> list[dict[str, Any]]:
        """The optimizer's parameter groups: ``decay`` and ``no_decay`` (:func:`decays`), trainable parameters only.

        With ``backbone_lr_factor`` != 1: ``head/decay``, ``head/no_decay`` (the parameters named in ``head``, at
        ``lr``) and ``backbone/decay``, ``backbone/no_decay`` (the rest, at ``lr * backbone_lr_factor``).
        """
        factor = self.backbone_lr_factor
        groups: dict[tuple[str, bool], list[nn.Parameter]] = {}
        for name, parameter in named_parameters:
            if parameter.requires_grad:
                part = "" if factor == 1 else ("head/" if name in head else "backbone/")
                groups.setdefault((part, decays(name, parameter)), []).append(parameter)
        return [
            {
                "name": f"{part}{'decay' if decaying else 'no_decay'}",
                "params": params,
                "weight_decay": self.weight_decay if decaying else 0.0,
                **({"lr": self.lr * factor} if part == "backbone/" else {}),
            }
            for (part, decaying), params in sorted(groups.items(), key=lambda item: (item[0][0], not item[0][1]))
        ]

    def build_optimizer(self, groups: Iterable[dict[str, Any]]) -> torch.optim.Optimizer:
        """SGD with (Nesterov) momentum, or AdamW with betas ``(0.9, 0.999)``, over parameter groups."""
        if self.optimizer == "adamw":
            return torch.optim.AdamW(groups, lr=self.lr, betas=(0.9, 0.999))
        return torch.optim.SGD(groups, lr=self.lr, momentum=self.momentum, nesterov=self.nesterov)

    def build_scheduler(self, optimizer: torch.optim.Optimizer) -> LRScheduler:
        """Per-epoch linear warm-up, then ``MultiStepLR`` at :attr:`milestones`.

        Without warm-up a ``MultiStepLR`` with the absolute milestones; with it, a
        ``SequentialLR([LinearLR, MultiStepLR], milestones=[warmup_epochs])`` whose ``MultiStepLR``
        milestones are shifted by ``-warmup_epochs``, as it starts counting when the warm-up ends. Both
        give the LR of epoch ``e``: ``lr * gamma ** (milestones <= e)``, ramped linearly from
        ``lr * warmup_start_factor`` during the warm-up.
        """
        warmup = self.warmup_epochs
        steps = MultiStepLR(optimizer, milestones=[m - warmup for m in self.milestones], gamma=self.gamma)
        if warmup == 0:
            return steps
        ramp = LinearLR(optimizer, start_factor=self.warmup_start_factor, end_factor=1.0, total_iters=warmup)
        return SequentialLR(optimizer, [ramp, steps], milestones=[warmup])


def decays(name: str, parameter: nn.Parameter) -> bool:
    """Whether weight decay applies: weights of two or more dimensions, not position tables (:data:`NO_DECAY_NAMES`)."""
    return parameter.ndim > 1 and not any(key in name for key in NO_DECAY_NAMES)


def check_same_optimizer(checkpoint: dict[str, Any], optimizer: str, path: Any) -> None:
    """Raise when a checkpoint of a fit with another ``optimizer`` is resumed (its state would not fit).

    Raises:
        ValueError: naming both optimizers and the fix.
    """
    saved = checkpoint.get("hyper_parameters", {}).get("optimizer", "sgd")
    if saved == optimizer:
        return
    raise ValueError(
        f"VideoClassifier(optimizer={optimizer!r}) cannot resume the checkpoint {path}: it was trained with "
        f"`optimizer`={saved!r}, whose state ({_OPTIMIZER_STATE.get(saved, 'its buffers')}) does not fit {optimizer!r}. "
        f"Resume with `optimizer={saved!r}`; to go on with {optimizer!r}, start a new fit from the checkpoint's weights: "
        f"`VideoClassifier.load_from_checkpoint(path, optimizer={optimizer!r})`, then `fit` without `ckpt_path`."
    )
