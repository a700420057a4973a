"""KeyedLocks: one re-entrant lock per user, so one user's slow call never holds up another's.

The graph store and the per-user SQLite stores serve many users from one object. With one lock
for the object, a cold graph load (~0.4 s at 10k memories) or an fsync'd SQLite commit of one user
made every other user's search wait. Each key gets its own lock instead; a key's entry exists only
while a call holds or waits for it, so the table is as small as the number of threads, however
many users the process has served. :meth:`KeyedLocks.busy` lets an LRU skip a user in use.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["KeyedLocks"]


class _Entry:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.users = 0  # calls holding or waiting for the lock


class KeyedLocks:
    """Re-entrant locks by key, created on first use and dropped when nobody holds them."""

    def __init__(self) -> None:
        self._guard = threading.Lock()  # a leaf lock: nothing is acquired while it is held
        self._entries: dict[str, _Entry] = {}

    def __repr__(self) -> str:
        return f"KeyedLocks(busy={len(self._entries)})"

    @contextmanager
    def hold(self, key: str) -> Iterator[None]:
        """Hold ``key``'s lock for the ``with`` block (re-entrant in one thread)."""
        with self._guard:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry()
            entry.users += 1
        try:
            with entry.lock:
                yield
        finally:
            with self._guard:
                entry.users -= 1
                if not entry.users:
                    del self._entries[key]

    def busy(self, key: str) -> bool:
        """Whether a call holds or waits for ``key`` right now."""
        with self._guard:
            return key in self._entries
