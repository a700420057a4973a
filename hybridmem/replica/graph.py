"""Server-mode stores: all shared state lives in the Chroma server; each process only caches.

Several app processes (on several hosts) can serve the same users through one Chroma server. Local
files with a file lock cannot keep them consistent across hosts, so with ``Settings.chroma_url``:

- vectors, documents and metadata stay in the user's main collection (:mod:`hybridmem.chroma.vector`);
- the graph is *derived*: every write of a memory's :class:`~hybridmem.models.Extraction` is one
  record in the side collection ``g-<user key>`` (:func:`hybridmem.chroma.client.collection_name`),
  and each process replays the records into an
  in-memory :class:`~hybridmem.graph.store.NetworkXGraphStore` (:class:`ChromaGraphStore`);
- the lexical index is a per-process FTS5 cache of the main collection's documents
  (:class:`ChromaLexicalIndex`).

Writes only add or delete records, never read-modify-write a shared blob, so no process overwrites
another's update. A process sees its own writes at once and other processes' adds and deletes at its
next *check*, which runs before a read at most every ``refresh_interval`` seconds (``refresh()``
forces one). A check lists record ids only, the cheapest thing Chroma serves (measured on one
``chroma run``: 10k ids in ~20 ms, their metadata in ~1.3 s), so a version must show in the id:
a graph record's id is ``<memory id>~<write token>``.

The client, collection names, creating, dropping, and reopening a handle whose collection another
process dropped are :mod:`hybridmem.chroma.client`'s, shared with the vector store.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import pairwise
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from hybridmem.chroma import client as _chroma
from hybridmem.runtime.files import user_key
from hybridmem.graph.state import Links
from hybridmem.errors import ClosedError, ConfigError, InvalidInputError, StorageError
from hybridmem.graph.store import NetworkXGraphStore
from hybridmem.graph.activation import FOCUS, SESSION, TOPIC, Similar
from hybridmem.sqlite.lexical import SqliteLexicalIndex
from hybridmem.models import (
    Entity,
    Extraction,
    GraphEntity,
    GraphRelation,
    Relation,
    as_utc,
    utcnow,
)
from hybridmem.text import content_words

if TYPE_CHECKING:
    from chromadb.api import ClientAPI
    from chromadb.api.models.Collection import Collection
    from chromadb.api.types import Metadata, PyEmbedding, Where

__all__ = ["ChromaGraphStore", "ChromaLexicalIndex"]

log = logging.getLogger(__name__)
SCHEMA = 1
#: Separates the memory id from the write token in a graph record id (tokens are hex, so the last
#: separator is the right one even if an imported memory id contains it).
SEP = "~"
#: Records per Chroma request: well under the server's batch limit, and a bounded request size.
BATCH = 1000
_UNIT = [1.0]  # Chroma wants a vector per record; side records are never searched by vector
_HINT = "check that the Chroma server at chroma_url is reachable"
T = TypeVar("T")


def _memory_of(record_id: str) -> str:
    return record_id.rpartition(SEP)[0]


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=12).digest()


def _chunks(items: Sequence[T]) -> Iterable[Sequence[T]]:
    return (items[i : i + BATCH] for i in range(0, len(items), BATCH))


def _of_memories(memory_ids: Sequence[str]) -> Where:
    """Chroma's filter for the graph records of these memories."""
    among: dict[Literal["$in", "$nin"], list[str | int | float | bool]] = {"$in": [*memory_ids]}
    return {"memory_id": among}


