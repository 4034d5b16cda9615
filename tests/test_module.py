"""VideoClassifier: fitting on mixed shapes, losses, metrics, per-video test, optimiser, LR."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from lightning_multigrid._lightning import pl
from lightning_multigrid.fit.multiview import aggregate_views
from lightning_multigrid.models import BACKBONES, TinyVideoNet
from lightning_multigrid.module import VideoClassifier


def trainer(tmp_path: Path, **kwargs: Any) -> pl.Trainer:
    options: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
    )
    options.update(kwargs)
    return pl.Trainer(**options)


def batches(shapes: list[tuple[int, int, int]], num_classes: int, multi_label: bool = False) -> list[dict[str, torch.Tensor]]:
    """Ready-made batches of random clips, one per ``(batch_size, num_frames, crop_size)``."""
    generator = torch.Generator().manual_seed(0)
    out, first_index = [], 0
    for batch_size, num_frames, crop_size in shapes:
        if multi_label:
            label = (torch.rand(batch_size, num_classes, generator=generator) < 0.4).float()
        else:
            label = torch.randint(num_classes, (batch_size,), generator=generator)
        out.append({
            "video": torch.randn(batch_size, 3, num_frames, crop_size, crop_size, generator=generator),
            "label": label,
            "index": torch.arange(first_index, first_index + batch_size),
        })
        first_index += batch_size
    return out


def loader(items: list[dict[str, torch.Tensor]]) -> DataLoader:
    return DataLoader(items, batch_size=None)  # the items are batches already


# Every step a different grid, as multigrid training gives them.
MIXED_SHAPES = [(4, 2, 16), (2, 4, 24), (1, 8, 32)]


def test_tiny_model_fits_on_mixed_shapes(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = VideoClassifier(num_classes=7, backbone="tiny", tiny_width=4, dropout_rate=0.0, lr=0.05)
    before = [p.detach().clone() for p in model.parameters()]
    fit = trainer(tmp_path, limit_train_batches=3, limit_val_batches=2)
    fit.fit(model, loader(batches(MIXED_SHAPES, 7)), loader(batches(MIXED_SHAPES[:2], 7)))

    assert fit.global_step == 3
    metrics = fit.callback_metrics
    assert {"train/loss", "val/loss", "val/top1", "val/top5"} <= metrics.keys()
    assert math.isfinite(metrics["train/loss"]) and math.isfinite(metrics["val/loss"])
    assert 0 <= metrics["val/top1"] <= metrics["val/top5"] <= 1
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_multi_label_fits_validates_and_tests(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = VideoClassifier(num_classes=4, backbone="tiny", tiny_width=4, multi_label=True, dropout_rate=0.0)
    fit = trainer(tmp_path, limit_train_batches=3, limit_val_batches=2)
    fit.fit(model, loader(batches(MIXED_SHAPES, 4, multi_label=True)), loader(batches(MIXED_SHAPES, 4, multi_label=True)))
    assert {"train/loss", "val/loss", "val/map"} <= fit.callback_metrics.keys()
    assert "val/top1" not in fit.callback_metrics

    (results,) = fit.test(model, loader(batches(MIXED_SHAPES, 4, multi_label=True)), verbose=False)
    assert 0 <= results["test/map"] <= 1 and math.isfinite(results["test/loss"])
    assert model.test_predictions is not None
    assert model.test_predictions.probs.shape == (7, 4)  # 4 + 2 + 1 videos, one view each


class MeanOverChannels(nn.Module):
    """Logits = the clip's mean per channel: a test controls the logits through the input."""

    def __init__(self) -> None:
        super().__init__()
        self.unused = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3, 4))


def views(logits: list[list[float]], labels: list[int], index: list[int]) -> dict[str, torch.Tensor]:
    return {
        "video": torch.tensor(logits, dtype=torch.float32)[:, :, None, None, None].expand(-1, -1, 2, 4, 4),
        "label": torch.tensor(labels),
        "index": torch.tensor(index),
    }


