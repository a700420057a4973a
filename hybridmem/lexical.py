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
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from hybridmem._sqlite import PerUserSqlite
from hybridmem.errors import InvalidInputError
from hybridmem.text import content_words, normalise

__all__ = ["FILE_NAME", "SqliteLexicalIndex"]

FILE_NAME = "lexical.sqlite3"


class SqliteLexicalIndex(PerUserSqlite):
    """The default :class:`~hybridmem.protocols.LexicalIndex`: FTS5 per user. Thread-safe (one
    lock, connections cached per user)."""

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
        if len(ids) != len(texts):
            raise InvalidInputError(f"{len(ids)} ids but {len(texts)} texts")
        if len(set(ids)) != len(ids):
            raise InvalidInputError("a memory id appears twice in one batch")
        if not ids:
            return
        docs = [(memory_id, normalise(text)) for memory_id, text in zip(ids, texts)]

        def work(conn: sqlite3.Connection) -> None:
            replaced = _delete(conn, ids)
            for memory_id, doc in docs:
                cursor = conn.execute("INSERT INTO docs(id, text) VALUES (?, ?)", (memory_id, doc))
                conn.execute(
                    "INSERT INTO ids(id, docid) VALUES (?, ?)", (memory_id, cursor.lastrowid)
                )
            if replaced:
                _optimize(conn)

        self._write(user_id, "index memories", work)

    def delete(self, user_id: str, ids: Sequence[str]) -> None:
        """Remove memory ids from the index (unknown ids are ignored)."""
        if not ids:
            return

        def work(conn: sqlite3.Connection) -> None:
            if _delete(conn, ids):
                _optimize(conn)

        self._write(user_id, "update the index", work, create=False)

    def refresh(self, user_id: str) -> None:
        """Nothing to catch up with: every process reads the same file, SQLite keeps it current."""

    def search(self, user_id: str, query: str, *, limit: int) -> list[tuple[str, float]]:
        """(memory id, score) best first; score is ``-bm25()`` so that higher is better."""
        words = content_words(query)
        if not words:
            return []
        match = " OR ".join('"' + w.replace('"', '""') + '"' for w in words)
        rows = self._read(
            user_id,
            "search the index",
            "SELECT id, -bm25(docs) AS s FROM docs WHERE docs MATCH ? ORDER BY s DESC LIMIT ?",
            (match, limit),
        )
        return [(str(i), float(s)) for i, s in rows]


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
