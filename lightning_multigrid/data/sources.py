"""One loader for every source of a dataset: a video manifest, a frame manifest, a folder per class, a packed frame store.

Above ``manifests/`` and ``store/``: a store's folder is read by the store package, which reads
manifests' entries, so the dispatch over the kinds lives here and ``manifests/`` never imports ``store/``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from lightning_multigrid.data.manifests.entries import (
    VIDEO_EXTENSIONS,
    Manifest,
    ManifestError,
    ManifestKind,
    check_manifest_kind,
    check_root,
)
from lightning_multigrid.data.manifests.frames import read_frame_manifest
from lightning_multigrid.data.manifests.load import detect_manifest_kind
from lightning_multigrid.data.manifests.store_folder import is_store
from lightning_multigrid.data.manifests.videos import read_folder_manifest, read_manifest
from lightning_multigrid.data.store.format import read_store_manifest

__all__ = ["load_manifest"]


def load_manifest(
    source: str | os.PathLike[str] | Manifest,
    root: str | os.PathLike[str] | None = None,
    class_names: str | os.PathLike[str] | Sequence[str] | None = None,
    kind: ManifestKind = "auto",
) -> Manifest:
    """A manifest from a manifest file, a folder of class folders, a packed frame store, or an already read one.

    A file whose paths are folders (``folder label [num_frames]``) or that is PySlowFast's
    frame-list CSV is read as a frame dataset
    (:func:`~lightning_multigrid.data.manifests.frames.read_frame_manifest`).

    Args:
        source: the manifest file, a folder per class, a packed frame store's folder
            (``lightning-multigrid pack-frames``; read with
            :func:`~lightning_multigrid.data.store.format.read_store_manifest`), or a :class:`Manifest`.
        root: directory the manifest's paths are relative to; default its directory.
        class_names: a class-names file or the names, for labels given as names.
        kind: ``"video"`` (``path label`` lines of video files), ``"frames"`` (a frame dataset), or
            ``"auto"``: told from the content (:func:`~lightning_multigrid.data.manifests.load.detect_manifest_kind`).

    Raises:
        FileNotFoundError: when the file or folder does not exist.
        ValueError: when ``root`` or ``class_names`` are given with a folder or a ``Manifest``, or
            ``kind`` is not one of the three.
        ManifestError: as :func:`~lightning_multigrid.data.manifests.videos.read_manifest` and
            :func:`~lightning_multigrid.data.manifests.videos.read_folder_manifest`, and when ``kind="auto"``
            and the content cannot tell.
    """
    check_manifest_kind(kind)
    if isinstance(source, Manifest):
        if root is not None or class_names is not None:
            raise ValueError("`root` and `class_names` apply to a manifest file, not to a `Manifest` object.")
        return source
    if is_store(source):
        if root is not None or class_names is not None:
            raise ValueError(
                f"{source} is a packed frame store: it holds its labels and class names; do not pass `root` or "
                "`class_names`."
            )
        return read_store_manifest(source)
    if Path(source).is_dir():
        if root is not None or class_names is not None:
            raise ValueError(
                f"{source} is a folder per class: its classes are the folder names; "
                "do not pass `root` or `class_names`."
            )
        return read_folder_manifest(source)
    if kind == "auto" and Path(source).is_file():
        check_root(root, default=Path(source).parent)
        detected = detect_manifest_kind(source, root)
        if detected is None:
            raise ManifestError(
                f"{source}: cannot tell whether it lists video files or frame folders: its paths have no video "
                f"extension ({', '.join(VIDEO_EXTENSIONS[:3])}, ...), no frame count, and none of the first lines "
                f"exists under {root if root is not None else Path(source).parent}. Check `root_dir` (--root), "
                "or state the kind: `manifest_kind='frames'` or `'video'` (--manifest-kind)."
            )
        kind = "frames" if detected == "frames" else "video"
    if kind == "frames":
        return read_frame_manifest(source, root=root, class_names=class_names)
    return read_manifest(source, root=root, class_names=class_names)
