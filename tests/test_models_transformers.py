"""Video transformers at every multigrid grid: ``tiny_swin3d``, ``swin3d_t``, ``mvit_v2_s``, ``mvit_v1_b``.

Grids come from the schedules of ``configs/demo.yaml`` and ``configs/kinetics400_*.yaml``, built with
the package's own ``build_schedule``.
"""

from __future__ import annotations

import importlib
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch import nn
from torch.nn import functional as F
from torchvision import models as tv_models
from torchvision.models import video as tv_video
from torchvision.models.video.mvit import MSBlockConfig

from lightning_multigrid._lightning import pl
from lightning_multigrid.callback import MultigridCallback
from lightning_multigrid.data.datamodule import MultigridVideoDataModule
from lightning_multigrid.data.synthetic import SyntheticDataset
from lightning_multigrid.models import build_backbone, make_multigrid_compatible, preflight, weights_names
from lightning_multigrid.models.mvit import GridPositionalEncoding, MultigridMViT
from lightning_multigrid.module import VideoClassifier
from lightning_multigrid.schedule import GridShape, MultigridConfig, MultigridSchedule, build_schedule
from lightning_multigrid.schedule.preview import format_table

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
# The 32-frame Kinetics grids take several seconds each, even at 8 channels.
SCHEDULES = ("demo.yaml", "kinetics400_x3d_m.yaml", pytest.param("kinetics400_slowfast_r50.yaml", marks=pytest.mark.slow))
NUM_CLASSES = 5
TRANSFORMERS = ("swin3d_t", "mvit_v1_b", "mvit_v2_s")
# The classifier's state-dict keys, left new by `weights=`.
HEADS = {"swin3d_t": ("head.weight", "head.bias"), "mvit_v1_b": ("head.1.weight", "head.1.bias"),
         "mvit_v2_s": ("head.1.weight", "head.1.bias")}


def config_schedule(name: str) -> MultigridSchedule:
    """The multigrid schedule a ``configs/`` file describes, as the callback builds it."""
    settings = yaml.safe_load((CONFIG_DIR / name).read_text(encoding="utf-8"))
    data, trainer, model = settings["data"]["init_args"], settings["trainer"], settings["model"]["init_args"]
    multigrid = settings.get("multigrid") or {}
    jitter = data.get("jitter_scales")
    return build_schedule(
        MultigridConfig(
            base=GridShape(data["batch_size"], data["num_frames"], data["crop_size"]),
            max_epochs=trainer["max_epochs"],
            milestones=tuple(multigrid.get("milestones") or model.get("milestones", ())),
            sampling_rate=data.get("sampling_rate", 4),
            devices=int(trainer.get("devices", 1)) * int(trainer.get("num_nodes", 1)),
            jitter_scales=None if jitter is None else tuple(jitter),
            options=MultigridCallback(**multigrid).options,
        )
    )


def test_tiny_swin3d_takes_every_grid_of_the_demo_schedule() -> None:
    grids = config_schedule("demo.yaml").distinct_grids()
    # The demo's base 8 x 64: long cycle 2/4/8 frames at 45/64 px, short cycle 32/45 px.
    assert {(g.num_frames, g.crop_size) for g in grids} >= {(2, 45), (8, 64), (8, 32)}
    preflight(build_backbone("tiny_swin3d", NUM_CLASSES, tiny_width=8), grids)


def test_tiny_swin3d_fits_with_the_multigrid_callback(
    synthetic_dataset: SyntheticDataset, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A real Trainer, real H.264 videos, the long and short cycle: every grid trains the transformer."""
    caplog.set_level(logging.INFO)
    pl.seed_everything(0, verbose=False)
    datamodule = MultigridVideoDataModule(
        train_manifest=str(synthetic_dataset.train_manifest), val_manifest=str(synthetic_dataset.val_manifest),
        root_dir=str(synthetic_dataset.root), batch_size=2, num_frames=8, crop_size=32, sampling_rate=2,
        num_workers=0, flip=False, seed=1,
    )
    model = VideoClassifier(num_classes=4, backbone="tiny_swin3d", tiny_width=8, lr=0.05, milestones=[2])
    before = [p.detach().clone() for p in model.parameters()]
    shapes: list[tuple[int, ...]] = []
    model.register_forward_pre_hook(lambda _module, args: shapes.append(tuple(args[0].shape)) if model.training else None)
    trainer = pl.Trainer(
        max_epochs=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=1,
        default_root_dir=tmp_path, callbacks=[MultigridCallback()],  # precise BN finds no BatchNorm: a no-op
    )
    trainer.fit(model, datamodule=datamodule)

    assert math.isfinite(trainer.callback_metrics["train/loss"])
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    # Coarse long-cycle grids (fewer frames) and short-cycle crops reached the model.
    assert {s[2] for s in shapes} > {8} and {s[3] for s in shapes} > {32}
    # The fit summary says there is no BatchNorm to group instead of a grouping per stage.
    assert "BN: the model has no BatchNorm, nothing to group (LayerNorm needs no conversion)." in caplog.text
    assert "split" not in caplog.text.split("Multigrid schedule")[1].split("BN:")[0]


def test_schedule_table_says_when_the_model_has_no_batchnorm() -> None:
    schedule = config_schedule("demo.yaml")
    rows = len(schedule.stages) + 2  # header and rule
    with_bn = format_table(schedule).splitlines()
    without = format_table(schedule, has_batchnorm=False).splitlines()
    assert with_bn[2].split()[-2:] == ["8", "2-8"] and with_bn[rows] == ""  # the demo's first stage: split 8
    assert [line.split()[-2] for line in without[2:rows]] == ["none"] * len(schedule.stages)
    assert without[rows] == "BN: the model has no BatchNorm, nothing to group (LayerNorm needs no conversion)."
    assert without[rows + 1:] == with_bn[rows:]  # the rest is unchanged


# ---------------------------------------------------------------- reduced-width torchvision models
# The preflight and parity checks need the shapes, not the widths: these are built from the same
# torchvision classes with the same patch embedding, windows, strides, pooling kernels and flags
# as swin3d_t / mvit_v1_b / mvit_v2_s (torchvision/models/video/{swin_transformer,mvit}.py), one
# block per change of token grid or width, and 8 channels in the first stage instead of 96.


def reduced_swin3d_t() -> nn.Module:
    """swin3d_t's patches (2x4x4), windows (8x7x7) and four stages, two blocks each (one shifted)."""
    return tv_video.SwinTransformer3d(
        patch_size=[2, 4, 4], embed_dim=8, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8], window_size=[8, 7, 7],
        stochastic_depth_prob=0.0, num_classes=NUM_CLASSES,
    )


