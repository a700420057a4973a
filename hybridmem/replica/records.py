"""Record snapshots in the Chroma server: how a process loads a user's record copy with one
read instead of asking the server for every record.

Why: on a Chroma server the vector store keeps a copy of each busy user's records
(:mod:`hybridmem.chroma.record_cache`), loaded whole at the user's second read. Chroma assembles
a record's metadata key by key, so that load cost 0.4 s of server time at 5k memories (0.2 s for
the documents alone); while it ran, the user's contexts went to the server uncached. One
compressed snapshot of the copy is a few parts of a megabyte.

What the vector store does with it (:class:`~hybridmem.chroma.vector.ChromaVectorStore`):

- a writer whose copy is loaded stores a snapshot when its lease ends, once enough was written
  since the last (or when there is none), naming the lease;
- a load reads the snapshot, then fetches by id what the lease slots noted after that lease
  (:func:`~hybridmem.chroma.follow.written_since`); when the slots cannot say, or there is no
  snapshot, it reads every record as before;
- a write that deletes a memory or replaces its text deletes the snapshot first (it held the
  text): nothing forgotten outlives the call in a snapshot.

The format lives with the other kinds of snapshot (:mod:`hybridmem.replica.snapshot`); this
class only finds the user's snapshot collection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridmem.chroma import client as _chroma
from hybridmem.protocols import RecordSnapshot
from hybridmem.replica import snapshot

if TYPE_CHECKING:
    from chromadb.api import ClientAPI

__all__ = ["ChromaRecordSnapshots"]

_HINT = "check that the Chroma server at chroma_url is reachable"


class ChromaRecordSnapshots:
    """:class:`~hybridmem.protocols.RecordSnapshots` in each user's snapshot collection, beside
    the graph and text snapshots (``client`` is the caller's: not closed here)."""

    def __init__(self, client: ClientAPI) -> None:
        self._handles = _chroma.CollectionHandles(client, hint=_HINT)

    def __repr__(self) -> str:
        return "ChromaRecordSnapshots()"

    def read(self, user_id: str) -> RecordSnapshot | None:
        got = self._handles.run(_chroma.collection_name(user_id, "snapshot"),
                                snapshot.read_records, user_id=user_id,
                                what="read the record snapshot")
        if got is None:
            return None
        _snap, rows, at = got
        return RecordSnapshot(rows=dict(rows), at=at)

    def write(self, user_id: str, made: RecordSnapshot) -> None:
        snap = snapshot.new_id()
        self._handles.run(_chroma.collection_name(user_id, "snapshot"),
                          lambda c: snapshot.write_records(c, snap, made.rows, made.at),
                          user_id=user_id, what="store the record snapshot",
                          create=snapshot.collection_meta(user_id))

    def drop(self, user_id: str) -> None:
        self._handles.run(_chroma.collection_name(user_id, "snapshot"), snapshot.drop_records,
                          user_id=user_id, what="delete the record snapshot")
