"""A 2-process DDP fit (CPU, gloo) over a manifest with bad videos, run by tests/test_callback_ddp_skipped.py.

Not a test module: Lightning's ``strategy="ddp"`` re-launches this script for rank 1::

    python tests/ddp_skipped.py OUT_DIR TRAIN_MANIFEST

Each rank writes ``OUT_DIR/rank{r}.json``: the videos it skipped itself and the value of
``multigrid/skipped_videos`` it logged at its last step.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.strategies import DDPStrategy
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's package

from lightning_multigrid.callback import MultigridCallback  # noqa: E402
from lightning_multigrid.data.datamodule import MultigridVideoDataModule  # noqa: E402


class TinyNet(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv3d(3, 2, 3, padding=1), nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(2, 4))

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        return nn.functional.cross_entropy(self.net(batch["video"]), batch["label"])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main(out_dir: str, train_manifest: str) -> None:
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    datamodule = MultigridVideoDataModule(
        train_manifest=train_manifest, num_workers=0, flip=False, seed=1, batch_size=1, num_frames=4, crop_size=16,
        sampling_rate=2,
    )
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=90)),
        use_distributed_sampler=False, max_epochs=1, num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[MultigridCallback(precise_bn_batches=0, preflight=False, long_cycle=False)],
    )
    trainer.fit(TinyNet(), datamodule=datamodule)
    record = {
        "own": list(datamodule.skipped_video_paths),
        "logged": float(trainer.callback_metrics["multigrid/skipped_videos"]),
    }
    path = Path(out_dir) / f"rank{trainer.global_rank}.json"
    path.with_suffix(".tmp").write_text(json.dumps(record))
    path.with_suffix(".tmp").replace(path)


if __name__ == "__main__":
    main(*sys.argv[1:3])
