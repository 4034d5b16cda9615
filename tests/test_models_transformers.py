"""Video transformers at every multigrid grid: ``tiny_swin3d``, ``swin3d_t``, ``mvit_v2_s``, ``mvit_v1_b``.

Grids come from the schedules of ``configs/demo.yaml`` and ``configs/kinetics400_*.yaml``, built with
the package's own ``build_schedule``.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytorch_lightning as pl
import torch
import yaml

from lightning_multigrid.callback import MultigridCallback
from lightning_multigrid.data.datamodule import MultigridVideoDataModule
from lightning_multigrid.data.synthetic import SyntheticDataset
from lightning_multigrid.models import build_backbone, preflight
from lightning_multigrid.module import VideoClassifier
from lightning_multigrid.schedule import GridShape, MultigridConfig, MultigridSchedule, build_schedule

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
NUM_CLASSES = 5


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


def test_tiny_swin3d_fits_with_the_multigrid_callback(synthetic_dataset: SyntheticDataset, tmp_path: Path) -> None:
    """A real Trainer, real H.264 videos, the long and short cycle: every grid trains the transformer."""
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
        default_root_dir=tmp_path, callbacks=[MultigridCallback(precise_bn_batches=0)],
    )
    trainer.fit(model, datamodule=datamodule)

    assert math.isfinite(trainer.callback_metrics["train/loss"])
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    # Coarse long-cycle grids (fewer frames) and short-cycle crops reached the model.
    assert {s[2] for s in shapes} > {8} and {s[3] for s in shapes} > {32}
