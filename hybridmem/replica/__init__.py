"""Chroma server mode: graph, lexical and history state kept in the one shared Chroma server.

Every app process pointing at the same Chroma server derives the same graph, lexical index and
history from records stored there, and serialises a user's writes with a lease held in Chroma.
Vectors, documents and metadata stay in the user's main collection (:mod:`hybridmem.chroma.vector`).

- :mod:`~hybridmem.replica.graph` — the graph, replayed from one extraction record per write.
- :mod:`~hybridmem.replica.lexical` — a per-process FTS5 cache of the main collection's documents.
- :mod:`~hybridmem.replica.sync` — what both share: per-user cache state, checks of the server.
- :mod:`~hybridmem.replica.history` — the history log as a Chroma collection.
- :mod:`~hybridmem.replica.lease` — cross-process per-user leases.

Imports the ground floor, ``runtime``, ``chroma``, ``sqlite`` and ``graph``.
"""
