"""The write pipeline: from ``Memory.add`` to the stores, crash-safe.

- :mod:`~hybridmem.write.writer` — ``Writer``: plan a batch, apply it, supersede.
- :mod:`~hybridmem.write.plan` — the plan of one write (pure), what planning does about a missing
  model answer, and the usage meter.
- :mod:`~hybridmem.write.policy` — near-duplicates, contradictions and decay (pure).
- :mod:`~hybridmem.write.extraction` — running the extractor, the rules as fallback, re-extraction.
- :mod:`~hybridmem.write.journal` — the intent journal that makes a write all-or-nothing, and
  settling a batch a crash interrupted.
- :mod:`~hybridmem.write.episodes` — grouping conversation turns into episodes (pure).

Imports the ground floor, ``runtime``, ``stores``, ``graph`` and ``read``.
"""
