"""Pretrained weights (lightning_multigrid/models/weights.py) through ``VideoClassifier(weights=...)``.

Nothing here downloads: files are state dicts saved to ``tmp_path``; the named weights go through
the real loading code with the framework's download function replaced by a stand-in that records
the URL.
"""

from __future__ import annotations

import importlib
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from lightning_multigrid._lightning import pl
from lightning_multigrid.models import build_backbone, load_weights, weights_names
from lightning_multigrid.module import VideoClassifier

# One backbone per family: torchvision's 3D ResNets and S3D, pytorchvideo's X3D and ResNet
# (SlowFast, two pathways), and the tiny CNN. name -> the classifier's state-dict keys.
FAMILIES = {
    "r3d_18": ("fc.weight", "fc.bias"),
    "s3d": ("classifier.1.weight", "classifier.1.bias"),
    "x3d_xs": ("blocks.5.proj.weight", "blocks.5.proj.bias"),
    "slowfast_r50": ("blocks.6.proj.weight", "blocks.6.proj.bias"),
    "tiny": ("fc.weight", "fc.bias"),
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_loads_a_local_state_dict_and_leaves_a_new_head(name: str, tmp_path: Path) -> None:
    source = build_backbone(name, num_classes=400).state_dict()
    path = tmp_path / "pretrained.pt"
    torch.save(source, path)

    model = VideoClassifier(num_classes=5, backbone=name, weights=str(path))

    head = FAMILIES[name]
    assert model.pretrained and model.loaded_weights is not None
    assert model.loaded_weights.new == head
    state = model.backbone.state_dict()
    assert set(model.loaded_weights.loaded) == set(state) - set(head)
    for key in model.loaded_weights.loaded:
        assert torch.equal(state[key], source[key]), key
    # The classifier is new, sized for 5 classes (the weights had 400).
    assert state[head[0]].shape[0] == 5 and source[head[0]].shape[0] == 400
    with torch.no_grad():
        assert model(torch.zeros(2, 3, 8, 64, 64)).shape == (2, 5)


class RandomClips(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> dict[str, Any]:
        generator = torch.Generator().manual_seed(index)
        return {"video": torch.randn(3, 4, 16, 16, generator=generator), "label": index % 3}


def test_loads_a_lightning_checkpoint_and_trains_the_backbone_at_a_lower_lr(tmp_path: Path) -> None:
    pl.seed_everything(0, verbose=False)
    pretrained = VideoClassifier(num_classes=3, backbone="tiny", tiny_width=4, lr=0.1, backbone_lr_factor=0.1)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(pretrained, DataLoader(RandomClips(), batch_size=4))
    # The classifier at lr, the rest at lr * backbone_lr_factor.
    assert {g["name"]: g["lr"] for g in trainer.optimizers[0].param_groups} == pytest.approx(
        {"backbone/decay": 0.01, "backbone/no_decay": 0.01, "head/decay": 0.1, "head/no_decay": 0.1}
    )
    checkpoint = tmp_path / "pretrained.ckpt"
    trainer.save_checkpoint(checkpoint)

    model = VideoClassifier(num_classes=7, backbone="tiny", tiny_width=4, weights=str(checkpoint))
    trained = pretrained.backbone.state_dict()
    state = model.backbone.state_dict()
    assert model.loaded_weights is not None and model.loaded_weights.new == ("fc.weight", "fc.bias")
    assert all(torch.equal(state[k], trained[k]) for k in model.loaded_weights.loaded)
    assert "features.1.running_mean" in model.loaded_weights.loaded  # BatchNorm statistics too
    assert state["fc.weight"].shape == (7, 32)


def test_named_weights_go_through_the_frameworks_download(monkeypatch: pytest.MonkeyPatch) -> None:
    urls: list[str] = []

    def download(url: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        urls.append(url)
        # As the pytorchvideo hub stores them: a PySlowFast checkpoint.
        return {"model_state": build_backbone("x3d_xs", num_classes=400).state_dict()}

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", download)
    model = VideoClassifier(num_classes=4, backbone="x3d_xs", weights="KINETICS400")
    assert urls == ["https://dl.fbaipublicfiles.com/pytorchvideo/model_zoo/kinetics/X3D_XS.pyth"]
    assert model.loaded_weights is not None and model.loaded_weights.source == "KINETICS400"

    api = importlib.import_module("torchvision.models._api")
    monkeypatch.setattr(api, "load_state_dict_from_url", lambda url, **kwargs: urls.append(url) or
                        build_backbone("r2plus1d_18", num_classes=400).state_dict())
    VideoClassifier(num_classes=4, backbone="r2plus1d_18", weights="KINETICS400_V1")
    assert urls[-1] == "https://download.pytorch.org/models/r2plus1d_18-91a641e6.pth"


def test_weights_names_per_backbone() -> None:
    for name in ("r3d_18", "mc3_18", "r2plus1d_18", "s3d"):
        assert "KINETICS400_V1" in weights_names(name)
    for name in ("x3d_xs", "x3d_s", "x3d_m", "slow_r50", "slowfast_r50", "i3d_r50"):
        assert weights_names(name) == ("KINETICS400",)
    assert weights_names("tiny") == ()


def test_unknown_name_missing_file_and_shape_mismatch_fail_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"Unknown `weights` 'KINETICS400' for backbone 'r3d_18': its names: "
                       r"KINETICS400_V1, DEFAULT\. Or give the path"):
        VideoClassifier(num_classes=5, backbone="r3d_18", weights="KINETICS400")
    with pytest.raises(ValueError, match=r"Unknown `weights` 'IMAGENET' for backbone 'tiny': its names: none"):
        VideoClassifier(num_classes=5, backbone="tiny", weights="IMAGENET")
    with pytest.raises(FileNotFoundError, match=r"`weights`='.*missing\.pt': no such file"):
        VideoClassifier(num_classes=5, backbone="r3d_18", weights=str(tmp_path / "missing.pt"))
    path = tmp_path / "r3d.pt"
    torch.save(build_backbone("r3d_18", num_classes=400).state_dict(), path)
    with pytest.raises(ValueError, match=r"do not fit backbone 'mc3_18': shape mismatch, weights vs model \(12\): "
                       r"layer2\.0\.conv1\.0\.weight \(128, 64, 3, 3, 3\) vs \(128, 64, 1, 3, 3\)"):
        VideoClassifier(num_classes=5, backbone="mc3_18", weights=str(path))
    torch.save({"step": 3}, path)
    with pytest.raises(ValueError, match="holds no state dict"):
        VideoClassifier(num_classes=5, backbone="r3d_18", weights=str(path))


def test_missing_and_unexpected_tensors_are_named(tmp_path: Path) -> None:
    state = build_backbone("tiny", num_classes=3, tiny_width=4).state_dict()
    state["extra.weight"] = torch.zeros(1)
    del state["features.0.weight"]
    path = tmp_path / "partial.pt"
    torch.save(state, path)
    model = build_backbone("tiny", num_classes=3, tiny_width=4)
    with pytest.raises(ValueError, match=r"missing \(1\): features\.0\.weight; unexpected \(1\): extra\.weight"):
        load_weights(model, path, backbone="tiny", num_classes=3)


@pytest.mark.parametrize("factor", [0, -1.0, True])
def test_backbone_lr_factor_must_be_positive(factor: Any) -> None:
    with warnings.catch_warnings(), pytest.raises(ValueError, match=r"`backbone_lr_factor` must be a number > 0"):
        VideoClassifier(num_classes=3, backbone="tiny", backbone_lr_factor=factor)
