"""Snapshots of what each process otherwise makes for itself on a Chroma server — the record copy
and the graph's name vectors — so a process's first use of a user reads them instead of
rebuilding them. Stored in the user's snapshot collection, beside the graph and text snapshots
(the formats: :mod:`hybridmem.replica.snapshot`).

**Record snapshots** (:class:`ChromaRecordSnapshots`). On a server the vector store keeps a copy
of each busy user's records (:mod:`hybridmem.chroma.record_cache`), loaded whole at the user's
second read. Chroma assembles a record's metadata key by key, so that load cost 0.4 s of server
time at 5k memories (0.2 s for the documents alone), and while it ran the user's contexts went
to the server uncached. With the snapshot (:class:`~hybridmem.chroma.vector.ChromaVectorStore`):

- a writer whose copy is loaded stores one when its lease ends, once enough was written since
  the last (or when there is none), naming the lease;
- a load reads it, then fetches by id what the lease slots noted after that lease
  (:func:`~hybridmem.chroma.follow.written_since`); when the slots cannot say, or there is none,
  it reads every record as before;
- a write that deletes a memory or replaces its text deletes the snapshot first (it held the
  text), and the writer's lease end stores one without it.

**Name snapshots** (:class:`ChromaNameSnapshots`). Embedded, the vectors of the graph's node names
persist in a file (:mod:`hybridmem.graph.name_vectors`); on a server each process embedded again,
in a background thread, each name a search met without a vector: at 5k memories (3,155 names,
~1.2 ms each with the local model) a fresh process's first seconds of contexts shared two cores
with that work and ran at twice their steady latency. With the snapshot a process's first use of
a user reads it in that thread (never in a search) and embeds only what it lacks; writers store
one as for records; removing a node's vector drops it first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from hybridmem.chroma import client as _chroma
from hybridmem.protocols import NameSnapshot, RecordSnapshot
from hybridmem.replica import snapshot

if TYPE_CHECKING:
    from chromadb.api import ClientAPI
    from chromadb.api.models.Collection import Collection

__all__ = ["ChromaNameSnapshots", "ChromaRecordSnapshots"]

T = TypeVar("T")


class _Snapshots:
    """The user's snapshot collection, through handles of ``client`` (the caller's: not closed
    here), or the caller's handles (see :func:`~hybridmem.chroma.client.handles_of`)."""

    def __init__(self, client: ClientAPI | _chroma.CollectionHandles) -> None:
        self._handles = _chroma.handles_of(
            client, hint="check that the Chroma server at chroma_url is reachable")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def _run(self, user_id: str, what: str, call: Callable[[Collection], T], *,
             create: bool = False) -> T | None:
        """``call`` on the collection; None when it does not exist and ``create`` is false."""
        return self._handles.run(_chroma.collection_name(user_id, "snapshot"), call,
                                 user_id=user_id, what=what,
                                 create=snapshot.collection_meta(user_id) if create else None)


class ChromaRecordSnapshots(_Snapshots):
    """:class:`~hybridmem.protocols.RecordSnapshots` on a Chroma server."""

    def read(self, user_id: str) -> RecordSnapshot | None:
        got = self._run(user_id, "read the record snapshot", snapshot.read_records)
        return None if got is None else RecordSnapshot(rows=got[1], at=got[2])

    def write(self, user_id: str, made: RecordSnapshot) -> None:
        snap = snapshot.new_id()
        self._run(user_id, "store the record snapshot",
                  lambda c: snapshot.write_records(c, snap, made.rows, made.at), create=True)

    def drop(self, user_id: str) -> None:
        self._run(user_id, "delete the record snapshot", snapshot.drop_records)


class ChromaNameSnapshots(_Snapshots):
    """:class:`~hybridmem.protocols.NameSnapshots` on a Chroma server."""

    def read(self, user_id: str) -> NameSnapshot | None:
        got = self._run(user_id, "read the name snapshot", snapshot.read_names)
        if got is None:
            return None
        model, width, keys, names, vectors = got
        return NameSnapshot(model=model, width=width, keys=keys, names=names, vectors=vectors)

    def write(self, user_id: str, made: NameSnapshot) -> None:
        snap = snapshot.new_id()
        self._run(user_id, "store the name snapshot", lambda c: snapshot.write_names(
            c, snap, made.model, made.width, made.keys, made.names, made.vectors), create=True)

    def drop(self, user_id: str) -> None:
        self._run(user_id, "delete the name snapshot", snapshot.drop_names)
