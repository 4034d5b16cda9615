"""GridMemoryFormat on a real Trainer: every step runs in the layout chosen for its grid, the model is left intact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from lightning_multigrid._lightning import pl
from lightning_multigrid.callback import MultigridCallback
from lightning_multigrid.data.synthetic import SyntheticDataset
from lightning_multigrid.memory_format import GridMemoryFormat, convert_memory_format, time_memory_formats

from test_callback import RecordingNet, make_datamodule, train_manifest  # noqa: F401  (fixture)


def _layout(model: nn.Module) -> str:
    weight = model.net[0].weight
    if weight.is_contiguous():
        return "contiguous"
    return "channels_last_3d" if weight.is_contiguous(memory_format=torch.channels_last_3d) else "other"


class LayoutNet(RecordingNet):
    """Records the layout of the convolution's weight at every step."""

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.layouts = getattr(self, "layouts", [])
        self.layouts.append((tuple(batch["video"].shape), _layout(self)))
        return super().training_step(batch, batch_idx)


def _fit(data: SyntheticDataset, manifest: Path, callbacks: list[Any], tmp_path: Path) -> LayoutNet:
    torch.manual_seed(0)
    model = LayoutNet()
    trainer = pl.Trainer(
        max_epochs=4, callbacks=callbacks, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, default_root_dir=tmp_path,
    )
    trainer.fit(model, datamodule=make_datamodule(data, manifest))
    return model


def test_convert_keeps_parameters_and_changes_layout() -> None:
    model = nn.Sequential(nn.Conv3d(3, 4, 3), nn.BatchNorm3d(4))
    before = list(model.parameters())
    convert_memory_format(model, "channels_last_3d")
    assert [id(p) for p in model.parameters()] == [id(p) for p in before]
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last_3d) and not model[0].weight.is_contiguous()
    convert_memory_format(model, "contiguous")
    assert model[0].weight.is_contiguous()


def test_timing_leaves_the_model_as_it_was() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv3d(3, 4, 3), nn.BatchNorm3d(4), nn.ReLU(), nn.AdaptiveAvgPool3d(1), nn.Flatten())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    seconds = time_memory_formats(model, [(2, 3, 4, 16, 16)], repeats=2)
    assert set(seconds) == {"contiguous", "channels_last_3d"} and all(s > 0 for s in seconds.values())
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())  # BN statistics restored
    assert model[0].weight.is_contiguous() and model[0].weight.grad is None
    assert torch.equal(rng, torch.get_rng_state())


def test_each_grid_trains_in_its_chosen_layout(
    synthetic_dataset: SyntheticDataset, train_manifest: Path, tmp_path: Path  # noqa: F811
) -> None:
    layouts = GridMemoryFormat("fastest", repeats=1)
    model = _fit(synthetic_dataset, train_manifest, [MultigridCallback(), layouts], tmp_path)
    grids = {shape for shape, _ in model.layouts}
    assert len(grids) > 2  # the short and long cycles: several grids, each timed once
    assert {key[0] for key in layouts.choices} == grids
    assert all(set(t) == {"contiguous", "channels_last_3d"} for t in layouts.timings.values())
    assert all(layout == layouts.choices[(shape,)] for shape, layout in model.layouts)
    restored = GridMemoryFormat()
    restored.load_state_dict(layouts.state_dict())
    assert restored.choices == layouts.choices


def test_a_fixed_layout_trains_like_contiguous(
    synthetic_dataset: SyntheticDataset, train_manifest: Path, tmp_path: Path  # noqa: F811
) -> None:
    channels_last = _fit(synthetic_dataset, train_manifest, [MultigridCallback(), GridMemoryFormat("channels_last_3d")], tmp_path)
    plain = _fit(synthetic_dataset, train_manifest, [MultigridCallback()], tmp_path)
    assert {layout for _, layout in channels_last.layouts} == {"channels_last_3d"}
    assert {layout for _, layout in plain.layouts} == {"contiguous"}
    for a, b in zip(channels_last.parameters(), plain.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-3)  # the same training; other float rounding, compounded over the steps


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"memory_format": "channels_last"}, "memory_format"),
    ({"repeats": 0}, "repeats"),
])
def test_bad_arguments_are_named(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GridMemoryFormat(**kwargs)
