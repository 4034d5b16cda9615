"""Resuming a fit from a checkpoint: exactly where it stopped, or refused before the first step.

``MultigridCallback`` calls :func:`check_same_base` when it rebuilds the checkpoint's schedule and
:func:`start_resumed_fit` in ``on_train_start`` (after Lightning restored the loops, before the
first step). Exact means the resumed run trains the same batches, clips, grids, LRs and BatchNorm
grouping as the uninterrupted run from the checkpoint on, from a checkpoint saved anywhere: at an
epoch's first, middle or last batch, or at its end. What cannot continue exactly is refused:

- a checkpoint of a run without the callback (a baseline) resumed with it, and the reverse (the
  reverse is refused by ``MultigridVideoDataModule``, which knows what it served);
- another baseline ``max_epochs`` (the stages follow from it: a finished run cannot be extended exactly),
  or another base shape or clip sampling than the checkpoint's (a smaller batch after an
  out-of-memory error, say): the schedule's grids, epochs and LR factors are built from them;
- a mid-epoch checkpoint with a train loader that would replay the epoch's first batches;
- ``MultigridCallback(pretrained=...)`` that asks for the other warm-up rule than the checkpoint's
  (:func:`resumed_pretrained_choice`). A module that says otherwise (``VideoClassifier`` built without
  ``weights=`` once the weights file is gone) is told, and the checkpoint's rule is kept.

The random state (dropout) is restored by the callback too: :mod:`lightning_multigrid.rng`.

Your own DataModule resumes mid-epoch exactly when its batch sampler skips the trained batches::

    ShortCycleBatchSampler(sampler, self.plan, start_epoch=self.trainer.current_epoch,
                           start_iteration=resume_iteration(self.trainer))
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from lightning_multigrid._internals import finish_epoch_saved_at_its_last_batch, iterations_done_in_epoch
from lightning_multigrid.config import MultigridConfig
from lightning_multigrid.data.sampler import ShortCycleBatchSampler

if TYPE_CHECKING:
    from lightning_multigrid._lightning import pl

__all__ = ["check_same_base", "check_same_length", "resume_iteration", "resumed_pretrained_choice", "start_resumed_fit"]

_SAMPLER_FIX = (
    "ShortCycleBatchSampler(sampler, plan, start_epoch=self.trainer.current_epoch, "
    "start_iteration=resume_iteration(self.trainer))` (`from lightning_multigrid.resume import resume_iteration`)"
)


def resume_iteration(trainer: pl.Trainer | None) -> int:
    """Batches of the current epoch already trained when ``fit`` resumes mid-epoch; else 0.

    Pass it as ``ShortCycleBatchSampler(start_iteration=...)`` in ``train_dataloader()`` so a
    resumed epoch goes on with the clips and grids of the uninterrupted run.
    """
    return iterations_done_in_epoch(trainer)


def check_same_base(restored: MultigridConfig, config: MultigridConfig) -> None:
    """Refuse to resume a schedule built for another base shape or clip sampling than the DataModule's.

    Raises:
        ValueError: naming both values and the fix.
    """
    names = ("base", "sampling_rate", "jitter_scales")
    changed = [name for name in names if getattr(restored, name) != getattr(config, name)]
    if not changed:
        return
    saved = ", ".join(f"{name}={getattr(restored, name)}" for name in changed)
    now = ", ".join(f"{name}={getattr(config, name)}" for name in changed)
    raise ValueError(
        f"MultigridCallback: the checkpoint's multigrid schedule was built for {saved}, but this run's DataModule "
        f"has {now}. Every grid, epoch and LR factor of the schedule follows from the base shape and the clip "
        "sampling, so the run cannot go on exactly with other ones (it would serve the checkpoint's grids, not "
        "yours). Resume with the checkpoint's DataModule settings; for a smaller batch (less memory per step), start "
        "a new run from the checkpoint's weights: `model.load_state_dict(torch.load(path)['state_dict'])`, then "
        "`fit` without `ckpt_path`."
    )


def check_same_length(restored: MultigridConfig, config: MultigridConfig) -> None:
    """Refuse to resume a schedule built for another baseline ``max_epochs`` than the Trainer's.

    The stages' epochs are the whole schedule scaled to ``epoch_factor * max_epochs``, so a longer
    baseline moves every stage: its schedule does not continue the checkpoint's (a finished run
    resumed with a larger ``max_epochs`` would train 0 steps and return as if done).

    Raises:
        ValueError: naming both values and the fix.
    """
    if restored.max_epochs == config.max_epochs:
        return
    outcome = "end where it is" if config.max_epochs > restored.max_epochs else "run past yours"
    raise ValueError(
        f"MultigridCallback: the checkpoint's multigrid schedule was built for a {restored.max_epochs}-epoch baseline "
        f"(`max_epochs`={restored.max_epochs}), but this Trainer has `max_epochs`={config.max_epochs}. Every stage's "
        "epochs follow from `max_epochs` (scaled to `epoch_factor` times it), so a schedule of another length does not "
        f"continue the checkpoint's, and the checkpoint's own would {outcome}. "
        f"Resume with `max_epochs={restored.max_epochs}`; to train longer, start a new run from the checkpoint's "
        "weights (`model.load_state_dict(torch.load(path)['state_dict'])`, then `fit` without `ckpt_path`, with a "
        "pretrained warm-up: `MultigridCallback(pretrained=True)`)."
    )


def resumed_pretrained_choice(
    saved: bool | None, asked: bool | None, source: str, *, given_to_callback: bool
) -> tuple[bool | None, str]:
    """Whether a resumed run trains as from pretrained weights (its warm-up rule), and who says it.

    Args:
        saved: the checkpoint's choice (``None``: a fit without a checkpoint, or one saved before the
            choice was kept).
        asked: this fit's choice (``None``: nobody says).
        source: who made this fit's choice, for the summary.
        given_to_callback: this fit's choice is ``MultigridCallback(pretrained=...)``'s.

    Returns:
        The checkpoint's choice when there is one (the rule a run trained with holds to its end: its
        warm-up and LRs must not change under a resume), else this fit's; and who says it.

    Raises:
        ValueError: ``MultigridCallback(pretrained=...)`` asks for the other rule than the checkpoint's.
    """
    if saved is None or bool(asked) == saved:
        return asked, source
    rule = "pretrained" if saved else "from-scratch"
    if given_to_callback:
        raise ValueError(
            f"MultigridCallback: the checkpoint was trained with the {rule} warm-up rule (pretrained={saved}), but "
            f"this fit asks for the other one with {source}. The rule sets the warm-up's LRs, so the resumed run would "
            f"train other steps than the run it continues. Resume with `MultigridCallback(pretrained={saved})` or "
            "`pretrained=None` (the checkpoint's rule); for the other rule, start a new run from the checkpoint's "
            "weights (`model.load_state_dict(torch.load(path)['state_dict'])`, then `fit` without `ckpt_path`)."
        )
    return saved, (
        f"the checkpoint's, pretrained={saved}: the run it resumes trained with this rule, which holds to its end; "
        f"this fit's choice is not used ({source}; a model rebuilt without `weights=` once the weights file is gone, say)"
    )


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
