"""Under DDP, `multigrid/skipped_videos` is the sum over ranks (it was rank 0's count alone)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_multigrid.data.synthetic import SyntheticDataset

from conftest import VideoFactory, run_ddp_script

SCRIPT = Path(__file__).with_name("ddp_skipped.py")


@pytest.mark.slow
def test_skipped_videos_is_the_sum_over_ranks(synthetic_dataset: SyntheticDataset, videos: VideoFactory, tmp_path: Path) -> None:
    root = synthetic_dataset.root
    lines = [f"{root / line}\n" for line in synthetic_dataset.train_manifest.read_text().splitlines()]
    bad = [videos.broken("random_bytes", f"bad{i}.mp4") for i in range(4)]
    (tmp_path / "train.csv").write_text("".join(lines) + "".join(f"{path} {i % 4}\n" for i, path in enumerate(bad)))
    run_ddp_script([str(SCRIPT), str(tmp_path), str(tmp_path / "train.csv")], cwd=tmp_path, timeout_s=240)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    own = [len(r["own"]) for r in ranks]
    assert all(count > 0 for count in own), own  # each rank skipped some: rank 0's alone would be less
    assert [r["logged"] for r in ranks] == [float(sum(own))] * 2
