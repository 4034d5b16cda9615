"""The random state of a training process, kept in ``MultigridCallback``'s checkpoint state.

Lightning saves no random state, so a resumed run draws other dropout masks (and anything else a
model draws from the global generators) than the uninterrupted run did: with ``VideoClassifier``'s
default ``dropout_rate=0.5`` the weights ended far apart. The callback saves every rank's state
(:func:`collect_rng_state`: torch's CPU generator, the current CUDA device's when CUDA is in use,
NumPy's global one and Python's ``random``) and puts it back (:func:`restore_rng_state`) just before
the resumed run's first step, where the uninterrupted run stood at that step.

Where the state is read and restored: creating a DataLoader iterator draws its workers' base seed
from torch's global generator (a loader with persistent workers only when its iterator is new), and
building a loader may draw too, so whether the time between two epochs draws depends on the loader
cache, not on the run. So the state at the end of an epoch's last step is the next epoch's: the
callback reads it there and restores it at the next epoch's first step (:class:`EpochBoundaryRNG`),
and a checkpoint saved between the two keeps it; the clips do not depend on these draws (the sampler
seeds every clip from its own seed). A checkpoint saved after a step within an epoch keeps the state
at its save, the next step's. Either is restored at the resumed run's first step.

States are plain values (tensors, ints, tuples), so the checkpoint loads with ``torch.load``'s
weights-only unpickler.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

__all__ = ["EpochBoundaryRNG", "collect_rng_state", "gather_rng_states", "restore_rng_state"]


def collect_rng_state() -> dict[str, Any]:
    """This process's random state: torch CPU, the current CUDA device's (when CUDA is initialised),
    NumPy's global generator and Python's ``random``, as plain values."""
    kind, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": (str(kind), torch.from_numpy(np.asarray(keys, dtype=np.int64)), int(position), int(has_gauss),
                  float(cached_gaussian)),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # never start CUDA for a CPU run
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back a state of :func:`collect_rng_state` (a CUDA state only where CUDA is available)."""
    torch.set_rng_state(state["torch"])
    kind, keys, position, has_gauss, cached_gaussian = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached_gaussian))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class EpochBoundaryRNG:
    """An epoch's steps start from the random state at the end of the previous epoch's last step.

    Call :meth:`batch_start` in ``on_train_batch_start`` and :meth:`batch_end` in ``on_train_batch_end``
    (before a checkpoint callback saves); a checkpoint keeps :meth:`state`; a resumed run calls
    :meth:`resume_from` with it before its first step.
    """

    def __init__(self) -> None:
        self._next_epoch: dict[str, Any] | None = None  # restored at the next step

    def batch_end(self, is_last_batch: bool) -> None:
        if is_last_batch:
            self._next_epoch = collect_rng_state()

    def batch_start(self) -> None:
        if self._next_epoch is not None:
            restore_rng_state(self._next_epoch)
            self._next_epoch = None

    def state(self) -> dict[str, Any]:
        """The state the next step starts from: the next epoch's after an epoch's last step, else the current one."""
        return collect_rng_state() if self._next_epoch is None else self._next_epoch

    def resume_from(self, state: dict[str, Any]) -> None:
        """Start the next step from a checkpoint's :meth:`state` (this rank's)."""
        self._next_epoch = state


def gather_rng_states(state: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's ``state`` (of :func:`collect_rng_state`), in rank order (this process's alone without a
    process group).

    A collective under DDP: call it on every rank, as Lightning saves checkpoints
    (``Trainer.save_checkpoint`` runs on all ranks).
    """
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [state]
    states: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(states, state)
    return states
