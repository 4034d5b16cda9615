"""``VideoClassifier``: a LightningModule for video classification that takes any grid.

The backbone comes by name (see :data:`~lightning_multigrid.models.BACKBONES`) or as an
``nn.Module``; either way its head pooling is made adaptive, so every step may bring a different
batch size, number of frames and crop (the module itself never assumes a shape). Optimisation is
the recipe of the multigrid paper's baselines (:class:`~lightning_multigrid.fit.recipe.OptimizerRecipe`):
SGD with momentum (or AdamW, ``optimizer="adamw"``, the usual choice for transformers), weight decay
on weights only, linear warm-up, then step decay per epoch.

Batches are dicts:

- ``"video"``: float ``(N, C, T, H, W)``, or ``[slow, fast]`` for a two-pathway backbone (a single
  tensor is split into pathways with ``slowfast_alpha``);
- ``"label"``: ``(N,)`` class indices, or ``(N, num_classes)`` multi-hot floats with
  ``multi_label=True``;
- ``"index"``: ``(N,)`` video index, needed in test to average the views of a video (and,
  optionally, ``"view"``: ``(N,)`` view index within the video, to drop views that a distributed
  sampler repeated to pad its shards).

Logged: ``train/loss`` (on logging steps, the last step of an epoch, and every step while a
progress bar shows it); ``val/loss`` and ``val/top1``, ``val/top5`` (or ``val/map``); per view
``test/loss``, per video ``test/top1``, ``test/top5`` (or ``test/map``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

import torch
from torch import nn
from torch.nn import functional as F
from torchmetrics.classification import MulticlassAccuracy, MultilabelAveragePrecision
from torchmetrics.functional.classification import multiclass_accuracy, multilabel_average_precision
from typing_extensions import override

from lightning_multigrid._checks import check_bool, check_int, plain_value
from lightning_multigrid._internals import is_logging_step, mark_dynamic_dims, raise_recompile_limit
from lightning_multigrid._lightning import pl, warn_if_the_other_package_is_imported
from lightning_multigrid.contracts import PathwayDataModule
from lightning_multigrid.fit.multiview import VideoPredictions, aggregate_views
from lightning_multigrid.fit.recipe import OptimizerRecipe, check_same_optimizer
from lightning_multigrid.models import (
    BACKBONES,
    TWO_PATHWAY_BACKBONES,
    LoadedWeights,
    build_backbone,
    check_slowfast_alpha,
    classifier_keys,
    load_weights,
    make_multigrid_compatible,
    preflight,
    slowfast_pathways,
)

__all__ = ["VideoClassifier", "VideoPredictions", "aggregate_views"]


# The dimensions of an (N, C, T, H, W) clip that change from grid to grid.
GRID_DIMS = (0, 2, 3, 4)
# Graphs kept per function with `compile="per_grid"`: a schedule's distinct grids (about 12) and room.
PER_GRID_RECOMPILE_LIMIT = 32


class VideoClassifier(pl.LightningModule):
    """Video classification that trains on any grid: the LightningModule for multigrid training.

    Args:
        num_classes: number of classes (labels, with ``multi_label``).
        backbone: a name from :data:`~lightning_multigrid.models.BACKBONES` (randomly
            initialised: ``tiny``, ``tiny_swin3d``, ``x3d_xs``, ``x3d_s``, ``x3d_m``, ``slow_r50``,
            ``slowfast_r50``, ``i3d_r50``, ``r3d_18``, ``mc3_18``, ``r2plus1d_18``, ``s3d``, the
            transformers ``swin3d_t``, ``mvit_v1_b``, ``mvit_v2_s``), or an
            ``nn.Module`` mapping a clip to ``(N, num_classes)`` logits. A module is made
            multigrid-compatible in place and not saved in the hyper-parameters (pass it again to
            ``load_from_checkpoint``).
        multi_label: multi-hot labels and binary cross-entropy with logits (and ``map`` metrics)
            instead of class indices and cross-entropy.
        lr: base learning rate (for the baseline batch size; the multigrid callback scales it).
        optimizer: ``"sgd"`` (momentum SGD, the multigrid paper's recipe) or ``"adamw"``
            (``torch.optim.AdamW``, betas ``(0.9, 0.999)``, decoupled weight decay: the usual
            choice for transformers, typically with ``lr`` about ``1e-3`` and ``weight_decay``
            about ``0.05``). Warm-up, step decay and the multigrid callback's LR scaling are the
            same for both.
        momentum: SGD momentum (unused with AdamW).
        nesterov: use Nesterov momentum (SGD; unused with AdamW).
        weight_decay: weight decay on weights (SGD: L2 penalty; AdamW: decoupled); norm
            parameters, biases (parameters with at most one dimension) and transformers' position
            tables (:data:`~lightning_multigrid.fit.recipe.NO_DECAY_NAMES`) get none.
        warmup_epochs: epochs of linear warm-up, 0 for none.
        warmup_start_factor: LR factor of the first warm-up epoch, in ``(0, 1]``.
        milestones: absolute epochs (0-based, counted from the start of training, warm-up
            included) where the LR is multiplied by ``gamma``; strictly increasing and after the
            warm-up. See :attr:`lr_milestones`.
        gamma: LR decay at each milestone.
        dropout_rate: dropout before the classifier of a named backbone.
        tiny_width: stem width of the ``tiny`` backbone, patch-embedding width of ``tiny_swin3d``.
        slowfast_alpha: frame-rate ratio of a two-pathway backbone: a ``(N, C, T, H, W)`` video
            becomes ``[video[:, :, ::alpha], video]`` (slow, fast). Default: 4 for ``slowfast_r50``,
            no split otherwise; set it for a two-pathway ``nn.Module`` backbone.
        weights: pretrained weights for the backbone, loaded here (errors come now, not at fit):
            a torchvision name for its video models (``"KINETICS400_V1"`` for ``r3d_18``,
            ``mc3_18``, ``r2plus1d_18``, ``s3d``, ``swin3d_t``, ``mvit_v1_b``, ``mvit_v2_s``;
            ``"DEFAULT"``), ``"KINETICS400"`` (the
            pytorchvideo hub's checkpoint) for ``x3d_xs``, ``x3d_s``, ``x3d_m``, ``slow_r50``,
            ``slowfast_r50``, ``i3d_r50``, or the path of a state-dict or checkpoint file (also for
            an ``nn.Module`` backbone). Names download once into ``torch.hub``'s cache. The
            classifier stays new, sized for ``num_classes``; :attr:`loaded_weights` says what was
            loaded and what was left new (also logged). ``load_from_checkpoint`` loads them again
            before the checkpoint's: pass ``weights=None`` there to skip that.
        backbone_lr_factor: the backbone's learning rate relative to ``lr`` (the classifier's), a
            common fine-tuning setting (e.g. 0.1); 1 trains everything at ``lr``.
        compile: compile the backbone with ``torch.compile`` so that the dozen grids of a multigrid
            run do not each recompile it. ``"dynamic"`` (or ``True``): batch, frames and crop are
            marked dynamic, one graph serves every grid (a second compile where a size is 1, which
            torch always specialises); ``"per_grid"``: one static graph per grid (about 12
            compiles, each as long as the first; the recompile limit is raised to
            :data:`PER_GRID_RECOMPILE_LIMIT` for the whole process). Compile time is paid in the
            first steps of each new grid; ``docs/trainer.md`` says when it pays.
        compile_backend: ``torch.compile``'s ``backend`` (``"inductor"`` generates kernels and needs a
            C++ compiler on CPU; ``"eager"`` only traces, for checking that a model compiles).
        pretrained: whether the backbone starts from pretrained weights (:attr:`pretrained`, which
            ``MultigridCallback`` reads for its warm-up rule). ``None``: pretrained when ``weights``
            are given or ``backbone`` is an ``nn.Module`` (a module passed in is usually built with its
            weights: say ``pretrained=False`` for a randomly initialised one); a named backbone without
            ``weights`` is from scratch. The value decided is saved with the hyper-parameters, so
            ``load_from_checkpoint(path, weights=None)`` (once the weights file is gone) keeps it.

    Example::

        model = VideoClassifier(num_classes=400, backbone="x3d_xs", lr=0.1, warmup_epochs=5,
                                milestones=(94, 154, 196))
        trainer.fit(model, datamodule=datamodule)

        # fine-tuning Kinetics-400 weights on 10 classes, the backbone at a tenth of the LR
        model = VideoClassifier(num_classes=10, backbone="r2plus1d_18", weights="KINETICS400_V1",
                                lr=0.01, backbone_lr_factor=0.1)
    """

    def __init__(
        self,
        num_classes: int,
        backbone: str | nn.Module = "tiny",
        multi_label: bool = False,
        lr: float = 0.1,
        optimizer: Literal["sgd", "adamw"] = "sgd",
        momentum: float = 0.9,
        nesterov: bool = True,
        weight_decay: float = 1e-4,
        warmup_epochs: int = 0,
        warmup_start_factor: float = 0.1,
        milestones: Sequence[int] = (),
        gamma: float = 0.1,
        dropout_rate: float = 0.5,
        tiny_width: int = 16,
        slowfast_alpha: int | None = None,
        weights: str | None = None,
        backbone_lr_factor: float = 1.0,
        compile: bool | Literal["dynamic", "per_grid"] = False,
        compile_backend: str = "inductor",
        pretrained: bool | None = None,
    ) -> None:
        super().__init__()
        warn_if_the_other_package_is_imported(self)  # before any Trainer: the fix is in the imports
        check_int("num_classes", num_classes, 1 if multi_label else 2)
        check_int("tiny_width", tiny_width, 1)
        if slowfast_alpha is not None:
            check_int("slowfast_alpha", slowfast_alpha, 1)
        # The optimisation options, checked as one value; the hyper-parameters keep them flat (`recipe`).
        OptimizerRecipe(
            lr=lr, optimizer=optimizer, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay,
            warmup_epochs=warmup_epochs, warmup_start_factor=warmup_start_factor, milestones=milestones, gamma=gamma,
            backbone_lr_factor=backbone_lr_factor,
        )
        if not 0 <= dropout_rate < 1:
            raise ValueError(f"`dropout_rate` must be in [0, 1), got {dropout_rate!r}.")
        check_bool("pretrained", pretrained, allow_none=True)

        # A module object is not a hyper-parameter: a checkpoint holds its weights, not its recipe.
        self.save_hyperparameters(ignore=["backbone"] if isinstance(backbone, nn.Module) else None)
        self.hparams.update(plain_value(dict(self.hparams)))  # a `weights` path as a string: weights-only loadable
        self.backbone, slowfast_alpha = _backbone(backbone, num_classes, dropout_rate, tiny_width, slowfast_alpha)
        self.loaded_weights: LoadedWeights | None = None
        """What ``weights`` loaded into the backbone and left new; ``None`` without ``weights``."""
        if weights is not None:
            self.loaded_weights = load_weights(
                self.backbone, weights, backbone=backbone if isinstance(backbone, str) else None, num_classes=num_classes
            )
        self._pretrained = pretrained if pretrained is not None else weights is not None or isinstance(backbone, nn.Module)
        # Saved as decided: a checkpoint restored without its weights file (`weights=None`) stays pretrained.
        self.hparams["pretrained"] = self._pretrained
        self.compile_mode = _compile_mode(compile)
        """``None`` (eager), ``"dynamic"`` or ``"per_grid"``: how the backbone is compiled."""
        if self.compile_mode is not None:
            if self.compile_mode == "per_grid":
                raise_recompile_limit(PER_GRID_RECOMPILE_LIMIT)
            # In place (nn.Module.compile): parameter names, state dicts and checkpoints unchanged.
            self.backbone.compile(backend=compile_backend, dynamic=False if self.compile_mode == "per_grid" else None)
        self.num_classes = num_classes
        self.multi_label = multi_label
        self.slowfast_alpha: int | None = slowfast_alpha
        """Frame-rate ratio used to split a video into ``[slow, fast]``; ``None`` for one pathway."""
        self._takes_one_clip = isinstance(backbone, str) and slowfast_alpha is None  # a module may take pathways

        if multi_label:
            self.val_map = MultilabelAveragePrecision(num_labels=num_classes, average="macro")
        else:
            self.val_top1 = MulticlassAccuracy(num_classes=num_classes, top_k=1, average="micro")
            self.val_top5 = MulticlassAccuracy(num_classes=num_classes, top_k=min(5, num_classes), average="micro")
        self._test_views: list[tuple[torch.Tensor, ...]] = []
        self.test_predictions: VideoPredictions | None = None
        """Per-video predictions of the last test epoch (on every rank)."""

    @override
    def setup(self, stage: str) -> None:
        """Refuse a DataModule that splits clips into pathways otherwise than the backbone expects
        (:func:`~lightning_multigrid.models.pathways.check_slowfast_alpha`), before the first step."""
        datamodule = getattr(self.trainer, "datamodule", None)  # the Trainer calls this hook
        if isinstance(datamodule, PathwayDataModule):
            check_slowfast_alpha(datamodule.slowfast_alpha, self.slowfast_alpha, model_takes_one_clip=self._takes_one_clip)

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuse, before the first step, to resume a fit's optimizer state with another optimizer."""
        try:
            trainer = self.trainer
        except RuntimeError:  # load_from_checkpoint: no optimizer state is restored
            return
        if trainer.state.fn == "fit" and checkpoint.get("optimizer_states"):
            check_same_optimizer(checkpoint, self.hparams.get("optimizer", "sgd"), trainer.ckpt_path)

    # ----------------------------------------------------------------------------------------
    # Forward and steps
    # ----------------------------------------------------------------------------------------

    @override
    def forward(self, video: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
        """Logits ``(N, num_classes)`` of ``(N, C, T, H, W)`` clips (or ``[slow, fast]``)."""
        if self.compile_mode == "dynamic":
            for pathway in [video] if isinstance(video, torch.Tensor) else video:
                mark_dynamic_dims(pathway, GRID_DIMS)
        if isinstance(video, torch.Tensor):
            if self.slowfast_alpha is None:
                return self.backbone(video)
            return self.backbone(slowfast_pathways(video, self.slowfast_alpha))
        # A new list: pytorchvideo's SlowFast overwrites the entries of the list it is given.
        return self.backbone(list(video))

    @override
    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        logits = self(batch["video"])
        loss = self._loss(logits, batch["label"])
        if self._loss_is_read():
            # Per step only, so the key stays `train/loss` (with on_epoch it would split in _step/_epoch).
            self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True, batch_size=len(logits))
        return loss

    def _loss_is_read(self) -> bool:
        """Whether anything reads this step's ``train/loss`` before the next logging step.

        ``self.log`` costs about 0.3 ms of Python per call (Lightning's result bookkeeping), a few
        percent of a small model's step. Loggers write only on logging steps
        (``log_every_n_steps``); a progress bar shows the loss at its refreshes; callbacks that
        monitor it at an epoch's end read the last step's. Every other step skips the call.
        """
        if self.fabric is not None:
            return True  # Fabric's self.log has its own rules
        try:
            trainer = self.trainer
        except RuntimeError:  # not attached to a Trainer: self.log decides what to do
            return True
        return trainer.progress_bar_callback is not None or trainer.is_last_batch or is_logging_step(trainer)

    @override
    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        logits = self(batch["video"])
        labels = batch["label"]
        batch_size = len(logits)
        self.log(
            "val/loss", self._loss(logits, labels), on_epoch=True, prog_bar=True, batch_size=batch_size, sync_dist=True
        )
        if self.multi_label:
            self.val_map.update(torch.sigmoid(logits), _multi_hot(labels))
            self.log("val/map", self.val_map, on_epoch=True, batch_size=batch_size)
        else:
            self.val_top1.update(logits, labels)
            self.val_top5.update(logits, labels)
            self.log("val/top1", self.val_top1, on_epoch=True, prog_bar=True, batch_size=batch_size)
            self.log("val/top5", self.val_top5, on_epoch=True, batch_size=batch_size)

    @override
    def on_test_epoch_start(self) -> None:
        self._test_views = []
        self.test_predictions = None

    @override
    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        if "index" not in batch:
            raise ValueError(
                "Test batches need an 'index' entry (the video index of each clip) to average the views "
                "of a video; add it to the dataset's samples."
            )
        logits = self(batch["video"])
        labels = batch["label"]
        self.log("test/loss", self._loss(logits, labels), on_epoch=True, batch_size=len(logits), sync_dist=True)
        probs = torch.sigmoid(logits) if self.multi_label else logits.softmax(dim=1)
        view = batch.get("view")
        entry = (batch["index"], probs, labels) + (() if view is None else (view,))
        self._test_views.append(tuple(t.detach() for t in entry))

    @override
    def on_test_epoch_end(self) -> None:
        if not self._test_views:
            return
        columns = [self._gather(torch.cat(column)) for column in zip(*self._test_views)]
        self._test_views = []
        predictions = aggregate_views(*columns)
        self.test_predictions = predictions
        # Every rank holds all views now and computes the same values; sync_dist only keeps
        # Lightning from warning about unsynced epoch-level logging.
        if self.multi_label:
            value = multilabel_average_precision(
                predictions.probs, _multi_hot(predictions.labels), num_labels=self.num_classes, average="macro"
            )
            self.log("test/map", value, sync_dist=True)
        else:
            for k in (1, 5):
                value = multiclass_accuracy(
                    predictions.probs,
                    predictions.labels,
                    num_classes=self.num_classes,
                    top_k=min(k, self.num_classes),
                    average="micro",
                )
                self.log(f"test/top{k}", value, sync_dist=True)

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.multi_label:
            if labels.shape != logits.shape:
                raise ValueError(
                    f"With `multi_label=True`, 'label' must be multi-hot {tuple(logits.shape)} "
                    f"(N, num_classes), got {tuple(labels.shape)}."
                )
            return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))
        if labels.dim() != 1:
            raise ValueError(
                f"'label' must be class indices of shape (N,), got {tuple(labels.shape)}; "
                "for multi-hot labels set `multi_label=True`."
            )
        return F.cross_entropy(logits, labels)

    def _gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate ``tensor`` (dim 0) over ranks; ranks may hold different lengths."""
        if self.trainer.world_size == 1:
            return tensor
        lengths = self.all_gather(torch.tensor(len(tensor), device=self.device)).reshape(-1)
        padded = tensor.new_zeros((int(lengths.max()), *tensor.shape[1:]))
        padded[: len(tensor)] = tensor
        gathered = self.all_gather(padded)  # (world_size, max length, ...)
        return torch.cat([gathered[rank, : int(length)] for rank, length in enumerate(lengths)])

    # ----------------------------------------------------------------------------------------
    # Optimisation
    # ----------------------------------------------------------------------------------------

    @property
    def lr_milestones(self) -> tuple[int, ...]:
        """Absolute epochs (0-based, warm-up included) where the LR decays by ``gamma``.

        This is the contract with the multigrid callback: these are the baseline run's LR stage
        boundaries (``MultigridConfig.milestones``), whatever the scheduler object looks like
        inside (with warm-up, the ``MultiStepLR`` in the ``SequentialLR`` counts from the end of
        the warm-up and holds ``milestone - warmup_epochs``).
        """
        return tuple(self.recipe.milestones)

    @property
    def pretrained(self) -> bool:
        """Whether the backbone starts from pretrained weights: the ``pretrained`` argument, by default
        whether ``weights`` were given or the backbone was passed as a module."""
        return self._pretrained

    @property
    def recipe(self) -> OptimizerRecipe:
        """The optimisation options as one value, read from the hyper-parameters (Lightning's LR finder sets ``lr`` there)."""
        return OptimizerRecipe.from_hparams(self.hparams)

    def parameter_groups(self) -> list[dict[str, Any]]:
        """Optimizer parameter groups: ``decay`` (weights) and ``no_decay`` (norms, biases, position tables).

        Parameters with at most one dimension (BatchNorm/LayerNorm scales and shifts, biases) are
        not decayed: decaying them shrinks normalisation gains without regularising anything.
        Neither are transformers' position tables and class tokens (names containing one of
        :data:`~lightning_multigrid.fit.recipe.NO_DECAY_NAMES`, e.g. Swin's ``relative_position_bias_table``),
        as in Swin's and MViT's reference recipes.
        Frozen parameters (``requires_grad=False``) are left out. With ``backbone_lr_factor`` != 1
        the groups are ``head/decay``, ``head/no_decay`` (the classifier, at ``lr``) and
        ``backbone/decay``, ``backbone/no_decay`` (the rest, at ``lr * backbone_lr_factor``).
        """
        recipe = self.recipe
        keys = classifier_keys(self.backbone, self.num_classes) if recipe.backbone_lr_factor != 1 else ()
        return recipe.parameter_groups(self.named_parameters(), head={f"backbone.{key}" for key in keys})

    @override
    def configure_optimizers(self) -> Any:
        """SGD (or AdamW), and per-epoch linear warm-up then ``MultiStepLR`` at :attr:`lr_milestones`
        (:meth:`~lightning_multigrid.fit.recipe.OptimizerRecipe.build_scheduler`)."""
        recipe = self.recipe
        optimizer = recipe.build_optimizer(self.parameter_groups())
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": recipe.build_scheduler(optimizer), "interval": "epoch"}}

    def preflight(self, grids: Iterable[Any], *, batch_size: int = 1) -> None:
        """Check that the backbone takes every grid; see :func:`lightning_multigrid.models.preflight`.

        Args:
            grids: objects with ``num_frames`` and ``crop_size``, e.g. ``schedule.distinct_grids()``.
            batch_size: clips per check forward.

        Raises:
            ValueError: naming the grid and the layer, when the backbone cannot take a grid.
        """
        preflight(self.backbone, grids, slowfast_alpha=self.slowfast_alpha, batch_size=batch_size)


def _backbone(
    backbone: str | nn.Module, num_classes: int, dropout_rate: float, tiny_width: int, slowfast_alpha: int | None
) -> tuple[nn.Module, int | None]:
    """The multigrid-compatible backbone and its ``slowfast_alpha`` (``None`` for one pathway)."""
    if isinstance(backbone, nn.Module):
        return make_multigrid_compatible(backbone), slowfast_alpha
    if not isinstance(backbone, str):
        raise TypeError(
            f"`backbone` must be a name ({', '.join(BACKBONES)}) or an nn.Module, got {type(backbone).__name__}."
        )
    model = build_backbone(backbone, num_classes, dropout_rate=dropout_rate, tiny_width=tiny_width)
    default_alpha = TWO_PATHWAY_BACKBONES.get(backbone)
    if slowfast_alpha is not None and default_alpha is None:
        raise ValueError(
            f"`slowfast_alpha`={slowfast_alpha} is set but `backbone`={backbone!r} has one pathway: "
            f"unset `slowfast_alpha`, or choose a two-pathway backbone ({', '.join(TWO_PATHWAY_BACKBONES)})."
        )
    return model, slowfast_alpha or default_alpha


def _multi_hot(labels: torch.Tensor) -> torch.Tensor:
    # Soft targets (label smoothing, mixup) count as positive above one half.
    return (labels > 0.5).long()


def _compile_mode(compile: Any) -> Literal["dynamic", "per_grid"] | None:
    if compile is False:
        return None
    if compile is True or compile == "dynamic":
        return "dynamic"
    if compile == "per_grid":
        return "per_grid"
    raise ValueError(f'`compile` must be False, True, "dynamic" or "per_grid", got {compile!r}.')
