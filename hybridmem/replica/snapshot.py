"""Compacted snapshots in the Chroma server, so a process's first read of a user loads one
snapshot and replays or fetches only what was written after it, instead of everything.

Why: replaying a graph record resolves its entities against the graph built so far (~0.65 ms a
record), so a process that replayed all 5,000 records of a user spent ~1.4 s before its first
answer; loading the resolved graph costs what an embedded ``graph.json`` load costs. Likewise
the lexical cache's first look fetched every document of the user (5k: ~0.46 s), where one
text snapshot is one small read.

**What is stored.** The user's side collection ``s-<user key>``
(:func:`hybridmem.chroma.client.collection_name`, kind ``"snapshot"``) holds two kinds of
snapshot, each a head and its parts, with metadata keys of its own (so a filter on one kind's
keys never touches the other's records: Chroma's ``$ne`` matches a record without the key):

- the *graph snapshot* (:func:`write`, :func:`read`): parts ``<snap>.<n>`` (metadata ``snap``,
  ``part``, ``data``) and the head ``head`` (``snap``, ``parts``, ``covers``: how many records,
  ``codec``, ``ts``). Its payload is one JSON line with the graph record ids the snapshot
  *covers* and the lease it was written under, a newline, then the graph in the ``graph.json``
  format
  (:func:`hybridmem.graph.fileformat.to_json_bytes`).
- the *text snapshot* (:func:`write_texts`, :func:`read_texts`): parts ``lexical.<snap>.<n>``
  (``lexical``, ``lpart``, ``data``) and the head ``lexical`` (``lexical``, ``lparts``,
  ``count``, ``codec``, ``ts``). Its payload is one JSON line (the format, memory ids, each
  text's :func:`~hybridmem.text.text_hash`, and the lease it was written under), a newline,
  then the user's lexical index file (see :mod:`hybridmem.replica.lexical`).
- the *record snapshot* (:func:`write_records`, :func:`read_records`): parts ``records.<snap>.<n>``
  (``records``, ``rpart``, ``data``) and the head ``records`` (``records``, ``rparts``, ``count``,
  ``codec``, ``ts``). Its payload is one JSON object: the format, the lease it was written under,
  and every record of the user's vector store (ids, documents, stored metadata), as the writer's
  record copy held them (see :mod:`hybridmem.replica.copies`).
- the *name snapshot* (:func:`write_names`, :func:`read_names`): parts ``names.<snap>.<n>``
  (``names``, ``npart``, ``data``) and the head ``names`` (``names``, ``nparts``, ``count``,
  ``codec``, ``ts``). Its payload is one JSON line (the format, the embedder's name, the width,
  the node keys and the names their vectors were made from), a newline, then the vectors as
  float16, row after row (see :mod:`hybridmem.replica.copies`).

A payload is compressed with Zstandard, base64-encoded (:data:`CODEC`) and cut into pieces of
at most :data:`PART_CHARS` characters, each in its part's *metadata* value ``data``. Why
metadata and compression: Chroma indexes every *document* for full-text search, so a megabyte
stored as a document costs the server about three times what the same megabyte costs as a
metadata value, and compressed (random-looking) text about ten times (measured on one ``chroma
run`` at 10k memories: a 1 MB part 0.62 s as a document, 0.19 s as metadata). Snapshots are
rewritten as their user grows (see :func:`due`), so this cost recurs in writes, and every
process's first look at a user decompresses them. Why Zstandard: on a 5k-memory user's
snapshots it stored the graph's 3.1 MB of JSON in 0.43 MB (zlib's fastest level: 0.99 MB),
compressing in 4 ms instead of 17 and decompressing in 1 ms instead of 5, and the text
snapshot in 0.69 MB instead of 0.96; the name vectors, which do not compress, took zlib 38 ms
to store and Zstandard 2. A snapshot of the earlier codec (:data:`ZLIB_CODEC`) is still read.

**Writing** (:func:`_put`): every part of the new snapshot is added first, and the head is
switched to it in the request that carries the last parts (after them: a snapshot of at most
:data:`PARTS_PER_CALL` parts is one request); then parts of the kind's other snapshots are
deleted. So a writer killed at any step leaves the head on a snapshot whose parts are all there
(the old one until the switch, the new one after: a request cut off while it is sent is not a
request the server runs), and parts nobody points at are deleted by the next write.

**Reading** (:func:`_get`): one ``get`` of the kind's head and parts; joined and decoded. Any
doubt (no head, a part missing because two writers raced, a payload that does not decode or
parse, a head of another codec) returns None and the caller does without: it replays every
record, or fetches every document, which is always right: a snapshot only saves work.

A graph snapshot is exactly the replay of the records it covers, so a reader computes what to do
from ids alone: records the server has and the snapshot does not cover are replayed (the
*tail*); covered records the server no longer has mean their memory was removed or rewritten
since, and that memory is dropped and replayed from its remaining records.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import time
import uuid
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import zstandard

if TYPE_CHECKING:
    from chromadb.api.models.Collection import Collection
    from chromadb.api.types import Metadata, PyEmbedding, Where

__all__ = ["CODEC", "FINISHED", "HEAD", "MAX_PAYLOAD", "NAMES_FORMAT", "NAMES_HEAD", "PART_CHARS",
           "RECORDS_FORMAT", "RECORDS_HEAD", "SCHEMA", "TEXTS_FORMAT", "TEXTS_HEAD", "ZLIB_CODEC",
           "Snapshot", "Texts", "collection_meta", "drop_graph", "drop_names", "drop_records",
           "drop_texts", "due", "finish", "new_id", "read", "read_names", "read_records",
           "read_texts", "texts_head", "write", "write_names", "write_records", "write_texts"]

log = logging.getLogger(__name__)
#: The schema the snapshot collection's metadata names.
SCHEMA = 1
#: The id of the record naming the current graph snapshot.
HEAD = "head"
#: The graph head's metadata key naming the graph snapshot after which its lease wrote no graph
#: record (see :func:`finish`).
FINISHED = "finished"
#: The id of the record naming the current text snapshot.
TEXTS_HEAD = "lexical"
#: The text snapshot's payload format (a reader ignores others: an older one listed texts).
TEXTS_FORMAT = 2
#: The id of the record naming the current record snapshot.
RECORDS_HEAD = "records"
#: The record snapshot's payload format (a reader ignores others).
RECORDS_FORMAT = 1
#: The id of the record naming the current name snapshot.
NAMES_HEAD = "names"
#: The name snapshot's payload format (a reader ignores others).
NAMES_FORMAT = 1
#: Characters per part: a bounded request, and far below any document limit of the server.
PART_CHARS = 1 << 20
#: Parts per ``upsert`` request.
PARTS_PER_CALL = 4
#: How a part's ``data`` encodes the payload (the head names it; a reader refuses any other
#: but :data:`ZLIB_CODEC`).
CODEC = "zstd+base64"
#: The codec of earlier releases' snapshots (zlib), read but not written.
ZLIB_CODEC = "zlib+base64"
#: Zstandard's default level: a graph payload 7x smaller, in a fraction of the serialising time.
LEVEL = 3
#: The largest payload a snapshot's frame may claim (a damaged or hostile one is refused, not
#: allocated).
MAX_PAYLOAD = 1 << 31
_UNIT = [1.0]  # Chroma wants a vector per record; snapshot records are never searched
_Op = Literal["$gt", "$gte", "$lt", "$lte", "$ne", "$eq", "$and", "$or"]


@dataclass(frozen=True)
class _Kind:
    """Where one kind of snapshot lives in the collection: its head's id, the metadata keys
    naming the snapshot (on the head and its parts), numbering a part and counting the parts,
    and the prefix of its parts' ids. The keys differ per kind, so a filter on one kind's keys
    never touches the other's records (Chroma's ``$ne`` matches a record without the key)."""

    head: str
    key: str
    part: str
    parts: str
    prefix: str


_GRAPH = _Kind(head=HEAD, key="snap", part="part", parts="parts", prefix="")
_TEXTS = _Kind(head=TEXTS_HEAD, key="lexical", part="lpart", parts="lparts", prefix="lexical.")
_RECORDS = _Kind(head=RECORDS_HEAD, key="records", part="rpart", parts="rparts",
                 prefix="records.")
_NAMES = _Kind(head=NAMES_HEAD, key="names", part="npart", parts="nparts", prefix="names.")


@dataclass(frozen=True)
class Snapshot:
    """A snapshot as read: its id, the graph record ids it covers, the graph file's bytes, and
    the lease it was written under when known (as :attr:`Texts.at`)."""

    snap: str
    covers: frozenset[str]
    graph: bytes
    at: tuple[int, str, bool] | None = None


@dataclass(frozen=True)
class Texts:
    """A text snapshot as read: its id, per memory id the text's
    :func:`~hybridmem.text.text_hash`, the lexical index file holding exactly those texts
    (:meth:`~hybridmem.sqlite.lexical.SqliteLexicalIndex.dump`; empty once loaded, as a process
    keeps the file, not a second copy), and the lease it was written under, when known: (slot,
    owner token, whether after the lease's last write). What the slots noted after it, and in
    it unless the snapshot came after its last write, is what the snapshot may lack."""

    snap: str
    hashes: dict[str, str]
    index: bytes = b""
    at: tuple[int, str, bool] | None = None


def new_id() -> str:
    """A fresh snapshot id."""
    return uuid.uuid4().hex


def write(collection: Collection, snap: str, covers: Sequence[str], graph: bytes,
          at: tuple[int, str, bool] | None = None) -> None:
    """Store snapshot ``snap`` of ``graph`` (``graph.json`` bytes) covering the record ids
    ``covers``, written under lease ``at``. Parts first, then the head, then other snapshots'
    parts go (see module)."""
    head = {"covers": sorted(covers), "at": list(at) if at is not None else None}
    payload = json.dumps(head).encode("ascii") + b"\n" + graph
    _put(collection, _GRAPH, snap, payload, {"covers": len(covers)})


def read(collection: Collection) -> Snapshot | None:
    """The current snapshot, or None when there is none or it cannot be trusted (see module)."""
    got = _headed(collection, _GRAPH)
    if got is None:
        return None
    snap, head, graph, meta = got
    if isinstance(head, list):  # as an older release wrote it: the records only
        head = {"covers": head, "at": None}
    covers, at = (head.get("covers"), head.get("at")) if isinstance(head, dict) else (None, None)
    if not isinstance(covers, list) or not all(isinstance(c, str) for c in covers) \
            or not _lease(at):
        log.warning("ignoring graph snapshot %s: its list of records does not parse", snap)
        return None
    finished = meta.get(FINISHED) == snap  # nothing written after it in its lease
    return Snapshot(snap=snap, covers=frozenset(covers), graph=graph,
                    at=(at[0], at[1], at[2] or finished) if at is not None else None)


def finish(collection: Collection, snap: str) -> None:
    """Mark graph snapshot ``snap``, stored mid-lease, as the last graph write of its lease (call
    under that lease, as it ends): a first look from it then skips that lease's own notes, which
    it covers, instead of asking the server which of its records still exist. The mark names
    the snapshot, so a later snapshot's head, which keeps the key, is not taken as marked."""
    collection.update(ids=[HEAD], metadatas=[{FINISHED: snap}])


def write_texts(collection: Collection, snap: str, texts: Texts) -> None:
    """Store text snapshot ``snap``: a JSON line of the memory ids, their text hashes and the
    lease it was written under, then the index file. Parts first, then the head, then other
    text snapshots' parts go, as :func:`write` does."""
    ids = sorted(texts.hashes)
    head = {"v": TEXTS_FORMAT, "ids": ids, "hashes": [texts.hashes[i] for i in ids],
            "at": list(texts.at) if texts.at is not None else None}
    payload = json.dumps(head).encode("ascii") + b"\n" + texts.index
    _put(collection, _TEXTS, snap, payload, {"count": len(ids)})


def read_texts(collection: Collection) -> Texts | None:
    """The current text snapshot, or None when there is none or it cannot be trusted (one of
    another format included: the caller then fetches every document)."""
    got = _fields(collection, _TEXTS, ("v", "ids", "hashes", "at"))
    if got is None:
        return None
    snap, (version, ids, hashes, at), index = got
    if not (version == TEXTS_FORMAT and isinstance(ids, list) and isinstance(hashes, list)
            and len(ids) == len(hashes) and all(isinstance(x, str) for x in (*ids, *hashes))
            and _lease(at) and index):
        log.warning("ignoring text snapshot %s: it does not parse", snap)
        return None
    return Texts(snap=snap, hashes=dict(zip(ids, hashes)), index=index,
                 at=(at[0], at[1], at[2]) if at is not None else None)


def collection_meta(user_id: str) -> dict[str, str | int]:
    """The metadata the user's snapshot collection is created with (by whichever kind of
    snapshot is stored first)."""
    return {"user_id": user_id, "kind": "hybridmem-graph-snapshot", "schema": SCHEMA}


def write_records(collection: Collection, snap: str,
                  rows: Mapping[str, tuple[str, Mapping[str, Any]]],
                  at: tuple[int, str, bool] | None) -> None:
    """Store record snapshot ``snap`` of ``rows`` (id -> (document, stored metadata)), taken
    under lease ``at``. Parts first, then the head, then other record snapshots' parts go, as
    :func:`write` does."""
    ids = sorted(rows)
    body = {"v": RECORDS_FORMAT, "at": list(at) if at is not None else None, "ids": ids,
            "docs": [rows[i][0] for i in ids], "metas": [rows[i][1] for i in ids]}
    payload = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    _put(collection, _RECORDS, snap, payload, {"count": len(ids)})


def read_records(collection: Collection) -> tuple[
        str, dict[str, tuple[str, dict[str, str | int | float | bool]]],
        tuple[int, str, bool] | None] | None:
    """(snapshot id, id -> (document, metadata), lease) of the current record snapshot, or None
    when there is none or it cannot be trusted: of another format, or a value that is not what
    Chroma stores (a string, number or boolean per metadata key)."""
    got = _fields(collection, _RECORDS, ("v", "at", "ids", "docs", "metas"))
    if got is None:
        return None
    snap, (version, at, ids, docs, metas), _ = got
    if not (version == RECORDS_FORMAT and _lease(at) and isinstance(ids, list)
            and isinstance(docs, list) and isinstance(metas, list)
            and len(ids) == len(docs) == len(metas)
            and all(isinstance(x, str) for x in (*ids, *docs))
            and all(isinstance(m, dict) and all(
                isinstance(v, (str, int, float, bool)) for v in m.values()) for m in metas)):
        log.warning("ignoring record snapshot %s: it does not parse", snap)
        return None
    return (snap, {i: (d, m) for i, d, m in zip(ids, docs, metas)},
            (at[0], at[1], at[2]) if at is not None else None)


def drop_graph(collection: Collection) -> None:
    """Delete the graph snapshot (see :func:`_drop`)."""
    _drop(collection, _GRAPH)


def drop_records(collection: Collection) -> None:
    """Delete the record snapshot (see :func:`_drop`)."""
    _drop(collection, _RECORDS)


def write_names(collection: Collection, snap: str, model: str, width: int, keys: Sequence[str],
                names: Sequence[str], vectors: bytes) -> None:
    """Store name snapshot ``snap``: node ``keys``, the ``names`` their vectors were made from,
    and the vectors (``width`` float16 components each, in ``keys`` order) made by ``model``.
    Parts first, then the head, then other name snapshots' parts go, as :func:`write` does."""
    head = {"v": NAMES_FORMAT, "model": model, "width": width, "keys": list(keys),
            "names": list(names)}
    payload = json.dumps(head, ensure_ascii=False).encode("utf-8") + b"\n" + vectors
    _put(collection, _NAMES, snap, payload, {"count": len(keys)})


def read_names(collection: Collection) -> tuple[str, int, list[str], list[str], bytes] | None:
    """(model, width, keys, names, float16 vectors) of the current name snapshot, or None when
    there is none or it cannot be trusted (another format, or vectors of another size)."""
    got = _fields(collection, _NAMES, ("v", "model", "width", "keys", "names"))
    if got is None:
        return None
    snap, (version, model, width, keys, names), vectors = got
    if not (version == NAMES_FORMAT and isinstance(model, str) and type(width) is int
            and width > 0 and isinstance(keys, list) and isinstance(names, list)
            and len(keys) == len(names) and all(isinstance(x, str) for x in (*keys, *names))
            and len(vectors) == 2 * width * len(keys)):
        log.warning("ignoring name snapshot %s: it does not parse", snap)
        return None
    return model, width, keys, names, vectors


def drop_names(collection: Collection) -> None:
    """Delete the name snapshot (see :func:`_drop`)."""
    _drop(collection, _NAMES)


def _headed(collection: Collection, kind: _Kind,
            ) -> tuple[str, Any, bytes, dict[str, Any]] | None:
    """(snapshot id, its payload's first line as JSON — None when it does not parse — the
    bytes after that line, and the head's metadata) of ``kind``'s current snapshot; None when
    there is none."""
    got = _get(collection, kind)
    if got is None:
        return None
    snap, payload, meta = got
    first, _, rest = payload.partition(b"\n")
    try:
        return snap, json.loads(first), rest, meta
    except ValueError:
        return snap, None, rest, meta


def _fields(collection: Collection, kind: _Kind, names: Sequence[str],
            ) -> tuple[str, list[Any], bytes] | None:
    """As :func:`_headed`, with the first line's values of ``names`` (all None when it is not
    an object that has each of them: the caller's checks then refuse it)."""
    got = _headed(collection, kind)
    if got is None:
        return None
    snap, head, rest, _ = got
    if not isinstance(head, dict) or any(n not in head for n in names):
        return snap, [None] * len(names), rest
    return snap, [head[n] for n in names], rest


def _lease(at: object) -> bool:
    """Whether ``at`` is a lease as stored (None, or [slot, owner token, after its last write])."""
    return at is None or (isinstance(at, list) and len(at) == 3 and type(at[0]) is int
                          and isinstance(at[1], str) and isinstance(at[2], bool))


def texts_head(collection: Collection) -> str | None:
    """The id of the current text snapshot (one small read), or None when there is none."""
    got = collection.get(ids=[TEXTS_HEAD], include=["metadatas"])
    metas = got["metadatas"] or []
    snap = (metas[0] or {}).get(_TEXTS.key) if metas else None
    return snap if isinstance(snap, str) else None


def drop_texts(collection: Collection) -> None:
    """Delete the text snapshot (see :func:`_drop`)."""
    _drop(collection, _TEXTS)


def _drop(collection: Collection, kind: _Kind) -> None:
    """Delete ``kind``'s snapshot, its head and every part (those of a write cut short
    included), in one request: a reader sees all of it or none."""
    collection.delete(where=_every(kind))


def _every(kind: _Kind) -> Where:
    """Chroma's filter for ``kind``'s head and parts (the other kinds' records not)."""
    some: dict[_Op, str | int | float | bool] = {"$gte": 0}
    return {"$or": [{kind.part: some}, {kind.parts: some}]}


def _these(kind: _Kind, cond: dict[_Op, str | int | float | bool],
           snap: str | None = None) -> Where:
    """Chroma's filter for ``kind``'s parts (those with ``part`` matching ``cond``), of
    snapshots other than ``snap`` when given."""
    parts: Where = {kind.part: cond}
    if snap is None:
        return parts
    differs: dict[_Op, str | int | float | bool] = {"$ne": snap}
    other: Where = {kind.key: differs}
    return {"$and": [parts, other]}


def _put(collection: Collection, kind: _Kind, snap: str, payload: bytes,
         extra: Metadata) -> None:
    """Store ``payload`` as snapshot ``snap`` of ``kind``, compressed into metadata parts, with
    the head switched to it in the request that carries the last parts (after them); then delete
    the parts of the kind's other snapshots. Each Chroma write costs a round trip whatever its
    size (on a busy server ~0.2-0.4 s), so the head rides along instead of going alone."""
    text = base64.b64encode(zstandard.ZstdCompressor(level=LEVEL).compress(payload)
                            ).decode("ascii")
    pieces = [text[i : i + PART_CHARS] for i in range(0, len(text), PART_CHARS)] or [""]
    ids = [f"{kind.prefix}{snap}.{n}" for n in range(len(pieces))]
    metas: list[Metadata] = [{kind.key: snap, kind.part: n, "data": piece}
                             for n, piece in enumerate(pieces)]
    ids.append(kind.head)
    metas.append({kind.key: snap, kind.parts: len(pieces), "codec": CODEC, "ts": time.time(),
                  **extra})
    units: list[PyEmbedding] = [_UNIT] * len(ids)
    for lo in range(0, len(pieces), PARTS_PER_CALL):
        hi = lo + PARTS_PER_CALL if lo + PARTS_PER_CALL < len(pieces) else len(ids)
        collection.upsert(ids=ids[lo:hi], embeddings=units[lo:hi], metadatas=metas[lo:hi])
    collection.delete(where=_these(kind, {"$gte": 0}, snap))


def _get(collection: Collection, kind: _Kind) -> tuple[str, bytes, dict[str, Any]] | None:
    """(snapshot id, payload, the head's metadata) of ``kind``'s current snapshot: one ``get``
    of its head and parts (the other kind's records stay on the server); None when there is
    none or it is unusable."""
    got = collection.get(where=_every(kind), include=["metadatas"])
    records = {i: dict(m or {}) for i, m in zip(got["ids"], got["metadatas"] or [])}
    head = records.get(kind.head)
    if head is None:
        return None
    snap, parts = head.get(kind.key), head.get(kind.parts)
    codec = head.get("codec")
    if not isinstance(snap, str) or not isinstance(parts, int) or codec not in (CODEC, ZLIB_CODEC):
        log.warning("ignoring a snapshot head (%s) without its id or parts, or of another codec",
                    kind.head)
        return None
    pieces = [records.get(f"{kind.prefix}{snap}.{n}", {}).get("data") for n in range(parts)]
    if not all(isinstance(p, str) for p in pieces):
        log.info("snapshot %s is incomplete (a concurrent write); not used", snap)
        return None
    try:
        packed = base64.b64decode("".join(map(str, pieces)), validate=True)
        return snap, _unpack(packed) if codec == CODEC else zlib.decompress(packed), head
    except (binascii.Error, zlib.error, zstandard.ZstdError, ValueError):
        log.warning("ignoring snapshot %s: its parts do not decode", snap)
        return None


def _unpack(packed: bytes) -> bytes:
    """A Zstandard frame's content; ValueError when the frame does not say its size or claims
    more than :data:`MAX_PAYLOAD` (what :func:`_put` writes always says it)."""
    size = zstandard.frame_content_size(packed)
    if size < 0 or size > MAX_PAYLOAD:
        raise ValueError(f"a snapshot frame of unknown or excessive size ({size})")
    return zstandard.ZstdDecompressor().decompress(packed, max_output_size=size)


def due(tail: int, covered: int, *, minimum: int, share: int = 40) -> bool:
    """Whether a tail of ``tail`` records past a snapshot of ``covered`` is worth a new one: at
    least ``minimum`` records, so a reader replays at most about that many, and at least a
    ``share``-th of the snapshot, so rewriting snapshots costs O(records written) overall (a
    smaller ``share`` writes less often and leaves a longer tail)."""
    return tail >= max(minimum, covered // share)

