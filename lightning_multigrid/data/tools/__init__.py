"""The data command-line tools: ``extract-frames`` and ``check-data``, and their process pool."""
