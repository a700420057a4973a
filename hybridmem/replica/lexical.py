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
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from hybridmem.chroma import client as _chroma
from hybridmem.errors import ConfigError
from hybridmem.replica.sync import REFRESH_INTERVAL, ServerCache, UserSync, chunks
from hybridmem.sqlite.lexical import SqliteLexicalIndex
from hybridmem.text import content_words

if TYPE_CHECKING:
    from chromadb.api import ClientAPI
    from chromadb.api.models.Collection import Collection

__all__ = ["ChromaLexicalIndex"]

T = TypeVar("T")


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

    def _sync(self, user_id: str, *, force: bool = False) -> UserSync:
        st = self._state(user_id)
        with st.lock:
            started = time.monotonic()
            sweep = force or st.swept is None or started - st.swept >= self.sweep_interval
            if not sweep and not self._due(st, False):
                return st
            marker = self._marker(user_id, fresh=force)  # unchanged: nobody wrote since (see replica.sync)
            if marker is not None and st.checked is not None and not force:
                if sweep and marker == st.swept_marker:
                    st.checked = st.swept = started  # no text can have changed since the sweep
                    return st
                if not sweep and marker == st.marker:
                    st.checked = started
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
                for part in chunks(sorted(remote - st.versions.keys())):
                    changed.update(self._documents(user_id, part))
            gone = [i for i in st.versions if i not in remote]
            if gone:
                self.delete(user_id, gone)
            if changed:
                self.add(user_id, list(changed), list(changed.values()))
            st.checked, st.marker = started, marker
            if sweep:
                st.swept, st.swept_marker = started, marker
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
