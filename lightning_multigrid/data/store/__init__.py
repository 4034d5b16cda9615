"""The packed frame store: every frame's JPEG bytes of a dataset in one file per resolution level.

``header`` is the header (``store.json``: one value, its JSON form, the names of a generation's
files), ``format`` the layout on disk and its index (read by offset through memory maps), ``reader``
the ``ClipReader`` over it, ``write`` the writing of a generation; ``lightning-multigrid pack-frames``
(:mod:`lightning_multigrid.data.tools.pack`) is the command that writes one. The package reads
``manifests/`` and ``decoding/``, which never import it.
"""
