"""TermIndex: a user's FTS5 postings in memory (numpy), ranked by exactly FTS5's ``bm25()``.

Why: FTS5 scores every row that matches any word of an OR query, one auxiliary-function call per
row, so the lexical query grows with the user: 0.6 ms at 1k memories, 3.4 ms at 10k and 43 ms at
100k on this project's synthetic users (a query's common words match tens of thousands of rows).
The same postings in numpy arrays score those rows in 0.4 / 0.6 / 2.4 ms.

It is a cache, never the truth: the SQLite file stays the persistent, erasable index, and this
copy is built from it (FTS5's own ``fts5vocab`` instance table, so the tokens are the ones FTS5
made: Porter stemming and Unicode folding included), kept current by the writes that go through
the same store, and dropped when anything else wrote the file. Query words are tokenized by FTS5
too, through an in-memory table with the same tokenizer (:class:`Tokenizer`).

The score is FTS5's ``bm25()`` (``fts5_aux.c``), computed in the same order of floating-point
operations so the results are identical, ties included (FTS5 returns equal scores in rowid
order): for a query of phrases ``p`` over ``N`` rows averaging ``avgdl`` tokens, a row of ``D``
tokens holding ``p`` ``f`` times scores ``sum(idf(p) * ((f * (k1 + 1)) / (f + k1 * (1 - b + b *
D / avgdl))))`` with ``idf(p) = log((N - n(p) + 0.5) / (n(p) + 0.5))`` (``1e-6`` if not
positive), ``k1 = 1.2``, ``b = 0.75``. Deleted rows are masked out and counted off ``N``; when a
quarter of the slots are dead the copy asks to be rebuilt.
"""

from __future__ import annotations

import math
import sqlite3
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

__all__ = ["TOKENIZE", "TermIndex", "Tokenizer"]

#: The tokenizer of the lexical index (hybridmem.sqlite.lexical) and of :class:`Tokenizer`: one spec.
TOKENIZE = "porter unicode61 remove_diacritics 2"
K1, B = 1.2, 0.75
#: Dead slots beyond this share of all slots make :attr:`TermIndex.stale` true.
DEAD_SHARE = 0.25

_I = npt.NDArray[np.int64]
_J = npt.NDArray[np.int32]  # postings: 8 bytes each (100k memories: ~1.8M postings, 14 MB)
_A = TypeVar("_A", bound=npt.NDArray[Any])
_F = npt.NDArray[np.float64]


class Tokenizer:
    """FTS5's tokens of texts, from a private in-memory FTS5 table with the index's tokenizer
    (thread-safe: one lock; a call costs ~0.1 ms)."""

    def __init__(self) -> None:
        self._conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        self._conn.execute(f"CREATE VIRTUAL TABLE t USING fts5(text, tokenize='{TOKENIZE}')")
        self._conn.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance')")
        self._lock = threading.Lock()

    def tokens(self, texts: Sequence[str]) -> list[list[str]]:
        """Each text's tokens in order."""
        out: list[list[str]] = [[] for _ in texts]
        with self._lock:
            self._conn.execute("BEGIN")
            try:
                self._conn.executemany("INSERT INTO t(rowid, text) VALUES (?, ?)",
                                       list(enumerate(texts)))
                for term, doc in self._conn.execute(
                        "SELECT term, doc FROM v ORDER BY doc, offset"):
                    out[doc].append(term)
            finally:
                self._conn.execute("ROLLBACK")  # the table stays empty
        return out

    def close(self) -> None:
        self._conn.close()


