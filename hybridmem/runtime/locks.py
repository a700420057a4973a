"""One process per embedded data dir: an OS lock held while a Memory has the directory open.

Embedded Chroma is single-process, and so are the graph's and the indexes' in-process caches: a
second process on the same directory silently misses the first one's writes. So opening an
embedded data dir takes an exclusive ``flock`` on ``data_dir/hybridmem.lock``; another process
gets :class:`~hybridmem.errors.DataDirLockedError` naming the holder (pid, host, command) and the
two ways to share a store. The kernel drops the lock when its process dies, even by ``kill -9``,
so a stale lock cannot outlive its owner.

Within one process several Memory objects may share a directory (a notebook cell re-run, a test
opening a second Memory): the lock is counted per process. That count is the one piece of
process-wide state in hybridmem, because the OS lock it mirrors is process-wide too.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import ClassVar

from hybridmem.errors import DataDirLockedError, StorageError

__all__ = ["LOCK_FILE", "DataDirLock", "UserLocks"]

LOCK_FILE = "hybridmem.lock"

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows: msvcrt locks a byte range instead
    fcntl = None  # type: ignore[assignment]


class DataDirLock:
    """The lock on one data dir, held until :meth:`release` (idempotent)."""

    _held: ClassVar[dict[str, tuple[int, int]]] = {}  # resolved path -> (fd, holders)
    _guard: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, data_dir: Path) -> None:
        self.path = (data_dir / LOCK_FILE).resolve()
        self._released = False
        with self._guard:
            key = str(self.path)
            if key in self._held:
                fd, count = self._held[key]
                self._held[key] = (fd, count + 1)
                return
            fd = self._acquire()
            self._held[key] = (fd, 1)

    def _acquire(self) -> int:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StorageError(f"could not open {self.path}: {exc}") from exc
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise DataDirLockedError(
                    f"the data dir {self.path.parent} is in use by {holder}. Embedded storage "
                    "serves one process; to share it, run the REST service (hybridmem serve) and "
                    "call it, or point every process at one Chroma server (HYBRIDMEM_CHROMA_URL)"
                ) from None
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(),
                 "command": " ".join(sys.argv)[:200]}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(owner).encode("utf-8"), 0)
        return fd

    def sole(self) -> bool:
        """Whether this is the data dir's only holder (another Memory of this process on the
        same dir writes it too, behind the back of this one's in-memory caches)."""
        with self._guard:
            held = self._held.get(str(self.path))
            return not self._released and held is not None and held[1] == 1

    def release(self) -> None:
        """Give up this holder's share; the OS lock goes with the last one."""
        with self._guard:
            if self._released:
                return
            self._released = True
            key = str(self.path)
            fd, count = self._held[key]
            if count > 1:
                self._held[key] = (fd, count - 1)
                return
            del self._held[key]
            os.close(fd)  # closing the descriptor releases the flock


def _holder(fd: int) -> str:
    """Who holds the lock, as the lock file says (best effort: it is a courtesy)."""
    try:
        owner = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return (f"process {owner.get('pid')} on {owner.get('host')} "
                f"({owner.get('command') or 'unknown command'})")
    except (OSError, ValueError, AttributeError):
        return "another process"


class _UserLock:
    """A re-entrant lock that can be weakly referenced (``threading.RLock`` cannot)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()

    def __enter__(self) -> bool:
        return self._lock.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


class UserLocks:
    """One re-entrant lock per user within a process: ``with locks(user_id): ...`` serialises a
    user's writes. A user's lock lives only while someone holds or waits for it (weak values), so
    the map does not grow with the users a process has ever served."""

    def __init__(self) -> None:
        self._locks: weakref.WeakValueDictionary[str, _UserLock] = weakref.WeakValueDictionary()
        self._guard = threading.Lock()

    def __call__(self, user_id: str) -> _UserLock:
        with self._guard:
            lock = self._locks.get(user_id)
            if lock is None:
                lock = self._locks[user_id] = _UserLock()
            return lock