def test_test_metrics_average_views_per_video(tmp_path: Path) -> None:
    # Six classes. Views of a video arrive in different batches, in any order.
    #   video 0, label 1, 2 views: logits 4 at class 1 / 3 at class 2
    #   video 1, label 0, 3 views: 5 at class 5 / 1 at class 0 (twice)
    #   video 2, label 3, 1 view:  1 everywhere but 0 at class 3 (ranks last)
    items = [
        views([[0, 0, 0, 0, 0, 5], [0, 4, 0, 0, 0, 0]], labels=[0, 1], index=[1, 0]),
        views([[1, 1, 1, 0, 1, 1], [1, 0, 0, 0, 0, 0], [0, 0, 3, 0, 0, 0]], labels=[3, 0, 1], index=[2, 1, 0]),
        views([[1, 0, 0, 0, 0, 0]], labels=[0], index=[1]),
    ]
    model = VideoClassifier(num_classes=6, backbone=MeanOverChannels())
    (results,) = trainer(tmp_path).test(model, loader(items), verbose=False)

    e = math.e
    # Video 0: class 1 = (e^4/(e^4+5) + 1/(e^3+5)) / 2 = (0.9161 + 0.0399) / 2 = 0.4780
    #          class 2 = (1/(e^4+5) + e^3/(e^3+5)) / 2 = (0.0168 + 0.8007) / 2 = 0.4087 -> 1, right.
    # Video 1: class 5 = (e^5/(e^5+5) + 2/(e+5)) / 3 = (0.9674 + 0.2591) / 3 = 0.4089
    #          class 0 = (1/(e^5+5) + 2e/(e+5)) / 3 = (0.0065 + 0.7044) / 3 = 0.2370 -> 5, wrong
    #          (a vote over views would say 0), but class 0 is second: in the top 5.
    # Video 2: class 3 has the smallest probability: wrong, and not in the top 5.
    predictions = model.test_predictions
    assert predictions is not None
    assert predictions.video_index.tolist() == [0, 1, 2]
    assert predictions.num_views.tolist() == [2, 3, 1]
    assert predictions.labels.tolist() == [1, 0, 3]
    expected_video1 = torch.tensor([1 / (e**5 + 5) + 2 * e / (e + 5), *[1 / (e**5 + 5) + 2 / (e + 5)] * 4,
                                    e**5 / (e**5 + 5) + 2 / (e + 5)]) / 3
    torch.testing.assert_close(predictions.probs[1], expected_video1)
    assert predictions.probs[0, 1] == pytest.approx((e**4 / (e**4 + 5) + 1 / (e**3 + 5)) / 2)
    assert results["test/top1"] == pytest.approx(1 / 3)
    assert results["test/top5"] == pytest.approx(2 / 3)


def test_aggregate_views_counts_repeated_views_once_and_checks_labels() -> None:
    probs = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.2, 0.8], [0.6, 0.4]])
    # Video 7's second view is repeated (a distributed sampler padding its shard).
    result = aggregate_views(torch.tensor([7, 7, 7, 3]), probs, torch.tensor([0, 0, 0, 1]), view=torch.tensor([0, 1, 1, 0]))
    assert result.video_index.tolist() == [3, 7] and result.num_views.tolist() == [1, 2]
    torch.testing.assert_close(result.probs, torch.tensor([[0.6, 0.4], [0.55, 0.45]]))
    with pytest.raises(ValueError, match="views of video 7 have different labels"):
        aggregate_views(torch.tensor([7, 7]), probs[:2], torch.tensor([0, 1]))


def test_test_batches_need_an_index(tmp_path: Path) -> None:
    item = batches([(2, 2, 16)], 3)[0]
    del item["index"]
    model = VideoClassifier(num_classes=3, backbone="tiny", tiny_width=4)
    with pytest.raises(ValueError, match="'index'"):
        trainer(tmp_path).test(model, loader([item]), verbose=False)


