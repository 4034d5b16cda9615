"""A 2-process DDP fit on CPU (gloo) whose Trainer is the other Lightning package's, with
``sync_batchnorm=True``, run by tests/test_lightning_packages.py.

Not a test module: Lightning's ``strategy="ddp"`` re-launches this script for rank 1. lightning_multigrid
uses ``pytorch_lightning`` (``LIGHTNING_MULTIGRID_PACKAGE``, inherited by rank 1); the user's Trainer,
LightningModule and DataModule (which keeps ours inside) are ``lightning.pytorch``'s::

    python tests/ddp_other_package.py OUT_DIR ROOT_DIR TRAIN_MANIFEST

Each rank writes ``OUT_DIR/rank{r}.txt``: the error ``fit`` raised (type and message), or ``trained``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["LIGHTNING_MULTIGRID_PACKAGE"] = "pytorch_lightning"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's package

import lightning.pytorch as user_pl  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from lightning_multigrid import MultigridCallback, MultigridVideoDataModule  # noqa: E402

OUT, ROOT, TRAIN = sys.argv[1:4]
inner = MultigridVideoDataModule(train_manifest=TRAIN, root_dir=ROOT, batch_size=2, num_frames=4, crop_size=32,
                                 sampling_rate=2, num_workers=0)


class UsersData(user_pl.LightningDataModule):
    base_shape = property(lambda self: inner.base_shape)
    clip_sampling = property(lambda self: inner.clip_sampling)

    def serve(self, plan):  # type: ignore[no-untyped-def]
        inner.serve(plan)

    def setup(self, stage):  # type: ignore[no-untyped-def]
        inner.setup(stage)

    def train_dataloader(self):  # type: ignore[no-untyped-def]
        return inner.train_dataloader()


class UsersNet(user_pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv3d(3, 4, 3, padding=1), nn.BatchNorm3d(4), nn.AdaptiveAvgPool3d(1), nn.Flatten(),
                                 nn.Linear(4, 4))

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        return nn.functional.cross_entropy(self.net(batch["video"].float()), batch["label"])

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.1)


trainer = user_pl.Trainer(
    max_epochs=2, accelerator="cpu", devices=2, strategy="ddp", sync_batchnorm=True, logger=False,
    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    callbacks=[MultigridCallback(precise_bn_batches=0, preflight=False)],
)
try:
    trainer.fit(UsersNet(), datamodule=UsersData())
    outcome = "trained"
except Exception as error:  # noqa: BLE001 -- the outcome is what the test reads
    outcome = f"{type(error).__name__}: {error}"
Path(OUT, f"rank{trainer.global_rank}.txt").write_text(outcome)
