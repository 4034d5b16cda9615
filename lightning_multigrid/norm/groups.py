"""Process groups for BatchNorm sync: groups of consecutive ranks, created once per size.

``torch.distributed.new_group`` is a collective, so groups are created up front on every rank
(:func:`create_sync_groups`) and looked up afterwards (:func:`get_sync_group`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from lightning_multigrid._checks import check_positive_int

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["create_sync_groups", "get_sync_group", "group_size_of"]


def group_size_of(process_group: ProcessGroup) -> int:
    """Ranks in ``process_group``."""
    return dist.get_world_size(process_group)


# Process groups per sync group size, valid for one default ("world") process group.
_SYNC_GROUPS: dict[int, Any] = {}
_SYNC_GROUPS_WORLD: list[Any] = [None]


def get_sync_group(group_size: int) -> ProcessGroup | None:
    """This rank's process group of ``group_size`` consecutive ranks (created once, then cached).

    Ranks ``[0, g)``, ``[g, 2g)``, ... form the groups. The first call for a ``group_size`` is a
    collective (``torch.distributed.new_group`` must run on every rank, in the same order):
    call it on all ranks at the same point, or create every size up front with
    :func:`create_sync_groups`. Later calls only look the group up. The cache is dropped when the
    default process group changes (``destroy_process_group`` and a new ``init_process_group``).

    Args:
        group_size: ranks per group; ``1`` means no sync and returns ``None``.

    Raises:
        ValueError: when ``group_size`` is not a positive integer, ``torch.distributed`` is not
            initialised or has one rank (and ``group_size > 1``), or ``group_size`` does not
            divide the world size.
    """
    check_positive_int("group_size", group_size)
    if group_size == 1:
        return None
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            f"BatchNorm sync over `group_size`={group_size} ranks needs torch.distributed, which is "
            "not initialised. Run with several processes (e.g. Trainer(strategy='ddp', devices=N)) "
            "or use a plan without sync (`BNPlan('plain')` or `BNPlan('split', num_splits=k)`)."
        )
    world_size = dist.get_world_size()
    if world_size == 1:
        raise ValueError(
            f"BatchNorm sync over `group_size`={group_size} ranks, but torch.distributed has a "
            "single rank. Run with several processes or use a plan without sync (`BNPlan('plain')` "
            "or `BNPlan('split', num_splits=k)`)."
        )
    if world_size % group_size:
        raise ValueError(
            f"BatchNorm sync over `group_size`={group_size} ranks needs a world size that is a "
            f"multiple of it, got world size {world_size}. Choose a group size that divides the "
            "number of ranks (the multigrid schedule does, when built with the right `devices`)."
        )
    world = dist.group.WORLD
    if _SYNC_GROUPS_WORLD[0] is not world:
        _SYNC_GROUPS.clear()
        _SYNC_GROUPS_WORLD[0] = world
    if group_size not in _SYNC_GROUPS:
        if group_size == world_size:
            _SYNC_GROUPS[group_size] = world
        else:
            rank = dist.get_rank()
            mine = None
            for start in range(0, world_size, group_size):
                ranks = list(range(start, start + group_size))
                group = dist.new_group(ranks)
                if rank in ranks:
                    mine = group
            _SYNC_GROUPS[group_size] = mine
    return _SYNC_GROUPS[group_size]


def create_sync_groups(group_sizes: Iterable[int]) -> None:
    """Create the process groups for every size in ``group_sizes`` (collective, all ranks).

    Sizes are created in increasing order, so the same call on every rank creates them in the
    same order whatever order they are given in. Sizes already created are skipped.

    Raises:
        ValueError: as :func:`get_sync_group`.
    """
    for group_size in sorted(set(group_sizes)):
        get_sync_group(group_size)