class TermIndex:
    """One user's postings: built from the user's FTS5 file (:meth:`build`), then kept current
    by :meth:`add` and :meth:`delete`. Not thread-safe: the lexical store uses it under the
    user's lock."""

    def __init__(self, rowids: _I, ids: Sequence[str], terms: dict[str, int],
                 starts: _I, slots: _J, freqs: _J) -> None:
        self._ids = list(ids)  # slot -> memory id; slots are in rowid order when built
        self._slot = {memory_id: n for n, memory_id in enumerate(self._ids)}
        self._terms, self._starts, self._slots, self._freqs = terms, starts, slots, freqs
        self._more: dict[str, tuple[list[int], list[int]]] = {}  # postings of later adds
        self._extra = 0  # how many postings are in _more
        # per slot, with room to grow (the first len(self._ids) entries are in use)
        self._rowid = rowids.astype(np.int64)
        self._sizes = np.bincount(slots, weights=freqs, minlength=len(self._ids))
        self._alive = np.ones(len(self._ids), dtype=bool)
        self._rows = len(self._ids)
        self._tokens = int(self._sizes.sum())

    @classmethod
    def build(cls, conn: sqlite3.Connection, table: str = "docs") -> TermIndex:
        """The postings of ``table`` (an FTS5 table with an ``id`` column) as FTS5 holds them:
        one grouped pass over its ``fts5vocab`` instance table, parsed by numpy (100k rows:
        ~2.6 s; 10k: ~0.3 s)."""
        conn.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS temp.{table}_terms "
                     f"USING fts5vocab(main, {table}, 'instance')")
        rows = conn.execute(f"SELECT rowid, id FROM {table} ORDER BY rowid").fetchall()
        rowids = np.array([r for r, _ in rows], dtype=np.int64)
        names: list[str] = []
        counts: list[int] = []
        chunks: list[str] = []
        for term, count, docs in conn.execute(
                f"SELECT term, count(*), group_concat(doc, ' ') FROM {table}_terms GROUP BY term"):
            names.append(term)
            counts.append(count)
            chunks.append(docs)
        # sorted within a term; parsed in C (a list of 1.8M str objects would cost ~100 MB)
        docs_of = np.fromstring(" ".join(chunks), dtype=np.int64, sep=" ")
        term_of = np.repeat(np.arange(len(names), dtype=np.int64), counts)
        first = np.ones(len(docs_of), dtype=bool)  # first instance of each (term, row) pair
        first[1:] = (term_of[1:] != term_of[:-1]) | (docs_of[1:] != docs_of[:-1])
        at = np.flatnonzero(first)
        freqs = np.diff(np.append(at, len(docs_of))).astype(np.int32)
        slots = np.searchsorted(rowids, docs_of[at]).astype(np.int32)
        starts = np.searchsorted(term_of[at], np.arange(len(names) + 1)).astype(np.int64)
        return cls(rowids, [str(i) for _, i in rows],
                   {t: n for n, t in enumerate(names)}, starts, slots, freqs)

    @property
    def stale(self) -> bool:
        """Too many deleted rows are still in the arrays: rebuild (:meth:`build`)."""
        used = max(len(self._ids), 1)
        return (len(self._ids) - self._rows > DEAD_SHARE * used
                or self._extra > DEAD_SHARE * max(len(self._slots), used))

    def add(self, rows: Sequence[tuple[int, str, Sequence[str]]]) -> None:
        """Rows just inserted in the FTS5 table: (rowid, memory id, its tokens)."""
        used = len(self._ids)
        if used + len(rows) > len(self._alive):  # grow the per-slot arrays by doubling
            room = max(2 * len(self._alive), used + len(rows), 16)
            self._rowid = _grown(self._rowid, room)
            self._sizes = _grown(self._sizes, room)
            self._alive = _grown(self._alive, room)
        for slot, (rowid, memory_id, tokens) in enumerate(rows, used):
            self._ids.append(memory_id)
            self._slot[memory_id] = slot
            self._rowid[slot], self._sizes[slot], self._alive[slot] = rowid, len(tokens), True
            counted = Counter(tokens)
            for token, count in counted.items():
                more = self._more.setdefault(token, ([], []))
                more[0].append(slot)
                more[1].append(count)
            self._extra += len(counted)
            self._rows += 1
            self._tokens += len(tokens)

    def delete(self, memory_ids: Sequence[str]) -> None:
        """Rows just deleted from the FTS5 table (unknown ids are ignored)."""
        for memory_id in memory_ids:
            slot = self._slot.pop(memory_id, None)
            if slot is not None and self._alive[slot]:
                self._alive[slot] = False
                self._rows -= 1
                self._tokens -= int(self._sizes[slot])

    def _postings(self, term: str) -> tuple[_J, _F]:
        """(slots, frequencies) of the live rows holding ``term``."""
        n = self._terms.get(term)
        slots = self._slots[self._starts[n]:self._starts[n + 1]] if n is not None else None
        freqs = self._freqs[self._starts[n]:self._starts[n + 1]] if n is not None else None
        more = self._more.get(term)
        if more is not None:
            extra_s, extra_f = np.array(more[0], dtype=np.int32), np.array(more[1], np.int32)
            slots = extra_s if slots is None else np.concatenate([slots, extra_s])
            freqs = extra_f if freqs is None else np.concatenate([freqs, extra_f])
        if slots is None or freqs is None:
            return np.empty(0, dtype=np.int32), np.empty(0, dtype=np.float64)
        live = self._alive[slots]
        return slots[live], freqs[live].astype(np.float64)

    def search(self, terms: Sequence[str], limit: int) -> list[tuple[str, float]]:
        """(memory id, score) best first, as ``SELECT id, -bm25(docs) ... WHERE docs MATCH
        '"t1" OR "t2" ...' ORDER BY 1 DESC LIMIT limit`` would answer (one token per phrase;
        a term given twice counts twice, as two phrases do in FTS5)."""
        if limit <= 0 or self._rows == 0:
            return []
        rows = float(self._rows)
        avgdl = self._tokens / rows
        score = np.zeros(len(self._ids), dtype=np.float64)
        for term in terms:
            slots, freqs = self._postings(term)
            idf = math.log((rows - len(slots) + 0.5) / (len(slots) + 0.5))
            if idf <= 0.0:
                idf = 1e-6
            norm = K1 * (1 - B + B * self._sizes[slots] / avgdl)
            score[slots] += idf * ((freqs * (K1 + 1.0)) / (freqs + norm))
        hit = np.flatnonzero(score)
        if len(hit) > limit:  # keep every row tied with the last one, then order exactly
            kth = np.partition(-score[hit], limit - 1)[limit - 1]
            hit = hit[-score[hit] <= kth]
        order = hit[np.lexsort((self._rowid[hit], -score[hit]))][:limit]
        return [(self._ids[n], float(score[n])) for n in order]


def _grown(array: _A, size: int) -> _A:
    """``array`` in a longer copy, zero-filled."""
    out = np.zeros(size, dtype=array.dtype)
    out[:len(array)] = array
    return out  # type: ignore[return-value]
