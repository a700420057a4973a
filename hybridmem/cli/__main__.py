"""``python -m hybridmem.cli``: the same command as the ``hybridmem`` console script."""

from hybridmem.cli.commands import main

main()