def _blocks(rows: list[tuple[int, int, int, list[int], list[int]]]) -> list[MSBlockConfig]:
    """``(heads, in, out, stride_q, stride_kv)`` rows; 3x3x3 pooling kernels where a stride pools."""
    return [
        MSBlockConfig(heads, cin, cout, [3, 3, 3] if stride_q else [], [3, 3, 3], stride_q, stride_kv)
        for heads, cin, cout, stride_q, stride_kv in rows
    ]


def reduced_mvit(version: str, **kwargs: Any) -> tv_video.MViT:
    """mvit_v1_b (``v1``) or mvit_v2_s (``v2``) at 16 x 224, with their strides and flags, 8 to 64 channels."""
    if version == "v1":  # mvit_v1_b's blocks 0, 1, 2, 3, 13, 14
        rows = [(1, 8, 16, [], [1, 8, 8]), (2, 16, 16, [1, 2, 2], [1, 4, 4]), (2, 16, 32, [], [1, 4, 4]),
                (2, 32, 32, [1, 2, 2], [1, 2, 2]), (2, 32, 64, [], [1, 2, 2]), (4, 64, 64, [1, 2, 2], [1, 1, 1])]
        flags = dict(residual_pool=False, residual_with_cls_embed=False, rel_pos_embed=False, proj_after_attn=False)
    else:  # mvit_v2_s's blocks 0, 1, 3, 14
        rows = [(1, 8, 8, [1, 1, 1], [1, 8, 8]), (2, 8, 16, [1, 2, 2], [1, 4, 4]), (2, 16, 32, [1, 2, 2], [1, 2, 2]),
                (4, 32, 64, [1, 2, 2], [1, 1, 1])]
        flags = dict(residual_pool=True, residual_with_cls_embed=False, rel_pos_embed=True, proj_after_attn=True)
    return tv_video.MViT(
        spatial_size=(224, 224), temporal_size=16, block_setting=_blocks(rows), num_classes=NUM_CLASSES, **flags,
        **kwargs,
    )


