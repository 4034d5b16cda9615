"""The former home of :class:`~lightning_multigrid.data.reader_settings.ReaderSettings`; its import path works.

The class moved above ``decoding/`` as it builds the store's reader too. The name is looked up on first
access, so importing this module loads nothing of ``store/``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning_multigrid._lazy import lazy_attribute

if TYPE_CHECKING:
    from lightning_multigrid.data.reader_settings import ReaderSettings

__all__ = ["ReaderSettings"]


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, {"ReaderSettings": "lightning_multigrid.data.reader_settings"}, name)
