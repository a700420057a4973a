"""Per-user SQLite stores: the lexical (BM25) index and the history log.

- :mod:`~hybridmem.sqlite.base` — one SQLite file per user, opened lazily, closed by an LRU.
- :mod:`~hybridmem.sqlite.bm25` — BM25 scoring (pure).
- :mod:`~hybridmem.sqlite.lexical` — ``SqliteLexicalIndex``.
- :mod:`~hybridmem.sqlite.history` — ``SqliteHistoryLog``.

Imports the ground floor and ``runtime`` only.
"""
