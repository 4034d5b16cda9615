"""Decoders: every way a clip gets from a file (or memory) to pixels, and the errors they raise."""
