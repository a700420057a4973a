"""Stores: the four stores a :class:`~hybridmem.Memory` is made of, as one value.

The write path, retrieval and the operator jobs receive one :class:`Stores` and use each store
only through its Protocol (:mod:`hybridmem.protocols`); :mod:`hybridmem.backends` decides which
concrete stores to open. Erasing a user and closing are defined here, once, because their order
across the four stores matters.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from hybridmem.config import Settings
from hybridmem.protocols import (GraphStore, HistoryLog, Leases, LexicalIndex, NameSnapshots,
                                 Refreshable, Settling, VectorStore)
from hybridmem.runtime.files import remove_tree, user_dir
from hybridmem.runtime.locks import DataDirLock

__all__ = ["Stores"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stores:
    """The four stores of a Memory, used only through their Protocols, and (embedded) the lock
    that keeps their directory to this process."""

    vectors: VectorStore
    lexical: LexicalIndex
    graph: GraphStore
    history: HistoryLog
    dir_lock: DataDirLock | None = None
    #: Server mode: the per-user write leases shared by every process (see hybridmem.replica.lease).
    leases: Leases | None = None
    #: Server mode: where the graph's name vectors are shared (see hybridmem.replica.copies).
    name_snapshots: NameSnapshots | None = None

    def drop_user(self, settings: Settings, user_id: str) -> None:
        """Erase everything of the user in every store, then the user's folder (the vector
        store makes its deletions physical within its purge delay: embedded Chroma keeps deleted
        rows in free pages until VACUUM)."""
        self.vectors.drop_user(user_id)
        self.lexical.drop_user(user_id)
        self.graph.drop_user(user_id)
        self.history.drop_user(user_id)
        if self.leases is not None:
            self.leases.drop_user(user_id)
        remove_tree(user_dir(settings.data_dir, user_id, create=False))

    def refresh(self, user_id: str) -> None:
        """Catch the caches of a shared server up with other processes' writes to the user
        (server mode: the graph, and the vector store's record copy)."""
        self.graph.refresh(user_id)
        if isinstance(self.vectors, Refreshable):
            self.vectors.refresh(user_id)

    def settle(self, user_id: str) -> None:
        """The user's lease ends after its last write (server mode): the stores that keep state
        in the server for other processes store what the lease's writes owe it."""
        for store in (self.lexical, self.vectors, self.graph):
            if isinstance(store, Settling):
                store.settle(user_id)

    def close(self) -> None:
        """Close every store, even if one fails; the first failure is raised at the end."""
        failure: BaseException | None = None
        for store in (self.vectors, self.lexical, self.graph, self.history):
            try:
                store.close()
            except Exception as exc:  # keep closing the others
                log.warning("closing %s failed: %s", type(store).__name__, exc)
                failure = failure or exc
        if self.leases is not None:
            self.leases.close()
        if self.dir_lock is not None:
            self.dir_lock.release()
        if failure is not None:
            raise failure