def test_weight_decay_skips_batchnorm_and_biases() -> None:
    model = VideoClassifier(num_classes=3, backbone="tiny", tiny_width=4, weight_decay=5e-4, nesterov=False)
    optimizer = model.configure_optimizers()["optimizer"]
    names = {id(p): name for name, p in model.named_parameters()}
    groups = {g["name"]: ({names[id(p)] for p in g["params"]}, g["weight_decay"]) for g in optimizer.param_groups}

    decayed, decay = groups["decay"]
    not_decayed, no_decay = groups["no_decay"]
    assert (decay, no_decay) == (5e-4, 0.0)
    # TinyVideoNet: features = 4 x (Conv3d, BatchNorm3d, ReLU), then fc.
    assert decayed == {f"backbone.features.{i}.weight" for i in (0, 3, 6, 9)} | {"backbone.fc.weight"}
    assert not_decayed == {f"backbone.features.{i}.{p}" for i in (1, 4, 7, 10) for p in ("weight", "bias")} | {
        "backbone.fc.bias"
    }
    assert optimizer.defaults["momentum"] == 0.9 and optimizer.defaults["nesterov"] is False


def test_adamw_groups_leave_swin_position_tables_undecayed() -> None:
    model = VideoClassifier(num_classes=3, backbone="tiny_swin3d", tiny_width=4, optimizer="adamw", lr=1e-3,
                            weight_decay=0.05)
    optimizer = model.configure_optimizers()["optimizer"]
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults["betas"] == (0.9, 0.999)
    names = {id(p): name for name, p in model.named_parameters()}
    groups = {g["name"]: ({names[id(p)] for p in g["params"]}, g["weight_decay"], g["lr"]) for g in optimizer.param_groups}
    decayed, decay, lr = groups["decay"]
    not_decayed, no_decay, _ = groups["no_decay"]
    assert (decay, no_decay, lr) == (0.05, 0.0, 1e-3)
    tables = {name for name in names.values() if name.endswith("relative_position_bias_table")}
    assert tables and tables <= not_decayed  # 2-D, yet not decayed
    assert all(p.ndim > 1 for name, p in model.named_parameters() if name in decayed)
    assert not any("norm" in name or name.endswith(".bias") for name in decayed)
    assert "backbone.head.weight" in decayed and decayed | not_decayed == set(names.values())


