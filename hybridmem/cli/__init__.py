"""The ``hybridmem`` command: ``hybridmem.cli:main`` is the console script, ``app`` the Typer app.

- :mod:`~hybridmem.cli.commands` — every command: the everyday verbs (demo, add, search, context,
  chat, serve, import, export, ...) and the operator's (backup, restore, reembed).
- :mod:`~hybridmem.cli.importfile` — reading the JSONL, CSV and export JSON files of ``import``.

Like every face, the CLI uses only the public API.
"""

from hybridmem.cli.commands import app, main

__all__ = ["app", "main"]
