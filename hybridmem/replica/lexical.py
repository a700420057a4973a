"""The lexical index in server mode: a per-process FTS5 cache of the documents that the Chroma
server already holds, so the texts have no second copy to keep consistent.

- :class:`ChromaLexicalIndex` — the :class:`~hybridmem.protocols.LexicalIndex` of server mode;
  its docstring says how the cache follows the server (checks of ids, sweeps of texts).

Separate from :mod:`hybridmem.replica.graph` because it follows other records (the documents of
the main and archive collections, not graph records) into another kind of cache; how both
follow the server is :mod:`hybridmem.replica.sync`'s.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from hybridmem.chroma import client as _chroma
from hybridmem.errors import ConfigError, StorageError
from hybridmem.protocols import GRAPH_NOTE
from hybridmem.replica import snapshot
from hybridmem.replica.sync import REFRESH_INTERVAL, ServerCache, UserSync, chunks
from hybridmem.sqlite.lexical import SqliteLexicalIndex
from hybridmem.text import content_words, text_hash

if TYPE_CHECKING:
    from chromadb.api import ClientAPI
    from chromadb.api.models.Collection import Collection
    from chromadb.api.types import Where

__all__ = ["TEXTS_SHARE", "TEXTS_TAIL", "ChromaLexicalIndex"]

log = logging.getLogger(__name__)
T = TypeVar("T")
#: Texts written or deleted past the last text snapshot before a writer stores a new one, or
#: an eighth of the snapshot if more (see snapshot.due): a first look fetches at most about
#: this many documents. A graph snapshot waits for a fortieth only, as replaying a graph record
#: costs several times what fetching a document costs (10k memories: ~0.65 ms against ~0.1 ms),
#: while storing either kind of snapshot costs about the same.
TEXTS_TAIL = 256
TEXTS_SHARE = 8
#: Snapshot entries per :meth:`ChromaLexicalIndex._stale` request: two SQL variables each, well
#: under SQLite's 32,766 per statement.
STALE_CHUNK = 5000


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=12).digest()


class ChromaLexicalIndex(ServerCache):
    """:class:`~hybridmem.protocols.LexicalIndex` for server mode: a per-process FTS5 cache of the
    documents in the user's main collection (written by
    :class:`~hybridmem.chroma.vector.ChromaVectorStore` on the same server), so there is no second
    copy of the texts to keep consistent.

    Both of the user's collections are read (current memories and the archive of the others).
    The cache is a :class:`~hybridmem.sqlite.lexical.SqliteLexicalIndex` in a private temporary
    directory, removed on :meth:`close`. Own ``add``/``delete`` apply at once. Before a search, at
    most every ``refresh_interval`` seconds, a check lists the collection's ids (cheap) to index
    new documents and drop missing ones; an id keeps its id when its text is edited, so at most
    every ``sweep_interval`` seconds (and on :meth:`refresh`) a *sweep* fetches every document and
    re-indexes those whose digest changed (10k documents: ~0.8 s).

    **Text snapshots.** A process's first look at a user starts from the user's *text snapshot*
    (:func:`hybridmem.replica.snapshot.read_texts`: memory id -> text hash and text, compressed
    in the user's snapshot collection) instead of fetching every document: it lists the ids,
    asks the server which memories carry a text hash other than the snapshot's for them
    (:meth:`_stale`: a ``text_hash`` filter, chunked by id), and fetches only those and the ids
    the snapshot lacks. Writers keep the snapshot: a write that deletes or rewrites a memory the
    snapshot holds rewrites it at once without that text (a forgotten or edited text leaves no
    copy), and after :data:`TEXTS_TAIL` texts (or an eighth of the snapshot) written since the
    last one, the writer stores a new one, built from the last and checked the same way.
    """

    def __init__(self, *, client: ClientAPI | None = None, url: str | None = None,
                 refresh_interval: float = REFRESH_INTERVAL, sweep_interval: float = 30.0) -> None:
        if sweep_interval < refresh_interval:
            raise ConfigError("sweep_interval must be >= refresh_interval")
        # the main collection: ChromaVectorStore creates and drops it, this cache only reads it
        super().__init__(client=client, url=url, refresh_interval=refresh_interval,
                         name_of=_chroma.collection_name)
        self.sweep_interval = float(sweep_interval)
        self._dir = tempfile.TemporaryDirectory(prefix="hybridmem-lexical-")
        self._index = SqliteLexicalIndex(Path(self._dir.name))

    def add(self, user_id: str, ids: Sequence[str], texts: Sequence[str]) -> None:
        """Index texts now (the documents are already in the main collection) and keep the text
        snapshot (call under the user's lease, as every write)."""
        st = self._state(user_id)
        with st.lock:
            self._cache_add(user_id, st, ids, texts)
            self._keep_texts(user_id, st, ids)

    def delete(self, user_id: str, ids: Sequence[str]) -> None:
        """Drop memory ids from this process's cache and from the text snapshot (call under the
        user's lease, as every write)."""
        st = self._state(user_id)
        with st.lock:
            self._cache_delete(user_id, st, ids)
            self._keep_texts(user_id, st, ids)

    def _cache_add(self, user_id: str, st: UserSync, ids: Sequence[str],
                   texts: Sequence[str]) -> None:
        self._index.add(user_id, ids, texts)
        st.versions.update(zip(ids, map(_digest, texts)))

    def _cache_delete(self, user_id: str, st: UserSync, ids: Sequence[str]) -> None:
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

    def _sync(self, user_id: str, *, force: bool = False) -> UserSync:
        st = self._state(user_id)
        with st.lock:
            started = time.monotonic()
            sweep = force or st.swept is None or started - st.swept >= self.sweep_interval
            if not sweep and not self._due(st, False):
                return st
            # unchanged: nobody wrote since (see replica.sync)
            marker, view = self._look(user_id, fresh=force)
            if marker is not None and st.checked is not None and not force:
                if sweep and marker == st.swept_marker:
                    st.checked = st.swept = started  # no text can have changed since the sweep
                    return st
                if not sweep and marker == st.marker:
                    st.checked = started
                    return st
            if st.checked is None and not force and self._start_from_snapshot(user_id, st):
                st.checked = st.swept = started  # the snapshot's texts were checked (_stale)
                st.marker = st.swept_marker = marker
                st.slots = view
                return st
            noted = None if sweep or marker is None else self._written(user_id, st, view)
            if noted is not None:  # what the slots list: O(changes), edits included
                self._catch_up(user_id, st, sorted(i for i in noted if GRAPH_NOTE not in i))
                st.checked, st.marker, st.slots = started, marker, view
                return st
            changed: dict[str, str] = {}
            if sweep:
                texts = self._documents(user_id, None)
                remote: set[str] = set(texts)
                changed = {i: t for i, t in texts.items() if st.versions.get(i) != _digest(t)}
            else:
                remote = self._remote_ids(user_id)
                for part in chunks(sorted(remote - st.versions.keys())):
                    changed.update(self._documents(user_id, part))
            gone = [i for i in st.versions if i not in remote]
            if gone:
                self._cache_delete(user_id, st, gone)
            if changed:
                self._cache_add(user_id, st, list(changed), list(changed.values()))
            st.checked, st.marker, st.slots = started, marker, view
            if sweep:
                st.swept, st.swept_marker = started, marker
            return st

    def _catch_up(self, user_id: str, st: UserSync, ids: Sequence[str]) -> None:
        """Index the server's texts of ``ids`` anew where they changed, and drop those it no
        longer has."""
        texts: dict[str, str] = {}
        for part in chunks(ids):
            texts.update(self._documents(user_id, part))
        gone = [i for i in ids if i not in texts and i in st.versions]
        if gone:
            self._cache_delete(user_id, st, gone)
        changed = {i: t for i, t in texts.items() if st.versions.get(i) != _digest(t)}
        if changed:
            self._cache_add(user_id, st, list(changed), list(changed.values()))

    # -- text snapshots (see hybridmem.replica.snapshot) -----------------------------------------
    def _start_from_snapshot(self, user_id: str, st: UserSync) -> bool:
        """A first look at the user from the text snapshot: its texts, less those the server
        dropped or changed since, plus the documents it lacks. False (nothing done) when there is
        no usable snapshot: the caller sweeps."""
        got = self._read_texts(user_id)
        if got is None:
            return False
        remote = self._remote_ids(user_id)
        gone = [i for i in st.versions if i not in remote]  # own writes before this first look
        if gone:
            self._cache_delete(user_id, st, gone)
        kept = {i: e for i, e in got.entries.items() if i in remote}
        fetch = (remote - kept.keys()) | self._stale(user_id, kept)
        for i in fetch:
            kept.pop(i, None)
        texts = {i: t for i, (_, t) in kept.items()}
        for part in chunks(sorted(fetch)):
            texts.update(self._documents(user_id, part))
        texts = {i: t for i, t in texts.items() if st.versions.get(i) != _digest(t)}
        if texts:
            self._cache_add(user_id, st, list(texts), list(texts.values()))
        st.texts = got
        log.debug("lexical cache: %d texts from snapshot %s, %d fetched", len(kept), got.snap,
                  len(fetch))
        return True

    def _keep_texts(self, user_id: str, st: UserSync, ids: Sequence[str]) -> None:
        """After an own write of ``ids`` (under the lease): a snapshot that holds one of them is
        rewritten at once without it (its text was deleted or replaced: no copy may outlive it,
        so a failure here fails the write, which the journal then finishes); otherwise a new
        snapshot is stored when enough was written since the last (a failure is logged: a
        snapshot only saves work)."""
        st.since_texts += len(ids)
        current = self._current_texts(user_id, st)
        if current is False:  # a head this process cannot read: it may hold the ids
            self._on_snapshots(user_id, "delete the text snapshot", snapshot.drop_texts)
            st.texts = None
            return
        held = [i for i in ids if current is not None and i in current.entries]
        if current is not None and held:
            self._write_texts(user_id, st, {
                i: e for i, e in current.entries.items() if i not in held})
            return
        if not snapshot.due(st.since_texts, len(current.entries) if current else 0,
                            minimum=TEXTS_TAIL, share=TEXTS_SHARE):
            return
        try:
            self._write_texts(user_id, st, self._rebuilt(user_id, current))
        except StorageError as exc:
            log.warning("text snapshot not stored (%s); first looks fetch more documents", exc)
            return
        st.since_texts = 0

    def _current_texts(self, user_id: str,
                       st: UserSync) -> snapshot.Texts | None | Literal[False]:
        """The server's current text snapshot (read only when it is not the one this process
        knows); None when there is none, False when there is one that cannot be read."""
        snap = self._on_snapshots(user_id, "read the text snapshot", snapshot.texts_head)
        if snap is None:
            st.texts = None
            return None
        if st.texts is None or st.texts.snap != snap:
            st.texts = self._read_texts(user_id)
            if st.texts is None or st.texts.snap != snap:
                return False
        return st.texts

    def _rebuilt(self, user_id: str, current: snapshot.Texts | None) -> dict[str, tuple[str, str]]:
        """Every text of the user with its hash, as the server has it now: the snapshot's
        entries checked as a first look checks them, and the rest fetched (everything when there
        is no snapshot)."""
        remote = self._remote_ids(user_id)
        kept = {} if current is None else {
            i: e for i, e in current.entries.items() if i in remote}
        for i in self._stale(user_id, kept):
            del kept[i]
        fetched: dict[str, str] = {}
        if current is None:
            fetched = self._documents(user_id, None)
        else:
            for part in chunks(sorted(remote - kept.keys())):
                fetched.update(self._documents(user_id, part))
        kept.update((i, (text_hash(t), t)) for i, t in fetched.items())
        return kept

    def _stale(self, user_id: str, entries: Mapping[str, tuple[str, str]]) -> set[str]:
        """The ids among ``entries`` whose document on the server has a text hash other than the
        entry's: one request per chunk of ids, each asking for the chunk's records whose
        ``text_hash`` is none of the chunk's hashes. (A text changed to exactly the text of
        another memory of the same chunk keeps a known hash and is not found; the next sweep
        re-indexes it.)"""
        found: set[str] = set()
        ids = sorted(entries)
        for lo in range(0, len(ids), STALE_CHUNK):
            part = ids[lo : lo + STALE_CHUNK]
            among: dict[Literal["$in", "$nin"], list[str | int | float | bool]] = {
                "$nin": sorted({entries[i][0] for i in part})}
            where: Where = {"text_hash": among}
            for got in self._each(user_id, "check the text snapshot",
                                  lambda c: c.get(ids=part, where=where, include=[])):
                found.update(got["ids"])
        return found

    def _read_texts(self, user_id: str) -> snapshot.Texts | None:
        try:
            return self._on_snapshots(user_id, "read the text snapshot", snapshot.read_texts)
        except StorageError as exc:
            log.warning("text snapshot of a user not read (%s); fetching every document", exc)
            return None

    def _write_texts(self, user_id: str, st: UserSync,
                     entries: dict[str, tuple[str, str]]) -> None:
        snap = snapshot.new_id()
        self._on_snapshots(user_id, "store the text snapshot",
                           lambda c: snapshot.write_texts(c, snap, entries), create=True)
        st.texts = snapshot.Texts(snap=snap, entries=entries)

    def _on_snapshots(self, user_id: str, what: str, call: Callable[[Collection], T], *,
                      create: bool = False) -> T | None:
        """``call`` on the user's snapshot collection (shared with the graph's snapshot); None
        when it does not exist and ``create`` is false."""
        made: _chroma.CollectionMeta = {
            "user_id": user_id, "kind": "hybridmem-graph-snapshot", "schema": snapshot.SCHEMA}
        return self._handles.run(_chroma.collection_name(user_id, "snapshot"), call,
                                 user_id=user_id, what=what, create=made if create else None)

    def _remote_ids(self, user_id: str) -> set[str]:
        """The ids of the user's documents in both collections (the cheapest listing)."""
        return {i for got in self._each(user_id, "list the memories", lambda c: c.get(include=[]))
                for i in got["ids"]}

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
        """Drop this process's cache of the user and the user's text snapshot (the vector store
        drops the documents; the graph store drops the whole snapshot collection, but a text
        snapshot holds texts, so it goes here whatever graph store the user has)."""
        st = self._state(user_id)
        with st.lock:
            self._on_snapshots(user_id, "delete the text snapshot", snapshot.drop_texts)
            self._index.drop_user(user_id)
            self._handles.forget(self._name_of(user_id))
            self._handles.forget(_chroma.collection_name(user_id, "archive"))
            self._handles.forget(_chroma.collection_name(user_id, "snapshot"))
            st.versions.clear()
            st.checked = st.swept = None
            st.texts, st.since_texts = None, 0

    def close(self) -> None:
        """Close and delete the cache; idempotent."""
        if self._close():
            self._index.close()
            self._dir.cleanup()
