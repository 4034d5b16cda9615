"""A 2-process DDP fit on CPU (gloo) of ``VideoClassifier``'s defaults (dropout 0.5), run by tests/test_resume_dropout.py.

Not a test module (pytest does not collect it): Lightning's ``strategy="ddp"`` re-launches the running
script for rank 1, which cannot work from inside pytest::

    python tests/ddp_resume.py OUT_DIR ROOT_DIR TRAIN_MANIFEST MODE CHECKPOINT_DIR

MODE: ``full`` (the uninterrupted run), ``stop`` (saves ``CHECKPOINT_DIR/last.ckpt`` at every epoch's end
and stops after epoch ``STOP_EPOCH``) or ``resume`` (from that checkpoint). Each rank seeds its own
generators (rank 0 with 0, rank 1 with 1), so the ranks draw different dropout masks and a rank that
got the other's random state back would train otherwise. Each rank writes ``OUT_DIR/rank{r}.json``: the
loss of every step and the final weights.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

# The package of this checkout (beside tests/), not the installed one.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lightning_multigrid._lightning import pl  # noqa: E402
from lightning_multigrid.callback import MultigridCallback  # noqa: E402
from lightning_multigrid.data.datamodule import MultigridVideoDataModule  # noqa: E402
from lightning_multigrid.module import VideoClassifier  # noqa: E402

STOP_EPOCH = 2


class Losses(pl.Callback):
    def __init__(self) -> None:
        self.losses: list[list[float]] = []

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.losses.append([trainer.global_step, float(outputs["loss"])])


class StopAfterEpoch(pl.Callback):
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.current_epoch == STOP_EPOCH:
            trainer.should_stop = True


def main(out_dir: str, root_dir: str, train_manifest: str, mode: str, checkpoint_dir: str) -> None:
    torch.set_num_threads(1)
    pl.seed_everything(int(os.environ.get("LOCAL_RANK", 0)), verbose=False)  # each rank its own state
    model = VideoClassifier(num_classes=4, tiny_width=4)
    datamodule = MultigridVideoDataModule(
        train_manifest=train_manifest, root_dir=root_dir, num_workers=0, flip=False, seed=1,
        batch_size=1, num_frames=8, crop_size=32, sampling_rate=2,
    )
    losses = Losses()
    callbacks: list[pl.Callback] = [MultigridCallback(bn_base_size=2, precise_bn_batches=0), losses]
    if mode == "stop":
        callbacks += [pl.callbacks.ModelCheckpoint(dirpath=checkpoint_dir, save_last=True), StopAfterEpoch()]
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy=pl.strategies.DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=90)),
        use_distributed_sampler=False, max_epochs=4, num_sanity_val_steps=0, limit_val_batches=0, logger=False,
        enable_checkpointing=mode == "stop", enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
        deterministic=True,
    )
    trainer.fit(model, datamodule=datamodule, ckpt_path=str(Path(checkpoint_dir) / "last.ckpt") if mode == "resume" else None)
    record = {
        "losses": losses.losses,
        "final": {name: [float(v) for v in value.double().flatten()] for name, value in model.state_dict().items()},
    }
    path = Path(out_dir) / f"rank{trainer.global_rank}.json"
    path.with_suffix(".tmp").write_text(json.dumps(record))
    path.with_suffix(".tmp").replace(path)  # complete files only


if __name__ == "__main__":
    if len(sys.argv) != 6:
        sys.exit(f"usage: {sys.argv[0]} OUT_DIR ROOT_DIR TRAIN_MANIFEST MODE CHECKPOINT_DIR")
    main(*sys.argv[1:])