def test_adamw_fits_tiny_swin3d(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = VideoClassifier(num_classes=5, backbone="tiny_swin3d", tiny_width=4, optimizer="adamw", lr=3e-3,
                            weight_decay=0.05, warmup_epochs=1, milestones=(2,), dropout_rate=0.0)
    assert model.hparams.optimizer == "adamw"
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    fit = trainer(tmp_path, max_epochs=3, limit_train_batches=3, limit_val_batches=1)
    fit.fit(model, loader(batches(MIXED_SHAPES, 5)), loader(batches(MIXED_SHAPES[:1], 5)))
    assert fit.global_step == 9
    assert math.isfinite(fit.callback_metrics["train/loss"]) and math.isfinite(fit.callback_metrics["val/loss"])
    after = dict(model.named_parameters())
    assert all(not torch.equal(before[name], after[name]) for name in before if name.endswith("bias_table"))
    assert isinstance(fit.optimizers[0], torch.optim.AdamW)


def test_warmup_then_steps_gives_the_expected_lr_per_epoch(tmp_path: Path) -> None:
    model = VideoClassifier(
        num_classes=3, backbone="tiny", tiny_width=4, lr=0.1, warmup_epochs=2, warmup_start_factor=0.1,
        milestones=(4, 6), gamma=0.1,
    )
    # Epoch 0: 0.1 * 0.1; epoch 1: 0.1 * (0.1 + 0.9 * 1/2); 2-3: 0.1; 4-5: 0.1 * 0.1; 6-7: 0.1 * 0.01.
    expected = [0.01, 0.055, 0.1, 0.1, 0.01, 0.01, 0.001, 0.001]
    assert model.lr_milestones == (4, 6)

    seen: list[float] = []
    record = pl.callbacks.LambdaCallback(
        on_train_epoch_start=lambda trainer, _: seen.append(trainer.optimizers[0].param_groups[0]["lr"])
    )
    fit = trainer(tmp_path, max_epochs=8, limit_train_batches=1, limit_val_batches=0, callbacks=[record])
    fit.fit(model, loader(batches([(2, 2, 16)], 3)))
    assert seen == pytest.approx(expected)


def test_no_warmup_uses_plain_multistep() -> None:
    model = VideoClassifier(num_classes=3, backbone="tiny", tiny_width=4, lr=0.2, milestones=(2,), gamma=0.5)
    config = model.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    assert isinstance(scheduler, torch.optim.lr_scheduler.MultiStepLR)
    lrs = []
    for _ in range(4):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([0.2, 0.2, 0.1, 0.1])


class RecordPathways(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.seen: list[list[tuple[int, ...]]] = []

    def forward(self, x: list[torch.Tensor]) -> torch.Tensor:
        self.seen.append([tuple(p.shape) for p in x])
        x[0] = x[0] * 0  # pytorchvideo's SlowFast overwrites list entries too
        return self.fc(x[1].mean(dim=(2, 3, 4)))


def test_two_pathway_input() -> None:
    backbone = RecordPathways()
    model = VideoClassifier(num_classes=2, backbone=backbone, slowfast_alpha=4)
    model(torch.zeros(2, 3, 8, 16, 16))
    given = [torch.ones(2, 3, 2, 16, 16), torch.ones(2, 3, 8, 16, 16)]
    model(given)
    assert backbone.seen == [[(2, 3, 2, 16, 16), (2, 3, 8, 16, 16)]] * 2
    assert torch.equal(given[0], torch.ones(2, 3, 2, 16, 16))  # the batch's list is not changed
    assert VideoClassifier(num_classes=2, backbone="slowfast_r50").slowfast_alpha == 4


@pytest.mark.parametrize("name", BACKBONES)
def test_every_named_backbone_builds_and_takes_a_small_clip(name: str) -> None:
    model = VideoClassifier(num_classes=5, backbone=name).eval()
    with torch.no_grad():
        assert model(torch.zeros(1, 3, 8, 32, 32)).shape == (1, 5)
    model.preflight([_Grid(8, 32), _Grid(5, 32)])
    if name == "s3d":
        # S3D halves the frames three times and ends with a 2x2x2 max pool: >= 5 frames per clip.
        with pytest.raises(ValueError, match=r"grid 4x32 .* layer `features.13` \(MaxPool3d\)"):
            model.preflight([_Grid(4, 32)])
    else:
        model.preflight([_Grid(4, 32)])


class _Grid:
    def __init__(self, num_frames: int, crop_size: int) -> None:
        self.num_frames, self.crop_size = num_frames, crop_size


def test_backbone_module_is_made_compatible_and_not_saved() -> None:
    backbone = nn.Sequential(nn.Conv3d(3, 4, 1), nn.AvgPool3d((2, 8, 8)), nn.Flatten(), nn.Linear(4, 3))
    model = VideoClassifier(num_classes=3, backbone=backbone)
    assert model.backbone is backbone and isinstance(backbone[1], nn.AdaptiveAvgPool3d)
    assert "backbone" not in model.hparams
    assert isinstance(VideoClassifier(num_classes=3).backbone, TinyVideoNet)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"backbone": "resnet9000"}, r"Unknown `backbone` 'resnet9000': choose one of tiny, tiny_swin3d, x3d_xs"),
        ({"backbone": 3}, "`backbone` must be a name"),
        ({"num_classes": 1}, "`num_classes` must be an integer >= 2"),
        ({"warmup_epochs": 5, "milestones": (5, 8)}, "must come after the warm-up"),
        ({"milestones": (8, 5)}, "strictly increasing"),
        ({"momentum": 0.0}, r"`nesterov=True` needs `momentum` > 0"),
        ({"warmup_start_factor": 0.0}, r"`warmup_start_factor` must be in \(0, 1\]"),
        ({"backbone": "x3d_xs", "slowfast_alpha": 4}, "has one pathway"),
        ({"lr": 0}, "`lr` must be a positive number"),
        ({"optimizer": "adam"}, r"`optimizer` must be one of 'sgd', 'adamw', got 'adam'"),
        ({"optimizer": "adamw", "momentum": 0.0}, None),  # momentum and nesterov are SGD's only
    ],
)
def test_invalid_arguments(kwargs: dict[str, Any], match: str | None) -> None:
    arguments: dict[str, Any] = {"num_classes": 3, **kwargs}
    if match is None:
        VideoClassifier(**arguments)
        return
    with pytest.raises((ValueError, TypeError), match=match):
        VideoClassifier(**arguments)


