"""ChromaVectorStore: one Chroma collection per user, embedded or server, with *our* vectors only.

Collections are created with ``embedding_function=None`` and an explicit cosine HNSW configuration,
so Chroma never attaches (and downloads) its own embedder (:mod:`hybridmem._chroma` owns the client,
naming and handle plumbing). The collection name is a hash of the user id; the raw id, the
embedder's name and its dimension are kept in the collection's metadata, and opening a collection
with a different embedder is refused.

This is the only module that knows how a :class:`~hybridmem.models.MemoryItem` is laid out as a
Chroma record: id, document = text, and flat metadata with

- the system fields under their own names (``kind``, ``category``, ``importance``, ...),
- times as epoch seconds under ``<name>_ts`` (``created_at_ts``, ``invalid_at_ts``, ...),
- derived fields for filters: ``current`` (not superseded or invalidated), ``has_key``,
  ``text_hash`` (:func:`hybridmem.text.text_hash`) and ``user_id``,
- the caller's metadata under ``meta.<key>``, so a caller key can never overwrite a system field.

Absent means None: Chroma stores no None values. Chroma *merges* metadata on ``upsert`` and
``update`` (a key left out keeps its old value), so writes send None for every field that is None
now and for every key the record had that the item no longer has: a write replaces the record.

A :data:`~hybridmem.filters.Filter` is compiled to a Chroma ``where`` (metadata conditions name
``meta.<key>``) for :meth:`ChromaVectorStore.list`, and evaluated in Python on records for
:meth:`~ChromaVectorStore.get` and :meth:`~ChromaVectorStore.query`, because Chroma answers any
``where`` with a scan of every record's metadata. Both evaluate alike: numbers compare across int
and float, booleans and strings only with their own kind, and a condition on a missing key never
matches except ``$ne`` and ``$nin``.
"""

from __future__ import annotations

import builtins
import logging
import re
import shutil
import sqlite3
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, Union
from urllib.parse import urlparse

from hybridmem import _chroma
from hybridmem.errors import (
    ClosedError,
    CorruptStateError,
    EmbedderMismatchError,
    InvalidInputError,
    StorageError,
)
from hybridmem.filters import AllOf, AnyOf, Condition, Filter, Scalar
from hybridmem.models import MemoryItem
from hybridmem.protocols import VectorHit
from hybridmem.text import text_hash

if TYPE_CHECKING:
    from chromadb.api import ClientAPI
    from chromadb.api.models.Collection import Collection
    from chromadb.api.types import Metadata, PyEmbedding, Where

__all__ = ["OVERFETCH", "SCHEMA_VERSION", "ChromaVectorStore"]

log = logging.getLogger(__name__)
SCHEMA_VERSION = 1
T = TypeVar("T")
#: How many more neighbours a filtered query fetches before filtering them itself.
OVERFETCH = 3
META_PREFIX = "meta."
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_TIME_FIELDS = ("created_at", "updated_at", "valid_from", "invalid_at", "expires_at",
                "last_accessed_at")
_PLAIN_FIELDS = ("kind", "category", "importance", "confidence", "source", "superseded_by",
                 "mention_count", "access_count", "needs_extraction", "extractor", "key")
_SYSTEM_KEYS = (*_PLAIN_FIELDS, *(f"{n}_ts" for n in _TIME_FIELDS), "current", "has_key",
                "text_hash", "user_id")
#: A record's metadata as written: None deletes a key (Chroma's update semantics).
Record = dict[str, Union[str, int, float, bool, None]]
_MISSING = object()


