"""SqliteLexicalIndex: a persistent per-user full-text index ranked by SQLite FTS5's ``bm25()``.

One small SQLite file per user (``users/<hash>/lexical.sqlite3``), Porter-stemmed, so forgetting a
user deletes one file and no other user's rows ever share a page with theirs. Queries are the
question's content words (:func:`hybridmem.text.content_words`) OR-ed together: FTS5's BM25 weighs
rare words up and common ones down.

Documents are indexed in their :func:`hybridmem.text.normalise` form, the form query words are
taken from, so both sides fold case, width and "ß" alike (FTS5's own folding leaves "Straße" and
full-width letters apart from what the query normaliser makes of them).

Deleting or replacing a text is physical: FTS5 keeps a deleted document's tokens in its index
segments until they merge, so every delete is followed by ``optimize`` (which merges them, in the
same transaction), and the connection's ``secure_delete`` zeroes the pages it frees. (FTS5's own
``secure-delete`` option needs SQLite 3.42; ``optimize`` works everywhere and costs a rewrite of
one user's index.)

A user's index is also held in memory once searching them through FTS5 has cost about what
building the copy costs (:mod:`hybridmem.sqlite.bm25`: the same postings and exactly FTS5's scores,
without FTS5's cost of one ranking call per matching row: 43 → 2.4 ms a query at 100k memories).
That is the ski-rental rule: a user searched a few times per stay in the LRU never pays a build
that would not pay back, and a user searched often pays at most about twice what the best choice
in hindsight would have cost. The build cost is estimated per indexed row and re-measured at each
build (10k memories 0.07-0.3 s, 100k 1.1-2.6 s). The copy is built from the file under the
user's lock (that user's calls wait for it: a build in a background thread would hold a read lock
on the file just as long, and with the rollback journal a writer waits for that lock anyway),
kept current by this store's own writes, and dropped with the user's connection or when another
connection changed the file (``PRAGMA data_version``). A one-shot process (the CLI's ``search``)
searches once and never builds it.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Sequence
from typing import NamedTuple

from hybridmem.sqlite.bm25 import TOKENIZE, TermIndex, Tokenizer
from hybridmem.runtime.files import user_dir, user_key
from hybridmem.sqlite.base import PerUserSqlite, storage_error
from hybridmem.errors import ClosedError, InvalidInputError, StorageError
from hybridmem.text import content_words, normalise

__all__ = ["FILE_NAME", "SqliteLexicalIndex"]

FILE_NAME = "lexical.sqlite3"
#: What building a user's in-memory copy is assumed to cost per indexed row, in seconds, until a
#: build in this process has measured it (measured on a 2-core machine: 7-11 µs a row).
BUILD_SECONDS_PER_ROW = 1e-5
_SEARCH = "SELECT id, -bm25(docs) AS s FROM docs WHERE docs MATCH ? ORDER BY s DESC LIMIT ?"


class _Copy(NamedTuple):
    conn: sqlite3.Connection  # the connection it was built on and is kept current through
    version: int  # that connection's PRAGMA data_version then: another writer changes it
    terms: TermIndex


class SqliteLexicalIndex(PerUserSqlite):
    """The default :class:`~hybridmem.protocols.LexicalIndex`: FTS5 per user. Thread-safe (one
    lock, connections cached per user). ``in_memory=False`` leaves every query to FTS5."""

    file_name = FILE_NAME
    what = "lexical index"
    schema = (
        "CREATE VIRTUAL TABLE IF NOT EXISTS docs USING fts5("
        f"id UNINDEXED, text, tokenize='{TOKENIZE}')",
        # FTS5 cannot index ``id``: deleting by it would scan every row, so map id -> rowid
        "CREATE TABLE IF NOT EXISTS ids (id TEXT PRIMARY KEY, docid INTEGER)",
    )

    def __init__(self, data_dir: str | os.PathLike[str], *, timeout: float = 5.0,
                 max_open: int = 128, in_memory: bool = True,
                 build_seconds_per_row: float | None = None) -> None:
        super().__init__(data_dir, timeout=timeout, max_open=max_open)
        self._in_memory = in_memory
        self._measure = build_seconds_per_row is None
        self._per_row = BUILD_SECONDS_PER_ROW if build_seconds_per_row is None \
            else build_seconds_per_row
        self._tokenizer = Tokenizer()
        # guarded by self._lock, like the connections; both go with the user's connection
        self._copies: dict[str, _Copy] = {}
        self._spent: dict[str, float] = {}  # seconds FTS5 spent on the user's searches
        self._shape: list[tuple[str, ...]] | None = None  # see _tables

    def add(self, user_id: str, ids: Sequence[str], texts: Sequence[str]) -> None:
        """Index texts under their memory ids (replacing earlier text of the same id)."""
        if len(ids) != len(texts):
            raise InvalidInputError(f"{len(ids)} ids but {len(texts)} texts")
        if len(set(ids)) != len(ids):
            raise InvalidInputError("a memory id appears twice in one batch")
        if not ids:
            return
        docs = [(memory_id, normalise(text)) for memory_id, text in zip(ids, texts)]
        rowids: list[int] = []

        def work(conn: sqlite3.Connection) -> None:
            rowids.clear()
            replaced = _delete(conn, ids)
            for memory_id, doc in docs:
                cursor = conn.execute("INSERT INTO docs(id, text) VALUES (?, ?)", (memory_id, doc))
                conn.execute(
                    "INSERT INTO ids(id, docid) VALUES (?, ?)", (memory_id, cursor.lastrowid)
                )
                rowids.append(int(cursor.lastrowid or 0))
            if replaced:
                _optimize(conn)

        with self._user(user_id):
            self._write(user_id, "index memories", work)
            copy = self._copy(user_id)
            if copy is not None:
                tokens = self._tokenizer.tokens([doc for _, doc in docs])
                copy.terms.delete(ids)
                copy.terms.add([(r, i, t) for r, (i, _), t in zip(rowids, docs, tokens)])

    def delete(self, user_id: str, ids: Sequence[str]) -> None:
        """Remove memory ids from the index (unknown ids are ignored)."""
        if not ids:
            return

        def work(conn: sqlite3.Connection) -> None:
            if _delete(conn, ids):
                _optimize(conn)

        with self._user(user_id):
            self._write(user_id, "update the index", work, create=False)
            copy = self._copy(user_id)
            if copy is not None:
                copy.terms.delete(ids)

    # -- the index file as bytes: a server-mode cache ships it (hybridmem.replica.lexical) ----
    def dump(self, user_id: str) -> bytes | None:
        """The user's index file (None when the user has none): read under the user's lock,
        between transactions, when the file is whole (a rollback journal writes every page into
        it at commit). Deleted texts are not in it (see the module docstring)."""
        with self._user(user_id):
            if self._conn(user_id, create=False) is None:
                return None
            path = user_dir(self._data_dir, user_id, create=False) / self.file_name
            try:
                return path.read_bytes()
            except OSError as exc:
                raise StorageError(f"could not read the {self.what} {path}: {exc}") from exc

    def load(self, user_id: str, image: bytes) -> bool:
        """Replace the user's index with ``image`` (a :meth:`dump`); False, and no index left
        for the user, when it is not a database of exactly this index's tables. Why the check:
        the image comes from a shared server, and a file with other tables, triggers or views
        is refused, not trusted."""
        key = user_key(user_id)
        with self._user(user_id):
            with self._lock:
                if self._closed:
                    raise ClosedError(
                        f"the {self.what} is closed; create a new {type(self).__name__}")
                conn = self._conns.pop(key, None)
                self._closed_conn(key)
            if conn is not None:
                conn.close()
            folder = user_dir(self._data_dir, user_id, create=True)
            path, loading = folder / self.file_name, folder / (self.file_name + ".load")
            try:
                (folder / (self.file_name + "-journal")).unlink(missing_ok=True)
                loading.write_bytes(image)
                os.replace(loading, path)
            except OSError as exc:
                raise StorageError(f"could not write the {self.what} {path}: {exc}") from exc
            try:
                conn = self._conn(user_id)
                ok = conn is not None and _tables(conn) == self._tables() \
                    and conn.execute("PRAGMA quick_check").fetchone() == ("ok",)
            except (sqlite3.Error, StorageError):
                ok = False
            if not ok:
                self.drop_user(user_id)
            return ok

    def _tables(self) -> list[tuple[str, ...]]:
        """What :func:`_tables` finds in a new index of this schema."""
        if self._shape is None:
            conn = sqlite3.connect(":memory:")
            try:
                for statement in self.schema:
                    conn.execute(statement)
                self._shape = _tables(conn)
            finally:
                conn.close()
        return self._shape

    def refresh(self, user_id: str) -> None:
        """Nothing to catch up with: every process reads the same file, SQLite keeps it current."""

    def search(self, user_id: str, query: str, *, limit: int) -> list[tuple[str, float]]:
        """(memory id, score) best first; score is ``-bm25()`` so that higher is better."""
        words = content_words(query)
        if not words:
            return []
        with self._user(user_id):
            conn = self._conn(user_id, create=False)
            if conn is None:
                return []
            try:
                index = self._searched(user_id, conn)
                if index is not None:
                    terms = self._tokenizer.tokens(words)
                    if all(len(t) == 1 for t in terms):  # else: phrases, FTS5's business
                        return index.search([t[0] for t in terms], limit)
                match = " OR ".join('"' + w.replace('"', '""') + '"' for w in words)
                started = time.perf_counter()
                rows = conn.execute(_SEARCH, (match, limit)).fetchall()
                self._spend(user_id, time.perf_counter() - started)
            except sqlite3.Error as exc:
                raise storage_error(exc, f"search the index of {user_id!r}") from exc
        return [(str(i), float(s)) for i, s in rows]

    # -- the in-memory copy (call with the user's lock held) ------------------------------------
    def _copy(self, user_id: str) -> _Copy | None:
        """The user's in-memory copy if it is still exact, else None (and it is dropped)."""
        key = user_key(user_id)
        with self._lock:
            copy = self._copies.get(key)
            conn = self._conns.get(key)
        if copy is None:
            return None
        if (copy.conn is conn and not copy.terms.stale
                and conn.execute("PRAGMA data_version").fetchone()[0] == copy.version):
            return copy
        with self._lock:
            self._copies.pop(key, None)
        return None

    def _searched(self, user_id: str, conn: sqlite3.Connection) -> TermIndex | None:
        """The copy to answer this search: the one kept, or one built now if FTS5 has already
        spent on this user what the build is estimated to cost; None for FTS5 to answer."""
        copy = self._copy(user_id)
        if copy is not None or not self._in_memory:
            return copy.terms if copy is not None else None
        key = user_key(user_id)
        with self._lock:
            spent = self._spent.get(key)
        if spent is None:  # the first search: FTS5's
            return None
        (rows,) = conn.execute("SELECT coalesce(max(rowid), 0) FROM docs_content").fetchone()
        if spent < self._per_row * rows:
            return None
        version = conn.execute("PRAGMA data_version").fetchone()[0]
        started = time.perf_counter()
        index = TermIndex.build(conn)
        took = time.perf_counter() - started
        with self._lock:
            self._copies[key] = _Copy(conn, version, index)
            self._spent.pop(key, None)
            if self._measure and rows:
                self._per_row = took / rows
        return index

    def _spend(self, user_id: str, seconds: float) -> None:
        """Add what an FTS5 search of the user cost to what the copy's build is weighed against."""
        key = user_key(user_id)
        with self._lock:
            if key in self._conns:  # else the connection is gone, and what it spent with it
                self._spent[key] = self._spent.get(key, 0.0) + seconds

    def _closed_conn(self, key: str) -> None:
        self._copies.pop(key, None)
        self._spent.pop(key, None)

    def close(self) -> None:
        """Close every connection and drop the in-memory copies; idempotent."""
        super().close()
        self._tokenizer.close()


def _tables(conn: sqlite3.Connection) -> list[tuple[str, ...]]:
    """Every table, index, trigger and view of the database, with its SQL."""
    rows = conn.execute("SELECT type, name, tbl_name, coalesce(sql, '') FROM sqlite_master "
                        "ORDER BY type, name").fetchall()
    return [tuple(str(v) for v in row) for row in rows]


def _delete(conn: sqlite3.Connection, ids: Sequence[str]) -> int:
    """Delete memory ids from the index through the id map (inside the caller's transaction);
    returns how many were there. Their tokens stay in the index segments until :func:`_optimize`."""
    deleted = 0
    for memory_id in ids:
        row = conn.execute("SELECT docid FROM ids WHERE id = ?", (memory_id,)).fetchone()
        if row is not None:
            conn.execute("DELETE FROM docs WHERE rowid = ?", (row[0],))
            conn.execute("DELETE FROM ids WHERE id = ?", (memory_id,))
            deleted += 1
    return deleted


def _optimize(conn: sqlite3.Connection) -> None:
    """Merge the index segments into one, so deleted documents leave no tokens behind."""
    conn.execute("INSERT INTO docs(docs) VALUES ('optimize')")
