"""Manifests: which videos a dataset holds and their labels (video files or frame folders)."""
