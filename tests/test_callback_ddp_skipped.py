"""Under DDP (2 gloo processes): `multigrid/skipped_videos` counts each bad video once over the ranks
(summing each rank's count logged 4 for 2 bad videos both ranks drew), and the callback makes no
collective call at a step that is not a logging step."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from lightning_multigrid.data.synthetic import SyntheticDataset

from conftest import VideoFactory, run_ddp_script

SCRIPT = Path(__file__).with_name("ddp_skipped.py")


@pytest.fixture(scope="module")
def ddp_run(synthetic_dataset: SyntheticDataset, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ddp_skipped")
    videos = VideoFactory(out)
    root = synthetic_dataset.root
    lines = [f"{root / line}\n" for line in synthetic_dataset.train_manifest.read_text().splitlines()]
    bad = [videos.broken("random_bytes", f"bad{i}.mp4") for i in range(2)]
    (out / "train.csv").write_text("".join(lines) + "".join(f"{path} {i % 4}\n" for i, path in enumerate(bad)))
    run_ddp_script([str(SCRIPT), str(out), str(out / "train.csv")], cwd=out, timeout_s=240)
    return out


def _ranks(out: Path) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
def test_skipped_videos_counts_each_video_once_over_ranks(ddp_run: Path) -> None:
    ranks = _ranks(ddp_run)
    own = [set(r["own"]) for r in ranks]
    assert sum(len(paths) for paths in own) > 2  # both ranks met a bad video the other met: a sum counts it twice
    with open(ddp_run / "logs/lightning_logs/version_0/metrics.csv") as file:
        logged = [float(row["multigrid/skipped_videos"]) for row in csv.DictReader(file) if row["multigrid/skipped_videos"]]
    assert logged[-1] == len(own[0] | own[1]) == 2
    assert logged == sorted(logged)  # a count, never going back


@pytest.mark.slow
def test_no_collective_at_a_step_that_is_not_a_logging_step(ddp_run: Path) -> None:
    for rank in _ranks(ddp_run):
        steps = rank["steps"]
        quiet = [s for s in steps if not s["logging"]]
        logging = [s for s in steps if s["logging"]]
        assert quiet and logging
        assert all(s["start"] == 0 and s["end"] == 0 for s in quiet), quiet
        # At a logging step: one exchange of the new skipped paths, nothing else.
        assert all(s["start"] == 0 and s["end"] == 1 for s in logging), logging
