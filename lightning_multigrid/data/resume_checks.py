"""What the DataModule served, as checkpoints store it, and the resumes it must refuse.

The DataModule's checkpoint state says whether it served a multigrid schedule and at which base
shape. A multigrid checkpoint resumed without an enabled ``MultigridCallback`` would go on at the
base shape from a multigrid epoch and LR, and a mid-epoch checkpoint resumed at another base batch
would skip the wrong number of clips: both are refused when the train loader is built, before the
first step. (A baseline checkpoint resumed with the callback is refused by the callback:
:mod:`lightning_multigrid.fit.resume`.) No Lightning here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning_multigrid.grid import GridShape

__all__ = ["check_resumed_train_loader", "saved_served", "served_state"]


def served_state(serving_schedule: bool, base: GridShape) -> dict[str, Any]:
    """The checkpoint entries: ``multigrid`` (a schedule was served) and the ``base_shape``."""
    return {"multigrid": serving_schedule, "base_shape": [base.batch_size, base.num_frames, base.crop_size]}


def check_resumed_train_loader(
    saved: Mapping[str, Any] | None, *, serving_schedule: bool, base: GridShape, start_iteration: int
) -> None:
    """Refuse a train loader for a resumed fit that cannot continue the checkpoint exactly.

    Args:
        saved: the checkpoint's :func:`served_state` (``None``: not resuming, or an older checkpoint).
        serving_schedule: a multigrid schedule is served now.
        base: the base shape now.
        start_iteration: batches of the current epoch already trained (a mid-epoch resume).

    Raises:
        ValueError: naming the checkpoint's and this run's values and the fix.
    """
    if not saved:
        return
    if saved.get("multigrid") and not serving_schedule:
        raise ValueError(
            "MultigridVideoDataModule: the checkpoint was saved by a multigrid run (MultigridCallback served its "
            "schedule), but this fit has no enabled MultigridCallback: it would go on at the base shape from a "
            "multigrid epoch and LR, in another mode. Add `MultigridCallback()` with the run's settings (enabled) to "
            "the Trainer to resume it; to train a baseline from its weights, load them "
            "(`model.load_state_dict(torch.load(path)['state_dict'])`) and fit without `ckpt_path`."
        )
    saved_base = saved.get("base_shape")
    now = [base.batch_size, base.num_frames, base.crop_size]
    if start_iteration and saved_base is not None and list(saved_base) != now:
        raise ValueError(
            f"MultigridVideoDataModule: the checkpoint was saved mid-epoch, after batch {start_iteration}, at base "
            f"shape (batch_size, num_frames, crop_size) {tuple(saved_base)}, but the DataModule has {tuple(now)}: the "
            "resumed epoch would skip another number of clips than were trained. Resume with the checkpoint's "
            "settings, or from an end-of-epoch checkpoint."
        )


def saved_served(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """The :func:`served_state` entries of a loaded DataModule state (none in an older checkpoint)."""
    return {key: state_dict[key] for key in ("multigrid", "base_shape") if key in state_dict}
