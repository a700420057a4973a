"""Compacted graph snapshots in the Chroma server, so a process's first read of a user loads one
snapshot and replays only the records written after it, instead of replaying every record.

Why: replaying a graph record resolves its entities against the graph built so far (~0.65 ms a
record), so a process that replayed all 5,000 records of a user spent ~1.4 s before its first
answer; loading the resolved graph costs what an embedded ``graph.json`` load costs.

**What is stored.** The user's side collection ``s-<user key>``
(:func:`hybridmem.chroma.client.collection_name`, kind ``"snapshot"``) holds:

- *parts* ``<snap>.<n>``: the snapshot's text cut into pieces of at most :data:`PART_CHARS`
  characters, metadata ``snap`` (its id) and ``part`` (n). The text is one JSON line listing the
  graph record ids the snapshot *covers*, a newline, then the graph in the ``graph.json`` format
  (:func:`hybridmem.graph.fileformat.to_json_bytes`).
- the *head* ``head``: metadata ``snap`` (the current snapshot), ``parts`` (how many), ``covers``
  (how many records) and ``ts``.

**Writing** (:func:`write`): every part of the new snapshot is added first, then the head is
switched to it, then parts of other snapshots are deleted. So a writer killed at any step leaves
the head on a snapshot whose parts are all there (the old one until the switch, the new one after),
and parts nobody points at are deleted by the next write.

**Reading** (:func:`read`): one ``get`` of the collection; the head's parts, joined. Any doubt (no
head, a part missing because two writers raced, text that does not parse) returns None and the
caller replays every record, which is always right: a snapshot only saves work.

A snapshot is exactly the replay of the records it covers, so a reader computes what to do from
ids alone: records the server has and the snapshot does not cover are replayed (the *tail*);
covered records the server no longer has mean their memory was removed or rewritten since, and
that memory is dropped and replayed from its remaining records.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from chromadb.api.models.Collection import Collection
    from chromadb.api.types import Metadata, PyEmbedding, Where

__all__ = ["HEAD", "PART_CHARS", "Snapshot", "due", "new_id", "read", "write"]

log = logging.getLogger(__name__)
#: The id of the record naming the current snapshot.
HEAD = "head"
#: Characters per part: a bounded request, and far below any document limit of the server.
PART_CHARS = 1 << 20
#: Parts per ``upsert`` request.
PARTS_PER_CALL = 4
_UNIT = [1.0]  # Chroma wants a vector per record; snapshot records are never searched


@dataclass(frozen=True)
class Snapshot:
    """A snapshot as read: its id, the graph record ids it covers and the graph file's bytes."""

    snap: str
    covers: frozenset[str]
    graph: bytes


def new_id() -> str:
    """A fresh snapshot id."""
    return uuid.uuid4().hex


def write(collection: Collection, snap: str, covers: Sequence[str], graph: bytes) -> None:
    """Store snapshot ``snap`` of ``graph`` (``graph.json`` bytes) covering the record ids
    ``covers``. Parts first, then the head, then other snapshots' parts go (see module)."""
    text = json.dumps(sorted(covers)) + "\n" + graph.decode("utf-8")
    pieces = [text[i : i + PART_CHARS] for i in range(0, len(text), PART_CHARS)] or [""]
    ids = [f"{snap}.{n}" for n in range(len(pieces))]
    metas: list[Metadata] = [{"snap": snap, "part": n} for n in range(len(pieces))]
    units: list[PyEmbedding] = [_UNIT] * len(ids)
    for lo in range(0, len(ids), PARTS_PER_CALL):
        hi = lo + PARTS_PER_CALL
        collection.upsert(ids=ids[lo:hi], documents=pieces[lo:hi], embeddings=units[lo:hi],
                          metadatas=metas[lo:hi])
    head: Metadata = {"snap": snap, "parts": len(pieces), "covers": len(covers), "ts": time.time()}
    collection.upsert(ids=[HEAD], documents=[snap], embeddings=units[:1], metadatas=[head])
    differs: dict[Literal["$gt", "$gte", "$lt", "$lte", "$ne", "$eq", "$and", "$or"],
                  str | int | float | bool] = {"$ne": snap}
    others: Where = {"snap": differs}
    collection.delete(where=others)  # the head carries ``snap`` too: it stays


def read(collection: Collection) -> Snapshot | None:
    """The current snapshot, or None when there is none or it cannot be trusted (see module)."""
    got = collection.get(include=["documents", "metadatas"])
    records: dict[str, tuple[dict[str, Any], str]] = {
        i: (dict(m or {}), d or "")
        for i, m, d in zip(got["ids"], got["metadatas"] or [], got["documents"] or [])
    }
    head = records.get(HEAD)
    if head is None:
        return None
    snap, parts = head[0].get("snap"), head[0].get("parts")
    if not isinstance(snap, str) or not isinstance(parts, int):
        log.warning("ignoring a graph snapshot head without snap/parts")
        return None
    pieces = [records.get(f"{snap}.{n}") for n in range(parts)]
    if any(p is None for p in pieces):
        log.info("graph snapshot %s is incomplete (a concurrent write); replaying records", snap)
        return None
    text = "".join(p[1] for p in pieces if p is not None)
    first, _, graph = text.partition("\n")
    try:
        covers = json.loads(first)
    except ValueError:
        covers = None
    if not isinstance(covers, list) or not all(isinstance(c, str) for c in covers):
        log.warning("ignoring graph snapshot %s: its list of records does not parse", snap)
        return None
    return Snapshot(snap=snap, covers=frozenset(covers), graph=graph.encode("utf-8"))


def due(tail: int, covered: int, *, minimum: int) -> bool:
    """Whether a tail of ``tail`` records past a snapshot of ``covered`` is worth a new one: at
    least ``minimum`` records, so a reader replays at most about that many, and at least a
    fortieth of the snapshot, so rewriting snapshots costs O(records written) overall."""
    return tail >= max(minimum, covered // 40)

