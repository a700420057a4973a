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

Every lock hybridmem takes lives here:

- :class:`DataDirLock` — one process per embedded data dir (an OS ``flock``).
- :class:`UserLocks` — one re-entrant lock per user within a process, so one user's slow call
  (a cold graph load, an fsync'd commit) never holds up another user's.
- :class:`WriteLocks` — the user's write lock: a :class:`UserLocks` entry, and in Chroma server
  mode also the user's lease across processes (:mod:`hybridmem.replica.lease`), with the hooks that
  finish a dead holder's batch and catch up with other processes' writes.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

from hybridmem.errors import DataDirLockedError, StorageError
from hybridmem.protocols import Lease, Leases

__all__ = ["LOCK_FILE", "MAX_REMEMBERED", "DataDirLock", "UserLocks", "WriteLocks"]

#: Users whose write epoch is remembered (least recently written forgotten first; see
#: :meth:`WriteLocks.epoch`).
MAX_REMEMBERED = 4096

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


class _Entry:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.users = 0  # calls holding or waiting for the lock


class UserLocks:
    """One re-entrant lock per user: ``with locks.hold(user_id): ...``. A user's entry exists only
    while a call holds or waits for it, so the table is as small as the number of threads, however
    many users the process has served; :meth:`busy` lets an LRU skip a user in use."""

    def __init__(self) -> None:
        self._guard = threading.Lock()  # a leaf lock: nothing is acquired while it is held
        self._entries: dict[str, _Entry] = {}

    def __repr__(self) -> str:
        return f"UserLocks(busy={len(self._entries)})"

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


class WriteLocks:
    """``with locks(user_id): ...`` — the user's write lock. Re-entrant within a thread. With
    ``leases`` (server mode) the outermost entry also takes the user's lease across processes;
    ``recover(user_id, intent_json)`` then finishes a dead holder's batch first,
    ``refresh(user_id)`` brings this process's caches up to date when another process held the
    lease last, and ``settle(user_id)`` runs after the section's last write, before the release
    (not after a failure). The writer that owns the journal creates its locks and hands the
    hooks in."""

    def __init__(
        self,
        leases: Leases | None = None,
        *,
        recover: Callable[[str, str], None] | None = None,
        refresh: Callable[[str], None] | None = None,
        settle: Callable[[str], None] | None = None,
    ) -> None:
        self._local = UserLocks()
        self.leases = leases
        self._recover = recover
        self._refresh = refresh
        self._settle = settle
        self._held: dict[str, Lease] = {}  # user -> the lease held (outermost entry)
        self._depth: dict[str, int] = {}  # user -> how deep the holding thread is
        self._guard = threading.Lock()
        #: user -> the tick of the last locked section's end; bounded: users without an entry
        #: share ``_floor``, which moves whenever an entry is evicted
        self._epochs: OrderedDict[str, int] = OrderedDict()
        self._tick = 0
        self._floor = 0

    def epoch(self, user_id: str) -> int:
        """Changes whenever a locked section of the user ends (in this process) or the lease
        was last held by another process: equal epochs mean nothing was written in between,
        so a plan made at the first still holds at the second."""
        with self._guard:
            return self._epochs.get(user_id, self._floor)

    def _bump(self, user_id: str) -> None:
        with self._guard:
            self._tick += 1
            self._epochs[user_id] = self._tick
            self._epochs.move_to_end(user_id)
            while len(self._epochs) > MAX_REMEMBERED:
                self._epochs.popitem(last=False)
                self._tick += 1
                self._floor = self._tick  # an evicted user's earlier epoch matches no more

    def lease(self, user_id: str) -> Lease | None:
        """The lease this thread holds for the user (call while holding the user's lock)."""
        with self._guard:
            return self._held.get(user_id)

    @contextmanager
    def __call__(self, user_id: str) -> Iterator[None]:
        with self._local.hold(user_id):  # from here on this thread alone changes the user's entries
            with self._guard:
                depth = self._depth.get(user_id, 0)
                self._depth[user_id] = depth + 1
            try:
                if depth == 0 and self.leases is not None:
                    with self._leased(user_id, self.leases):
                        yield
                else:
                    yield
            finally:
                with self._guard:
                    if depth == 0:
                        del self._depth[user_id]
                    else:
                        self._depth[user_id] = depth
                if depth == 0:
                    self._bump(user_id)

    @contextmanager
    def _leased(self, user_id: str, leases: Leases) -> Iterator[None]:
        """Hold the user's lease (the outermost entry only); first finish a dead holder's batch
        and catch up with other processes' writes."""
        lease = leases.acquire(user_id)
        with self._guard:
            self._held[user_id] = lease
        try:
            if lease.foreign:
                self._bump(user_id)  # plans made before are stale
                if self._refresh is not None:
                    self._refresh(user_id)  # another process wrote: plan from what it wrote
            if lease.orphan and self._recover is not None:
                self._recover(user_id, lease.orphan)
        except BaseException:  # unreleased: the lease expires with the orphan kept for the next
            with self._guard:
                del self._held[user_id]
            raise
        try:
            yield
            if self._settle is not None:
                self._settle(user_id)
        finally:
            with self._guard:
                del self._held[user_id]
            leases.release(lease)
