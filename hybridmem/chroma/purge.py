"""Physical erasure in embedded Chroma's SQLite file: what a forgotten memory leaves behind, gone.

Embedded Chroma deletes rows logically: a deleted record's text stays in free pages of
``chroma.sqlite3``, in its write-ahead log of applied operations and in the full-text index's
segments, and a dropped collection's HNSW folder stays on disk. :func:`purge_embedded` blanks
the applied log, merges the full-text index, VACUUMs the file and removes the folders of
collections that no longer exist. A Chroma server manages its own files: there its operator
compacts them.

That rewrite costs time in proportion to the whole file, every user's memories included, so an
erasure does not wait for it: a :class:`Compactor` runs it in the background within a bounded
delay, once for every erasure of that delay, and a marker file (:data:`MARKER`, beside
``chroma.sqlite3``; it names no user) says a purge is owed until one has run, so the store purges
at its next open what a crash left owed.
"""

from __future__ import annotations

import logging
import re
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from hybridmem.errors import StorageError
from hybridmem.runtime.files import atomic_write_bytes

__all__ = ["MARKER", "Compactor", "purge_embedded"]

log = logging.getLogger(__name__)
#: The file beside ``chroma.sqlite3`` that exists while a purge is owed.
MARKER = "purge.pending"

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


class Compactor:
    """Runs ``purge`` on a daemon thread at most ``delay`` seconds after the first erasure it is
    told about, once for all the erasures told meanwhile, and keeps the ``marker`` file while a
    purge is owed.

    - :meth:`owed` wraps an erasure: the marker is written (atomically, fsync'd) before it, no
      purge starts while it runs, and a purge is due ``delay`` seconds after the first erasure
      since the last purge; :meth:`request` does the same for an erasure already done (and
      journaled, so a crash before the marker replays it).
    - A purge covers the erasures that ended before it started; one that ends meanwhile gets
      another. The marker is removed once a purge covered every erasure.
    - The thread starts on first need and never runs after :meth:`close`, which waits for a
      purge in progress; the owner then runs what is owed itself (:meth:`run`).
    - A purge that fails is logged and tried again ``delay`` seconds later (the marker stays).
    - ``delay`` 0, or ``defer()`` False: the purge runs in the erasing call, when the erasure
      ends (the store passes whether it is the only one on its files in this process: another
      store's Chroma calls would not wait for a purge of this one).

    Bound: an erasure is purged at most ``delay`` + one purge after it ends (plus the time a
    purge already running takes); at the latest by :meth:`close` and :meth:`run`, or at the next
    open after a crash.
    """

    def __init__(self, purge: Callable[[], None], *, delay: float, marker: Path,
                 defer: Callable[[], bool] | None = None) -> None:
        self._purge, self._delay, self._marker, self._defer = purge, delay, marker, defer
        self._cond = threading.Condition()
        self._asked = 0  # erasures ended so far
        self._done = 0  # erasures the last successful purge covered
        self._holds = 0  # erasures in progress
        self._due: float | None = None  # when the next purge starts (time.monotonic)
        self._marked = marker.exists()
        self._running = False
        self._closed = False
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"Compactor(delay={self._delay}, pending={self.pending})"

    @property
    def pending(self) -> bool:
        """Whether an erasure awaits its purge (the marker file exists)."""
        with self._cond:
            return self._marked

    @contextmanager
    def owed(self) -> Iterator[None]:
        """Wrap an erasure: marked owed before it, purged within ``delay`` after it."""
        with self._cond:
            if not self._marked:
                atomic_write_bytes(self._marker, b"a purge of erased memories is owed\n")
                self._marked = True
            self._holds += 1
        try:
            yield
        finally:
            with self._cond:
                self._holds -= 1
                self._asked += 1
                if self._due is None:
                    self._due = time.monotonic() + self._delay
                if self._delay > 0 and self._thread is None and not self._closed:
                    self._thread = threading.Thread(target=self._loop, daemon=True,
                                                    name="hybridmem-compactor")
                    self._thread.start()
                self._cond.notify_all()
        if self._delay == 0 or (self._defer is not None and not self._defer()):
            self.run()

    def request(self) -> None:
        """An erasure already done is owed a purge (see :meth:`owed`)."""
        with self.owed():
            pass

    def run(self) -> None:
        """Purge now, after the erasures in progress and a purge already running; raises what
        the purge raises (the marker then stays)."""
        with self._cond:
            self._cond.wait_for(lambda: not self._holds and not self._running)
            self._running = True
            covered = self._asked
        try:
            self._purge()
        finally:
            with self._cond:
                self._running = False
                self._cond.notify_all()
        with self._cond:
            self._done = max(self._done, covered)
            if self._done == self._asked and not self._holds:
                self._due = None
                if self._marked:
                    self._marker.unlink(missing_ok=True)
                    self._marked = False
            else:  # erasures that ended meanwhile: the next window starts now
                self._due = time.monotonic() + self._delay

    def close(self) -> None:
        """Stop the thread (after the purge it is running, if any); idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed:
                    if self._due is not None and not (self._holds or self._running):
                        wait = self._due - time.monotonic()
                        if wait <= 0:
                            break
                        self._cond.wait(wait)
                    else:
                        self._cond.wait()
                if self._closed:
                    return
            try:
                self.run()
            except Exception as exc:  # kept owed: tried again after the delay
                log.warning("purging erased memories failed, retried in %.1f s: %s",
                            self._delay, exc)
                with self._cond:
                    self._due = time.monotonic() + self._delay