class ChromaVectorStore:
    """:class:`~hybridmem.protocols.VectorStore` on Chroma: per-user collections in one client.

    Thread-safe; collection handles are cached per user. ``path`` opens an embedded store,
    ``url`` a Chroma server (exactly one). :meth:`close` releases the client; a closed store
    raises :class:`~hybridmem.errors.ClosedError`.
    """

    def __init__(
        self,
        *,
        embedder_name: str,
        dimension: int,
        path: Path | None = None,
        url: str | None = None,
        scrub_heap: bool = True,
        max_open: int = 128,
    ) -> None:
        if scrub_heap and url is None:
            _chroma.scrub_freed_heap()
        client = _chroma.make_client(path=path, url=url)
        hint = "check that the Chroma server at chroma_url is reachable" if url else ""
        self._handles = _chroma.CollectionHandles(
            client, hint=hint, max_open=max_open,
            reopen=None if url is not None else lambda: _chroma.make_client(path=path),
        )
        self._path = None if url is not None else path
        self._where = f"url={urlparse(url).netloc.rpartition('@')[2]!r}" if url else f"path={path}"
        self._embedder_name = embedder_name
        self._dimension = dimension
        self._lock = threading.Lock()
        self._closed = False

    @property
    def client(self) -> ClientAPI:
        """The Chroma client (server mode shares it with the graph and lexical stores, which
        borrow it: this store closes it)."""
        return self._handles.client

    def __repr__(self) -> str:
        return (f"ChromaVectorStore({self._where}, embedder={self._embedder_name!r}, "
                f"dimension={self._dimension})")

    def __enter__(self) -> ChromaVectorStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing -------------------------------------------------------------------------------
    def _live(self) -> None:
        if self._closed:
            raise ClosedError("the vector store is closed; create a new ChromaVectorStore")

    def _run(self, user_id: str, what: str, call: Callable[[Collection], T], *,
             create: bool = False) -> T | None:
        """``call`` on the user's collection (None when it does not exist, unless ``create``)."""
        self._live()
        meta: _chroma.CollectionMeta | None = None
        if create:
            meta = {"user_id": user_id, "embedder": self._embedder_name,
                    "dimension": self._dimension, "schema": SCHEMA_VERSION}
        return self._handles.run(
            _chroma.collection_name(user_id), call, user_id=user_id, what=what, create=meta,
            check=lambda c: self._check_identity(user_id, c),
        )

    def _check_identity(self, user_id: str, collection: Collection) -> None:
        meta = collection.metadata or {}
        if meta.get("embedder") != self._embedder_name or meta.get("dimension") != self._dimension:
            raise EmbedderMismatchError(
                f"the memories of {user_id!r} were embedded with {meta.get('embedder')!r} "
                f"({meta.get('dimension')}-d) but {self._embedder_name!r} "
                f"({self._dimension}-d) is configured; configure the original embedder, or "
                "export the user, forget it and import the export to re-embed"
            )

    # -- writes ---------------------------------------------------------------------------------
    def upsert(
        self, user_id: str, items: Sequence[MemoryItem], embeddings: Sequence[Sequence[float]]
    ) -> None:
        """Insert or replace memories (text, fields and vector) with our embeddings."""
        self._live()
        if len(items) != len(embeddings):
            raise InvalidInputError(f"{len(items)} memories but {len(embeddings)} embeddings")
        if not items:
            return
        records = self._records(user_id, items)
        vectors: builtins.list[PyEmbedding] = [self._vector(e) for e in embeddings]
        ids = [i.id for i in items]

        def write(c: Collection) -> None:
            c.upsert(ids=ids, documents=[i.text for i in items], embeddings=vectors,
                     metadatas=_replacing(c, ids, records))

        self._run(user_id, "write the memories", write, create=True)

    def update(self, user_id: str, items: Sequence[MemoryItem]) -> None:
        """Replace the fields of existing memories whose text did not change (documents and
        vectors stay; unknown ids are ignored)."""
        self._live()
        if not items:
            return
        records = self._records(user_id, items)
        ids = [i.id for i in items]
        self._run(user_id, "update the memories", lambda c: c.update(
            ids=ids, metadatas=_replacing(c, ids, records)))

    def delete(self, user_id: str, ids: Sequence[str]) -> None:
        """Delete memories by id (unknown ids are ignored)."""
        self._live()
        if ids:
            self._run(user_id, "delete memories", lambda c: c.delete(ids=list(ids)))

    def drop_user(self, user_id: str) -> None:
        """Delete the user's whole collection."""
        self._live()
        self._handles.drop(_chroma.collection_name(user_id), user_id=user_id,
                           what="delete the memories")

    def _records(self, user_id: str, items: Sequence[MemoryItem]) -> list[Record]:
        for item in items:
            if item.user_id != user_id:
                raise InvalidInputError(
                    f"memory {item.id} belongs to {item.user_id!r}, not {user_id!r}")
        return [_to_record(i) for i in items]

    def _vector(self, embedding: Sequence[float]) -> list[float]:
        if len(embedding) != self._dimension:
            raise InvalidInputError(
                f"an embedding has {len(embedding)} dimensions but this store holds "
                f"{self._dimension}-d vectors of {self._embedder_name!r}")
        return [float(x) for x in embedding]

    # -- reads ----------------------------------------------------------------------------------
    def get(
        self, user_id: str, ids: Sequence[str], *, where: Filter | None = None
    ) -> builtins.list[MemoryItem]:
        """Memories by id, in the order of ``ids``; missing ids and non-matching ones skipped."""
        self._live()
        if not ids:
            return []
        got = self._run(user_id, "read the memories", lambda c: c.get(
            ids=list(dict.fromkeys(ids)), include=["documents", "metadatas"]))
        if got is None:
            return []
        rows = {i: (d, m) for i, d, m in _rows(got["ids"], got["documents"], got["metadatas"])}
        # filtered here, not by Chroma: its where on a get by ids scans every record
        return [_to_item(user_id, i, *rows[i]) for i in ids
                if i in rows and matches(where, rows[i][1])]

    def list(
        self,
        user_id: str,
        *,
        where: Filter | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> builtins.list[MemoryItem]:
        """Memories matching ``where`` (all when None), in storage order."""
        self._live()
        if offset < 0 or (limit is not None and limit < 0):
            raise InvalidInputError("limit and offset must be >= 0")
        if limit == 0:
            return []
        compiled = compile_where(where)
        got = self._run(user_id, "read the memories", lambda c: c.get(
            where=compiled, limit=limit, offset=offset or None,
            include=["documents", "metadatas"]))
        if got is None:
            return []
        return [_to_item(user_id, i, d, m)
                for i, d, m in _rows(got["ids"], got["documents"], got["metadatas"])]

    def query(
        self,
        user_id: str,
        embeddings: Sequence[Sequence[float]],
        *,
        limit: int,
        where: Filter | None = None,
    ) -> builtins.list[builtins.list[VectorHit]]:
        """One list of the ``limit`` nearest memories (best first, by cosine similarity) per
        query embedding, in one call to Chroma."""
        self._live()
        if not embeddings:
            return []
        if limit <= 0:
            return [[] for _ in embeddings]
        vectors: builtins.list[PyEmbedding] = [self._vector(e) for e in embeddings]
        # Chroma pre-filters a where by scanning all metadata (~50 ms at 10k memories), so first
        # ask without it for more neighbours and filter here; only lists that the filter thinned
        # below ``limit`` (while more neighbours exist) are asked again with Chroma's filter.
        fetch = limit * OVERFETCH if where is not None else limit
        lists = self._query(user_id, vectors, fetch, None)
        out: builtins.list[builtins.list[VectorHit]] = []
        for vector, rows in zip(vectors, lists):
            kept = [r for r in rows if matches(where, r[2])]
            if where is not None and len(kept) < limit and len(rows) == fetch:
                kept = self._query(user_id, [vector], limit, where)[0]
            out.append([VectorHit(_to_item(user_id, i, d, m), s) for i, d, m, s in kept[:limit]])
        return out

    def _query(
        self, user_id: str, vectors: builtins.list[PyEmbedding], limit: int,
        where: Filter | None,
    ) -> builtins.list[builtins.list[tuple[str, str | None, Mapping[str, Any] | None, float]]]:
        compiled = compile_where(where)
        got = self._run(user_id, "search the memories", lambda c: c.query(
            query_embeddings=vectors, n_results=limit, where=compiled,
            include=["documents", "metadatas", "distances"]))
        if got is None:
            return [[] for _ in vectors]
        docs, metas, dists = got["documents"], got["metadatas"], got["distances"]
        return [
            [(i, d, m, 1.0 - float(dist)) for (i, d, m), dist in
             zip(_rows(ids, docs[n] if docs else None, metas[n] if metas else None),
                 dists[n] if dists else [])]
            for n, ids in enumerate(got["ids"])
        ]

    def count(self, user_id: str) -> int:
        """How many memories the user has."""
        return self._run(user_id, "count the memories", lambda c: c.count()) or 0

    # -- lifecycle ------------------------------------------------------------------------------
    def purge(self) -> None:
        """Make deletions and replaced texts physical in embedded mode; a Chroma server manages
        its own files, so there this does nothing (its operator must compact them).

        Where embedded Chroma keeps a deleted or overwritten document, and what is done about it:

        1. its write-ahead log (``embeddings_queue``) keeps every write's document and metadata
           until the vector index persists (every ~1000 writes); once the metadata segment has
           applied a write, the log is kept only so the vector index can replay the vector, so
           the document and metadata of applied writes are blanked to ``{}`` (what Chroma itself
           writes for a record without them);
        2. its trigram full-text index keeps postings of deleted documents until its segments
           merge: ``optimize`` merges them;
        3. SQLite keeps deleted rows in free pages and in the free space of pages (Chroma's
           connection does not use ``secure_delete``): VACUUM rewrites the file without them;
        4. segment folders no collection uses any more are removed.

        Cost: a rewrite of Chroma's SQLite file, ~proportional to its size (see the README).
        """
        self._live()
        if self._path is None:
            return
        db = self._path / "chroma.sqlite3"
        if not db.exists():
            return
        with self._lock:
            try:
                conn = sqlite3.connect(str(db), timeout=30, isolation_level=None)
                try:
                    conn.execute("PRAGMA secure_delete=ON")
                    live = {row[0] for row in conn.execute("SELECT id FROM segments")}
                    _blank_applied_log(conn)
                    _optimize_fulltext(conn)
                    conn.execute("VACUUM")
                finally:
                    conn.close()
            except sqlite3.Error as exc:
                raise StorageError(f"could not compact {db}: {exc}") from exc
            for child in self._path.iterdir():
                if child.is_dir() and _UUID.match(child.name) and child.name not in live:
                    shutil.rmtree(child, ignore_errors=True)

    def close(self) -> None:
        """Forget cached handles and release the client; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._handles.clear()
            _chroma.close_client(self._handles.client)


# -- physical erasure in Chroma's SQLite file -------------------------------------------------
def _blank_applied_log(conn: sqlite3.Connection) -> None:
    """Blank documents and metadata in Chroma's log for writes its metadata segment has applied
    (their vectors stay: the vector index replays them from the log until it persists)."""
    applied = conn.execute(
        "SELECT s.collection, m.seq_id FROM segments s JOIN max_seq_id m ON m.segment_id = s.id "
        "WHERE s.scope = 'METADATA'"
    ).fetchall()
    conn.execute("BEGIN IMMEDIATE")
    try:
        for collection, seq_id in applied:
            if not isinstance(seq_id, int):  # an older Chroma stored bytes: leave the log alone
                continue
            conn.execute(
                "UPDATE embeddings_queue SET metadata = '{}' WHERE seq_id <= ? AND topic LIKE ? "
                "AND metadata IS NOT NULL AND metadata != '{}'",
                (seq_id, f"%/{collection}"),
            )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _optimize_fulltext(conn: sqlite3.Connection) -> None:
    """Merge the segments of Chroma's full-text index, dropping postings of deleted documents."""
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE name = 'embedding_fulltext_search'").fetchone()
    if exists:
        conn.execute("INSERT INTO embedding_fulltext_search(embedding_fulltext_search) "
                     "VALUES ('optimize')")


# -- the record layout ---------------------------------------------------------------------------
def _to_record(item: MemoryItem) -> Record:
    """The flat record metadata of ``item``; None values delete keys when written."""
    meta: Record = {name: getattr(item, name) for name in _PLAIN_FIELDS}
    for name in _TIME_FIELDS:
        value: datetime | None = getattr(item, name)
        meta[f"{name}_ts"] = None if value is None else value.timestamp()
    meta["current"] = item.is_current
    meta["has_key"] = item.key is not None
    meta["text_hash"] = text_hash(item.text)
    meta["user_id"] = item.user_id
    for key, val in item.metadata.items():
        meta[META_PREFIX + key] = val
    return meta


def _replacing(collection: Collection, ids: Sequence[str], records: Sequence[Record]
               ) -> builtins.list[Metadata]:
    """``records`` plus None for each key the stored record has and the new one lacks (Chroma
    merges metadata on writes; None deletes a key)."""
    old = collection.get(ids=list(ids), include=["metadatas"])
    stale = {i: m for i, _, m in _rows(old["ids"], None, old["metadatas"]) if m}
    return [{**{k: None for k in stale.get(i, {}) if k not in r}, **r}
            for i, r in zip(ids, records)]


def _to_item(user_id: str, id_: str, text: str | None, meta: Mapping[str, Any] | None
             ) -> MemoryItem:
    """Rebuild a :class:`MemoryItem` from a stored record."""
    m = meta or {}
    fields: dict[str, Any] = {name: m[name] for name in _PLAIN_FIELDS if name in m}
    for name in _TIME_FIELDS:
        ts = m.get(f"{name}_ts")
        fields[name] = (datetime.fromtimestamp(float(ts), tz=timezone.utc)
                        if isinstance(ts, (int, float)) and not isinstance(ts, bool) else None)
    if fields["updated_at"] is None:
        fields["updated_at"] = fields["created_at"]
    fields["metadata"] = {k[len(META_PREFIX):]: v for k, v in m.items()
                          if k.startswith(META_PREFIX)}
    try:
        return MemoryItem(id=id_, user_id=str(m.get("user_id", user_id)), text=text or "",
                          **fields)
    except ValueError as exc:  # pydantic's ValidationError
        raise CorruptStateError(
            f"the stored memory {id_} of {user_id!r} cannot be read back: {exc}") from exc


def _rows(ids: Sequence[str], docs: Sequence[str | None] | None,
          metas: Sequence[Mapping[str, Any] | None] | None
          ) -> Iterable[tuple[str, str | None, Mapping[str, Any] | None]]:
    """Chroma's columns as (id, document, metadata) rows (a column not included is None)."""
    for n, id_ in enumerate(ids):
        yield id_, docs[n] if docs else None, metas[n] if metas else None


# -- filters: compiled for Chroma, evaluated in Python -------------------------------------------
def _key(cond: Condition) -> str:
    return META_PREFIX + cond.field if cond.metadata else cond.field


def compile_where(flt: Filter | None) -> Where | None:
    """A :data:`Filter` as a Chroma ``where`` on our record layout (None: no filter)."""
    if flt is None:
        return None
    if isinstance(flt, Condition):
        value = list(flt.value) if isinstance(flt.value, tuple) else flt.value
        return {_key(flt): {flt.op: value}}  # type: ignore[dict-item]  # op and value checked
    if isinstance(flt, AnyOf) and not flt.parts:
        raise InvalidInputError("an empty AnyOf matches nothing; leave the filter out instead")
    parts = [p for p in map(compile_where, flt.parts) if p is not None]
    if len(parts) <= 1:
        return parts[0] if parts else None
    return {"$and" if isinstance(flt, AllOf) else "$or": parts}


def matches(flt: Filter | None, meta: Mapping[str, Any] | None) -> bool:
    """Evaluate a filter on one record's metadata in Python, exactly as Chroma would.

    Chroma answers ``get(ids=..., where=...)`` with a scan of the whole collection's metadata
    (~250 ms at 10k memories); fetching by id and filtering here costs microseconds.
    """
    if flt is None:
        return True
    if isinstance(flt, Condition):
        value = (meta or {}).get(_key(flt), _MISSING)
        return _test(flt, _MISSING if value is None else value)
    if isinstance(flt, AllOf):
        return all(matches(p, meta) for p in flt.parts)
    if not flt.parts:
        raise InvalidInputError("an empty AnyOf matches nothing; leave the filter out instead")
    return any(matches(p, meta) for p in flt.parts)


def _test(cond: Condition, value: object) -> bool:
    expected = cond.value if isinstance(cond.value, tuple) else (cond.value,)
    if cond.op in ("$ne", "$nin"):
        return value is _MISSING or not any(_same(value, e) for e in expected)
    if value is _MISSING:
        return False
    if cond.op in ("$eq", "$in"):
        return any(_same(value, e) for e in expected)
    a, b = value, cond.value
    if not (isinstance(a, (int, float)) and isinstance(b, (int, float))
            and _number(a) and _number(b)):
        return False  # ordering compares numbers only (as in Chroma)
    if cond.op == "$gt":
        return a > b
    if cond.op == "$gte":
        return a >= b
    if cond.op == "$lt":
        return a < b
    if cond.op == "$lte":
        return a <= b
    raise InvalidInputError(f"unknown filter operator {cond.op!r}")


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _same(value: object, expected: Scalar) -> bool:
    """Chroma's equality: numbers across int and float; booleans and strings only with their own."""
    if _number(value) and _number(expected):
        return value == expected
    return type(value) is type(expected) and value == expected
