"""ChromaVectorStore: one Chroma collection per user, embedded or server, holding *our* vectors only.

Collections are created with ``embedding_function=None`` and an explicit cosine HNSW configuration,
so Chroma never attaches (and downloads) its own embedder. The collection name is a hash of the
user id; the raw id, the embedder's name and its dimension are kept in the collection's metadata,
and opening a collection with a different embedder is refused.
"""

from __future__ import annotations

import builtins

import ctypes
import logging
import re
import shutil
import sqlite3
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

from hybridmem._files import user_key
from hybridmem._records import matches
from hybridmem.errors import EmbedderMismatchError, StorageError
from hybridmem.models import MetadataValue
from hybridmem.protocols import StoredRecord, VectorHit

__all__ = ["ChromaVectorStore", "make_chroma_client"]

log = logging.getLogger(__name__)
SCHEMA_VERSION = 1
T = TypeVar("T")
#: glibc's mallopt parameter and the byte freed memory is overwritten with.
M_PERTURB = -6
PERTURB_BYTE = 0x5A
#: How many more neighbours a filtered query fetches before filtering them itself.
OVERFETCH = 3
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def scrub_freed_heap() -> bool:
    """Ask glibc to overwrite freed heap memory and fill new allocations (``M_PERTURB``).

    Why: embedded Chroma's HNSW index persists its whole preallocated capacity, uninitialised, to
    ``data_level0.bin`` / ``length.bin``. Those bytes can hold freed heap — including the text of a
    user who was just forgotten — so erasure could leave a copy inside *another* user's index file
    (seen about once in 25 runs). With ``M_PERTURB`` no allocation can carry old contents. It is
    process-wide and costs a memset per malloc/free; ``Settings(scrub_heap=False)`` turns it off.
    Returns False where it is not available (not Linux/glibc).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_PERTURB, PERTURB_BYTE))
    except (OSError, AttributeError):
        return False


def make_chroma_client(*, path: Path | None = None, url: str | None = None) -> Any:
    """An embedded (``path``) or server (``url``) Chroma client with telemetry off."""
    try:
        import chromadb
        from chromadb.config import Settings as ChromaSettings
    except ImportError as exc:  # pragma: no cover - hard dependency
        raise StorageError("chromadb is not installed: pip install hybridmem") from exc
    chroma_settings = ChromaSettings(anonymized_telemetry=False, allow_reset=False)
    try:
        if url is not None:
            parsed = urlparse(url)
            return chromadb.HttpClient(
                host=parsed.hostname or "127.0.0.1",
                port=parsed.port or (443 if parsed.scheme == "https" else 8000),
                ssl=parsed.scheme == "https",
                settings=chroma_settings,
            )
        assert path is not None
        path.mkdir(parents=True, exist_ok=True)
        return chromadb.PersistentClient(path=str(path), settings=chroma_settings)
    except Exception as exc:
        where = url or str(path)
        raise StorageError(f"could not open the Chroma store at {where}: {exc}") from exc


class ChromaVectorStore:
    """Per-user collections in one Chroma client. Thread-safe; handles are cached per user."""

    def __init__(
        self,
        *,
        embedder_name: str,
        dimension: int,
        path: Path | None = None,
        url: str | None = None,
        scrub_heap: bool = True,
    ) -> None:
        if scrub_heap and url is None:
            scrub_freed_heap()
        self._client = make_chroma_client(path=path, url=url)
        self._path = None if url is not None else path
        self._embedder_name = embedder_name
        self._dimension = dimension
        self._collections: dict[str, Any] = {}
        self._lock = threading.RLock()
        self._closed = False

    # -- collections ---------------------------------------------------------------------------
    def _collection(self, user_id: str, *, create: bool = True) -> Any | None:
        name = user_key(user_id)
        with self._lock:
            if self._closed:
                raise StorageError("the vector store is closed")
            cached = self._collections.get(name)
            if cached is not None:
                return cached
            try:
                if create:
                    collection = self._client.get_or_create_collection(
                        name=name,
                        embedding_function=None,
                        configuration={"hnsw": {"space": "cosine"}},
                        metadata={
                            "user_id": user_id,
                            "embedder": self._embedder_name,
                            "dimension": self._dimension,
                            "schema": SCHEMA_VERSION,
                        },
                    )
                else:
                    collection = self._client.get_collection(name=name, embedding_function=None)
            except Exception as exc:
                if not create and _is_not_found(exc):
                    return None
                raise StorageError(f"could not open the collection of {user_id!r}: {exc}") from exc
            meta = collection.metadata or {}
            if meta.get("embedder") != self._embedder_name or meta.get("dimension") != self._dimension:
                raise EmbedderMismatchError(
                    f"the memories of {user_id!r} were embedded with {meta.get('embedder')!r} "
                    f"({meta.get('dimension')}-d) but {self._embedder_name!r} "
                    f"({self._dimension}-d) is configured; configure the original embedder, or "
                    "export the user, forget it and import the export to re-embed"
                )
            self._collections[name] = collection
            return collection

    def _run(self, user_id: str, what: str, op: Callable[[Any], T], *, create: bool = False,
             default: T) -> T:
        """Run ``op`` on the user's collection; ``default`` when it does not exist.

        A cached handle goes stale when another process deletes the collection (``forget`` on a
        shared Chroma server): then the handle is dropped and the call retried once. Any Chroma
        failure becomes a :class:`StorageError` that names the user and the operation.
        """
        for attempt in (0, 1):
            collection = self._collection(user_id, create=create)
            if collection is None:
                return default
            try:
                return op(collection)
            except StorageError:
                raise
            except Exception as exc:
                if attempt == 0 and _is_not_found(exc):
                    with self._lock:
                        self._collections.pop(user_key(user_id), None)
                    continue
                raise StorageError(f"could not {what} the memories of {user_id!r}: {exc}") from exc
        return default

    # -- writes -------------------------------------------------------------------------------
    def upsert(
        self,
        user_id: str,
        ids: Sequence[str],
        texts: Sequence[str],
        embeddings: Sequence[Sequence[float]],
        metadatas: Sequence[dict[str, MetadataValue]],
    ) -> None:
        """Insert or replace records with our embeddings."""
        if ids:
            self._run(user_id, "write to", lambda c: c.upsert(
                ids=list(ids), documents=list(texts), embeddings=[list(e) for e in embeddings],
                metadatas=[_clean(m) for m in metadatas],
            ), create=True, default=None)

    def update_metadata(
        self, user_id: str, ids: Sequence[str], metadatas: Sequence[dict[str, MetadataValue]]
    ) -> None:
        """Replace the metadata of existing records (documents and vectors stay)."""
        if ids:
            self._run(user_id, "update", lambda c: c.update(
                ids=list(ids), metadatas=[_clean(m) for m in metadatas]), default=None)

    def delete(self, user_id: str, ids: Sequence[str]) -> None:
        """Delete records by id (unknown ids are ignored)."""
        if ids:
            self._run(user_id, "delete from", lambda c: c.delete(ids=list(ids)), default=None)

    def drop_user(self, user_id: str) -> None:
        """Delete the user's whole collection."""
        name = user_key(user_id)
        with self._lock:
            self._collections.pop(name, None)
            try:
                self._client.delete_collection(name=name)
            except Exception as exc:
                if not _is_not_found(exc):
                    raise StorageError(f"could not delete the memories of {user_id!r}: {exc}") from exc

    # -- reads --------------------------------------------------------------------------------
    def get(
        self, user_id: str, ids: Sequence[str], *, where: Mapping[str, Any] | None = None
    ) -> builtins.list[StoredRecord]:
        """Records by id (missing ids are skipped), in the order of ``ids``; ``where`` filters."""
        if not ids:
            return []
        result = self._run(user_id, "read from", lambda c: c.get(
            ids=list(ids), include=["documents", "metadatas"],
        ), default=None)
        records = {r.id: r for r in _records(result)} if result is not None else {}
        # filtered here, not by Chroma: its where on a get by ids scans every record
        return [records[i] for i in ids if i in records and matches(where, records[i].metadata)]

    def list(
        self,
        user_id: str,
        *,
        where: Mapping[str, Any] | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> builtins.list[StoredRecord]:
        """Records matching ``where`` (all when None), in storage order."""
        result = self._run(user_id, "read from", lambda c: c.get(
            where=dict(where) if where else None, limit=limit, offset=offset or None,
            include=["documents", "metadatas"],
        ), default=None)
        return _records(result) if result is not None else []

    def query(
        self,
        user_id: str,
        embedding: Sequence[float],
        *,
        limit: int,
        where: Mapping[str, Any] | None = None,
    ) -> builtins.list[VectorHit]:
        """The ``limit`` nearest records by cosine similarity, best first."""
        return self.query_batch(user_id, [embedding], limit=limit, where=where)[0]

    def query_batch(
        self,
        user_id: str,
        embeddings: Sequence[Sequence[float]],
        *,
        limit: int,
        where: Mapping[str, Any] | None = None,
    ) -> builtins.list[builtins.list[VectorHit]]:
        """One nearest-neighbour list per query embedding, in one call to Chroma."""
        if not embeddings:
            return []
        # Chroma pre-filters a where by scanning all metadata (~50 ms at 10k memories), so first
        # ask without it for more neighbours and filter here; only lists that the filter thinned
        # below ``limit`` (while more neighbours exist) are asked again with Chroma's filter.
        fetch = limit * OVERFETCH if where else limit
        lists = self._query(user_id, embeddings, fetch, None)
        out: builtins.list[builtins.list[VectorHit]] = []
        for embedding, hits in zip(embeddings, lists):
            kept = [h for h in hits if matches(where, h.record.metadata)]
            if where and len(kept) < limit and len(hits) == fetch:
                kept = self._query(user_id, [embedding], limit, where)[0]
            out.append(kept[:limit])
        return out

    def _query(
        self,
        user_id: str,
        embeddings: Sequence[Sequence[float]],
        limit: int,
        where: Mapping[str, Any] | None,
    ) -> builtins.list[builtins.list[VectorHit]]:
        result = self._run(user_id, "search", lambda c: c.query(
            query_embeddings=[list(e) for e in embeddings], n_results=limit,
            where=dict(where) if where else None,
            include=["documents", "metadatas", "distances"],
        ), default=None)
        if result is None:
            return [[] for _ in embeddings]
        return [
            [
                VectorHit(StoredRecord(i, d or "", dict(m or {})), 1.0 - float(dist))
                for i, d, m, dist in zip(ids, docs, metas, dists)
            ]
            for ids, docs, metas, dists in zip(
                result["ids"], result["documents"], result["metadatas"], result["distances"]
            )
        ]

    def get_embeddings(self, user_id: str, ids: Sequence[str]) -> dict[str, builtins.list[float]]:
        """The stored vectors of ``ids`` (for export and near-duplicate checks)."""
        if not ids:
            return {}
        result = self._run(user_id, "read from", lambda c: c.get(
            ids=list(ids), include=["embeddings"]), default=None)
        if result is None:
            return {}
        return {i: [float(x) for x in e] for i, e in zip(result["ids"], result["embeddings"])}

    def count(self, user_id: str) -> int:
        """Number of records of the user."""
        return int(self._run(user_id, "count", lambda c: c.count(), default=0))

    def purge(self) -> None:
        """Make deletions physical in embedded mode: VACUUM Chroma's SQLite file (deleted rows
        otherwise stay in free pages) and remove segment folders no collection uses any more.
        A Chroma server manages its own files: there this does nothing."""
        if self._path is None:
            return
        db = self._path / "chroma.sqlite3"
        if not db.exists():
            return
        with self._lock:
            try:
                conn = sqlite3.connect(str(db), timeout=30)
                try:
                    live = {row[0] for row in conn.execute("SELECT id FROM segments")}
                    conn.execute("VACUUM")
                finally:
                    conn.close()
            except sqlite3.Error as exc:
                raise StorageError(f"could not compact {db}: {exc}") from exc
            for child in self._path.iterdir():
                if child.is_dir() and _UUID.match(child.name) and child.name not in live:
                    shutil.rmtree(child, ignore_errors=True)

    def close(self) -> None:
        """Forget cached handles; idempotent."""
        with self._lock:
            self._collections.clear()
            self._closed = True


def _clean(metadata: Mapping[str, MetadataValue]) -> dict[str, MetadataValue]:
    """Chroma refuses None values: absent means None."""
    return {k: v for k, v in metadata.items() if v is not None}


def _records(result: Mapping[str, Any]) -> list[StoredRecord]:
    return [
        StoredRecord(i, d or "", dict(m or {}))
        for i, d, m in zip(result["ids"], result["documents"], result["metadatas"])
    ]


def _is_not_found(exc: Exception) -> bool:
    return type(exc).__name__ in {"NotFoundError", "InvalidCollectionException"} or (
        "does not exist" in str(exc)
    )