@dataclass
class _Sync:
    """One user's cache state: its lock (held across a check, so a concurrent own write is never
    mistaken for a remote delete), what the cache holds and when the server was last checked."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    record_ids: set[str] = field(default_factory=set)  # graph: server records replayed
    versions: dict[str, bytes] = field(default_factory=dict)  # lexical: memory id -> text digest
    checked: float | None = None  # monotonic time of the last check's start
    swept: float | None = None  # lexical: last full comparison of texts


class _ServerCache:
    """Plumbing shared by both stores: the client, per-user state, rate-limited checks, and handles
    that survive another process dropping and re-creating a collection (:mod:`hybridmem.chroma.client`).
    A client made here from ``url`` is closed by :meth:`close`; a ``client`` passed in is not."""

    def __init__(self, *, client: ClientAPI | None, url: str | None, refresh_interval: float,
                 name_of: Callable[[str], str]) -> None:
        if (client is None) == (url is None):
            raise ConfigError(f"{type(self).__name__} needs exactly one of client= or url=")
        if refresh_interval < 0:
            raise ConfigError("refresh_interval must be >= 0 seconds")
        self._own_client = client is None
        self._handles = _chroma.CollectionHandles(
            client if client is not None else _chroma.make_client(url=url), hint=_HINT
        )
        self._name_of = name_of
        self.refresh_interval = float(refresh_interval)
        self._users: dict[str, _Sync] = {}
        self._guard = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}(users_cached={len(self._users)})"

    def _state(self, user_id: str) -> _Sync:
        key = user_key(user_id)  # validates the user id
        with self._guard:
            if self._closed:
                raise ClosedError(f"the {type(self).__name__} is closed; create a new one")
            return self._users.setdefault(key, _Sync())

    def _run(self, user_id: str, what: str, call: Callable[[Collection], T], *,
             create: _chroma.CollectionMeta | None = None) -> T | None:
        """``call(collection)``; None when the collection does not exist (unless ``create``, its
        metadata, is given). A stale handle (the collection was dropped by someone) is reopened
        once."""
        return self._handles.run(self._name_of(user_id), call, user_id=user_id, what=what,
                                 create=create)

    def _due(self, st: _Sync, force: bool) -> bool:
        return force or st.checked is None or time.monotonic() - st.checked >= self.refresh_interval

    def _close(self) -> bool:
        """Mark closed, drop caches and handles, release an own client; False if it already was."""
        with self._guard:
            if self._closed:
                return False
            self._closed = True
            self._users.clear()
            self._handles.clear()
            if self._own_client:
                _chroma.close_client(self._handles.client)
            return True


class ChromaGraphStore(_ServerCache):
    """:class:`~hybridmem.protocols.GraphStore` for server mode: extraction records in Chroma, the
    graph a per-process cache rebuilt from them.

    A record: id ``<memory id>~<token>`` (a fresh uuid per write), document the extraction JSON,
    metadata ``memory_id``, ``token`` and ``ts`` (epoch seconds: first/last seen, so every process
    derives the same times). Like :class:`~hybridmem.graph.store.NetworkXGraphStore`, adding is additive
    and removing a memory removes all its records. A check lists record ids; new ones are fetched
    and replayed, and a memory that lost records is removed and replayed from what is left.
    Entity display names are the first surface form *this process* replayed, so two processes can
    name a node differently while agreeing on its key, edges and memories.
    """

    def __init__(self, *, client: ClientAPI | None = None, url: str | None = None,
                 refresh_interval: float = 1.0, focus: float = FOCUS,
                 session: float = SESSION) -> None:
        super().__init__(client=client, url=url, refresh_interval=refresh_interval,
                         name_of=partial(_chroma.collection_name, kind="graph"))
        self._cache = NetworkXGraphStore(None, focus=focus, session=session)

    # -- writes ----------------------------------------------------------------------------------
    def add_extraction(self, user_id: str, memory_id: str, extraction: Extraction, *,
                       at: datetime | None = None) -> None:
        """Add one memory's entities and relations."""
        self.add_extractions(user_id, [(memory_id, extraction)], at=at)

    def add_extractions(self, user_id: str, items: Sequence[tuple[str, Extraction]], *,
                        at: datetime | None = None, links: Links = True) -> None:
        """Write one record per item, then apply them to this process's cache. Each record
        names in ``prev`` the memory linked just before it ("" for none), so a process that
        replays the records rebuilds the same episodic links."""
        if not items:
            return
        when = as_utc(at or utcnow())
        if links is True:
            before = {b: a for a, b in pairwise(dict.fromkeys(m for m, _ in items))}
        else:
            before = {} if links is False else {b: a for a, b in links}
        tokens = [uuid.uuid4().hex for _ in items]
        ids = [f"{mid}{SEP}{tok}" for (mid, _), tok in zip(items, tokens)]
        docs = [e.model_dump_json() for _, e in items]
        metas: list[Metadata] = [
            {"memory_id": mid, "token": tok, "ts": when.timestamp(), "prev": before.get(mid, "")}
            for (mid, _), tok in zip(items, tokens)
        ]
        units: list[PyEmbedding] = [_UNIT] * len(ids)
        st = self._state(user_id)
        created: _chroma.CollectionMeta = {
            "user_id": user_id, "kind": "hybridmem-graph", "schema": SCHEMA
        }
        with st.lock:
            try:
                for lo in range(0, len(ids), BATCH):
                    hi = lo + BATCH
                    self._run(user_id, "store the graph", lambda c: c.upsert(
                        ids=ids[lo:hi], documents=docs[lo:hi],
                        embeddings=units[lo:hi], metadatas=metas[lo:hi],
                    ), create=created)
            except StorageError:
                try:  # best effort, so a failed add leaves no half-written batch
                    for part in _chunks(ids):
                        self._run(user_id, "undo a graph write", lambda c: c.delete(ids=list(part)))
                except StorageError:
                    log.warning("could not undo a failed graph write; checks replay what landed")
                raise
            self._cache.add_extractions(user_id, items, at=when, links=links)
            st.record_ids.update(ids)

    def remove_memory(
        self, user_id: str, memory_ids: Sequence[str], *, erase: bool = False
    ) -> None:
        """Delete every record of the memories (whoever wrote them) and drop them from the cache
        (records are deleted either way, so ``erase`` changes nothing here)."""
        mids = list(dict.fromkeys(memory_ids))
        if not mids:
            return
        st = self._state(user_id)
        with st.lock:
            for part in _chunks(mids):
                where = _of_memories(part)
                self._run(user_id, "delete graph records", lambda c: c.delete(where=where))
            self._cache.remove_memory(user_id, mids)
            gone = set(mids)
            st.record_ids = {r for r in st.record_ids if _memory_of(r) not in gone}

    def import_graph(self, user_id: str, data: Mapping[str, Any]) -> None:
        """Replace the user's graph with an export: it is split back into per-memory extractions
        (entities, relations, supporting memories and confidences survive; first/last seen become
        the import time)."""
        scratch = NetworkXGraphStore(None)
        scratch.import_graph(user_id, dict(data))  # validates; InvalidInputError when malformed
        exported = scratch.export(user_id)["graph"]
        items = _extractions_of(exported)
        episodes = sorted(exported["graph"].get("next", {}).items())  # the export's own links
        linked = dict.fromkeys(m for link in episodes for m in link)
        known = {m for m, _ in items}
        items += [(m, Extraction(extractor="import")) for m in linked if m not in known]
        st = self._state(user_id)
        with st.lock:
            for part in _chunks(self._record_ids(user_id)):
                self._run(user_id, "replace the graph", lambda c: c.delete(ids=list(part)))
            self._cache.drop_user(user_id)
            st.record_ids.clear()
            st.checked = None  # the next read replays what others wrote meanwhile
            self.add_extractions(user_id, items, links=episodes)

    def drop_user(self, user_id: str) -> None:
        """Delete the user's side collection and cached graph."""
        st = self._state(user_id)
        with st.lock:
            self._handles.drop(self._name_of(user_id), user_id=user_id, what="delete the graph")
            st.checked = None
            st.record_ids.clear()
            self._cache.drop_user(user_id)

    def close(self) -> None:
        """Forget the caches; idempotent. The server keeps everything."""
        if self._close():
            self._cache.close()

    # -- sync ------------------------------------------------------------------------------------
    def refresh(self, user_id: str) -> None:
        """Check the server now, whatever the refresh interval."""
        self._sync(user_id, force=True)

    def _sync(self, user_id: str, *, force: bool = False) -> _Sync:
        st = self._state(user_id)
        with st.lock:
            if not self._due(st, force):
                return st
            started = time.monotonic()
            remote = set(self._record_ids(user_id))
            gone, new = st.record_ids - remote, remote - st.record_ids
            if gone or new:
                self._apply(user_id, st, remote, gone, new)
            st.checked = started
            return st

    def _record_ids(self, user_id: str) -> list[str]:
        """The ids of the user's graph records in the server (the cheapest listing there is)."""
        listing = self._run(user_id, "list graph records", lambda c: c.get(include=[]))
        return listing["ids"] if listing else []

    def _apply(
        self, user_id: str, st: _Sync, remote: set[str], gone: set[str], new: set[str]
    ) -> None:
        """Replay new records; memories that lost records are removed and replayed from the rest."""
        rebuild = {_memory_of(r) for r in gone}
        wanted = new | {r for r in remote & st.record_ids if _memory_of(r) in rebuild}
        rows: list[tuple[float, str, str, str]] = []
        for part in _chunks(sorted(wanted)):
            got = self._run(user_id, "read graph records", lambda c: c.get(
                ids=list(part), include=["documents", "metadatas"]
            ))
            if not got:
                continue
            for rid, doc, meta in zip(got["ids"], got["documents"] or [], got["metadatas"] or []):
                ts, prev = (meta or {}).get("ts"), (meta or {}).get("prev")
                rows.append((float(ts) if isinstance(ts, (int, float)) else 0.0, rid, doc or "",
                             prev if isinstance(prev, str) else ""))
        if rebuild:
            self._cache.remove_memory(user_id, sorted(rebuild))
            st.record_ids = {r for r in st.record_ids if _memory_of(r) not in rebuild}
        for ts, rid, doc, prev in sorted(rows):  # write order, so every process replays alike
            try:
                extraction = Extraction.model_validate_json(doc)
            except ValueError:
                log.warning("skipping an unreadable graph record %s", rid)
            else:
                at = datetime.fromtimestamp(ts, tz=timezone.utc) if ts else None
                mid = _memory_of(rid)
                self._cache.add_extractions(user_id, [(mid, extraction)], at=at,
                                            links=[(prev, mid)] if prev else False)
            st.record_ids.add(rid)
        log.debug("graph cache: %d records replayed, %d memories rebuilt", len(rows), len(rebuild))

    # -- reads: the cache, after a check of the server if one is due -------------------------------
    def entities_in(self, user_id: str, text: str) -> list[str]:
        with self._sync(user_id).lock:
            return self._cache.entities_in(user_id, text)

    def neighbourhood(
        self, user_id: str, entities: Sequence[str], *, hops: int
    ) -> dict[str, tuple[int, str]]:
        with self._sync(user_id).lock:
            return self._cache.neighbourhood(user_id, entities, hops=hops)

    def activation(
        self, user_id: str, seeds: Sequence[tuple[str, float]], query: str, *, hops: int = 1,
        episodic: float = 0.5, topic: float = TOPIC, similar: Similar | None = None,
        linked: Sequence[tuple[str, float]] = (),
    ) -> dict[str, tuple[float, int, str]]:
        with self._sync(user_id).lock:
            return self._cache.activation(user_id, seeds, query, hops=hops, episodic=episodic,
                                          topic=topic, similar=similar, linked=linked)

    def entities_of(self, user_id: str, memory_ids: Sequence[str]) -> list[str]:
        with self._sync(user_id).lock:
            return self._cache.entities_of(user_id, memory_ids)

    def entity(self, user_id: str, name: str) -> GraphEntity | None:
        with self._sync(user_id).lock:
            return self._cache.entity(user_id, name)

    def entities(self, user_id: str) -> list[GraphEntity]:
        with self._sync(user_id).lock:
            return self._cache.entities(user_id)

    def relations(
        self, user_id: str, memory_ids: Sequence[str] | None = None
    ) -> list[GraphRelation]:
        with self._sync(user_id).lock:
            return self._cache.relations(user_id, memory_ids)

    def query_path(self, user_id: str, a: str, b: str, *, max_depth: int = 3) -> list[str]:
        with self._sync(user_id).lock:
            return self._cache.query_path(user_id, a, b, max_depth=max_depth)

    def export(self, user_id: str) -> dict[str, Any]:
        with self._sync(user_id).lock:
            return self._cache.export(user_id)


