"""The read pipeline: from a query to hits and a packed context.

- :mod:`~hybridmem.read.retrieval` — gathering vector, lexical and graph candidates.
- :mod:`~hybridmem.read.access` — access counts written in the background; context()'s extras.
- :mod:`~hybridmem.read.ranking` — the fusion formula (pure, stated in its docstring).
- :mod:`~hybridmem.read.context` — packing ranked items into a token budget (pure).

Imports the ground floor, ``runtime``, ``stores`` and ``graph``.
"""
