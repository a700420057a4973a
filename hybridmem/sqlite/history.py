"""HistoryStore: the audit log of every change to a user's memories, one SQLite file per user.

Events are append-only, except that deleting a memory scrubs the texts its events carried (a
deleted memory's words must not survive in its own history), and forgetting a user deletes the file.
"""

from __future__ import annotations

import builtins
import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime, timezone

from hybridmem.sqlite.base import PerUserSqlite
from hybridmem.models import HistoryEvent

__all__ = ["FILE_NAME", "HistoryStore"]

FILE_NAME = "history.sqlite3"


class HistoryStore(PerUserSqlite):
    """The default :class:`~hybridmem.protocols.HistoryLog`: an append-only per-user event log.
    Thread-safe."""

    file_name = FILE_NAME
    what = "history"
    schema = (
        "CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
        "id TEXT UNIQUE, memory_id TEXT, action TEXT, at REAL, cause TEXT, text TEXT, detail TEXT)",
        "CREATE INDEX IF NOT EXISTS events_memory ON events(memory_id)",
    )

    def record(self, user_id: str, events: Sequence[HistoryEvent]) -> None:
        """Append events (an event id already present is ignored, so imports are idempotent)."""
        if not events:
            return
        rows = [
            (e.id, e.memory_id, e.action, e.at.timestamp(), e.cause, e.text, json.dumps(e.detail))
            for e in events
        ]

        def work(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT OR IGNORE INTO events(id, memory_id, action, at, cause, text, detail) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                rows,
            )

        self._write(user_id, "record history", work)

    def list(self, user_id: str, memory_id: str | None = None) -> builtins.list[HistoryEvent]:
        """Events oldest first, all of the user's or one memory's."""
        query = "SELECT id, memory_id, action, at, cause, text, detail FROM events"
        args: tuple[str, ...] = ()
        if memory_id is not None:
            query += " WHERE memory_id = ?"
            args = (memory_id,)
        rows = self._read(user_id, "read the history", query + " ORDER BY seq", args)
        return [
            HistoryEvent(
                id=r[0],
                memory_id=r[1],
                action=r[2],
                at=datetime.fromtimestamp(r[3], tz=timezone.utc),
                cause=r[4],
                text=r[5],
                detail=json.loads(r[6] or "{}"),
            )
            for r in rows
        ]

    def scrub(self, user_id: str, memory_ids: Sequence[str]) -> None:
        """Remove the texts that events of deleted memories carried."""
        if not memory_ids:
            return

        def work(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "UPDATE events SET text = NULL, detail = '{}' WHERE memory_id = ?",
                [(m,) for m in memory_ids],
            )

        self._write(user_id, "scrub the history", work, create=False)
