"""A 2-process DDP fit on CPU (gloo) with MultigridCallback, run by tests/test_callback_ddp.py.

Not a test module (pytest does not collect it): Lightning's ``strategy="ddp"`` re-launches the
running script for rank 1, which cannot work from inside pytest, so the test runs this file::

    python tests/ddp_fit.py OUT_DIR ROOT_DIR TRAIN_MANIFEST VAL_MANIFEST [PRECISION [CHECKPOINT_DIR]]

PRECISION is the Trainer's (default ``32-true``); with CHECKPOINT_DIR a checkpoint is saved at
the end of every epoch (``epoch=E-*.ckpt``), for a resume on another number of devices. With the
environment variable ``DDP_FIT_BATCH_SIZING`` (``flops`` or ``time``), batches are sized by measured cost.

Each rank writes ``OUT_DIR/rank{r}.json``: per training step the epoch, batch index, video
shape, the BatchNorm layer's grouping (mode, num_splits, sync group size) and the statistics
needed to check what the layer computed (its running statistics before and after the step and
the per-channel mean and variance of its local input); the final parameters and buffers; and
(rank 0) the schedule the callback built.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

# The package of this checkout (beside tests/), not the installed one: the script runs from a
# temporary directory, where the import would find whichever copy is installed.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lightning_multigrid._lightning import pl  # noqa: E402
from lightning_multigrid.callback import MultigridCallback  # noqa: E402
from lightning_multigrid.data.datamodule import MultigridVideoDataModule  # noqa: E402
from lightning_multigrid.norm import MultigridBatchNorm  # noqa: E402

DDPStrategy = pl.strategies.DDPStrategy

BASE: dict[str, Any] = dict(batch_size=1, num_frames=8, crop_size=32, sampling_rate=2)
MAX_EPOCHS, MILESTONES, BN_BASE_SIZE = 4, [2], 2
BATCH_SIZING = os.environ.get("DDP_FIT_BATCH_SIZING", "equation1")


def _floats(tensor: torch.Tensor) -> list[float]:
    return [float(v) for v in tensor.detach().double().flatten()]


class RecordingNet(pl.LightningModule):
    """A tiny shape-agnostic 3D CNN with BatchNorm; records every training step."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv3d(3, 4, 3, padding=1), nn.BatchNorm3d(4), nn.ReLU(),
            nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(4, 4),
        )
        self.steps: list[dict[str, Any]] = []
        self.dtypes: set[torch.dtype] = set()  # of the BatchNorm input

    def forward(self, video: torch.Tensor) -> torch.Tensor:
        return self.net(video)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        video = batch["video"]
        bn = self.net[1]
        assert isinstance(bn, MultigridBatchNorm), type(bn)
        assert bn.running_mean is not None and bn.running_var is not None
        # self.net(video), layer by layer, to see the BatchNorm layer's input and buffers.
        x = self.net[0](video)
        self.dtypes.add(x.dtype)
        before_mean, before_var = bn.running_mean.clone(), bn.running_var.clone()
        with torch.no_grad():
            local_var, local_mean = torch.var_mean(x.double(), dim=[0, 2, 3, 4], correction=0)
        y = bn(x)
        logits = self.net[2:](y)
        group = bn.process_group
        self.steps.append({
            "epoch": self.current_epoch,
            "batch_idx": batch_idx,
            "shape": list(video.shape),
            "mode": bn.mode,
            "num_splits": bn.num_splits,
            "group_size": dist.get_world_size(group) if bn.mode == "sync" else None,
            "momentum": bn.momentum,
            "count": x.numel() // x.shape[1],
            "local_mean": _floats(local_mean),
            "local_var": _floats(local_var),  # biased
            "running_mean_before": _floats(before_mean),
            "running_var_before": _floats(before_var),
            "running_mean_after": _floats(bn.running_mean),
            "running_var_after": _floats(bn.running_var),
        })
        return nn.functional.cross_entropy(logits, batch["label"])

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        loss = nn.functional.cross_entropy(self(batch["video"]), batch["label"])
        self.log("val_loss", loss, batch_size=len(batch["label"]), sync_dist=True)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.MultiStepLR(optimizer, MILESTONES)}


def main(
    out_dir: str,
    root_dir: str,
    train_manifest: str,
    val_manifest: str,
    precision: str = "32-true",
    checkpoint_dir: str | None = None,
) -> None:
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    model = RecordingNet()
    datamodule = MultigridVideoDataModule(
        train_manifest=train_manifest, val_manifest=val_manifest, root_dir=root_dir,
        num_workers=0, flip=False, seed=1, **BASE,
    )
    callbacks: list[pl.Callback] = [
        MultigridCallback(bn_base_size=BN_BASE_SIZE, precise_bn_batches=0, milestones=MILESTONES,
                          batch_sizing=BATCH_SIZING)  # type: ignore[arg-type]
    ]
    if checkpoint_dir is not None:
        callbacks.append(pl.callbacks.ModelCheckpoint(dirpath=checkpoint_dir, save_top_k=-1, every_n_epochs=1))
    trainer = pl.Trainer(
        accelerator="cpu", devices=2,
        # Plain "ddp" with a bounded collective timeout, so a rank that dies surfaces as an
        # error on the other instead of a 30-minute wait.
        strategy=DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=90)),
        use_distributed_sampler=False, max_epochs=MAX_EPOCHS, num_sanity_val_steps=0,
        limit_val_batches=1, logger=False, enable_checkpointing=checkpoint_dir is not None,
        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks, precision=precision,
    )
    trainer.fit(model, datamodule=datamodule)

    callback = callbacks[0]
    assert isinstance(callback, MultigridCallback)
    schedule = callback.schedule
    assert schedule is not None
    bn = model.net[1]
    record: dict[str, Any] = {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "precision": trainer.precision,
        "dtypes": sorted({str(d) for d in model.dtypes}),
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "pid": os.getpid(),
        "current_epoch": trainer.current_epoch,
        "steps": model.steps,
        "final": {name: _floats(value) for name, value in model.state_dict().items()},
        "final_bn_mode": bn.mode,
        "schedule": {
            "max_epochs": schedule.max_epochs,
            "devices": schedule.config.devices,
            "clip_costs": [[c.num_frames, c.crop_size, c.cost_per_clip] for c in schedule.config.clip_costs],
            "stages": [
                {"start_epoch": s.start_epoch, "end_epoch": s.end_epoch, "bn": s.bn.to_dict()}
                for s in schedule.stages
            ],
        },
    }
    path = Path(out_dir) / f"rank{trainer.global_rank}.json"
    path.with_suffix(".tmp").write_text(json.dumps(record))
    path.with_suffix(".tmp").replace(path)  # complete files only


if __name__ == "__main__":
    if not 5 <= len(sys.argv) <= 7:
        sys.exit(f"usage: {sys.argv[0]} OUT_DIR ROOT_DIR TRAIN_MANIFEST VAL_MANIFEST [PRECISION [CHECKPOINT_DIR]]")
    main(*sys.argv[1:])
