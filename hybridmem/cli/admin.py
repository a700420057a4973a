"""The operator's commands of ``hybridmem``: backup, restore, reembed and purge.

Kept apart from :mod:`hybridmem.cli` (which stays within its size) and registered on its app by
:func:`register`, with the CLI's own way to open a Memory and to fail, so every command behaves
the same (settings from the environment, ``--data-dir`` over them, one-line errors, exit codes).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.console import Console

if TYPE_CHECKING:  # the CLI imports Memory only when a command runs (--help loads no store)
    from hybridmem import Memory

__all__ = ["register"]

OpenMemory = Callable[[Optional[Path]], AbstractContextManager["Memory"]]
DataDirOpt = typer.Option(None, "--data-dir", help="Where memories live (HYBRIDMEM_DATA_DIR).")
UserOpt = typer.Option(None, "--user", help="Only this user (default: every user).")


def register(app: typer.Typer, open_memory: OpenMemory, out: Console, err: Console) -> None:
    """Add the backup, restore, reembed and purge commands to ``app``."""

    @app.command()
    def backup(
        dest: Path = typer.Argument(..., help="The backup folder; snapshots go inside it."),
        user: Optional[str] = UserOpt,
        data_dir: Optional[Path] = DataDirOpt,
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Snapshot every user (or one) into DEST while the store stays usable; keeps the newest
        HYBRIDMEM_BACKUP_KEEP snapshots there (default 7)."""
        with open_memory(data_dir) as mem:
            path = mem.backup(dest, user_id=user)
        manifest = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
        if as_json:
            print(json.dumps({"snapshot": str(path), "users": manifest["users"]}, indent=2))
        else:
            count = sum(u["memories"] for u in manifest["users"])
            out.print(f"{path}: {len(manifest['users'])} users, {count} memories",
                      highlight=False, markup=False)

    @app.command()
    def restore(
        source: Path = typer.Argument(
            ..., help="A snapshot folder, or a backup folder (its newest snapshot)."),
        user: Optional[str] = UserOpt,
        replace: bool = typer.Option(
            False, "--replace", help="Replace users who have memories here (they are erased "
            "first); without it such users are refused."),
        data_dir: Optional[Path] = DataDirOpt,
    ) -> None:
        """Bring back the users of a snapshot (re-embedded with the configured embedder)."""
        with open_memory(data_dir) as mem:
            count = mem.restore(source, user_id=user, replace=replace)
        out.print(f"restored {count} memories", highlight=False, markup=False)

    @app.command()
    def reembed(
        user: Optional[str] = UserOpt,
        data_dir: Optional[Path] = DataDirOpt,
    ) -> None:
        """Move memories to the configured embedder (HYBRIDMEM_EMBEDDER); safe to run again
        after an interruption: it resumes where it stopped."""
        from rich.progress import Progress

        with Progress(console=err, transient=False) as bar, open_memory(data_dir) as mem:
            tasks: dict[str, int] = {}

            def report(user_id: str, done: int, total: int) -> None:
                if user_id not in tasks:
                    tasks[user_id] = int(bar.add_task(f"re-embedding {user_id}", total=total))
                bar.update(tasks[user_id], completed=done)  # type: ignore[arg-type]

            count = mem.reembed(user, progress=report)
        out.print(f"re-embedded {count} memories with {mem.embedder.name}",
                  highlight=False, markup=False)

    @app.command()
    def purge(data_dir: Optional[Path] = DataDirOpt) -> None:
        """Make every erasure physical now (forget, prune and update otherwise leave it to a
        background compaction within HYBRIDMEM_PURGE_DELAY seconds)."""
        with open_memory(data_dir) as mem:
            mem.purge_now()
        out.print("purged", highlight=False, markup=False)
