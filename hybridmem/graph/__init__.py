"""The entity graph: one NetworkX ``DiGraph`` per user, its file format, and how it is searched.

- :mod:`~hybridmem.graph.store` — :class:`NetworkXGraphStore`, the ``GraphStore`` seam on disk.
- :mod:`~hybridmem.graph.state` — one user's graph in memory: its indexes, its changes, which
  node a name means and which known entities a text names.
- :mod:`~hybridmem.graph.fileformat` — ``graph.json`` snapshots and the ``graph.log`` change log.
- :mod:`~hybridmem.graph.activation` — the walks search makes: spreading activation from query
  seeds, and the bounded hop neighbourhood of entities (pure).
- :mod:`~hybridmem.graph.resolve` — entity resolution by tokens (pure).
- :mod:`~hybridmem.graph.name_vectors` — embeddings of node names, for the topic signal.
- :mod:`~hybridmem.graph.export` — a graph as node-link JSON, GraphML or GEXF, for people's tools.

Imports the ground floor, ``runtime`` and ``sqlite`` only.
"""

from hybridmem.graph.store import NetworkXGraphStore

__all__ = ["NetworkXGraphStore"]
