"""What makes a folder a packed frame store: its header, or the marker of a packing run writing it.

Told apart here, with the other kinds of dataset source, because the manifests need it (a folder per
class leaves a store out of its classes) and sit below the store package
(:mod:`lightning_multigrid.data.store`), which writes and reads these files and imports their names
from here.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["HEADER_FILE", "PACKING_MARKER", "is_store"]

HEADER_FILE = "store.json"
PACKING_MARKER = ".packing"  # present while pack-frames writes into the folder


def is_store(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a store folder: complete, or left incomplete by an interrupted ``pack-frames``."""
    folder = Path(path)
    return folder.is_dir() and ((folder / HEADER_FILE).is_file() or (folder / PACKING_MARKER).exists())
