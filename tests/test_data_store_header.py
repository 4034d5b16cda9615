"""The store's header value: its JSON form (``store.json``'s keys, pinned), old headers, a generation's file
names, and each level's frame size as the writer records it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_multigrid.data import load_manifest
from lightning_multigrid.data.manifests.entries import ManifestError, VideoEntry
from lightning_multigrid.data.manifests.store_folder import HEADER_FILE
from lightning_multigrid.data.store.format import read_store_manifest, store_digest, store_failures
from lightning_multigrid.data.store.header import (
    PackFailure,
    StoreHeader,
    frames_file,
    generation_token,
    offsets_file,
    read_header,
    videos_file,
)
from lightning_multigrid.data.store.write import PackedVideo
from lightning_multigrid.data.tools.pack import pack_frames

from conftest import FrameFactory

# store.json's keys, in the order written: changing them is a change of the store's format.
KEYS = [
    "format", "version", "token", "levels", "files", "videos_file", "total_frames", "names", "paths", "video_ids",
    "labels", "frame_counts", "num_classes", "multi_label", "class_names", "failures", "packed_from", "packed_for",
    "quality", "subsampling",
]


@pytest.fixture
def store(tmp_path: Path, frames: FrameFactory) -> Path:
    for i in range(2):
        frames.smooth(f"v{i}", num_frames=6, width=64, height=48, seed=i)
    (tmp_path / "m.txt").write_text("v0 0\nv1 1\nmissing 1\n")
    return pack_frames(load_manifest(tmp_path / "m.txt"), tmp_path / "s.store", crop_size=32, levels=2, workers=0,
                       progress=False).store


def test_the_header_reads_back_to_the_json_it_was_written_as(store: Path) -> None:
    written = json.loads((store / HEADER_FILE).read_text())
    assert list(written) == KEYS
    header = read_header(store)
    assert header.to_json() == written
    assert header.levels == (46, 33)  # round(320 * 32 / 224), / sqrt(2)
    assert header.files[0].frames == frames_file(46, header.token) == f"L46-{header.token}.bin"
    assert header.files[1].offsets == offsets_file(33, header.token) == f"L33-{header.token}.offsets.npy"
    assert header.videos_file == videos_file(header.token) == f"videos-{header.token}.npz"
    assert header.total_frames == 12 and [e.num_frames for e in header.entries] == [6, 6]
    assert header.failures == (PackFailure(str(store.parent / "missing"), header.failures[0].reason),)
    assert store_failures(store) == [(str(store.parent / "missing"), header.failures[0].reason)]
    assert header.packing.subsampling == "4:4:4" and header.packing.crop_size == 32
    assert read_store_manifest(store) == header.manifest(str(store))


def test_a_header_written_before_subsampling_and_the_digest_were_recorded(store: Path) -> None:
    written = json.loads((store / HEADER_FILE).read_text())
    del written["subsampling"], written["packed_from"]["digest"]  # as an older version wrote it
    header = StoreHeader.from_json(written)
    assert header.packing.subsampling == "4:2:0"  # what those versions packed
    assert header.packing.digest is None
    (store / HEADER_FILE).write_text(json.dumps(written))
    assert store_digest(store) is None


def test_a_header_missing_a_key_is_refused_naming_it(store: Path) -> None:
    written = json.loads((store / HEADER_FILE).read_text())
    del written["levels"]
    (store / HEADER_FILE).write_text(json.dumps(written))
    with pytest.raises(ManifestError, match=r"store.json: not a readable store header \(missing or malformed 'levels'\)"):
        read_header(store)
    assert store_digest(store) is None  # not a complete store: pack it again


def test_a_generation_s_files_are_told_apart_by_their_token() -> None:
    assert [generation_token(name) for name in ("L160-0a1b.bin", "L80-0a1b.offsets.npy", "videos-0a1b.npz")] == [
        "0a1b", "0a1b", "0a1b"
    ]
    for other in (HEADER_FILE, ".packing", "L160-0a1b.bin.partial", "notes-0a1b.npz", "L160-XYZ.bin"):
        assert generation_token(other) is None, other


def test_level_sizes_are_never_upscaled_and_a_repeated_size_holds_no_frames() -> None:
    levels = (160, 113, 80)
    # 320 x 240 to short sides 160, 113, 80: widths 320 * 160 / 240 = 213.3, 150.7, 106.7.
    assert PackedVideo.of_size(320, 240, levels).level_sizes == [(213, 160), (151, 113), (107, 80)]
    # 150 x 120: level 0 keeps the source size (never up), the others shrink it.
    assert PackedVideo.of_size(150, 120, levels).level_sizes == [(150, 120), (141, 113), (100, 80)]
    # 100 x 80: every level would hold the source size: only level 0 holds frames.
    packed = PackedVideo.of_size(100, 80, levels)
    assert packed.level_sizes == [(100, 80), (0, 0), (0, 0)]
    assert packed.source_size == (100, 80) and packed.frames == [[], [], []] and packed.error is None


def test_the_header_s_entries_name_the_videos_as_the_manifest_does() -> None:
    entry = VideoEntry("clips.csv-folder", (3,), 8, video_id="7")
    written = {
        "token": "ab", "levels": [46], "files": [{"frames": "L46-ab.bin", "offsets": "L46-ab.offsets.npy", "bytes": 9}],
        "videos_file": "videos-ab.npz", "total_frames": 8, "names": [entry.name], "paths": [entry.path],
        "video_ids": ["7"], "labels": [[3]], "frame_counts": [8], "num_classes": 4, "multi_label": False,
        "class_names": None, "failures": [], "packed_from": {"source": "m.csv", "format": "frames", "digest": "d"},
        "packed_for": {"crop_size": 32, "jitter_scales": [40, 50]}, "quality": 90, "subsampling": "4:4:4",
    }
    header = StoreHeader.from_json(written)
    assert header.entries == (entry,) and header.entries[0].name == "clips.csv-folder [video 7]"
    assert header.packing.jitter_scales == (40, 50)
    assert header.to_json() == {"format": "lightning-multigrid frame store", "version": 1, **written}
