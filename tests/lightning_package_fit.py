"""A fit with one Lightning package's Trainer, as its user writes it, run by tests/test_lightning_packages.py.

Not a test module: the package lightning_multigrid uses is chosen once per process, so each case
runs in its own process::

    python tests/lightning_package_fit.py PACKAGE ONLY ROOT_DIR TRAIN_MANIFEST VAL_MANIFEST OUT_DIR

PACKAGE is the user's (``lightning`` or ``pytorch_lightning``); with ONLY=1 the other package cannot
be imported, as when it is not installed. The user imports their Trainer's package first, then
lightning_multigrid, and fits the callback, the DataModule, ``VideoClassifier`` and the
BatchNorm-sync plugin; then ``lightning-multigrid fit`` runs on the same data. Prints one JSON line:
the package lightning_multigrid chose, the steps trained, and the modules of both packages loaded.
"""

from __future__ import annotations

import importlib.abc
import json
import sys
from pathlib import Path

PACKAGE, ONLY, ROOT, TRAIN, VAL, OUT = sys.argv[1:7]
OTHER = "pytorch_lightning" if PACKAGE == "lightning" else "lightning"


class _NotInstalled(importlib.abc.MetaPathFinder):
    """Imports of the other package fail, as if it were not installed."""

    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if fullname.split(".")[0] == OTHER:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


if ONLY == "1":
    sys.meta_path.insert(0, _NotInstalled())

if PACKAGE == "lightning":
    import lightning.pytorch as user_pl
else:
    import pytorch_lightning as user_pl  # type: ignore[no-redef]

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's package

from lightning_multigrid import (  # noqa: E402
    MultigridBatchNormSync,
    MultigridCallback,
    MultigridVideoDataModule,
    VideoClassifier,
)
from lightning_multigrid._lightning import PACKAGE as CHOSEN  # noqa: E402
from lightning_multigrid.cli.commands import main  # noqa: E402

data = dict(train_manifest=TRAIN, val_manifest=VAL, root_dir=ROOT, batch_size=2, num_frames=4, crop_size=32,
            sampling_rate=2, num_workers=0)
trainer = user_pl.Trainer(
    max_epochs=2, callbacks=[MultigridCallback(precise_bn_batches=1)], plugins=[MultigridBatchNormSync()],
    logger=False, enable_checkpointing=False, enable_progress_bar=False, limit_val_batches=1, default_root_dir=OUT,
)
trainer.fit(VideoClassifier(num_classes=4, backbone="tiny", tiny_width=4, milestones=[1]),
            datamodule=MultigridVideoDataModule(**data))

args = ["fit", "--model.num_classes", "4", "--model.backbone", "tiny", "--model.tiny_width", "4",
        "--model.milestones", "[1]", "--trainer.max_epochs", "2", "--trainer.limit_val_batches", "1",
        "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", OUT,
        *[f"--data.{name}={value}" for name, value in data.items()]]
sys.argv = ["lightning-multigrid"]
main(args)
loaded = sorted({name.split(".")[0] for name in sys.modules} & {"lightning", "pytorch_lightning"})
print(json.dumps({"chosen": CHOSEN, "steps": trainer.global_step, "loaded": loaded}))
