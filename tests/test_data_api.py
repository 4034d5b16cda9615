"""The public names of ``lightning_multigrid.data``: a pinned list, each imported on first access.

The list is what a user builds a data pipeline from (in a plain PyTorch loop or their own
DataModule); everything else is reached by its module path, so renaming an internal is not a
breaking change. Importing the package or its batch sampler must not load PyAV, the synthetic
generator or the tools: a DataLoader worker or a tool pays only for what it uses.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

import lightning_multigrid
import lightning_multigrid.data as data
from lightning_multigrid import FixedGrid, GridShape
from lightning_multigrid.data import (
    EpochShardSampler,
    ShortCycleBatchSampler,
    TrainVideoDataset,
    VideoFileReader,
    collate_clips,
    load_manifest,
)
from lightning_multigrid.data.synthetic import SyntheticDataset

# Changing this list is an API change: say so in the CHANGELOG.
PUBLIC = [
    "ClipReader",
    "ClipRequest",
    "EpochShardSampler",
    "EvalVideoDataset",
    "FrameFolderReader",
    "FrameLayout",
    "InMemoryReader",
    "Manifest",
    "ManifestError",
    "PackedFrameReader",
    "ReaderSettings",
    "ShortCycleBatchSampler",
    "TrainVideoDataset",
    "VideoDecodeError",
    "VideoFileReader",
    "check_videos",
    "collate_clips",
    "load_manifest",
]

# Modules that importing the package or its batch sampler must not load.
HEAVY = (
    "av",
    "pytorch_lightning",
    "lightning",
    "lightning_multigrid.data.synthetic",
    "lightning_multigrid.data.tools",
    "lightning_multigrid.data.decoding.video",
)


def _run(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return result.stdout.strip()


def test_the_public_names_are_pinned() -> None:
    assert data.__all__ == PUBLIC
    assert len(PUBLIC) < 20
    assert sorted(data._LAZY) == sorted(PUBLIC)


def test_each_public_name_is_the_object_its_defining_module_holds() -> None:
    for name in PUBLIC:
        module = importlib.import_module(data._LAZY[name])
        value = getattr(data, name)
        assert value is getattr(module, name)
        assert value.__module__ == module.__name__, f"{name} is defined in {value.__module__}, not {module.__name__}"
    # The samplers are public at the package root too: the same classes.
    assert lightning_multigrid.ShortCycleBatchSampler is data.ShortCycleBatchSampler
    assert lightning_multigrid.EpochShardSampler is data.EpochShardSampler
    # As the README writes it: `MultigridVideoDataModule(..., reader_settings=ReaderSettings(...))`.
    assert lightning_multigrid.ReaderSettings is data.ReaderSettings
    assert "ReaderSettings" in lightning_multigrid.__all__


def test_type_checkers_see_the_same_names_from_the_same_modules() -> None:
    # The `if TYPE_CHECKING:` imports are what mypy reads; they must match what runs.
    tree = ast.parse(Path(data.__file__).read_text())
    typed = {
        alias.name: node.module
        for block in tree.body
        if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert typed == data._LAZY


def test_dir_lists_the_public_names_and_a_name_that_left_is_gone() -> None:
    assert set(PUBLIC) <= set(dir(data))
    for former in ("VideoReader", "probe_video", "slowfast_pathways", "generate_synthetic_dataset", "check_frames"):
        with pytest.raises(AttributeError, match=f"'lightning_multigrid.data' has no attribute '{former}'"):
            getattr(data, former)
    with pytest.raises(ImportError, match="cannot import name 'VideoReader'"):
        exec("from lightning_multigrid.data import VideoReader", {})


@pytest.mark.parametrize(
    "statement",
    [
        "import lightning_multigrid.data.sampler",
        "import lightning_multigrid.data",
        "import lightning_multigrid; lightning_multigrid.ShortCycleBatchSampler",
    ],
)
def test_importing_the_package_or_the_sampler_loads_no_decoder_and_no_tool(statement: str) -> None:
    loaded = _run(f"import sys; {statement}; print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    assert loaded == "[]", f"`{statement}` loaded {loaded}"


def test_every_public_name_loaded_still_leaves_out_lightning_and_the_model_zoo() -> None:
    # What the old eager import checked: the data pipeline needs the one [slow, fast] split from
    # models/, not torchvision's model zoo (a second of start-up in every DataLoader worker).
    code = (
        "import sys, lightning_multigrid.data as data; [getattr(data, name) for name in data.__all__]; "
        "print(sorted(m for m in ('torchvision.models', 'pytorch_lightning', 'lightning') if m in sys.modules))"
    )
    assert _run(code) == "[]"


def test_a_name_is_imported_on_first_access() -> None:
    code = (
        "import sys, lightning_multigrid.data as data; "
        "before = 'lightning_multigrid.data.dataset' in sys.modules; "
        "data.TrainVideoDataset; "
        "print(before, 'lightning_multigrid.data.dataset' in sys.modules, 'av' in sys.modules)"
    )
    assert _run(code) == "False True True"  # the datasets read video files through PyAV


def test_the_public_names_make_a_plain_pytorch_pipeline(synthetic_dataset: SyntheticDataset) -> None:
    # A training loader from the root's grid values and this package's public names only.
    manifest = load_manifest(synthetic_dataset.train_manifest, class_names=synthetic_dataset.class_names_file)
    dataset = TrainVideoDataset(manifest, reader=VideoFileReader())
    plan = FixedGrid(GridShape(batch_size=4, num_frames=4, crop_size=32))
    batches = ShortCycleBatchSampler(EpochShardSampler(len(dataset)), plan, seed=1)
    loader = DataLoader(dataset, batch_sampler=batches, collate_fn=collate_clips)
    batch = next(iter(loader))
    assert batch["video"].shape == (4, 3, 4, 32, 32) and batch["video"].dtype == torch.uint8
    assert len(loader) == synthetic_dataset.num_train // 4
