"""Keeping a process's caches of a user in step with the Chroma server: what the graph and
lexical replicas share.

In server mode no process owns a user's graph or lexical index: each process caches what it
derives from records in the one Chroma server (:mod:`hybridmem.replica.graph`,
:mod:`hybridmem.replica.lexical`). Writes only add or delete records, never read-modify-write a
shared blob, so no process overwrites another's update. A process sees its own writes at once and
other processes' adds and deletes at its next *check*, which runs before a read at most every
``refresh_interval`` seconds (``refresh()`` forces one). A check first reads the user's lease
slots (:meth:`ServerCache._marker`): when no process took the lease since the last check, nothing
was written and the check ends there. Otherwise it lists record ids only, the cheapest listing
Chroma serves (measured on one ``chroma run``: 10k ids in ~20 ms, their metadata in ~1.3 s), so a
change must show in the ids, or be found by a slower comparison now and then.

- :class:`ServerCache` — the client, each user's state, when a check is due, and collection
  handles that survive another process dropping and re-creating a collection.
- :class:`UserSync` — one user's cache state: its lock, what the cache holds, when it was checked.
- :func:`chunks` and :data:`BATCH` — requests to the server cut to a bounded size.

Separate from the replicas because both follow the server the same way; each of them keeps only
what it caches and how it replays the server's records into it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from hybridmem.chroma import client as _chroma
from hybridmem.errors import ClosedError, ConfigError
from hybridmem.chroma.follow import written
from hybridmem.protocols import WriteLog, WriteSlot
from hybridmem.replica import snapshot
from hybridmem.runtime.files import user_key

if TYPE_CHECKING:
    from chromadb.api import ClientAPI
    from chromadb.api.models.Collection import Collection

__all__ = ["BATCH", "REFRESH_INTERVAL", "ServerCache", "UserSync", "chunks"]

#: Seconds between two checks of a user's caches against the server (the default of every
#: cache that follows the server: graph, lexical index, record copy).
REFRESH_INTERVAL = 1.0
#: Records per Chroma request: well under the server's batch limit, and a bounded request size.
BATCH = 1000
_HINT = "check that the Chroma server at chroma_url is reachable"
T = TypeVar("T")


def chunks(items: Sequence[T]) -> Iterable[Sequence[T]]:
    """``items`` in slices of at most :data:`BATCH`."""
    return (items[i : i + BATCH] for i in range(0, len(items), BATCH))


@dataclass
class UserSync:
    """One user's cache state: its lock (held across a check, so a concurrent own write is never
    mistaken for a remote delete), what the cache holds and when the server was last checked."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    record_ids: set[str] = field(default_factory=set)  # graph: server records replayed
    versions: dict[str, str] = field(default_factory=dict)  # lexical: memory id -> text hash
    checked: float | None = None  # monotonic time of the last check's start
    swept: float | None = None  # lexical: last full comparison of texts
    #: the user's lease slots as the last check saw them while every slot was free (None:
    #: unknown, or a write was under way), and as the last lexical sweep saw them
    marker: object = None
    swept_marker: object = None
    #: the lease slots as the last check saw them (None: unknown; see ServerCache.watch)
    slots: dict[int, WriteSlot] | None = None
    #: graph: the records of the server's snapshot this process last read or wrote (its id in
    #: ``snap``), the lease it was written under (None: not known), and how many records were
    #: added or removed since (see replica.snapshot)
    snap: str | None = None
    snap_covers: frozenset[str] = frozenset()
    snap_at: tuple[int, str, bool] | None = None
    since_snap: int = 0
    #: lexical: the text snapshot this process last read or wrote (its ids and text hashes;
    #: None: not known), and how many texts it wrote or deleted since
    texts: snapshot.Texts | None = None
    since_texts: int = 0
    #: lexical: a new text snapshot is due, stored when the lease ends (see its settle())
    owed: bool = False


