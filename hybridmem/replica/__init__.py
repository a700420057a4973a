"""Chroma server mode: graph, lexical and history state kept in the one shared Chroma server.

Every app process pointing at the same Chroma server derives the same graph, lexical index and
history from records stored there, and serialises a user's writes with a lease held in Chroma.

- :mod:`~hybridmem.replica.graph` — the graph and lexical replicas and how they follow the server.
- :mod:`~hybridmem.replica.history` — the history log as a Chroma collection.
- :mod:`~hybridmem.replica.lease` — cross-process per-user leases.

Imports the ground floor, ``runtime``, ``chroma``, ``sqlite`` and ``graph``.
"""
