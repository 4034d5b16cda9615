"""Resuming a fit from a checkpoint: exactly where it stopped, or refused before the first step.

``MultigridCallback`` calls :func:`start_resumed_fit` and :func:`restore_rng` in ``on_train_start``
(after Lightning restored the loops, before the first step). Exact means the resumed run trains the
same batches, clips, grids, LRs, BatchNorm grouping and random draws (dropout) as the uninterrupted
run from the checkpoint on, from a checkpoint saved anywhere: at an epoch's first, middle or last
batch, or at its end. What cannot continue exactly is refused:

- a checkpoint of a run without the callback (a baseline) resumed with it, and the reverse (the
  reverse is refused by ``MultigridVideoDataModule``, which knows what it served);
- a mid-epoch checkpoint with a train loader that would replay the epoch's first batches;
- what the checkpoint's schedule rules out, refused by the fit's plan
  (:mod:`lightning_multigrid.fit.plan`): another baseline ``max_epochs``, base shape or clip
  sampling than the checkpoint's, or ``MultigridCallback(pretrained=...)`` asking for the other
  warm-up rule.

Your own DataModule resumes mid-epoch exactly when its batch sampler skips the trained batches::

    ShortCycleBatchSampler(sampler, self.plan, start_epoch=self.trainer.current_epoch,
                           start_iteration=resume_iteration(self.trainer))
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from lightning_multigrid._internals import finish_epoch_saved_at_its_last_batch, iterations_done_in_epoch
from lightning_multigrid.data.sampler import ShortCycleBatchSampler
from lightning_multigrid.fit.rng import EpochBoundaryRNG

if TYPE_CHECKING:
    from lightning_multigrid._lightning import pl

__all__ = ["restore_rng", "resume_iteration", "start_resumed_fit"]

_SAMPLER_FIX = (
    "ShortCycleBatchSampler(sampler, plan, start_epoch=self.trainer.current_epoch, "
    "start_iteration=resume_iteration(self.trainer))` (`from lightning_multigrid.fit.resume import resume_iteration`)"
)


def resume_iteration(trainer: pl.Trainer | None) -> int:
    """Batches of the current epoch already trained when ``fit`` resumes mid-epoch; else 0.

    Pass it as ``ShortCycleBatchSampler(start_iteration=...)`` in ``train_dataloader()`` so a
    resumed epoch goes on with the clips and grids of the uninterrupted run.
    """
    return iterations_done_in_epoch(trainer)


def restore_rng(trainer: pl.Trainer, rng: EpochBoundaryRNG, checkpoint: Mapping[str, Any]) -> str | None:
    """Start this rank's first step from its random state in the checkpoint (mind: each rank its own).

    Args:
        trainer: the Trainer, before the first step.
        rng: the callback's random state keeper.
        checkpoint: the callback's state of the checkpoint (empty for a fresh fit).

    Returns:
        What to tell the user when the state is not restored: the checkpoint holds none (saved by an
        earlier version), or holds another process count's; ``None`` otherwise.
    """
    states = checkpoint.get("rng")
    if states is None:
        if checkpoint.get("config") is None or trainer.global_step == 0:
            return None
        return (
            "multigrid: the checkpoint holds no random state (saved by an earlier version): a model that draws "
            "random numbers in training (dropout) goes on with other draws than the uninterrupted run."
        )
    if len(states) != trainer.world_size:
        return (
            f"multigrid: the checkpoint holds the random state of {len(states)} processes and this fit has "
            f"{trainer.world_size}: not restored (on another device count the resumed run cannot be exact anyway)."
        )
    rng.resume_from(states[trainer.global_rank])
    return None


def start_resumed_fit(trainer: pl.Trainer, has_multigrid_state: bool) -> None:
    """Before the first step of a fit: refuse a resume that cannot be exact, fix one Lightning gets wrong.

    ``has_multigrid_state``: the checkpoint held the callback's schedule. A no-op for a fresh fit.

    Raises:
        ValueError: a run without the callback resumed with it, or a mid-epoch resume whose train
            loader would not skip the trained batches.
    """
    if not has_multigrid_state and _resumed(trainer):
        raise ValueError(
            f"MultigridCallback: the checkpoint {trainer.ckpt_path} was saved without MultigridCallback (a baseline "
            f"run, or `enabled=False`) at epoch {trainer.current_epoch}, step {trainer.global_step}; resuming it "
            "with multigrid would go on in another mode (other epochs, grids and LRs). To finish the baseline, "
            "resume without the callback (or with `MultigridCallback(enabled=False)`); to train multigrid from its "
            "weights, load them (`model.load_state_dict(torch.load(path)['state_dict'])`) and fit without `ckpt_path`."
        )
    finish_epoch_saved_at_its_last_batch(trainer)
    _check_loader_skips_trained_batches(trainer)


def _resumed(trainer: pl.Trainer) -> bool:
    # `ckpt_path` alone is not enough: Lightning's batch-size finder restores its own checkpoint of step 0.
    return trainer.ckpt_path is not None and (trainer.global_step > 0 or trainer.current_epoch > 0)


def _check_loader_skips_trained_batches(trainer: pl.Trainer) -> None:
    done = iterations_done_in_epoch(trainer)
    if not done:
        return
    epoch = trainer.current_epoch
    for loader in _loaders(trainer.train_dataloader):
        batch_sampler = getattr(loader, "batch_sampler", None)
        if isinstance(batch_sampler, ShortCycleBatchSampler):
            if (batch_sampler.start_epoch, batch_sampler.start_iteration) == (epoch, done):
                continue
            found = f"starts epoch {batch_sampler.start_epoch} at iteration {batch_sampler.start_iteration}"
        elif callable(getattr(loader, "load_state_dict", None)):
            continue  # a stateful loader: Lightning restores its position
        else:
            found = f"is built on {type(batch_sampler).__name__}, which cannot skip them"
        raise ValueError(
            f"MultigridCallback: this fit resumes mid-epoch, after batch {done} of epoch {epoch}, but the train "
            f"loader's batch sampler {found}: the epoch would replay its first clips, off the schedule's grids. "
            f"Build it in `train_dataloader()` with `{_SAMPLER_FIX}, or resume from an end-of-epoch checkpoint."
        )


def _loaders(iterables: Any) -> Iterable[Any]:
    """The loaders of ``trainer.train_dataloader`` (one, or a list or dict of them)."""
    if isinstance(iterables, Mapping):
        return list(iterables.values())
    if isinstance(iterables, (list, tuple)):
        return list(iterables)
    return [] if iterables is None else [iterables]
