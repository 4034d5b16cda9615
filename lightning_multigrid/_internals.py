"""Every read or write of Lightning and torch internals in this package, one small function each.

Private attributes, the fit loop's progress counters on resume, and the loop attributes behind
the Trainer's read-only settings. Each exists because no public path gives the same thing;
``tests/test_internals.py`` checks each against the installed Lightning and torch, so a rename
upstream fails there, not in a user's run. One more lives where it must, as an override: ``ChunkedDataLoader._index_sampler``
(``data/loaders.py``), what torch's DataLoader draws worker tasks from; ``tests/test_data_loader.py``
fails if torch stops reading it (batches would no longer be cut into chunks).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.lr_scheduler import LRScheduler, SequentialLR

if TYPE_CHECKING:  # Lightning only in annotations: `schedule/lr.py`, below the Lightning layer, imports this module
    from lightning_multigrid._lightning import pl

__all__ = [
    "drop_train_loader", "ensure_train_loader", "finish_epoch_saved_at_its_last_batch", "is_logging_step",
    "iterations_done_in_epoch", "layer_sync_of", "logger_step", "mark_dynamic_dims", "max_epochs_filled_in",
    "raise_recompile_limit", "sequential_lr_parts", "setting_owner", "shutdown_loader_workers", "watch_train_fetches",
]


def drop_train_loader(trainer: pl.Trainer) -> None:
    """Make the fit loop build the train loader again before its next epoch.

    A loader built before the callback attached the schedule (``estimated_stepping_batches`` in
    ``configure_optimizers`` builds one) serves the baseline grid for the whole first epoch;
    ``reload_dataloaders_every_n_epochs`` only counts from the epoch that loader was built in.
    """
    trainer.fit_loop._combined_loader = None


def ensure_train_loader(trainer: pl.Trainer) -> None:
    """Build the fit loop's train loader now, if it has none yet, so ``trainer.num_training_batches`` is known.

    Lightning builds it at the start of the first epoch; the callback needs the baseline loader's
    length (with ``limit_train_batches``) in ``on_fit_start``, before that. ``fit_loop.setup_data``
    is the fit loop's own method (not a Trainer API): it builds nothing when a loader is there.
    """
    trainer.fit_loop.setup_data()


def watch_train_fetches(trainer: pl.Trainer, on_fetch: Callable[[], None]) -> Callable[[], None]:
    """Call ``on_fetch`` each time the fit loop starts fetching a training batch; returns the undo.

    The fit's epoch loop brackets each ``next()`` on the train loader (and nothing else) with its
    ``_on_before_fetch``/``_on_after_fetch``, which start and stop the profiler's
    ``[_TrainingEpochLoop].train_dataloader_next`` action; it hands them to its data fetcher at the
    start of each epoch's run. ``on_fetch`` runs after the profiler's start, just before the fetch.
    Lightning offers no hook there: ``on_train_batch_start`` comes after the fetch, and the hooks
    before it (other callbacks' ``on_train_batch_end``, logger writes, checkpoint saves) are not
    the loader's time. Install it before the epoch runs (``on_fit_start``); the undo removes it.
    """
    epoch_loop = trainer.fit_loop.epoch_loop
    lightning_before = epoch_loop._on_before_fetch

    def before_fetch() -> None:
        lightning_before()
        on_fetch()

    epoch_loop._on_before_fetch = before_fetch  # an instance attribute, read at each epoch's start

    def undo() -> None:
        vars(epoch_loop).pop("_on_before_fetch", None)

    return undo


def is_logging_step(trainer: pl.Trainer) -> bool:
    """Whether Lightning writes this training step's logged values to the loggers.

    Lightning's own decision (``log_every_n_steps``, the last step before a stop, never with
    ``log_every_n_steps=0``), which its ``LearningRateMonitor`` reads the same way; plus
    ``fast_dev_run``, where it writes every step. Valid from ``on_train_batch_start`` to
    ``on_train_batch_end`` of the step; the same on every rank.
    """
    return bool(trainer._logger_connector.should_update_logs or trainer.fast_dev_run)


def logger_step(trainer: pl.Trainer) -> int:
    """The step Lightning gives the loggers for this training step (optimizer steps so far, as
    ``LearningRateMonitor`` writes it; not ``global_step``, which counts every optimizer's steps)."""
    return int(trainer.fit_loop.epoch_loop._batches_that_stepped)


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


def finish_epoch_saved_at_its_last_batch(trainer: pl.Trainer) -> bool:
    """Start the next epoch at its first batch after a checkpoint saved at an epoch's last batch.

    A checkpoint saved after the last training batch of epoch ``e`` (``ModelCheckpoint(every_n_train_steps=...)``
    falling there) resumes at epoch ``e + 1``: the fit loop counts epoch ``e`` done, but its epoch
    loop only starts the new epoch at batch 0 when the finished epoch had at least as many batches
    as the new one (it compares with the new loader's length). Multigrid epochs differ in length,
    so a longer next epoch went on at batch ``n_e``: its first ``n_e`` batch indices skipped, the
    epoch ended ``n_e`` batches early. This does what the epoch loop does when the lengths allow
    (epoch-interval schedulers were stepped before the save: nothing to do for them).
    Call it after the fit loop's reset (``on_train_start``); returns whether it applied.
    """
    fit_loop = trainer.fit_loop
    epoch_loop = fit_loop.epoch_loop
    epoch = fit_loop.epoch_progress.current
    rolled_over = (
        fit_loop.restarting
        and epoch_loop.restarted_on_train_batch_end
        and epoch_loop.batch_progress.is_last_batch
        and epoch.started == epoch.processed  # the fit loop counted the epoch done
    )
    if not rolled_over:
        return False
    epoch_loop.batch_progress.increment_completed()  # the saved batch ended after the save
    epoch_loop.batch_progress.reset_on_run()
    epoch_loop.scheduler_progress.reset_on_run()
    epoch_loop.automatic_optimization.optim_progress.reset_on_run()
    epoch_loop.val_loop.batch_progress.total.reset()
    epoch_loop.reset_restart_stage()  # so the epoch loop does not count the batch completed again
    return True


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


# What Lightning sets `max_epochs` to when fit starts without it (and without `max_steps` or a `Timer`).
LIGHTNING_DEFAULT_MAX_EPOCHS = 1000


def max_epochs_filled_in(trainer: pl.Trainer) -> bool:
    """Whether the fit loop's ``max_epochs`` may be the one Lightning filled in: ``Trainer(max_epochs=...)`` not given.

    When ``fit`` starts, before any callback hook, Lightning replaces a missing ``max_epochs`` by
    1000 (``max_steps`` unset and no ``Timer`` callback) or by -1 (no epoch limit); it keeps no
    record of what was given, so this repeats its rule (``loops.utilities._parse_loop_limits``): a
    1000 under that rule reads as not given. -1 is no epoch limit, given or not.
    """
    # At call time: this module is below the Lightning layer. Either package's Timer: the Trainer may be the other's.
    from lightning_multigrid._lightning import either_package

    timers = either_package("callbacks.Timer")
    return (
        trainer.max_epochs == LIGHTNING_DEFAULT_MAX_EPOCHS and trainer.max_steps == -1
        and not any(isinstance(callback, timers) for callback in trainer.callbacks)
    )


def mark_dynamic_dims(tensor: torch.Tensor, dims: Iterable[int]) -> None:
    """Tell ``torch.compile`` that ``tensor``'s sizes along ``dims`` vary between calls.

    ``torch._dynamo.maybe_mark_dynamic``: compile one graph for every size instead of one per
    size; unlike ``mark_dynamic`` it does not raise where the model's code fixes a size (a
    fixed-size pooling), which then simply compiles once more.
    """
    import torch._dynamo

    for dim in dims:
        torch._dynamo.maybe_mark_dynamic(tensor, dim)


def raise_recompile_limit(limit: int) -> int:
    """Let ``torch.compile`` keep at least ``limit`` compiled graphs per function (default 8).

    Beyond the limit torch falls back to eager for new shapes, with a warning. The setting is
    process-wide (``torch._dynamo.config.recompile_limit``, ``cache_size_limit`` before torch 2.6).
    Returns the limit now in force.
    """
    import torch._dynamo

    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(int(getattr(config, name)), limit))
    return int(getattr(config, name))


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
