"""Datasets on real H.264 files: every grid of a schedule, multi-view, SlowFast, bad videos, workers."""

from __future__ import annotations

import logging
import os
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from lightning_multigrid.data.clip_params import ClipRequest
from lightning_multigrid.data.dataset import EvalVideoDataset, TrainVideoDataset, collate_clips
from lightning_multigrid.data.decoding.errors import VideoDecodeError
from lightning_multigrid.data.decoding.video import VideoReader
from lightning_multigrid.data.manifests.entries import ManifestError
from lightning_multigrid.data.reader_settings import ReaderSettings
from lightning_multigrid.data.synthetic import SyntheticDataset
from lightning_multigrid.grid import ClipSampling, EvalViews
from lightning_multigrid.schedule import GridShape, MultigridConfig, build_schedule

from conftest import BROKEN_KINDS, VideoFactory


def request(index: int = 0, seed: int = 0, num_frames: int = 4, crop_size: int = 32) -> ClipRequest:
    return ClipRequest(index, num_frames, crop_size, (2.0, 2.0), (40, 48), seed)


def test_every_grid_of_a_schedule(synthetic_dataset: SyntheticDataset) -> None:
    schedule = build_schedule(
        MultigridConfig(base=GridShape(2, 8, 32), sampling_rate=2, max_epochs=8, milestones=(4, 6))
    )
    dataset = TrainVideoDataset(synthetic_dataset.train_manifest, flip=False)
    seen = set()
    for stage in schedule.stages:
        for grid in stage.short_cycle or (stage.shape,):
            if grid in seen:
                continue
            seen.add(grid)
            requests = [
                ClipRequest(
                    index=i % len(dataset),
                    num_frames=grid.num_frames,
                    crop_size=grid.crop_size,
                    sampling_rate_range=stage.sampling_rate,
                    scale_range=schedule.jitter_scales_for(grid.crop_size),
                    seed=1000 * len(seen) + i,
                )
                for i in range(grid.batch_size)
            ]
            batch = collate_clips([dataset[r] for r in requests])
            assert batch["video"].shape == (grid.batch_size, 3, grid.num_frames, grid.crop_size, grid.crop_size)
            assert batch["video"].dtype == torch.uint8
            assert batch["label"].shape == (grid.batch_size,) and batch["label"].dtype == torch.int64
            assert batch["skipped"] == []
    assert seen == set(schedule.distinct_grids())
    assert {(g.num_frames, g.crop_size) for g in seen} >= {(2, 16), (4, 23), (8, 32)}


def test_sample_fields(synthetic_dataset: SyntheticDataset) -> None:
    dataset = TrainVideoDataset(synthetic_dataset.train_manifest, class_names=synthetic_dataset.class_names_file)
    sample = dataset[request(index=5)]
    assert set(sample) == {"video", "label", "index", "skipped"}
    assert sample["index"] == 5 and sample["label"] == 5 % 4 and sample["skipped"] == ()
    assert dataset.num_classes == 4 and dataset.class_names == synthetic_dataset.class_names
    assert not dataset.multi_label
    again = dataset[request(index=5)]
    assert torch.equal(sample["video"], again["video"])  # same seed, same clip


def test_short_video_repeats_its_last_frame(videos: VideoFactory, tmp_path: Path) -> None:
    videos.coded("short.mp4", num_frames=5)
    (tmp_path / "m.csv").write_text("short.mp4 0\n")
    dataset = TrainVideoDataset(tmp_path / "m.csv")
    # span = 3 * 2 + 1 = 7 > 5 frames: start 0, frames 0, 2, 4, 6 -> 4.
    clip = dataset[request()]["video"]
    assert [VideoFactory.frame_index(clip[:, t].numpy()) for t in range(4)] == [0, 2, 4, 4]


def test_slowfast_pathways(synthetic_dataset: SyntheticDataset) -> None:
    dataset = TrainVideoDataset(synthetic_dataset.train_manifest, slowfast_alpha=4)
    slow, fast = dataset[request(num_frames=8)]["video"]
    assert fast.shape == (3, 8, 32, 32) and slow.shape == (3, 2, 32, 32)
    assert torch.equal(slow, fast[:, [0, 4]])
    batch = collate_clips([dataset[request(index=i, num_frames=8)] for i in range(3)])
    assert [v.shape for v in batch["video"]] == [(3, 3, 2, 32, 32), (3, 3, 8, 32, 32)]
    evaluation = EvalVideoDataset(synthetic_dataset.val_manifest, base_shape=GridShape(1, 8, 32), slowfast_alpha=2)
    assert [v.shape[1] for v in evaluation[0]["video"]] == [4, 8]


