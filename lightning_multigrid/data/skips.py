"""One voice for skipped videos: each bad video is logged once per process, in every decode mode.

The workers (:mod:`~lightning_multigrid.data.dataset`) and the device decode
(:mod:`~lightning_multigrid.data.decoding.device`) both report here, with the same words.
"""

from __future__ import annotations

import logging

__all__ = ["report_skip"]

logger = logging.getLogger("lightning_multigrid.data")

# Bad videos already logged by this process (each DataLoader worker logs its own once).
_LOGGED: set[str] = set()


def report_skip(name: str, reason: str) -> None:
    """Log that video ``name`` is skipped (replaced by another video's clip), once per process."""
    if name in _LOGGED:
        return
    _LOGGED.add(name)
    logger.warning(
        "Skipping video %s: %s. It is replaced by another video's clip and reported in the batch's "
        "'skipped' paths (logged once per process; `lightning-multigrid check-data` lists all bad files).",
        name,
        reason,
    )
