"""PerUserSqlite: one small SQLite file per user, for the lexical index and the history log.

A file per user means forgetting a user deletes one file and no other user's rows ever share a
page with theirs. Writes are durable (``synchronous=FULL``, a rollback journal) and deleted rows
are zeroed (``secure_delete``).
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from hybridmem._files import user_dir, user_key
from hybridmem.errors import CorruptStateError

__all__ = ["PerUserSqlite"]


class PerUserSqlite:
    """Connections cached per user behind one lock; subclasses name the file and its schema."""

    file_name = "store.sqlite3"
    what = "store"
    schema: tuple[str, ...] = ()

    def __init__(self, data_dir: Path) -> None:
        self._data_dir = data_dir
        self._conns: dict[str, sqlite3.Connection] = {}
        self._lock = threading.RLock()

    def _conn(self, user_id: str, *, create: bool = True) -> sqlite3.Connection | None:
        """The user's connection (call with the lock held); None if absent and not ``create``."""
        key = user_key(user_id)
        conn = self._conns.get(key)
        if conn is not None:
            return conn
        path = user_dir(self._data_dir, user_id, create=create) / self.file_name
        if not create and not path.exists():
            return None
        try:
            conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
            conn.execute("PRAGMA journal_mode=DELETE")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA secure_delete=ON")
            for statement in self.schema:
                conn.execute(statement)
        except sqlite3.DatabaseError as exc:
            raise CorruptStateError(f"the {self.what} {path} cannot be opened: {exc}") from exc
        self._conns[key] = conn
        return conn

    def drop_user(self, user_id: str) -> None:
        """Close and delete the user's file (and any journal beside it)."""
        with self._lock:
            conn = self._conns.pop(user_key(user_id), None)
            if conn is not None:
                conn.close()
            folder = user_dir(self._data_dir, user_id, create=False)
            for suffix in ("", "-journal", "-wal", "-shm"):
                (folder / (self.file_name + suffix)).unlink(missing_ok=True)

    def close(self) -> None:
        """Close every connection; idempotent."""
        with self._lock:
            for conn in self._conns.values():
                conn.close()
            self._conns.clear()