class ServerCache:
    """Plumbing shared by both replicas: the client, per-user state, rate-limited checks, and
    handles that survive another process dropping and re-creating a collection
    (:mod:`hybridmem.chroma.client`). A client made here from ``url`` is closed by :meth:`close`;
    a ``client`` passed in is not, nor handles passed in (shared with the store that made them,
    see :func:`~hybridmem.chroma.client.handles_of`) cleared."""

    def __init__(self, *, client: ClientAPI | _chroma.CollectionHandles | None, url: str | None,
                 refresh_interval: float, name_of: Callable[[str], str]) -> None:
        if (client is None) == (url is None):
            raise ConfigError(f"{type(self).__name__} needs exactly one of client= or url=")
        if refresh_interval < 0:
            raise ConfigError("refresh_interval must be >= 0 seconds")
        self._own_client = client is None
        self._own_handles = not isinstance(client, _chroma.CollectionHandles)
        self._handles = _chroma.handles_of(
            client if client is not None else _chroma.make_client(url=url), hint=_HINT)
        self._name_of = name_of
        self.refresh_interval = float(refresh_interval)
        self._users: dict[str, UserSync] = {}
        self._guard = threading.Lock()
        self._closed = False
        self._log: WriteLog | None = None  # see watch()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(users_cached={len(self._users)})"

    def _state(self, user_id: str) -> UserSync:
        key = user_key(user_id)  # validates the user id
        with self._guard:
            if self._closed:
                raise ClosedError(f"the {type(self).__name__} is closed; create a new one")
            return self._users.setdefault(key, UserSync())

    def _run(self, user_id: str, what: str, call: Callable[[Collection], T], *,
             create: _chroma.CollectionMeta | None = None) -> T | None:
        """``call(collection)``; None when the collection does not exist (unless ``create``, its
        metadata, is given). A stale handle (the collection was dropped by someone) is reopened
        once."""
        return self._handles.run(self._name_of(user_id), call, user_id=user_id, what=what,
                                 create=create)

    def watch(self, log: WriteLog) -> None:
        """Follow the server through the users' write leases ``log``
        (:class:`~hybridmem.replica.lease.ChromaLeases`): the checks of a user's caches that
        fall due together share one read of the slots, a check after other processes' writes
        reads what their released slots list and fetches just that (see
        :func:`hybridmem.chroma.follow.written`), and this cache's own writes are noted."""
        self._log = log

    def _note(self, user_id: str, ids: Sequence[str]) -> None:
        """Note ``ids`` in the lease this process holds (server mode with :meth:`watch`)."""
        if self._log is not None:
            self._log.note(user_id, ids)

    def _look(self, user_id: str, *, fresh: bool = False,
              ) -> tuple[object, dict[int, WriteSlot] | None]:
        """(:meth:`_marker`, the slots it was made of: None without :meth:`watch`)."""
        if self._log is None:
            return self._marker(user_id, fresh=fresh), None
        view = self._log.slots(user_id, fresh=fresh)
        # another process's write under way: what it wrote so far is listed at its release
        # (this process's own writes, as a background flush of access counts, reach its caches
        # directly)
        if not view or any(slot.held and not slot.mine for slot in view.values()):
            return None, view
        return tuple(sorted((n, slot.owner) for n, slot in view.items())), view

    def _written(self, user_id: str, st: UserSync, view: dict[int, WriteSlot] | None,
                 ) -> set[str] | None:
        """What other processes noted since this cache's last check of the user, or None when
        the slots cannot say (then the caller lists the server's ids)."""
        if self._log is None or view is None or st.checked is None:
            return None
        return written(self._log, user_id, st.slots, view)

    def _marker(self, user_id: str, *, fresh: bool = False) -> object:
        """The user's lease slots (ids, owners, states), or None when a write is under way or
        there is no lease: one small read. Every write of a user's memories, graph records or
        documents runs under the lease (:mod:`hybridmem.replica.lease`), and every taking of it
        adds a slot with a fresh owner, so while the marker stays the same nothing was written:
        a check then costs this read, whatever the user's size. ``fresh``: not a read another
        check shared (see :meth:`watch`)."""
        if self._log is not None:
            return self._look(user_id, fresh=fresh)[0]
        got = self._handles.run(_chroma.collection_name(user_id, "lease"),
                                lambda c: c.get(include=["metadatas"]),
                                user_id=user_id, what="read the write lease")
        if got is None:
            return None
        slots = tuple(sorted((i, str((m or {}).get("owner")), str((m or {}).get("state")))
                             for i, m in zip(got["ids"], got["metadatas"] or [])))
        if not slots or any(state != "free" for _, _, state in slots):
            return None
        return slots

    def _due(self, st: UserSync, force: bool) -> bool:
        return force or st.checked is None or time.monotonic() - st.checked >= self.refresh_interval

    def _close(self) -> bool:
        """Mark closed, drop caches and handles, release an own client; False if it already was."""
        with self._guard:
            if self._closed:
                return False
            self._closed = True
            self._users.clear()
            if self._own_handles:
                self._handles.clear()
            if self._own_client:
                _chroma.close_client(self._handles.client)
            return True
