"""Where a user's records are, and writing them knowing it: fresh ids are *added*, and the
metadata a write replaces comes from what the store already read, never from a second read.

Why: Chroma's ``upsert`` costs more than its ``add`` (it looks every id up first), and a write
that replaces a record must send None for every key the old record had and the new one lacks
(Chroma merges metadata). Learning those keys by a ``get`` per write would cost a round trip
for records that, on a plain add, do not exist at all.

The trap this module exists to avoid: Chroma's ``add`` of an id that is already stored is *silently
ignored* (checked with chromadb 1.5.9: the old document and metadata stay). So an id is added only
where an exact check found it absent: :data:`Placed` says, for each id, in which of the user's two
collections it is stored and with what metadata. It comes from

- the record cache (embedded mode: the data-dir lock makes this process the one writer, and the
  cache is updated after every write, so it is exact; :mod:`hybridmem.chroma.record_cache`), or
- one ``get`` by ids on each collection (server mode, or before the cache is loaded), made while
  the caller holds the user's write lock (a lease in server mode), so no other writer can add or
  move those ids in between.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hybridmem.chroma.layout import Record, stored
from hybridmem.chroma.record_cache import UserRecords
from hybridmem.chroma.layout import rows as _rows
from hybridmem.chroma.layout import archived

if TYPE_CHECKING:
    from chromadb.api.models.Collection import Collection
    from chromadb.api.types import GetResult, Metadata

__all__ = ["Placed", "changes", "from_cache", "from_gets", "moved_out", "over", "put", "refresh"]

#: id -> {collection (True: the archive) -> the metadata stored there}; ids stored nowhere are
#: absent. With the record cache an id is in one collection at most; read from Chroma it may be
#: in both (a move a crash interrupted, resolved when the records are next loaded).
Placed = dict[str, dict[bool, Mapping[str, Any]]]


def from_cache(records: UserRecords, ids: Sequence[str]) -> Placed:
    """Where each id is, from the user's record cache (exact: see the module docstring)."""
    out: Placed = {}
    for i in ids:
        row = records.row(i)
        if row is not None:
            out[i] = {archived(row[1]): row[1]}
    return out


def from_gets(ids: Sequence[str], get: Callable[[bool], GetResult | None]) -> Placed:
    """Where each id is, from ``get(archive)``: the records of those ids in one collection (their
    metadata included), or None when the collection does not exist."""
    out: Placed = {}
    for archive in (False, True):
        got = get(archive)
        if got is not None:
            for i, _, meta in _rows(got["ids"], None, got["metadatas"]):
                out.setdefault(i, {})[archive] = meta or {}
    return out


def over(record: Record, old: Mapping[str, Any] | None) -> Metadata:
    """``record`` plus None for each key of the stored ``old`` it lacks (Chroma merges metadata
    on writes; None deletes a key)."""
    return {**{k: None for k in old or {} if k not in record}, **record}


#: Records per Chroma write call: Chroma refuses a batch over its ``max_batch_size`` (5,461 with
#: its SQLite here), so an ``add_many``, an import or an access-count flush of more goes in parts.
WRITE_BATCH = 1000


def _parts(picked: Sequence[int]) -> list[Sequence[int]]:
    return [picked[lo : lo + WRITE_BATCH] for lo in range(0, len(picked), WRITE_BATCH)]


def put(collection: Collection, archive: bool, placed: Placed, ids: Sequence[str],
        records: Sequence[Record], *, documents: Sequence[str],
        embeddings: Any) -> None:
    """Write records to ``collection`` (the archive when ``archive``): ids it does not hold are
    added, the others upserted over the metadata ``placed`` says they have there. ``embeddings``:
    our vectors, or those Chroma returned for a move (lists or numpy rows)."""
    fresh = [n for n, i in enumerate(ids) if archive not in placed.get(i, {})]
    known = [n for n, i in enumerate(ids) if archive in placed.get(i, {})]
    for part in _parts(fresh):
        collection.add(ids=[ids[n] for n in part], documents=[documents[n] for n in part],
                       embeddings=[embeddings[n] for n in part],
                       metadatas=[stored(records[n]) for n in part])
    for part in _parts(known):
        collection.upsert(
            ids=[ids[n] for n in part], documents=[documents[n] for n in part],
            embeddings=[embeddings[n] for n in part],
            metadatas=[over(records[n], placed[ids[n]][archive]) for n in part])


def changes(record: Record, old: Mapping[str, Any] | None) -> Metadata:
    """The keys of ``record`` that differ from the stored ``old`` (None for each key it drops):
    what a metadata update must send, since Chroma merges metadata. Without ``old``, all of
    :func:`over`. Equal means equal in type too (Chroma's ``True`` is not its ``1``)."""
    if old is None:
        return over(record, None)
    out: dict[str, Any] = {k: None for k in old if record.get(k) is None}
    for k, v in record.items():
        if v is not None and not (k in old and type(old[k]) is type(v) and old[k] == v):
            out[k] = v
    return out


def refresh(collection: Collection, archive: bool, placed: Placed, ids: Sequence[str],
            records: Sequence[Record]) -> None:
    """Replace the metadata of records ``collection`` holds (documents and vectors stay),
    sending only the keys that changed; records with no change are not sent.

    Why: Chroma's update holds the GIL while it runs, and its cost grows with the keys sent:
    an access-count flush changes 2 of a record's ~17 keys, and sending those 2 made a
    3,000-record flush at 10k memories about half as long (every served request waits for it)."""
    sent = [(ids[n], meta) for n in range(len(ids))
            if (meta := changes(records[n], placed.get(ids[n], {}).get(archive)))]
    for part in _parts(range(len(sent))):
        collection.update(ids=[sent[n][0] for n in part],
                          metadatas=[sent[n][1] for n in part])


def moved_out(placed: Placed, ids: Sequence[str], archive: bool) -> list[str]:
    """The ids that are (also) stored in the other collection than ``archive``'s."""
    return [i for i in ids if (not archive) in placed.get(i, {})]
