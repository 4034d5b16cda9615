"""Every read or write of Lightning and torch internals in this package, one small function each.

Private attributes, the fit loop's progress counters on resume, and the loop attributes behind
the Trainer's read-only settings. Each exists because no public path gives the same thing;
``tests/test_internals.py`` checks each against the installed Lightning and torch, so a rename
upstream fails there, not in a user's run. One more lives where it must, as an override: ``ChunkedDataLoader._index_sampler``
(``data/loaders.py``), what torch's DataLoader draws worker tasks from; ``tests/test_data_loader.py``
fails if torch stops reading it (batches would no longer be cut into chunks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch.optim.lr_scheduler import LRScheduler, SequentialLR

if TYPE_CHECKING:  # Lightning only in annotations: `lr.py`, below the Lightning layer, imports this module
    import pytorch_lightning as pl

__all__ = [
    "drop_train_loader", "iterations_done_in_epoch", "layer_sync_of", "sequential_lr_parts", "setting_owner",
    "shutdown_loader_workers",
]


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


def iterations_done_in_epoch(trainer: Any) -> int:
    """Batches of the current epoch already trained when ``fit`` resumes mid-epoch; else 0.

    Lightning restores the fit loop's progress from the checkpoint and goes on at the next batch
    index, but restarts the loader; the batch sampler skips these batches instead, so the data
    order and the short-cycle phase continue where they stopped. ``trainer`` may be ``None`` or a
    stand-in without a fit loop (0).
    """
    fit_loop = getattr(trainer, "fit_loop", None)
    if fit_loop is None:
        return 0
    epoch = fit_loop.epoch_progress.current
    # `restarting` is set by a checkpoint load and cleared after the first epoch it runs; an
    # epoch started but not processed is the mid-epoch case.
    if not fit_loop.restarting or epoch.started == epoch.processed:
        return 0
    return int(fit_loop.epoch_loop.batch_progress.current.processed)


def setting_owner(trainer: pl.Trainer, name: str) -> Any:
    """The object whose attribute ``name`` holds a Trainer setting the callback changes for a fit.

    ``trainer.max_epochs`` and ``trainer.max_steps`` are read-only views of the fit loop's
    ``max_epochs`` and its epoch loop's ``max_steps``; other settings are the Trainer's own.
    """
    if name == "max_epochs":
        return trainer.fit_loop
    if name == "max_steps":
        return trainer.fit_loop.epoch_loop
    return trainer


def shutdown_loader_workers(loader: Any) -> None:
    """Stop a DataLoader's persistent workers now, and forget their iterator (no-op without workers).

    torch keeps a persistent-workers iterator in the loader's ``_iterator`` and stops its workers only
    when that is garbage-collected: if that happens in a process forked later (the next fit's
    workers), torch's ``__del__`` fails there with "can only test a child process". Lightning's own
    shutdown of the train loader's workers reads the same attributes.
    """
    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    iterator = getattr(loader, "_iterator", None)
    if isinstance(iterator, _MultiProcessingDataLoaderIter):
        iterator._shutdown_workers()
    if iterator is not None:
        loader._iterator = None