@pytest.mark.parametrize("bad", ["yes", 1, "max-autotune"])
def test_compile_mode_is_checked(bad):
    with pytest.raises(ValueError, match="`compile` must be"):
        VideoClassifier(num_classes=3, backbone="tiny", tiny_width=4, compile=bad)


def test_compile_dynamic_does_not_recompile_at_every_grid():
    import torch._dynamo
    from torch._dynamo.utils import counters

    grids = [(4, 4, 32), (2, 8, 32), (8, 4, 45), (2, 8, 64), (16, 2, 32)]  # (batch, frames, crop)
    graphs = {}
    for mode in ("dynamic", "per_grid"):
        torch._dynamo.reset()
        counters.clear()
        # The "eager" backend traces as inductor would, without generating kernels: the graph count is the same.
        model = VideoClassifier(num_classes=3, backbone="tiny", tiny_width=4, compile=mode, compile_backend="eager")
        for batch, frames, crop in grids:
            video = torch.randn(batch, 3, frames, crop, crop)
            model(video).sum().backward()
        graphs[mode] = counters["stats"]["unique_graphs"]
        assert list(model.state_dict()) == list(VideoClassifier(num_classes=3, backbone="tiny", tiny_width=4).state_dict())
    torch._dynamo.reset()
    # Dynamic: one graph per range of sizes the network's strides bring to 1 (frames 2, 4, 8 here).
    assert graphs == {"dynamic": 3, "per_grid": len(grids)}


class StepLosses(pl.Callback):
    """Each step's loss, and the ``train/loss`` Lightning holds for the progress bar after it."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.shown: list[float | None] = []

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.losses.append(float(outputs["loss"]))
        shown = trainer.progress_bar_metrics.get("train/loss")
        self.shown.append(None if shown is None else float(shown))


@pytest.mark.parametrize("progress_bar", [False, True])
def test_train_loss_reaches_loggers_bar_and_epoch_end_without_a_call_per_step(tmp_path: Path, progress_bar: bool) -> None:
    CSVLogger = pl.loggers.CSVLogger

    torch.manual_seed(0)
    model = VideoClassifier(num_classes=3, backbone="tiny", tiny_width=2, dropout_rate=0.0)
    calls = []
    log = model.log
    model.log = lambda name, *args, **kwargs: (calls.append(name), log(name, *args, **kwargs))[1]  # type: ignore[method-assign]
    steps = StepLosses()
    shapes = [(2, 2, 16)] * 7  # 7 steps per epoch, 2 epochs
    fit = trainer(tmp_path, max_epochs=2, log_every_n_steps=3, logger=CSVLogger(tmp_path, name="csv"),
                  enable_progress_bar=progress_bar, callbacks=[steps])
    fit.fit(model, loader(batches(shapes, 3)))

    # The loggers get every logging step's own loss (steps 3, 6, 9, 12 of 14), as Lightning writes them.
    rows = (Path(fit.logger.log_dir) / "metrics.csv").read_text().splitlines()  # type: ignore[union-attr]
    header = rows[0].split(",")
    logged = {int(r.split(",")[header.index("step")]): float(r.split(",")[header.index("train/loss")]) for r in rows[1:]}
    assert logged == pytest.approx({step - 1: steps.losses[step - 1] for step in (3, 6, 9, 12)})
    # The last step of each epoch is there for epoch-end readers (EarlyStopping, ModelCheckpoint).
    assert steps.shown[6] == pytest.approx(steps.losses[6]) and steps.shown[13] == pytest.approx(steps.losses[13])
    assert fit.callback_metrics["train/loss"] == pytest.approx(steps.losses[-1])
    if progress_bar:  # the bar shows every step's loss
        assert steps.shown == pytest.approx(steps.losses) and len(calls) == 14
    else:  # logging steps and epoch ends only
        assert calls.count("train/loss") == 6
        assert steps.shown[3] == pytest.approx(steps.losses[2])  # between them, the last logged value
