"""Pretrained weights for a backbone: by name (torchvision, pytorchvideo hub) or from a local file.

Fine-tuning a Kinetics-pretrained network is how most people train on a small video dataset, and
where multigrid's published small-data results come from (Charades, Something-Something V2).
:func:`load_weights` copies every backbone tensor from the weights into a model built for
``num_classes`` and leaves its classifier (the head) as initialised.

Names download once into the framework's cache (``torch.hub.get_dir()``, ``$TORCH_HOME``):

- torchvision's video models (``r3d_18``, ``mc3_18``, ``r2plus1d_18``, ``s3d``, ``swin3d_t``,
  ``mvit_v1_b``, ``mvit_v2_s``): the members of their ``Weights`` enum, e.g. ``"KINETICS400_V1"``
  or ``"DEFAULT"`` (MViT's load into the ``MultigridMViT`` unchanged: same state-dict keys);
- pytorchvideo's (``x3d_xs``, ``x3d_s``, ``x3d_m``, ``slow_r50``, ``slowfast_r50``, ``i3d_r50``):
  ``"KINETICS400"``, the checkpoint of its model hub (``pytorchvideo.models.hub``).

A path loads a file: a state dict, a Lightning checkpoint of a
:class:`~lightning_multigrid.module.VideoClassifier` (its ``backbone.`` entries) or a
PySlowFast/pytorchvideo checkpoint (``model_state``); a ``module.`` prefix (DDP) is dropped.

Example::

    model = build_backbone("r3d_18", num_classes=10)
    report = load_weights(model, "KINETICS400_V1", backbone="r3d_18", num_classes=10)
    report.new  # ('fc.weight', 'fc.bias')
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torchvision import models as tv_models

__all__ = ["LoadedWeights", "classifier_keys", "load_weights", "weights_names"]

log = logging.getLogger(__name__)

_TORCHVISION = ("r3d_18", "mc3_18", "r2plus1d_18", "s3d", "swin3d_t", "mvit_v1_b", "mvit_v2_s")
# backbone -> (module of pytorchvideo.models.hub, key of its `checkpoint_paths`)
_PYTORCHVIDEO_HUB: dict[str, tuple[str, str]] = {
    "x3d_xs": ("x3d", "x3d_xs"),
    "x3d_s": ("x3d", "x3d_s"),
    "x3d_m": ("x3d", "x3d_m"),
    "slow_r50": ("resnet", "slow_r50"),
    "i3d_r50": ("resnet", "i3d_r50"),
    "slowfast_r50": ("slowfast", "slowfast_r50"),
}
_PYTORCHVIDEO_NAME = "KINETICS400"
_FILE_SUFFIXES = (".pt", ".pth", ".pyth", ".ckpt", ".bin", ".tar")


@dataclass(frozen=True)
class LoadedWeights:
    """What :func:`load_weights` did.

    Attributes:
        source: the weights name or the file path.
        loaded: state-dict keys copied from the weights.
        new: state-dict keys left as initialised: the classifier, sized for ``num_classes``.
    """

    source: str
    loaded: tuple[str, ...]
    new: tuple[str, ...]


def weights_names(backbone: str) -> tuple[str, ...]:
    """The weights names :func:`load_weights` downloads for ``backbone`` (empty: files only)."""
    if backbone in _TORCHVISION:
        return tuple(tv_models.get_model_weights(backbone).__members__)
    if backbone in _PYTORCHVIDEO_HUB:
        return (_PYTORCHVIDEO_NAME,)
    return ()


def load_weights(model: nn.Module, weights: str | os.PathLike[str], *, backbone: str | None, num_classes: int) -> LoadedWeights:
    """Copy pretrained weights into ``model``, in place; its classifier stays new.

    Args:
        model: the backbone, built for ``num_classes`` (e.g. by ``build_backbone``).
        weights: a name of :func:`weights_names` for ``backbone`` (downloaded once into
            ``torch.hub``'s cache), or the path of a checkpoint or state-dict file.
        backbone: the backbone's name, for names; ``None`` for a user's ``nn.Module`` (paths only).
        num_classes: outputs of ``model``'s classifier, found as its last ``Linear``/``Conv3d``
            with that many outputs.

    Returns:
        The source, the keys loaded and the keys left new; also logged at INFO level.

    Raises:
        ValueError: for a name that ``backbone`` has no weights under, when the weights do not fit
            ``model`` (missing, unexpected or differently shaped tensors, named), or when
            ``model`` has no classifier with ``num_classes`` outputs.
        FileNotFoundError: for a path that does not exist.
    """
    source = os.fspath(weights)
    state = _state_dict(_read(source, backbone), source)
    head = classifier_keys(model, num_classes)
    own = model.state_dict()
    _check_fit(state, own, head, source, backbone)
    loadable = {key: value for key, value in state.items() if key not in head}
    model.load_state_dict(loadable, strict=False)
    report = LoadedWeights(source, tuple(loadable), tuple(k for k in own if k in head))
    log.info(
        "Loaded %d tensors of %s from %s; left new (the classifier, %d classes): %s",
        len(report.loaded), backbone or type(model).__name__, source, num_classes, ", ".join(report.new),
    )
    return report


def classifier_keys(model: nn.Module, num_classes: int) -> frozenset[str]:
    """State-dict keys of ``model``'s classifier: its last ``Linear``/``Conv3d`` with ``num_classes`` outputs.

    Raises:
        ValueError: when no such layer exists.
    """
    found = ""
    for name, module in model.named_modules():
        outputs = getattr(module, "out_features", None) if isinstance(module, nn.Linear) else None
        if isinstance(module, nn.Conv3d):
            outputs = module.out_channels
        if outputs == num_classes:
            found = name
    if not found:
        raise ValueError(
            f"Found no classifier (a Linear or Conv3d with `num_classes`={num_classes} outputs) in "
            f"{type(model).__name__}, so pretrained weights cannot leave it new. Build the model for num_classes."
        )
    return frozenset(f"{found}.{key}" for key in model.get_submodule(found).state_dict())


def _read(source: str, backbone: str | None) -> object:
    """The object stored under a weights name or in a file."""
    if backbone is not None and source in weights_names(backbone):
        return _download(backbone, source)
    if not _looks_like_path(source):
        names = weights_names(backbone) if backbone is not None else ()
        known = f"{', '.join(names)}" if names else f"none: backbone {backbone!r} has no published weights"
        raise ValueError(
            f"Unknown `weights` {source!r} for backbone {backbone!r}: its names: {known}. "
            "Or give the path of a checkpoint or state-dict file."
        )
    path = Path(source).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"`weights`={source!r}: no such file. Give the path of an existing checkpoint or state-dict "
            + (f"file, or one of the names {', '.join(weights_names(backbone))}." if backbone and weights_names(backbone) else "file.")
            + " Restoring a VideoClassifier trained from these weights after the file is gone? Its checkpoint holds the "
            "trained weights: pass `weights=None`, as in `VideoClassifier.load_from_checkpoint(path, weights=None)` "
            "(it stays `pretrained`)."
        )
    # Lightning checkpoints hold plain containers and tensors: the safe unpickler reads them.
    return torch.load(path, map_location="cpu", weights_only=True)


def _looks_like_path(source: str) -> bool:
    return os.sep in source or "/" in source or source.endswith(_FILE_SUFFIXES) or Path(source).exists()


def _download(backbone: str, name: str) -> object:
    """Fetch named weights through the framework's own cache (downloads once)."""
    if backbone in _TORCHVISION:
        return tv_models.get_model_weights(backbone)[name].get_state_dict(progress=True, check_hash=True)
    module, key = _PYTORCHVIDEO_HUB[backbone]
    hub = importlib.import_module(f"pytorchvideo.models.hub.{module}")
    url: str = hub.checkpoint_paths[key]
    load: Callable[..., object] = torch.hub.load_state_dict_from_url
    return load(url, progress=True, map_location="cpu")


def _state_dict(stored: object, source: str) -> dict[str, torch.Tensor]:
    """The backbone's tensors out of a state dict or a checkpoint (Lightning, PySlowFast)."""
    if isinstance(stored, Mapping):
        for wrapper in ("state_dict", "model_state", "model"):
            if isinstance(stored.get(wrapper), Mapping):
                stored = stored[wrapper]
                break
    if not isinstance(stored, Mapping) or not all(isinstance(v, torch.Tensor) for v in stored.values()):
        raise ValueError(
            f"`weights`={source!r} holds no state dict (a mapping of names to tensors, or a checkpoint with "
            "'state_dict' or 'model_state'); save one with `torch.save(model.state_dict(), path)`."
        )
    state = {_strip(str(key), "module."): value for key, value in stored.items()}
    if any(key.startswith("backbone.") for key in state):  # a VideoClassifier checkpoint
        state = {key[len("backbone."):]: value for key, value in state.items() if key.startswith("backbone.")}
    return state


def _strip(key: str, prefix: str) -> str:
    return key[len(prefix):] if key.startswith(prefix) else key


def _check_fit(
    state: Mapping[str, torch.Tensor],
    own: Mapping[str, torch.Tensor],
    head: frozenset[str],
    source: str,
    backbone: str | None,
) -> None:
    """Raise, naming the tensors, unless every body tensor of the model is in the weights with its shape."""
    # Checkpoints from before BatchNorm counted its batches lack the counters; they stay at 0.
    missing = [k for k in own if k not in state and k not in head and not k.endswith("num_batches_tracked")]
    unexpected = [k for k in state if k not in own]
    mismatched = [
        f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}"
        for k in own
        if k in state and k not in head and state[k].shape != own[k].shape
    ]
    problems = [
        f"{label} ({len(keys)}): {', '.join(keys[:4])}{', ...' if len(keys) > 4 else ''}"
        for label, keys in (("missing", missing), ("unexpected", unexpected), ("shape mismatch, weights vs model", mismatched))
        if keys
    ]
    if problems:
        raise ValueError(
            f"`weights`={source!r} do not fit backbone {backbone or 'module'!r}: " + "; ".join(problems)
            + ". Use weights saved from the same architecture (the classifier may differ: it is replaced)."
        )
