"""``python -m lightning_multigrid.cli``: the ``lightning-multigrid`` command."""

from lightning_multigrid.cli.commands import main

main()
