"""The Chroma wing: every use of ChromaDB, embedded or server, behind the ``VectorStore`` seam.

- :mod:`~hybridmem.chroma.client` — opening a client (embedded or HTTP), every collection name.
- :mod:`~hybridmem.chroma.vector` — ``ChromaVectorStore``.
- :mod:`~hybridmem.chroma.layout` — how a memory's fields map to Chroma metadata.
- :mod:`~hybridmem.chroma.record_cache` — the in-process cache of a user's records.
- :mod:`~hybridmem.chroma.placement` — which collection a user's records live in.
- :mod:`~hybridmem.chroma.repair` — checking and repairing an embedded Chroma directory.
- :mod:`~hybridmem.chroma.reembed` — moving a user's collections to another embedder, resumably.
- :mod:`~hybridmem.chroma.purge` — making erasure physical in embedded Chroma's files.

Imports the ground floor and ``runtime`` only.
"""
