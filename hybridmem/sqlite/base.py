"""PerUserSqlite: one small SQLite file per user, for the lexical index and the history log.

A file per user means forgetting a user deletes one file and no other user's rows ever share a
page with theirs. Writes are durable (``synchronous=FULL``, a rollback journal) and deleted rows
are zeroed (``secure_delete``).

The rollback journal is *truncated* at each commit (``journal_mode=TRUNCATE``), not deleted: the
default mode creates and unlinks ``<file>-journal`` in every transaction, two directory changes
the file system must commit, which made a one-row commit cost 9.0 ms here against 0.9 ms
truncated (same durability; measured on this project's ext4 machine). The journal holds page
images only while its transaction runs; afterwards it is an empty file beside the
database (removed with it by :meth:`PerUserSqlite.drop_user`).

Every write goes through :meth:`PerUserSqlite._write`, one ``BEGIN IMMEDIATE`` ... ``COMMIT`` that
rolls back on any failure, and every SQLite error leaves as one of ours (:func:`storage_error`):
:class:`~hybridmem.errors.StoreBusyError` (retryable) when another connection holds the lock past
``timeout``, :class:`~hybridmem.errors.CorruptStateError` when the file is not a readable database,
:class:`~hybridmem.errors.StorageError` otherwise. A closed store raises
:class:`~hybridmem.errors.ClosedError` instead of quietly opening new connections.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, TypeVar

from hybridmem.runtime.files import check_users_dir, user_dir, user_key
from hybridmem.runtime.locks import UserLocks
from hybridmem.errors import ClosedError, CorruptStateError, StorageError, StoreBusyError

__all__ = ["PerUserSqlite", "storage_error"]

log = logging.getLogger(__name__)

_S = TypeVar("_S", bound="PerUserSqlite")

# SQLite primary result codes (https://sqlite.org/rescode.html); extended codes keep them in the
# low byte. Python < 3.11 does not expose them, so the messages SQLite gives them are the fallback.
_BUSY = {5: "database is locked", 6: "database table is locked"}  # SQLITE_BUSY, SQLITE_LOCKED
_CORRUPT = {11: "malformed", 26: "not a database"}  # SQLITE_CORRUPT, SQLITE_NOTADB


def _matches(exc: sqlite3.Error, codes: dict[int, str]) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in codes
    return any(text in str(exc) for text in codes.values())


def storage_error(exc: sqlite3.Error, doing: str) -> StorageError:
    """Our error for a SQLite failure while ``doing`` something (raise it ``from exc``)."""
    if _matches(exc, _BUSY):
        return StoreBusyError(
            f"could not {doing}: the database is locked by another connection ({exc}); retry later"
        )
    if _matches(exc, _CORRUPT):
        return CorruptStateError(
            f"could not {doing}: the file is not a readable SQLite database ({exc}); move it away "
            "(the lexical index can be rebuilt from the memories) or restore it from a backup"
        )
    return StorageError(f"could not {doing}: {exc}")


class PerUserSqlite:
    """Connections cached per user, each used under its user's own lock (one user's fsync'd
    commit never holds up another user's query); subclasses name the file and its schema.

    ``timeout`` is how long (seconds) a statement waits for another connection's lock before
    :class:`~hybridmem.errors.StoreBusyError` is raised.
    """

    file_name = "store.sqlite3"
    what = "store"
    schema: tuple[str, ...] = ()

    def __init__(
        self, data_dir: str | os.PathLike[str], *, timeout: float = 5.0, max_open: int = 128
    ) -> None:
        self._data_dir = Path(data_dir)
        self._timeout = timeout
        #: Least recently used first; beyond ``max_open`` the oldest connection is closed, so
        #: open files stay flat however many users a process serves.
        self._conns: OrderedDict[str, sqlite3.Connection] = OrderedDict()
        self._max_open = max(1, max_open)
        self._lock = threading.RLock()  # the table and the closed flag only, never a statement
        self._users = UserLocks()  # a user's connection is used under that user's lock
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"open_users={len(self._conns)}"
        return f"{type(self).__name__}(data_dir={str(self._data_dir)!r}, {state})"

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ping(self) -> None:
        """Raise unless the store serves: open, and its users' directory writable (see
        :class:`~hybridmem.protocols.Pingable`)."""
        with self._lock:
            if self._closed:
                raise ClosedError(f"the {self.what} is closed; create a new {type(self).__name__}")
        check_users_dir(self._data_dir, self.what)

    def _conn(self, user_id: str, *, create: bool = True) -> sqlite3.Connection | None:
        """The user's connection (call with the user's lock held, see :meth:`_user`); None if
        absent and not ``create``."""
        key = user_key(user_id)
        with self._lock:
            if self._closed:
                raise ClosedError(f"the {self.what} is closed; create a new {type(self).__name__}")
            conn = self._conns.get(key)
            if conn is not None:
                self._conns.move_to_end(key)
                return conn
        path = user_dir(self._data_dir, user_id, create=create) / self.file_name
        if not create and not path.exists():
            return None
        try:
            conn = sqlite3.connect(
                str(path), timeout=self._timeout, check_same_thread=False, isolation_level=None
            )
        except sqlite3.Error as exc:
            raise storage_error(exc, f"open the {self.what} {path}") from exc
        try:
            conn.execute("PRAGMA journal_mode=TRUNCATE")  # see the module docstring
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA secure_delete=ON")
            for statement in self.schema:
                conn.execute(statement)
        except sqlite3.Error as exc:
            conn.close()
            raise storage_error(exc, f"open the {self.what} {path}") from exc
        with self._lock:
            self._conns[key] = conn
            # the least recently used go first, never one a call holds (it may be using it)
            for old in [k for k in self._conns if k != key and not self._users.busy(k)]:
                if len(self._conns) <= self._max_open:
                    break
                self._conns.pop(old).close()
                self._closed_conn(old)
        return conn

    def _closed_conn(self, key: str) -> None:
        """The connection of user ``key`` was closed (called under the store-wide lock): state a
        subclass keeps beside it goes with it."""

    def _user(self, user_id: str) -> AbstractContextManager[None]:
        return self._users.hold(user_key(user_id))

    def _write(
        self,
        user_id: str,
        doing: str,
        work: Callable[[sqlite3.Connection], object],
        *,
        create: bool = True,
    ) -> None:
        """Run ``work`` in one transaction on the user's database: all of it or none of it.

        With ``create=False`` a user without a file is left alone (nothing to delete or scrub).
        ``BEGIN IMMEDIATE`` takes the write lock up front, so a busy database fails (after
        ``timeout``) before anything was done, never halfway.
        """
        with self._user(user_id):
            conn = self._conn(user_id, create=create)
            if conn is None:
                return
            try:
                conn.execute("BEGIN IMMEDIATE")
                work(conn)
                conn.execute("COMMIT")
            except BaseException as exc:
                self._rollback(user_id, conn)
                if isinstance(exc, sqlite3.Error):
                    raise storage_error(exc, f"{doing} of {user_id!r}") from exc
                raise

    def _rollback(self, user_id: str, conn: sqlite3.Connection) -> None:
        """Undo the open transaction, if any; a failing rollback must not hide the first error,
        and its connection is dropped (SQLite undoes the transaction when the file is reopened)."""
        if not conn.in_transaction:
            return
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            log.warning("rollback failed in the %s; reopening it", self.what, exc_info=True)
            with self._lock:
                self._conns.pop(user_key(user_id), None)
                self._closed_conn(user_key(user_id))
            conn.close()

    def _read(
        self, user_id: str, doing: str, sql: str, args: Sequence[object] = ()
    ) -> list[tuple[Any, ...]]:
        """The rows of one query on the user's database ([] when the user has no file)."""
        with self._user(user_id):
            conn = self._conn(user_id, create=False)
            if conn is None:
                return []
            try:
                return conn.execute(sql, tuple(args)).fetchall()
            except sqlite3.Error as exc:
                raise storage_error(exc, f"{doing} of {user_id!r}") from exc

    def drop_user(self, user_id: str) -> None:
        """Close and delete the user's file (and any journal beside it)."""
        with self._user(user_id):
            with self._lock:
                if self._closed:
                    raise ClosedError(
                        f"the {self.what} is closed; create a new {type(self).__name__}")
                conn = self._conns.pop(user_key(user_id), None)
                self._closed_conn(user_key(user_id))
            if conn is not None:
                conn.close()
            folder = user_dir(self._data_dir, user_id, create=False)
            for suffix in ("", "-journal", "-wal", "-shm"):
                path = folder / (self.file_name + suffix)
                try:
                    path.unlink(missing_ok=True)
                except OSError as exc:
                    raise StorageError(f"could not delete {path}: {exc}") from exc

    def close(self) -> None:
        """Close every connection; idempotent. The store refuses use afterwards."""
        with self._lock:
            self._closed = True  # no new call gets a connection from here on
            keys = list(self._conns)
        for key in keys:  # each closed once no call holds it
            with self._users.hold(key), self._lock:
                conn = self._conns.pop(key, None)
                self._closed_conn(key)
            if conn is not None:
                conn.close()

