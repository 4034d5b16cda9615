"""The packed frame store: every frame's JPEG bytes of a dataset in one file per resolution level.

``format`` is the layout on disk and its index (read by offset through memory maps), ``reader`` the
``ClipReader`` over it; ``lightning-multigrid pack-frames``
(:mod:`lightning_multigrid.data.tools.pack`) writes one.
"""
