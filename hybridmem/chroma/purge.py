"""Physical erasure in embedded Chroma's SQLite file: what a forgotten memory leaves behind, gone.

Embedded Chroma deletes rows logically: a deleted record's text stays in free pages of
``chroma.sqlite3``, in its write-ahead log of applied operations and in the full-text index's
segments, and a dropped collection's HNSW folder stays on disk. :func:`purge_embedded` blanks
the applied log, merges the full-text index, VACUUMs the file and removes the folders of
collections that no longer exist. A Chroma server manages its own files: there its operator
compacts them.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
from pathlib import Path

from hybridmem.errors import StorageError

__all__ = ["purge_embedded"]

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def purge_embedded(path: Path) -> None:
    """Make deletions and replaced texts physical in the embedded Chroma store at ``path``.

    Where embedded Chroma keeps a deleted or overwritten document, and what is done about it:

    1. its write-ahead log (``embeddings_queue``) keeps every write's document and metadata until
       the vector index persists (every ~1000 writes); once the metadata segment has applied a
       write, the log is kept only so the vector index can replay the vector, so the document
       and metadata of applied writes are blanked to ``{}`` (what Chroma itself writes for a
       record without them);
    2. its trigram full-text index keeps postings of deleted documents until its segments merge:
       ``optimize`` merges them;
    3. SQLite keeps deleted rows in free pages and in the free space of pages (Chroma's connection
       does not use ``secure_delete``): VACUUM rewrites the file without them;
    4. segment folders no collection uses any more are removed.
    """
    db = path / "chroma.sqlite3"
    if not db.exists():
        return
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
    for child in path.iterdir():
        if child.is_dir() and _UUID.match(child.name) and child.name not in live:
            shutil.rmtree(child, ignore_errors=True)


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