def test_multi_view_evaluation(synthetic_dataset: SyntheticDataset) -> None:
    dataset = EvalVideoDataset(
        synthetic_dataset.val_manifest, base_shape=GridShape(1, 4, 32), clip_sampling=ClipSampling(2), views=EvalViews(2, 3)
    )
    assert dataset.clips_per_video == 6 and len(dataset) == 8 * 6
    loader = DataLoader(dataset, batch_size=12, collate_fn=collate_clips)
    videos, views, labels = Counter(), [], {}
    for batch in loader:
        assert batch["video"].shape[1:] == (3, 4, 32, 32)
        videos.update(batch["index"].tolist())
        views += batch["view"].tolist()
        labels.update(zip(batch["index"].tolist(), batch["label"].tolist()))
    assert videos == Counter({i: 6 for i in range(8)})
    assert views == list(range(6)) * 8
    assert labels == {i: i % 4 for i in range(8)}
    # Views differ: 3 crops along the long side of a 64x48 frame resized to short side 37.
    first = [dataset[i]["video"] for i in range(3)]
    assert not torch.equal(first[0], first[2])


def test_multi_label_targets(videos: VideoFactory, tmp_path: Path) -> None:
    videos.coded("a.mp4", num_frames=8)
    videos.coded("b.mp4", num_frames=8)
    (tmp_path / "m.csv").write_text("a.mp4 0,3\nb.mp4 2\n")
    dataset = TrainVideoDataset(tmp_path / "m.csv")
    assert dataset.multi_label and dataset.num_classes == 4
    batch = collate_clips([dataset[request(index=i)] for i in range(2)])
    assert torch.equal(batch["label"], torch.tensor([[1.0, 0, 0, 1], [0, 0, 1, 0]]))


@pytest.fixture
def mixed_manifest(videos: VideoFactory, tmp_path: Path) -> Path:
    """Two good videos and one of every broken kind."""
    lines = [f"{videos.coded(f'good{i}.mp4', num_frames=12).name} {i}\n" for i in range(2)]
    lines += [f"{videos.broken(kind).name} 0\n" for kind in BROKEN_KINDS]
    (tmp_path / "mixed.csv").write_text("".join(lines))
    return tmp_path / "mixed.csv"