def _extractions_of(graph: dict[str, Any]) -> list[tuple[str, Extraction]]:
    """Split a node-link graph back into the extractions of the memories that support it."""
    names = {n["id"]: n["name"] for n in graph["nodes"]}
    found: dict[str, tuple[list[Entity], list[Relation]]] = {}
    try:
        for node in graph["nodes"]:
            entity = Entity(name=node["name"], type=node["type"])
            for mid in node["memory_ids"]:
                found.setdefault(mid, ([], []))[0].append(entity)
        for edge in graph["edges"]:
            for pred, support in edge["evidence"].items():
                for mid, conf in support.items():
                    found.setdefault(mid, ([], []))[1].append(Relation(
                        subject=names[edge["source"]], predicate=pred,
                        object=names[edge["target"]], confidence=conf,
                    ))
    except ValueError as exc:  # pydantic's ValidationError
        raise InvalidInputError(f"cannot import graph: {exc}") from exc
    return [
        (mid, Extraction(entities=ents, relations=rels, extractor="import"))
        for mid, (ents, rels) in sorted(found.items())
    ]


class ChromaLexicalIndex(_ServerCache):
    """:class:`~hybridmem.protocols.LexicalIndex` for server mode: a per-process FTS5 cache of the
    documents in the user's main collection (written by :class:`~hybridmem.chroma.vector.ChromaVectorStore`
    on the same server), so there is no second copy of the texts to keep consistent.

    Both of the user's collections are read (current memories and the archive of the others).
    The cache is a :class:`~hybridmem.sqlite.lexical.SqliteLexicalIndex` in a private temporary directory,
    removed on :meth:`close`. Own ``add``/``delete`` apply at once. Before a search, at most every
    ``refresh_interval`` seconds, a check lists the collection's ids (cheap) to index new documents
    and drop missing ones; an id keeps its id when its text is edited, so at most every
    ``sweep_interval`` seconds (and on :meth:`refresh`) a *sweep* fetches every document and
    re-indexes those whose digest changed (10k documents: ~0.8 s).
    """

    def __init__(self, *, client: ClientAPI | None = None, url: str | None = None,
                 refresh_interval: float = 1.0, sweep_interval: float = 30.0) -> None:
        if sweep_interval < refresh_interval:
            raise ConfigError("sweep_interval must be >= refresh_interval")
        # the main collection: ChromaVectorStore creates and drops it, this cache only reads it
        super().__init__(client=client, url=url, refresh_interval=refresh_interval,
                         name_of=_chroma.collection_name)
        self.sweep_interval = float(sweep_interval)
        self._dir = tempfile.TemporaryDirectory(prefix="hybridmem-lexical-")
        self._index = SqliteLexicalIndex(Path(self._dir.name))

    def add(self, user_id: str, ids: Sequence[str], texts: Sequence[str]) -> None:
        """Index texts now (the documents are already in the main collection)."""
        st = self._state(user_id)
        with st.lock:
            self._index.add(user_id, ids, texts)
            st.versions.update(zip(ids, map(_digest, texts)))

    def delete(self, user_id: str, ids: Sequence[str]) -> None:
        """Drop memory ids from this process's cache."""
        st = self._state(user_id)
        with st.lock:
            self._index.delete(user_id, ids)
            for i in ids:
                st.versions.pop(i, None)

    def search(self, user_id: str, query: str, *, limit: int) -> list[tuple[str, float]]:
        """(memory id, bm25 score) best first, after a check of the server if one is due."""
        if not content_words(query):
            return []
        with self._sync(user_id).lock:
            return self._index.search(user_id, query, limit=limit)

    def refresh(self, user_id: str) -> None:
        """Compare every document with the server now (a sweep), whatever the intervals."""
        self._sync(user_id, force=True)

    def _sync(self, user_id: str, *, force: bool = False) -> _Sync:
        st = self._state(user_id)
        with st.lock:
            started = time.monotonic()
            sweep = force or st.swept is None or started - st.swept >= self.sweep_interval
            if not sweep and not self._due(st, False):
                return st
            changed: dict[str, str] = {}
            if sweep:
                texts = self._documents(user_id, None)
                remote: set[str] = set(texts)
                changed = {i: t for i, t in texts.items() if st.versions.get(i) != _digest(t)}
            else:
                remote = {i for got in self._each(user_id, "list the memories",
                                                  lambda c: c.get(include=[]))
                          for i in got["ids"]}
                for part in _chunks(sorted(remote - st.versions.keys())):
                    changed.update(self._documents(user_id, part))
            gone = [i for i in st.versions if i not in remote]
            if gone:
                self.delete(user_id, gone)
            if changed:
                self.add(user_id, list(changed), list(changed.values()))
            st.checked = started
            if sweep:
                st.swept = started
            return st

    def _documents(self, user_id: str, ids: Sequence[str] | None) -> dict[str, str]:
        """id -> text of the given memories (all when None) in the main collection."""
        def read(c: Collection) -> Mapping[str, Any]:
            if ids is None:  # every record: in pages (see _chroma.get_paged)
                return _chroma.get_paged(c, include=["documents"])
            return c.get(ids=list(ids), include=["documents"])

        return {str(i): str(t or "") for got in self._each(user_id, "read the memories", read)
                for i, t in zip(got["ids"], got["documents"] or [])}

    def _each(self, user_id: str, what: str, call: Callable[[Collection], T]) -> list[T]:
        """``call`` on the user's hot and archive collections (those that exist): the vector
        store keeps memories that are not current in the archive, and they stay searchable."""
        got = [self._run(user_id, what, call),
               self._handles.run(_chroma.collection_name(user_id, "archive"), call,
                                 user_id=user_id, what=what)]
        return [g for g in got if g is not None]

    def drop_user(self, user_id: str) -> None:
        """Drop this process's cache of the user (the vector store drops the documents)."""
        st = self._state(user_id)
        with st.lock:
            self._index.drop_user(user_id)
            self._handles.forget(self._name_of(user_id))
            self._handles.forget(_chroma.collection_name(user_id, "archive"))
            st.versions.clear()
            st.checked = st.swept = None

    def close(self) -> None:
        """Close and delete the cache; idempotent."""
        if self._close():
            self._index.close()
            self._dir.cleanup()
