"""The ``hybridmem`` command: ``hybridmem.cli:main`` is the console script, ``app`` the Typer app.

:mod:`~hybridmem.cli.commands` holds the everyday verbs (demo, add, search, context, chat, serve,
import, export), :mod:`~hybridmem.cli.admin` the operator commands. Like every face, the CLI
uses only the public API.
"""

from hybridmem.cli.commands import app, main

__all__ = ["app", "main"]
