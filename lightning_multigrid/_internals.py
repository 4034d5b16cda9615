"""The private Lightning and torch attributes this package reads, one small function each.

Each exists because no public path gives the same thing; ``tests/test_internals.py`` checks each
against the installed Lightning and torch, so a rename upstream fails there, not in a user's run.
One more lives where it must, as an override: ``ChunkedDataLoader._index_sampler``
(``data/loader.py``), what torch's DataLoader draws worker tasks from; ``tests/test_data_loader.py``
fails if torch stops reading it (batches would no longer be cut into chunks).
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from torch.optim.lr_scheduler import LRScheduler, SequentialLR

__all__ = ["drop_train_loader", "layer_sync_of", "sequential_lr_parts"]


def drop_train_loader(trainer: pl.Trainer) -> None:
    """Make the fit loop build the train loader again before its next epoch.

    A loader built before the callback attached the schedule (``estimated_stepping_batches`` in
    ``configure_optimizers`` builds one) serves the baseline grid for the whole first epoch;
    ``reload_dataloaders_every_n_epochs`` only counts from the epoch that loader was built in.
    """
    trainer.fit_loop._combined_loader = None


def layer_sync_of(strategy: Any) -> Any:
    """The strategy's layer-sync plugin (``Trainer(sync_batchnorm=True)`` sets one), or ``None``.

    Lightning offers no accessor; this is what the strategy applies to the model in its set-up.
    """
    return getattr(strategy, "_layer_sync", None)


def sequential_lr_parts(scheduler: SequentialLR) -> tuple[list[LRScheduler], list[int]]:
    """The schedulers a ``SequentialLR`` chains and the steps where each after the first starts.

    torch keeps both only in private attributes.
    """
    return list(scheduler._schedulers), list(scheduler._milestones)
