"""The lexical index in server mode: a per-process FTS5 cache of the documents that the Chroma
server already holds, so the texts have no second copy to keep consistent.

- :class:`ChromaLexicalIndex` — the :class:`~hybridmem.protocols.LexicalIndex` of server mode;
  its docstring says how the cache follows the server (checks of ids, sweeps of texts).

Separate from :mod:`hybridmem.replica.graph` because it follows other records (the documents of
the main and archive collections, not graph records) into another kind of cache; how both
follow the server is :mod:`hybridmem.replica.sync`'s.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from hybridmem.chroma import client as _chroma
from hybridmem.errors import ConfigError, StorageError
from hybridmem.chroma.follow import aged, noted_texts, written_since
from hybridmem.protocols import WriteSlot
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
#: a fortieth of the snapshot if more (see snapshot.due), as for the graph: a first look
#: fetches about this many documents at most, and a tail of 500 added ~0.1 s to a first
#: context() at 5k memories (an eighth of the snapshot would spare a 10k user's add_many a
#: text snapshot every other batch, ~0.3 s, and cost first reads about as much).
TEXTS_TAIL = 256
TEXTS_SHARE = 40
#: Snapshot entries per :meth:`ChromaLexicalIndex._stale` request: two SQL variables each, well
#: under SQLite's 32,766 per statement.
STALE_CHUNK = 5000


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
    re-indexes those whose text hash changed (10k documents: ~0.8 s).

    **Text snapshots.** A process's first look at a user starts from the user's *text snapshot*
    (:func:`hybridmem.replica.snapshot.read_texts`: the index file of the process that stored
    it, with every memory id and text hash, compressed in the user's snapshot collection) instead
    of fetching and indexing every document: it loads the file as it is
    (:meth:`~hybridmem.sqlite.lexical.SqliteLexicalIndex.load`) and fetches the documents that
    the lease slots noted after the snapshot's lease
    (:func:`~hybridmem.chroma.follow.written_since`); when the slots cannot say, it lists the ids
    and asks the server which memories carry a text hash other than the snapshot's
    (:meth:`_stale`). Writers keep the snapshot: a write that deletes or rewrites a memory the
    snapshot holds rewrites it at once (a forgotten or edited text leaves no copy), and after
    :data:`TEXTS_TAIL` texts (or a fortieth of the snapshot) written since the last one, a new
    one is stored when the lease ends (:meth:`settle`). A snapshot is the writer's own index
    file once it has caught up with every other process's writes: no document is read to make
    it.
    """

    def __init__(self, *, client: ClientAPI | _chroma.CollectionHandles | None = None,
                 url: str | None = None,
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
        st.versions.update(zip(ids, map(text_hash, texts)))

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

    def preload(self, user_id: str) -> None:
        """Make the first look at the user now unless it was made (see
        :class:`~hybridmem.protocols.Preloading`): context() starts it while it asks which
        sections the user has, so its search finds the cache loaded."""
        if self._state(user_id).checked is None:
            self._sync(user_id)

    def refresh(self, user_id: str) -> None:
        """Compare every document with the server now (a sweep), whatever the intervals."""
        self._sync(user_id, force=True)

    def _sync(self, user_id: str, *, force: bool = False, now: bool = False) -> UserSync:
        """Check the cache against the server when due: at most every ``refresh_interval``
        (``now``: at once, to be exact before a snapshot is made of it) through the lease notes,
        and every ``sweep_interval`` (``force``: at once) by comparing every text."""
        st = self._state(user_id)
        with st.lock:
            started = time.monotonic()
            sweep = force or st.swept is None or (
                not now and started - st.swept >= self.sweep_interval)
            if not now and not sweep and not self._due(st, False):
                return st
            # unchanged: nobody wrote since (see replica.sync)
            marker, view = self._look(user_id, fresh=force or now)
            if marker is not None and st.checked is not None and not force:
                if sweep and marker == st.swept_marker:
                    st.checked = st.swept = started  # no text can have changed since the sweep
                    return st
                if not sweep and marker == st.marker:
                    st.checked = started
                    return st
            if st.checked is None and not force and self._start_from_snapshot(user_id, st, view):
                st.checked = st.swept = started  # the snapshot's texts are checked (see there)
                st.marker = st.swept_marker = marker
                st.slots = view
                return st
            noted = None if sweep or marker is None else self._written(user_id, st, view)
            if noted is None and now:  # exact, edits included: compare every text
                sweep = True
            if noted is not None:  # what the slots list: O(changes), edits included
                self._catch_up(user_id, st, sorted(noted_texts(noted)))
                st.checked, st.marker, st.slots = started, marker, view
                return st
            changed: dict[str, str] = {}
            if sweep:
                texts = self._documents(user_id, None)
                remote: set[str] = set(texts)
                changed = {i: t for i, t in texts.items() if st.versions.get(i) != text_hash(t)}
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
        longer has. The texts of ids the cache holds are fetched only if their text hash
        changed (:meth:`_stale`, after a listing of which of them exist): a lease notes every
        memory it wrote, and most of those writes change fields, not texts (access counts: a
        process that answered 90 contexts notes ~2,000 memories as it closes, whose documents
        a fresh process's first look fetched, 0.13 s at 5k, for nothing)."""
        held = {i: st.versions[i] for i in ids if i in st.versions}
        fetch = [i for i in ids if i not in st.versions]
        if held:
            there = self._existing(user_id, sorted(held))
            gone = [i for i in held if i not in there]
            if gone:
                self._cache_delete(user_id, st, gone)
            fetch += sorted(self._stale(user_id, {i: h for i, h in held.items() if i in there}))
        texts: dict[str, str] = {}
        for part in chunks(fetch):
            texts.update(self._documents(user_id, part))
        gone = [i for i in fetch if i not in texts and i in st.versions]
        if gone:
            self._cache_delete(user_id, st, gone)
        changed = {i: t for i, t in texts.items() if st.versions.get(i) != text_hash(t)}
        if changed:
            self._cache_add(user_id, st, list(changed), list(changed.values()))

    def _existing(self, user_id: str, ids: Sequence[str]) -> set[str]:
        """Those of ``ids`` the server holds (ids only: the cheapest read by id)."""
        return self._found(user_id, ids, lambda part: None)

    def _found(self, user_id: str, ids: Sequence[str],
               where: Callable[[Sequence[str]], Where | None]) -> set[str]:
        """Those of ``ids`` the server holds that match ``where(chunk)``, asked in chunks of
        :data:`STALE_CHUNK` ids (ids come back, nothing else)."""
        found: set[str] = set()
        for lo in range(0, len(ids), STALE_CHUNK):
            part, cond = list(ids[lo : lo + STALE_CHUNK]), where(ids[lo : lo + STALE_CHUNK])
            for got in self._each(user_id, "check the cached texts",
                                  lambda c: c.get(ids=part, where=cond, include=[])):
                found.update(got["ids"])
        return found

    # -- text snapshots (see hybridmem.replica.snapshot) -----------------------------------------
    def _start_from_snapshot(self, user_id: str, st: UserSync,
                             view: dict[int, WriteSlot] | None) -> bool:
        """A first look at the user from the text snapshot: its index file loaded as it is,
        then what changed since it was written fetched — what the lease slots noted from the
        slot it was written under on (``view``), or, when the slots cannot say, the memories
        whose ids or text hashes differ from the snapshot's. This process's own writes before
        this look are fetched again (the loaded file replaced them). False (nothing left in the
        cache) when there is no usable snapshot: the caller sweeps."""
        got = self._read_texts(user_id)
        if got is None:
            return False
        own = list(st.versions)
        st.versions.clear()
        if not self._index.load(user_id, got.index):
            log.warning("ignoring text snapshot %s: not a lexical index file", got.snap)
            return False
        st.versions.update(got.hashes)
        noted = None
        if got.at is not None and view is not None and self._log is not None:
            noted = written_since(self._log, user_id, got.at, view)
        if noted is None:
            remote = self._remote_ids(user_id)
            kept = {i: h for i, h in got.hashes.items() if i in remote}
            noted = (remote ^ got.hashes.keys()) | self._stale(user_id, kept)
        fetch = sorted(noted_texts(noted).union(own))
        self._catch_up(user_id, st, fetch)
        st.texts = snapshot.Texts(snap=got.snap, hashes=got.hashes, at=got.at)
        log.debug("lexical cache: %d texts from snapshot %s, %d fetched", len(got.hashes),
                  got.snap, len(fetch))
        return True

    def _keep_texts(self, user_id: str, st: UserSync, ids: Sequence[str]) -> None:
        """After an own write of ``ids`` (under the lease): a snapshot that holds one of them is
        rewritten at once without it (its text was deleted or replaced: no copy may outlive it,
        so a failure here fails the write, which the journal then finishes); otherwise a new
        snapshot is owed when enough was written since the last, and stored when the lease
        ends (:meth:`settle`; at once without a write log to name the lease)."""
        st.since_texts += len(ids)
        if st.checked is None:  # a first look, from the snapshot: what it holds is then known
            self._sync(user_id)
        current = self._current_texts(user_id, st)
        if current is False:  # a head this process cannot read: it may hold the ids
            self._on_snapshots(user_id, "delete the text snapshot", snapshot.drop_texts)
            st.texts = None
            return
        if current is not None and any(i in current.hashes for i in ids):
            self._write_texts(user_id, st, final=False)
            return
        st.owed = snapshot.due(st.since_texts, len(current.hashes) if current else 0,
                               minimum=TEXTS_TAIL, share=TEXTS_SHARE)
        if st.owed and self._log is None:
            self.settle(user_id)

    def settle(self, user_id: str) -> None:
        """The user's lease ends after its last write: store the text snapshot if one is owed
        (see :class:`~hybridmem.protocols.Settling`), or if the one this process knows was
        written :data:`~hybridmem.protocols.SNAPSHOT_AGE` leases ago (see
        :func:`~hybridmem.chroma.follow.aged`: leases that write no text, such as access
        counts, would otherwise leave its lease slot to be tidied away). Made now, it lacks
        nothing this lease wrote, so a first look from it fetches only what later leases
        noted."""
        st = self._state(user_id)
        with st.lock:
            renew = st.texts is not None and st.checked is not None and self._log is not None \
                and aged(self._log, user_id, st.texts.at)
            if not (st.owed or renew):
                return
            try:
                self._write_texts(user_id, st, final=True)
            except StorageError as exc:
                log.warning("text snapshot not stored (%s); first looks fetch more documents",
                            exc)

    def _current_texts(self, user_id: str,
                       st: UserSync) -> snapshot.Texts | None | Literal[False]:
        """The server's current text snapshot (read only when it is not the one this process
        knows); None when there is none, False when there is one that cannot be read."""
        snap = self._on_snapshots(user_id, "read the text snapshot", snapshot.texts_head)
        if snap is None:
            st.texts = None
            return None
        if st.texts is None or st.texts.snap != snap:
            got = self._read_texts(user_id)
            if got is None or got.snap != snap:
                return False
            st.texts = snapshot.Texts(snap=got.snap, hashes=got.hashes, at=got.at)
        return st.texts

    def _stale(self, user_id: str, hashes: Mapping[str, str]) -> set[str]:
        """The ids among ``hashes`` whose document on the server has a text hash other than
        theirs: one request per chunk of ids, each asking for the chunk's records whose
        ``text_hash`` is none of the chunk's hashes. (A text changed to exactly the text of
        another memory of the same chunk keeps a known hash and is not found; the next sweep
        re-indexes it.)"""
        def where(part: Sequence[str]) -> Where:
            among: dict[Literal["$in", "$nin"], list[str | int | float | bool]] = {
                "$nin": sorted({hashes[i] for i in part})}
            return {"text_hash": among}

        return self._found(user_id, sorted(hashes), where)

    def _read_texts(self, user_id: str) -> snapshot.Texts | None:
        try:
            return self._on_snapshots(user_id, "read the text snapshot", snapshot.read_texts)
        except StorageError as exc:
            log.warning("text snapshot of a user not read (%s); fetching every document", exc)
            return None

    def _write_texts(self, user_id: str, st: UserSync, *, final: bool) -> None:
        """Store this process's index of the user as the text snapshot, once it has every
        other process's writes, naming the lease held now and whether this lease writes
        nothing more (see :func:`~hybridmem.chroma.follow.written_since`)."""
        self._sync(user_id, now=True)
        image = self._index.dump(user_id)
        if image is None:  # nothing was ever indexed here: no snapshot holds anything either
            self._on_snapshots(user_id, "delete the text snapshot", snapshot.drop_texts)
            st.texts, st.since_texts, st.owed = None, 0, False
            return
        held = self._log.holding(user_id) if self._log is not None else None
        at = None if held is None else (*held, final)
        snap = snapshot.new_id()
        made = snapshot.Texts(snap=snap, hashes=dict(st.versions), index=image, at=at)
        self._on_snapshots(user_id, "store the text snapshot",
                           lambda c: snapshot.write_texts(c, snap, made), create=True)
        st.texts = snapshot.Texts(snap=snap, hashes=made.hashes, at=at)
        st.since_texts, st.owed = 0, False

    def _on_snapshots(self, user_id: str, what: str, call: Callable[[Collection], T], *,
                      create: bool = False) -> T | None:
        """``call`` on the user's snapshot collection (shared with the graph's snapshot); None
        when it does not exist and ``create`` is false."""
        made = snapshot.collection_meta(user_id)
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
            st.texts, st.since_texts, st.owed = None, 0, False

    def close(self) -> None:
        """Close and delete the cache; idempotent."""
        if self._close():
            self._index.close()
            self._dir.cleanup()
