"""A 2-process DDP fit (CPU, gloo) over a manifest with bad videos, run by tests/test_callback_ddp_skipped.py.

Not a test module: Lightning's ``strategy="ddp"`` re-launches this script for rank 1::

    python tests/ddp_skipped.py OUT_DIR TRAIN_MANIFEST

Every ``torch.distributed`` collective is wrapped with a counter in both processes, and the
callback's per-step hooks record how many ran inside them. Each rank writes
``OUT_DIR/rank{r}.json``: the videos it skipped itself, and per step whether it was a logging step
and the collectives the callback's hooks made. Rank 0's CSV logger writes under ``OUT_DIR/logs``.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's package

from lightning_multigrid._internals import is_logging_step  # noqa: E402
from lightning_multigrid._lightning import pl  # noqa: E402
from lightning_multigrid.callback import MultigridCallback  # noqa: E402
from lightning_multigrid.data.datamodule import MultigridVideoDataModule  # noqa: E402

DDPStrategy = pl.strategies.DDPStrategy

COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast", "broadcast_object_list",
    "reduce", "reduce_scatter", "gather", "gather_object", "scatter", "all_to_all", "barrier",
)
CALLS = {"count": 0}


def _counted(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        CALLS["count"] += 1
        return function(*args, **kwargs)

    return wrapper


for _name in COLLECTIVES:  # the real backend's functions, counted
    setattr(dist, _name, _counted(getattr(dist, _name)))


class CountingCallback(MultigridCallback):
    """The real callback; its two per-step hooks record the collectives made inside them."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.steps: list[dict[str, Any]] = []

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        before = CALLS["count"]
        super().on_train_batch_start(trainer, *args)
        self.steps.append({"logging": is_logging_step(trainer), "start": CALLS["count"] - before})

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        before = CALLS["count"]
        super().on_train_batch_end(trainer, *args)
        self.steps[-1]["end"] = CALLS["count"] - before


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
    callback = CountingCallback(precise_bn_batches=0, preflight=False, long_cycle=False)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=90)),
        use_distributed_sampler=False, max_epochs=2, num_sanity_val_steps=0, enable_checkpointing=False,
        logger=pl.loggers.CSVLogger(Path(out_dir) / "logs", version=0), log_every_n_steps=2,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
    )
    trainer.fit(TinyNet(), datamodule=datamodule)
    record = {"own": list(datamodule.skipped_video_paths), "steps": callback.steps}
    path = Path(out_dir) / f"rank{trainer.global_rank}.json"
    path.with_suffix(".tmp").write_text(json.dumps(record))
    path.with_suffix(".tmp").replace(path)


if __name__ == "__main__":
    main(*sys.argv[1:3])
