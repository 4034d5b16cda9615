"""The data-wait advice of MultigridVideoDataModule fits what it reads: video files, frame folders,
a packed store, and its settings; real manifests (the synthetic dataset, its frames, a packed store)."""

from __future__ import annotations

from pathlib import Path

from lightning_multigrid.data.datamodule import MultigridVideoDataModule
from lightning_multigrid.data.reader_settings import ReaderSettings
from lightning_multigrid.data.sources import load_manifest
from lightning_multigrid.data.synthetic import SyntheticDataset
from lightning_multigrid.data.tools.pack import pack_frames


def _advice(train_manifest: Path | str, **kwargs: object) -> str:
    datamodule = MultigridVideoDataModule(
        train_manifest=str(train_manifest), batch_size=2, num_frames=4, crop_size=32, **kwargs  # type: ignore[arg-type]
    )
    datamodule.setup("fit")
    return datamodule.loading_advice()


def test_advice_fits_the_source_and_settings(
    synthetic_dataset: SyntheticDataset, synthetic_frames: tuple[Path, Path], tmp_path: Path
) -> None:
    videos = _advice(synthetic_dataset.train_manifest, class_names=str(synthetic_dataset.class_names_file),
                     num_workers=2)
    assert "reading frames from a packed frame store instead of the video files" in videos
    assert "frame_decode" not in videos  # video files cannot be decoded on the device
    assert "more loader workers (`num_workers`, now 2)" in videos

    frames = _advice(synthetic_frames[0], num_workers=3, chunk_batches=False)
    assert "packing the frame folders into a frame store" in frames
    assert "frame_decode: device" not in frames  # measured slower than the workers' decode (docs/gpu.md)
    assert "`chunk_batches: true`" in frames

    store = pack_frames(load_manifest(synthetic_frames[0]), tmp_path / "train.store", crop_size=32, workers=1,
                        progress=False).store
    stored = _advice(store, reader_settings=ReaderSettings(frame_decode="device"), decode_ahead=1)
    assert "packed frame store" not in stored and "packing" not in stored  # it reads one
    assert "`pack-frames --levels 2`" in stored
    assert "decoding further ahead of the step (`decode_ahead: 2`, now 1)" in stored
    assert "frame_decode: device" not in stored  # it does
    assert "decoding in the workers (`reader_settings: {frame_decode: workers}`), measured faster" in stored
