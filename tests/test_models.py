"""Head pooling surgery, preflight and the backbone builder (lightning_multigrid/models/)."""

from __future__ import annotations

import copy
import warnings
from collections import OrderedDict
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torchvision.models.video import r3d_18

from lightning_multigrid.models import (
    BACKBONES,
    FixedHeadPoolWarning,
    build_backbone,
    convert_head_pooling,
    find_fixed_head_pools,
    make_multigrid_compatible,
    preflight,
)
from lightning_multigrid.schedule import GridShape, MultigridConfig, build_schedule

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", category=FutureWarning)
    from pytorchvideo.models.resnet import create_resnet
    from pytorchvideo.models.slowfast import create_slowfast
    from pytorchvideo.models.x3d import create_x3d

# pytorchvideo's Swish (X3D) uses a deprecated autograd attribute; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:'saved_variables' is deprecated:DeprecationWarning")

NUM_CLASSES = 5
ALPHA = 4  # SlowFast frame-rate ratio


def grids(num_frames: int, crop_size: int) -> tuple[GridShape, ...]:
    """Every grid of a small long + short cycle schedule, e.g. 2x32 ... 8x64 for base 8x64."""
    config = MultigridConfig(base=GridShape(2, num_frames, crop_size), max_epochs=10, milestones=(4, 8))
    return build_schedule(config).distinct_grids()


