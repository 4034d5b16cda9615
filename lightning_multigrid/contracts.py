"""What the Lightning shell needs from the user's DataModule and LightningModule, as Protocols.

:class:`GridDataModule` is everything ``MultigridCallback`` needs from a DataModule. The other
Protocols are capabilities it uses when present, checked with ``isinstance``; a capability the
user asked for but the DataModule lacks is a warning that names it. Pure Python.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from lightning_multigrid.grid import ClipSampling, GridPlan, GridShape

__all__ = [
    "GridDataModule",
    "LoadingAdviceDataModule",
    "MilestonesModule",
    "PathwayDataModule",
    "PreciseBNDataModule",
    "PreflightModule",
    "PretrainedModule",
    "SizedDataModule",
    "SkipCountingDataModule",
]


@runtime_checkable
class GridDataModule(Protocol):
    """What the callback needs from a DataModule: its base grid, and serving a plan's grids.

    ``serve(plan)`` makes the train loader yield ``plan.grid_at(epoch, iteration)``-shaped
    batches from the next ``train_dataloader()`` on (``ShortCycleBatchSampler`` does that);
    ``serve(None)`` goes back to the base shape.
    """

    @property
    def base_shape(self) -> GridShape: ...

    @property
    def clip_sampling(self) -> ClipSampling: ...

    def serve(self, plan: GridPlan | None) -> None: ...


@runtime_checkable
class PreciseBNDataModule(Protocol):
    """Can serve base-shape training batches for precise BatchNorm (``precise_bn_batches > 0``)."""

    def precise_bn_dataloader(self) -> Iterable[Any]: ...


@runtime_checkable
class SizedDataModule(Protocol):
    """Knows its training clips after ``setup("fit")`` (the summary's iteration counts)."""

    @property
    def train_dataset_size(self) -> int: ...


@runtime_checkable
class SkipCountingDataModule(Protocol):
    """Names the videos it skipped on this rank (their number over all ranks, each video once, is
    logged as ``multigrid/skipped_videos``: names, because two ranks may skip the same video)."""

    @property
    def skipped_video_paths(self) -> Sequence[str]: ...


@runtime_checkable
class LoadingAdviceDataModule(Protocol):
    """Says what would make its loading faster, for the data-wait summary of a fit that loading paced.

    ``loading_advice()`` fits how it reads its clips and the settings it has (e.g. "more loader
    workers (`num_workers`, now 2)"), a phrase without a final stop; without it the summary gives
    advice that fits any DataModule.
    """

    def loading_advice(self) -> str: ...


@runtime_checkable
class PathwayDataModule(Protocol):
    """Says whether it splits clips into ``[slow, fast]`` pathways (for the preflight check)."""

    @property
    def slowfast_alpha(self) -> int | None: ...


@runtime_checkable
class PretrainedModule(Protocol):
    """A LightningModule that says whether it starts from pretrained weights (``VideoClassifier`` does).

    The callback's summary uses it to say whether a short run is from scratch, below multigrid's
    validated regime; without it the summary says "if from scratch".
    """

    @property
    def pretrained(self) -> bool: ...


@runtime_checkable
class MilestonesModule(Protocol):
    """A LightningModule that declares the baseline's LR milestones (``VideoClassifier`` does).

    Epochs (0-based) where its LR stages after the first start, or ``None`` when it has none to
    declare. The callback takes them when ``MultigridCallback(milestones=...)`` names none, before
    looking for a ``MultiStepLR``/``StepLR`` among the module's schedulers.
    """

    @property
    def lr_milestones(self) -> Sequence[int] | None: ...


@runtime_checkable
class PreflightModule(Protocol):
    """A LightningModule that checks itself on every grid before training (``VideoClassifier`` does).

    ``preflight(grids)`` runs the model once per grid (the schedule's distinct grids, in order of
    first use) and raises on a grid it cannot take; the module knows its own input format (a
    two-pathway model its ``[slow, fast]`` split). Without it, the callback runs
    :func:`lightning_multigrid.models.preflight` on the module's ``forward``.
    """

    def preflight(self, grids: Sequence[GridShape]) -> None: ...