def test_bad_videos_are_replaced_logged_once_and_reported(
    mixed_manifest: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dataset = TrainVideoDataset(mixed_manifest)
    bad_paths = {e.path for e in dataset.manifest.entries[2:]}
    with caplog.at_level(logging.WARNING, logger="lightning_multigrid.data"):
        samples = [dataset[request(index=i, seed=s)] for s in range(3) for i in range(len(dataset))]
    for sample in samples:
        assert sample["index"] in (0, 1)  # a good video's clip, whatever was asked
        assert sample["video"].shape == (3, 4, 32, 32)
    skipped = [p for s in samples for p in s["skipped"]]
    assert set(skipped) == bad_paths
    assert all(s["skipped"][0] == dataset.manifest.entries[i].path for s, i in zip(samples, list(range(len(dataset))) * 3) if i >= 2)
    logged = Counter(r.args[0] for r in caplog.records if r.args)  # type: ignore[index]
    assert logged == Counter({p: 1 for p in bad_paths})  # each bad file once per process
    assert "missing.mp4: the file does not exist" in caplog.text
    # The replacement is a function of the seed: the same in any process.
    fresh = TrainVideoDataset(mixed_manifest)
    again = fresh[request(index=4, seed=7)]
    first = dataset[request(index=4, seed=7)]
    assert again["index"] == first["index"] and torch.equal(again["video"], first["video"])
    assert again["skipped"] == first["skipped"] and first["skipped"][0] == dataset.manifest.entries[4].path
    assert collate_clips([first, again])["skipped"] == [*first["skipped"], *again["skipped"]]


@pytest.mark.parametrize("kind", BROKEN_KINDS)
def test_strict_raises_with_the_path(videos: VideoFactory, tmp_path: Path, kind: str) -> None:
    bad = videos.broken(kind)  # type: ignore[arg-type]
    (tmp_path / "m.csv").write_text(f"{bad.name} 0\n")
    with pytest.raises(VideoDecodeError, match=f"Cannot decode video {bad}"):
        TrainVideoDataset(tmp_path / "m.csv", strict=True)[request()]
    with pytest.raises(VideoDecodeError, match=str(bad)):
        EvalVideoDataset(tmp_path / "m.csv", base_shape=GridShape(1, 4, 32), strict=True)[0]


def test_all_bad_gives_up_with_advice(videos: VideoFactory, tmp_path: Path) -> None:
    (tmp_path / "m.csv").write_text(f"{videos.broken('empty').name} 0\n{videos.broken('random_bytes').name} 1\n")
    with pytest.raises(RuntimeError, match="could not be decoded.*check-data"):
        TrainVideoDataset(tmp_path / "m.csv", max_replacements=5)[request()]


def test_eval_replaces_bad_videos_too(mixed_manifest: Path) -> None:
    dataset = EvalVideoDataset(mixed_manifest, base_shape=GridShape(1, 4, 32))
    sample = dataset[3]
    assert sample["index"] in (0, 1) and sample["view"] == 0
    assert sample["skipped"][0] == dataset.manifest.entries[3].path
    assert set(sample["skipped"]) <= {e.path for e in dataset.manifest.entries[2:]}


def test_configuration_errors_raise_at_construction(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        TrainVideoDataset(tmp_path / "missing.csv")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(ManifestError, match="lists no videos"):
        TrainVideoDataset(tmp_path / "empty.csv")
    (tmp_path / "m.csv").write_text("a.mp4 0\n")
    with pytest.raises(FileNotFoundError, match="root"):
        TrainVideoDataset(tmp_path / "m.csv", root=tmp_path / "nowhere")
    with pytest.raises(ValueError, match="slowfast_alpha"):
        TrainVideoDataset(tmp_path / "m.csv", slowfast_alpha=0)
    with pytest.raises(ValueError, match="num_crops"):
        EvalVideoDataset(tmp_path / "m.csv", base_shape=GridShape(1, 4, 32), views=EvalViews(1, 2))
    with pytest.raises(TypeError, match="indexed by `ClipRequest`"):
        TrainVideoDataset(tmp_path / "m.csv")[0]  # type: ignore[index]


def test_collate_rejects_mixed_shapes(synthetic_dataset: SyntheticDataset) -> None:
    dataset = TrainVideoDataset(synthetic_dataset.train_manifest)
    with pytest.raises(ValueError, match="share a shape"):
        collate_clips([dataset[request(num_frames=4)], dataset[request(num_frames=2)]])


def test_workers_reproduce_the_single_process_batches(synthetic_dataset: SyntheticDataset) -> None:
    dataset = TrainVideoDataset(synthetic_dataset.train_manifest)
    batches = [[request(index=(3 * b + i) % 16, seed=100 * b + i) for i in range(4)] for b in range(4)]
    serial = list(DataLoader(dataset, batch_sampler=batches, collate_fn=collate_clips))
    parallel = list(DataLoader(dataset, batch_sampler=batches, collate_fn=collate_clips, num_workers=2))
    for a, b in zip(serial, parallel):
        assert torch.equal(a["video"], b["video"]) and torch.equal(a["index"], b["index"])


def test_metadata_is_probed_once_per_video_and_worker(
    synthetic_dataset: SyntheticDataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "probes.log"
    probe = VideoReader._probe

    def counting_probe(self: VideoReader) -> object:
        with open(log, "a") as file:
            file.write(f"{os.getpid()} {self.path}\n")
        return probe(self)

    monkeypatch.setattr(VideoReader, "_probe", counting_probe)
    dataset = TrainVideoDataset(synthetic_dataset.train_manifest)
    batches = [[request(index=i % 2, seed=10 * b + i) for i in range(4)] for b in range(6)]
    list(DataLoader(dataset, batch_sampler=batches, collate_fn=collate_clips, num_workers=2))
    probes = Counter(log.read_text().splitlines())
    assert len({line.split()[0] for line in probes}) == 2  # both workers probed...
    assert max(probes.values()) == 1  # ...each video at most once
    assert len(probes) <= 4


def test_metadata_file_skips_probing(
    synthetic_dataset: SyntheticDataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning_multigrid.data.manifests.videos import read_manifest
    from lightning_multigrid.data.tools.check import check_videos

    check_videos(read_manifest(synthetic_dataset.train_manifest), workers=1, progress=False).metadata_cache().save(
        tmp_path / "meta.json"
    )

    def no_probe(self: VideoReader) -> None:
        raise AssertionError("probed although the metadata file has it")

    monkeypatch.setattr(VideoReader, "_probe", no_probe)
    dataset = TrainVideoDataset(synthetic_dataset.train_manifest, ReaderSettings(metadata_file=tmp_path / "meta.json"))
    assert dataset[request(index=3)]["video"].shape == (3, 4, 32, 32)