# Small configurations, each built for its base grid (head kernels sized for it).
# name -> (builder, base frames, base crop, two pathways, head pools pytorchvideo builds fixed)
MODELS: dict[str, tuple[Callable[[], nn.Module], int, int, bool, list[str]]] = {
    "x3d": (
        lambda: create_x3d(
            input_clip_length=8, input_crop_size=32, model_num_class=NUM_CLASSES, width_factor=1.0,
            depth_factor=1.0, stem_dim_in=8, head_dim_out=32, head_activation=None,
        ),
        8, 32, False, ["blocks.5.pool.pool"],
    ),
    "resnet": (
        # Depth 50 is the smallest create_resnet supports; a narrow stem keeps it small.
        lambda: create_resnet(model_depth=50, stem_dim_out=8, model_num_class=NUM_CLASSES, head_pool_kernel_size=(8, 2, 2)),
        8, 64, False, ["blocks.5.pool"],
    ),
    "slowfast": (
        lambda: create_slowfast(
            model_depth=18, stem_dim_outs=(16, 2), model_num_class=NUM_CLASSES,
            head_pool_kernel_sizes=((16 // ALPHA, 2, 2), (16, 2, 2)),
        ),
        16, 64, True, ["blocks.5.pool.0", "blocks.5.pool.1"],
    ),
    # 33M parameters: the smallest grids keep its backward pass cheap.
    "r3d_18": (lambda: r3d_18(weights=None, num_classes=NUM_CLASSES), 4, 32, False, []),
}


def clip_input(batch_size: int, num_frames: int, crop_size: int, two_pathway: bool) -> torch.Tensor | list[torch.Tensor]:
    clip = torch.randn(batch_size, 3, num_frames, crop_size, crop_size)
    return [clip[:, :, ::ALPHA], clip] if two_pathway else clip


@pytest.mark.parametrize("name", list(MODELS))
def test_converted_model_trains_on_every_grid(name: str) -> None:
    builder, num_frames, crop_size, two_pathway, fixed_pools = MODELS[name]
    torch.manual_seed(0)
    model = builder()
    module_types = [type(m) for m in model.modules()]

    assert make_multigrid_compatible(model) is model
    assert find_fixed_head_pools(model) == []
    if not fixed_pools:  # torchvision ResNets already pool adaptively: nothing changes
        assert [type(m) for m in model.modules()] == module_types

    schedule_grids = grids(num_frames, crop_size)
    assert len({(g.num_frames, g.crop_size) for g in schedule_grids}) == 8
    preflight(model, schedule_grids, slowfast_alpha=ALPHA if two_pathway else None)

    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    before = [p.detach().clone() for p in model.parameters()]
    labels = torch.tensor([0, 3])
    for grid in schedule_grids:  # batch 2 instead of the grid's batch: the shape is what matters
        logits = model(clip_input(2, grid.num_frames, grid.crop_size, two_pathway))
        assert logits.shape == (2, NUM_CLASSES), grid
        loss = nn.functional.cross_entropy(logits, labels)
        assert torch.isfinite(loss)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


@pytest.mark.parametrize("name", [n for n in MODELS if MODELS[n][4]])
def test_conversion_is_needed_and_exact_at_the_base_grid(name: str) -> None:
    builder, num_frames, crop_size, two_pathway, fixed_pools = MODELS[name]
    torch.manual_seed(0)
    original = builder().eval().requires_grad_(False)
    assert find_fixed_head_pools(original) == fixed_pools

    coarsest = grids(num_frames, crop_size)[0]
    with torch.no_grad(), pytest.raises(RuntimeError, match="smaller than kernel size"):
        original(clip_input(1, coarsest.num_frames, coarsest.crop_size, two_pathway))

    converted = copy.deepcopy(original)
    assert convert_head_pooling(converted) == fixed_pools
    assert convert_head_pooling(converted) == []  # idempotent
    # Parameters and buffers are untouched, so checkpoints still load.
    assert converted.state_dict().keys() == original.state_dict().keys()
    torch.manual_seed(1)
    expected = original(clip_input(2, num_frames, crop_size, two_pathway))
    torch.manual_seed(1)  # a fresh input: pytorchvideo's SlowFast overwrites the list it is given
    torch.testing.assert_close(converted(clip_input(2, num_frames, crop_size, two_pathway)), expected)


def test_generic_pool_before_linear_is_converted_body_pools_are_not() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(nn.Conv3d(3, 4, 3, padding=1), nn.MaxPool3d((1, 2, 2)), nn.Conv3d(4, 8, 1))
            self.pool = nn.AvgPool3d((4, 8, 8))
            self.dropout = nn.Dropout(0.1)
            self.fc = nn.Linear(8, NUM_CLASSES)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.dropout(self.pool(self.features(x)).flatten(1)))

    model = Net()
    flat = nn.Sequential(nn.Conv3d(3, 8, 1), nn.MaxPool3d(4), nn.Flatten(), nn.Linear(8, NUM_CLASSES))
    assert convert_head_pooling(model) == ["pool"]
    assert convert_head_pooling(flat) == ["1"]
    assert isinstance(model.pool, nn.AdaptiveAvgPool3d) and isinstance(flat[1], nn.AdaptiveMaxPool3d)
    assert isinstance(model.features[1], nn.MaxPool3d)  # followed by a conv: a body pool
    assert model(torch.randn(2, 3, 2, 8, 8)).shape == (2, NUM_CLASSES)


def test_preflight_names_a_fixed_size_linear() -> None:
    model = nn.Sequential(
        OrderedDict(
            features=nn.Conv3d(3, 2, 1, stride=(1, 8, 8)),
            flatten=nn.Flatten(),
            classifier=nn.Linear(2 * 8 * 8 * 8, NUM_CLASSES),  # sized for 8x64 only
        )
    )
    model(torch.zeros(1, 3, 8, 64, 64))  # the base grid works
    with pytest.raises(ValueError, match=r"grid 2x32 .*\(1, 3, 2, 32, 32\) failed in layer `classifier` \(Linear\)"):
        preflight(model, grids(8, 64))


def test_preflight_catches_a_slowfast_with_too_few_frames() -> None:
    builder, *_ = MODELS["slowfast"]
    model = make_multigrid_compatible(builder())
    # Base 8 frames: the coarsest long-cycle grid has 2 frames, 2 // 4 = 0 slow frames.
    with pytest.raises(ValueError, match=r"Grid 2x32 .*slow pathway.*`slowfast_alpha`=4"):
        preflight(model, grids(8, 64), slowfast_alpha=ALPHA)


def test_preflight_names_a_temporal_kernel_larger_than_the_input() -> None:
    # Unpadded temporal convolution: needs at least 3 frames.
    model = nn.Sequential(nn.Conv3d(3, 4, (3, 1, 1)), nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(4, 2))
    preflight(model, [GridShape(1, 4, 16)])
    with pytest.raises(ValueError, match=r"grid 2x16 .*\(1, 3, 2, 16, 16\) failed in layer `0` \(Conv3d\)"):
        preflight(model, [GridShape(1, 4, 16), GridShape(1, 2, 16)])


def test_preflight_catches_an_output_that_changes_with_the_grid() -> None:
    model = nn.Sequential(nn.Conv3d(3, NUM_CLASSES, 1), nn.AvgPool3d((2, 8, 8)))  # no global average
    with pytest.raises(ValueError, match=r"output shape changes with the grid: \(1, 5, 2, 2, 2\) at 4x16"):
        preflight(model, [GridShape(1, 2, 8), GridShape(1, 4, 16)])


def test_preflight_warns_about_fixed_head_pools_and_restores_modes() -> None:
    builder, num_frames, crop_size, _, _ = MODELS["resnet"]
    model = builder().train()
    model.blocks[0].eval()  # a frozen stem must stay frozen
    modes = [m.training for m in model.modules()]
    with pytest.warns(FixedHeadPoolWarning, match=r"blocks\.5\.pool.*make_multigrid_compatible"):
        preflight(model, [GridShape(1, num_frames, crop_size)])
    assert [m.training for m in model.modules()] == modes
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"grids": []}, "`grids` is empty"),
        ({"grids": [SimpleNamespace(num_frames=0, crop_size=8)]}, "num_frames=0"),  # GridShape refuses 0 itself
        ({"grids": [(4, 8)]}, "`grids` must hold objects"),
        ({"grids": [GridShape(1, 4, 8)], "slowfast_alpha": 0}, "`slowfast_alpha` must be"),
        ({"grids": [GridShape(1, 4, 8)], "batch_size": 0}, "`batch_size` must be"),
    ],
)
def test_preflight_rejects_invalid_arguments(kwargs: dict, match: str) -> None:
    model = nn.Sequential(nn.Conv3d(3, 2, 1), nn.AdaptiveAvgPool3d(1), nn.Flatten())
    with pytest.raises(ValueError, match=match):
        preflight(model, **kwargs)


def test_build_backbone_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match=r"Unknown `backbone` 'resnet9000': choose one of tiny, tiny_swin3d, x3d_xs, .*s3d"):
        build_backbone("resnet9000", NUM_CLASSES)
    with pytest.raises(ValueError, match="`num_classes` must be a positive integer"):
        build_backbone("tiny", 0)
    assert BACKBONES[0] == "tiny"


def test_tiny_backbone_takes_every_grid() -> None:
    model = build_backbone("tiny", NUM_CLASSES, tiny_width=4)
    preflight(model, grids(8, 64), batch_size=2)
