"""Manifests: Kinetics / PySlowFast / pytorchvideo lines, multi-label, folders per class, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from lightning_multigrid.data.manifests.entries import Manifest, ManifestError, VideoEntry, read_class_names
from lightning_multigrid.data.manifests.videos import read_folder_manifest, read_manifest, write_manifest
from lightning_multigrid.data.sources import load_manifest

from conftest import FrameFactory, VideoFactory


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_space_and_comma_separated_with_header(tmp_path: Path) -> None:
    spaces = read_manifest(write(tmp_path / "a.csv", "path label\nv/a.mp4 0\nv/b c.mp4 2\n\n"))
    commas = read_manifest(write(tmp_path / "b.csv", "video,label\nv/a.mp4,0\nv/b c.mp4,2\n"))
    for manifest in (spaces, commas):
        assert manifest.entries == (
            VideoEntry(str(tmp_path / "v/a.mp4"), (0,)),
            VideoEntry(str(tmp_path / "v/b c.mp4"), (2,)),
        )
        assert manifest.num_classes == 3
        assert not manifest.multi_label
        assert manifest.entries[1].label == 2


def test_root_and_absolute_paths(tmp_path: Path) -> None:
    root = tmp_path / "videos"
    root.mkdir()
    manifest = read_manifest(write(tmp_path / "m.txt", "a.mp4 1\n/abs/b.mp4 0\n"), root=root)
    assert [e.path for e in manifest.entries] == [str(root / "a.mp4"), "/abs/b.mp4"]


def test_multi_label(tmp_path: Path) -> None:
    manifest = read_manifest(write(tmp_path / "charades.csv", "a.mp4 3,17,42\nb.mp4 5\n"))
    assert manifest.multi_label
    assert manifest.entries[0].labels == (3, 17, 42)
    assert manifest.num_classes == 43
    with pytest.raises(ValueError, match="3 labels"):
        _ = manifest.entries[0].label


def test_class_names_as_labels(tmp_path: Path) -> None:
    names = write(tmp_path / "classnames.txt", "abseiling\nair drumming\nbowling\n")
    manifest = read_manifest(write(tmp_path / "m.csv", "a.mp4 bowling\nb.mp4,air drumming\nc.mp4 0\n"), class_names=names)
    assert [e.labels for e in manifest.entries] == [(2,), (1,), (0,)]
    assert manifest.class_names == ("abseiling", "air drumming", "bowling")
    assert manifest.num_classes == 3


def test_class_names_json(tmp_path: Path) -> None:
    names = write(tmp_path / "classids.json", '{"b": 1, "a": 0}')
    assert read_class_names(names) == ("a", "b")
    with pytest.raises(ManifestError, match="without gaps"):
        read_class_names(write(tmp_path / "bad.json", '{"b": 2, "a": 0}'))


def test_folder_per_class(tmp_path: Path) -> None:
    for name in ("b/2.mp4", "b/1.mp4", "a/x.avi", "a/notes.txt"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    manifest = read_folder_manifest(tmp_path)
    assert manifest.class_names == ("a", "b")
    assert manifest.entries == (
        VideoEntry(str(tmp_path / "a/x.avi"), (0,)),
        VideoEntry(str(tmp_path / "b/1.mp4"), (1,)),
        VideoEntry(str(tmp_path / "b/2.mp4"), (1,)),
    )
    assert load_manifest(tmp_path) == manifest


def test_write_and_read_back(tmp_path: Path) -> None:
    entries = [VideoEntry(str(tmp_path / "x/a.mp4"), (1,)), VideoEntry(str(tmp_path / "b.mp4"), (0, 2))]
    write_manifest(tmp_path / "out.csv", entries)
    assert (tmp_path / "out.csv").read_text() == "x/a.mp4 1\nb.mp4 0,2\n"
    assert read_manifest(tmp_path / "out.csv").entries == tuple(entries)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("a.mp4 0\nb.mp4\n", r"m.csv:2: malformed line 'b.mp4'"),
        ("a.mp4 0\n\nb.mp4 cat\n", r"m.csv:3: label 'cat' is not a class index.*pass `class_names`"),
        ("a.mp4 -1\n", r"m.csv:1: label -1 is negative"),
        ("", r"m.csv: the manifest lists no videos"),
        ("path label\n# comment\n", r"m.csv: the manifest lists no videos"),
    ],
)
def test_malformed_manifests(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(ManifestError, match=match):
        read_manifest(write(tmp_path / "m.csv", text))


def test_unknown_label_name(tmp_path: Path) -> None:
    names = write(tmp_path / "names.txt", "cat\ndog\n")
    with pytest.raises(ManifestError, match=r"m.csv:2: unknown label 'cow'"):
        read_manifest(write(tmp_path / "m.csv", "a.mp4 cat\nb.mp4 cow\n"), class_names=names)
    with pytest.raises(ManifestError, match=r"m.csv:1: label 2 is out of range for 2 class names"):
        read_manifest(write(tmp_path / "m.csv", "a.mp4 2\n"), class_names=names)


def test_missing_files_and_roots(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="Manifest .*nope.csv does not exist"):
        read_manifest(tmp_path / "nope.csv")
    manifest = write(tmp_path / "m.csv", "a.mp4 0\n")
    with pytest.raises(FileNotFoundError, match="Dataset root .* is not a directory: check `root`"):
        read_manifest(manifest, root=tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="Class-names file"):
        read_manifest(manifest, class_names=tmp_path / "names.txt")
    with pytest.raises(ManifestError, match="no class folders"):
        read_folder_manifest(tmp_path)
    with pytest.raises(ValueError, match="folder per class"):
        load_manifest(tmp_path, root=tmp_path)


def test_load_manifest_passes_objects_through(tmp_path: Path) -> None:
    manifest = Manifest((VideoEntry("a.mp4", (0,)),), 1)
    assert load_manifest(manifest) is manifest


# ---------------------------------------------------------------------------- as editors write them


@pytest.mark.parametrize("newline", ["\n", "\r\n"], ids=["lf", "crlf"])
def test_byte_order_mark_and_crlf_keep_the_first_entry(tmp_path: Path, newline: str) -> None:
    """Failure 6: a manifest saved with a UTF-8 byte-order mark lost its first entry."""
    from lightning_multigrid.data.manifests.frames import write_frame_manifest

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / name / "img_00001.jpg")
    text = newline.join(["a 0 1", "b 1 1", ""])
    (tmp_path / "frames.txt").write_bytes(b"\xef\xbb\xbf" + text.encode())
    (tmp_path / "videos.csv").write_bytes(b"\xef\xbb\xbf" + newline.join(["a.mp4,0", "b.mp4,1", ""]).encode())
    (tmp_path / "names.txt").write_bytes(b"\xef\xbb\xbf" + newline.join(["jump", "run", ""]).encode())
    frames = load_manifest(tmp_path / "frames.txt", class_names=tmp_path / "names.txt")
    videos = load_manifest(tmp_path / "videos.csv")
    assert frames.format == "frames" and [Path(e.path).name for e in frames.entries] == ["a", "b"]
    assert frames.class_names == ("jump", "run")
    assert videos.format == "video" and [Path(e.path).name for e in videos.entries] == ["a.mp4", "b.mp4"]
    write_frame_manifest(tmp_path / "again.txt", frames.entries)
    assert load_manifest(tmp_path / "again.txt").entries == frames.entries


def test_frame_manifests_are_told_apart_from_video_manifests_by_content(tmp_path: Path) -> None:
    """A frame manifest whose first folders are missing, that is comma-separated, or whose root is
    wrong was read as a video manifest (paths with the label glued on, advice about video files)."""
    for name in ("c", "d"):
        (tmp_path / name).mkdir()
    missing_first = write(tmp_path / "m1.txt", "a 0\nb 1\nc 0\nd 1\n")
    commas = write(tmp_path / "m2.csv", "c,0,12\nd,1,12\n")
    quoted = write(tmp_path / "m3.txt", '"air drumming/x" 1 12\nc 0 12\n')
    for manifest in (missing_first, commas, quoted):
        assert load_manifest(manifest).format == "frames"
    assert [e.path for e in load_manifest(commas).entries] == [str(tmp_path / "c"), str(tmp_path / "d")]
    assert load_manifest(quoted).entries[0].path == str(tmp_path / "air drumming/x")
    wrong_root = tmp_path / "elsewhere"
    wrong_root.mkdir()
    assert load_manifest(commas, root=wrong_root).format == "frames"  # the frame count tells
    with pytest.raises(ManifestError, match=r"cannot tell whether it lists video files or frame folders.*"
                       r"Check `root_dir` \(--root\), or state the kind: `manifest_kind='frames'`"):
        load_manifest(missing_first, root=wrong_root)
    assert load_manifest(missing_first, root=wrong_root, kind="frames").format == "frames"
    with pytest.raises(ValueError, match="`manifest_kind` must be"):
        load_manifest(missing_first, kind="folders")  # type: ignore[arg-type]


def test_folders_with_spaces_round_trip_through_the_frame_manifest(tmp_path: Path) -> None:
    """Failure 12 (the format): a Kinetics class folder such as `air drumming` could not be written."""
    from lightning_multigrid.data.manifests.frames import write_frame_manifest

    entries = [VideoEntry(str(tmp_path / "air drumming" / "v1"), (0,), 12), VideoEntry(str(tmp_path / "abseiling" / "v2"), (1,), 9)]
    for entry in entries:
        Path(entry.path).mkdir(parents=True)
    write_frame_manifest(tmp_path / "train.txt", entries)
    assert (tmp_path / "train.txt").read_text().splitlines()[0] == '"air drumming/v1" 0 12'
    assert load_manifest(tmp_path / "train.txt").entries == tuple(entries)
    with pytest.raises(ValueError, match="whitespace and a double quote"):
        write_frame_manifest(tmp_path / "bad.txt", [VideoEntry(str(tmp_path / 'say "hi" now'), (0,), 1)])


# ---------------------------------------------------------------------------- one header rule, malformed lines named


def test_a_header_line_is_skipped_in_frame_manifests_as_in_video_manifests(
    tmp_path: Path, frames: FrameFactory, videos: VideoFactory
) -> None:
    """Review leftover: `path label` was skipped in a video manifest, `folder label num_frames` refused in a frame one."""
    for name in ("a", "b"):
        frames.coded(name, num_frames=6)
        videos.coded(f"{name}.mp4", num_frames=6)
    framed = load_manifest(write(tmp_path / "f.txt", "folder label num_frames\na 0 6\nb 1 6\n"))
    assert framed.format == "frames"
    assert [(e.path, e.labels, e.num_frames) for e in framed.entries] == [
        (str(tmp_path / "a"), (0,), 6), (str(tmp_path / "b"), (1,), 6)
    ]
    assert [e.line_number for e in framed.entries] == [2, 3]
    video = load_manifest(write(tmp_path / "v.txt", "path label\na.mp4 0\nb.mp4 1\n"))
    assert [(e.path, e.labels) for e in video.entries] == [(str(tmp_path / "a.mp4"), (0,)), (str(tmp_path / "b.mp4"), (1,))]
    # A first line naming a real folder or video with a bad label is an error, not a header.
    with pytest.raises(ManifestError, match=r"g.txt:1: label 'x' is not a class index"):
        load_manifest(write(tmp_path / "g.txt", "a x 6\nb 1 6\n"), kind="frames")
    with pytest.raises(ManifestError, match=r"w.txt:1: label 'x' is not a class index"):
        load_manifest(write(tmp_path / "w.txt", "a.mp4 x\nb.mp4 1\n"))


def test_an_extra_column_is_named_as_a_malformed_line(tmp_path: Path, frames: FrameFactory, videos: VideoFactory) -> None:
    """Review leftover: an extra column in a frame manifest whose folders exist was reported as
    "cannot tell ... check `root_dir`"; `a.mp4 0 x` as "no video extension"."""
    for name in ("a", "b"):
        frames.coded(name, num_frames=6)
    with pytest.raises(ManifestError, match=r"f.txt:1: malformed line 'a 0 6 extra': expected `folder label \[num_frames\]`"):
        load_manifest(write(tmp_path / "f.txt", "a 0 6 extra\nb 1 6 extra\n"))
    videos.coded("a.mp4", num_frames=6)
    for name in ("v.txt", "w.txt"):  # the video there, and not
        text = "a.mp4 0 x\n" if name == "v.txt" else "c.mp4 0 x\n"
        with pytest.raises(ManifestError, match=rf"{name}:1: malformed line '.\.mp4 0 x': expected `path label`, got 3 "
                           r"columns .*: remove the columns after the label"):
            load_manifest(write(tmp_path / name, text))
