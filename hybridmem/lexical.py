"""SqliteLexicalIndex: a persistent per-user full-text index ranked by SQLite FTS5's ``bm25()``.

One small SQLite file per user (``users/<hash>/lexical.sqlite3``), Porter-stemmed, so forgetting a
user deletes one file and no other user's rows ever share a page with theirs. Queries are the
question's content words OR-ed together: FTS5's BM25 weighs rare words up and common ones down.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence

from hybridmem._sqlite import PerUserSqlite
from hybridmem.errors import StorageError

__all__ = ["SqliteLexicalIndex", "content_words"]

FILE_NAME = "lexical.sqlite3"
_WORD = re.compile(r"\w+", re.UNICODE)
# Function words that match nearly every memory; dropping them keeps OR-queries selective.
STOPWORDS = frozenset(
    """a an and are as at be been but by can could did do does for from had has have he her hers him
    his how i if in into is it its me my of on or our she so than that the their them then there these
    they this to us was we were what when where which who whom why will with would you your yours
    about after all also am any before being both did doing during each few further here just more
    most no nor not now only other over own same should some such too under until up very while""".split()
)


def content_words(text: str) -> list[str]:
    """Lower-cased words of ``text`` without stopwords, first occurrence order, no repeats."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(text.lower()):
        if word not in STOPWORDS and word not in seen:
            seen[word] = None
    return list(seen)


class SqliteLexicalIndex(PerUserSqlite):
    """FTS5 index per user. Thread-safe (one lock, connections cached per user)."""

    file_name = FILE_NAME
    what = "lexical index"
    schema = (
        "CREATE VIRTUAL TABLE IF NOT EXISTS docs USING fts5("
        "id UNINDEXED, text, tokenize='porter unicode61 remove_diacritics 2')",
        # FTS5 cannot index ``id``: deleting by it would scan every row, so map id -> rowid
        "CREATE TABLE IF NOT EXISTS ids (id TEXT PRIMARY KEY, docid INTEGER)",
    )

    def add(self, user_id: str, ids: Sequence[str], texts: Sequence[str]) -> None:
        """Index texts under their memory ids (replacing earlier text of the same id)."""
        if not ids:
            return
        with self._lock:
            conn = self._conn(user_id)
            assert conn is not None
            try:
                conn.execute("BEGIN")
                _delete(conn, ids)
                for memory_id, text in zip(ids, texts):
                    cursor = conn.execute(
                        "INSERT INTO docs(id, text) VALUES (?, ?)", (memory_id, text)
                    )
                    conn.execute("INSERT INTO ids(id, docid) VALUES (?, ?)",
                                 (memory_id, cursor.lastrowid))
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                conn.execute("ROLLBACK")
                raise StorageError(f"could not index memories of {user_id!r}: {exc}") from exc

    def delete(self, user_id: str, ids: Sequence[str]) -> None:
        """Remove memory ids from the index."""
        with self._lock:
            conn = self._conn(user_id, create=False)
            if conn is None or not ids:
                return
            try:
                conn.execute("BEGIN")
                _delete(conn, ids)
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                conn.execute("ROLLBACK")
                raise StorageError(f"could not update the index of {user_id!r}: {exc}") from exc

    def search(self, user_id: str, query: str, *, limit: int) -> list[tuple[str, float]]:
        """(memory id, score) best first; score is ``-bm25()`` so that higher is better."""
        words = content_words(query)
        if not words:
            return []
        match = " OR ".join('"' + w.replace('"', '""') + '"' for w in words)
        with self._lock:
            conn = self._conn(user_id, create=False)
            if conn is None:
                return []
            try:
                rows = conn.execute(
                    "SELECT id, -bm25(docs) AS s FROM docs WHERE docs MATCH ? ORDER BY s DESC LIMIT ?",
                    (match, limit),
                ).fetchall()
            except sqlite3.Error as exc:
                raise StorageError(f"could not search the index of {user_id!r}: {exc}") from exc
        return [(str(i), float(s)) for i, s in rows]


def _delete(conn: sqlite3.Connection, ids: Sequence[str]) -> None:
    """Delete memory ids from the index through the id map (inside the caller's transaction)."""
    for memory_id in ids:
        row = conn.execute("SELECT docid FROM ids WHERE id = ?", (memory_id,)).fetchone()
        if row is not None:
            conn.execute("DELETE FROM docs WHERE rowid = ?", (row[0],))
            conn.execute("DELETE FROM ids WHERE id = ?", (memory_id,))
