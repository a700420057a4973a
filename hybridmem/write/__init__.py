"""The write pipeline: from ``Memory.add`` to the stores, crash-safe.

- :mod:`~hybridmem.write.writer` — ``Writer``: extract, embed, deduplicate, apply to every store.
- :mod:`~hybridmem.write.plan` — the plan of one write (pure) and the usage meter.
- :mod:`~hybridmem.write.policy` — near-duplicates, contradictions and decay (pure).
- :mod:`~hybridmem.write.journal` — the intent journal that makes a write all-or-nothing.
- :mod:`~hybridmem.write.episodes` — grouping conversation turns into episodes (pure).

Imports the ground floor, ``runtime`` and ``graph``.
"""