REDUCED: dict[str, Callable[[], nn.Module]] = {
    "swin3d_t": reduced_swin3d_t,
    "mvit_v1_b": lambda: reduced_mvit("v1"),
    "mvit_v2_s": lambda: reduced_mvit("v2"),
}


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("name", TRANSFORMERS)
def test_transformers_take_every_grid_of_the_demo_and_kinetics_schedules(name: str, schedule: str) -> None:
    torch.manual_seed(0)
    model = make_multigrid_compatible(REDUCED[name]())
    preflight(model, config_schedule(schedule).distinct_grids())


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_torchvisions_mvit_fails_off_its_grid_and_the_preflight_names_the_layer(version: str) -> None:
    layer = r"grid 8x112 \(frames x crop\).* layer `(pos_encoding|blocks\.0\.[\w.]+)`.*MViT reads the token grid"
    with pytest.raises(ValueError, match=layer):
        preflight(reduced_mvit(version), [GridShape(1, 8, 112)])


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_interpolated_positional_tables_are_trained_off_the_base_grid(version: str) -> None:
    """At a coarse grid the interpolation is differentiable: one SGD step changes the tables."""
    torch.manual_seed(0)
    model = make_multigrid_compatible(reduced_mvit(version))
    tables = ["pos_encoding.spatial_pos", "pos_encoding.temporal_pos"] if version == "v1" else [
        "blocks.0.attn.rel_pos_h", "blocks.0.attn.rel_pos_w", "blocks.0.attn.rel_pos_t"]
    before = {name: p.detach().clone() for name, p in model.named_parameters() if name in tables}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = F.cross_entropy(model(torch.randn(2, 3, 4, 64, 64)), torch.tensor([0, 1]))
    loss.backward()
    optimizer.step()
    assert set(before) == set(tables)
    for name, parameter in model.named_parameters():
        if name in before:
            assert not torch.equal(parameter, before[name]), name


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_multigrid_mvit_equals_torchvisions_at_its_own_grid(version: str) -> None:
    """At 16 x 224 nothing is interpolated: the converted model computes exactly what torchvision's does."""
    torch.manual_seed(0)
    reference = reduced_mvit(version).eval()
    converted = make_multigrid_compatible(reduced_mvit(version)).eval()
    assert isinstance(converted, MultigridMViT)
    assert list(converted.state_dict()) == list(reference.state_dict())
    converted.load_state_dict(reference.state_dict())  # a state dict of torchvision's architecture loads as is
    clip = torch.randn(1, 3, 16, 224, 224, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(converted(clip), reference(clip))


def test_conversion_keeps_the_parameters_and_nests() -> None:
    mvit = reduced_mvit("v1")
    parameters = list(mvit.parameters())
    wrapper = nn.Sequential(mvit)
    assert make_multigrid_compatible(wrapper) is wrapper  # a child is replaced in place
    converted = wrapper[0]
    assert isinstance(converted, MultigridMViT)
    assert [id(p) for p in converted.parameters()] == [id(p) for p in parameters]
    assert make_multigrid_compatible(converted) is converted  # twice changes nothing


def test_v1_positional_embedding_is_the_reference_trilinear_interpolation() -> None:
    """Interpolating the spatial and temporal tables separately equals PySlowFast's trilinear
    interpolation of their sum (``_get_pos_embed``), class position kept."""
    torch.manual_seed(0)
    encoding = GridPositionalEncoding(reduced_mvit("v1").pos_encoding)
    assert (encoding.temporal_size, encoding.spatial_size) == (8, (56, 56))
    spatial, temporal = encoding.spatial_pos, encoding.temporal_pos
    assert spatial is not None and temporal is not None and encoding.class_pos is not None
    channels = spatial.shape[1]
    full = (temporal[:, None, :] + spatial[None]).reshape(8, 56, 56, channels).permute(3, 0, 1, 2)[None]
    thw = (4, 20, 28)  # 8 frames x 80 x 112 pixels (ceil(T/2), ceil(H/4), ceil(W/4))
    expected = F.interpolate(full, size=thw, mode="trilinear", align_corners=False)[0].flatten(1).t()
    tokens = torch.zeros(2, 4 * 20 * 28, channels)
    with torch.no_grad():
        out = encoding(tokens, thw)
    assert out.shape == (2, 1 + 4 * 20 * 28, channels)
    torch.testing.assert_close(out[:, 1:], expected.expand(2, -1, -1), rtol=0, atol=1e-6)
    torch.testing.assert_close(out[:, 0], (encoding.class_token + encoding.class_pos).detach().expand(2, -1))


@pytest.mark.parametrize("name", TRANSFORMERS)
def test_weights_load_a_torchvision_state_dict(name: str, tmp_path: Path) -> None:
    """A state dict of torchvision's own (unconverted) architecture, as its Kinetics weights are saved."""
    torch.manual_seed(0)
    source = tv_models.get_model_builder(name)().state_dict()
    path = tmp_path / f"{name}.pt"
    torch.save(source, path)

    model = VideoClassifier(num_classes=NUM_CLASSES, backbone=name, weights=str(path))

    assert model.loaded_weights is not None and model.loaded_weights.new == HEADS[name]
    state = model.backbone.state_dict()
    assert set(model.loaded_weights.loaded) == set(state) - set(HEADS[name]) == set(source) - set(HEADS[name])
    assert all(torch.equal(state[key], source[key]) for key in model.loaded_weights.loaded)
    assert state[HEADS[name][0]].shape[0] == NUM_CLASSES
    # The full-size model, weights loaded, at every grid of the demo (2 to 8 frames, 32 to 64 px).
    model.preflight(config_schedule("demo.yaml").distinct_grids())


def test_kinetics_weights_by_name_go_through_torchvisions_enum(monkeypatch: pytest.MonkeyPatch) -> None:
    urls: list[str] = []
    api = importlib.import_module("torchvision.models._api")
    monkeypatch.setattr(api, "load_state_dict_from_url", lambda url, **kwargs: urls.append(url) or
                        tv_video.mvit_v2_s().state_dict())
    model = VideoClassifier(num_classes=NUM_CLASSES, backbone="mvit_v2_s", weights="KINETICS400_V1")
    assert urls == [tv_video.MViT_V2_S_Weights.KINETICS400_V1.url]
    assert isinstance(model.backbone, MultigridMViT) and model.loaded_weights is not None
    for name in TRANSFORMERS:
        assert "KINETICS400_V1" in weights_names(name)
    assert weights_names("tiny_swin3d") == ()
