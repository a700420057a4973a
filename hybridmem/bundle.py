"""Export and import: everything of one user as JSON-ready data, and back.

A bundle holds the memories (every field, ids and times kept), the key facts, the graph and the
history. Vectors are not exported: an import re-embeds with the configured embedder, so a bundle
also moves a user to another embedder.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hybridmem.backends import Stores
from hybridmem.errors import InvalidInputError
from hybridmem.models import HistoryEvent, MemoryItem, utcnow

__all__ = ["EXPORT_FORMAT", "EXPORT_VERSION", "export_bundle", "import_bundle"]

EXPORT_FORMAT = "hybridmem-export"
EXPORT_VERSION = 1
#: Memories embedded and written per step of an import.
IMPORT_CHUNK = 256
Embed = Callable[[Sequence[str]], list[list[float]]]


def export_bundle(stores: Stores, user_id: str, *, embedder: str) -> dict[str, Any]:
    """The user's bundle (see the module docstring)."""
    items = sorted(stores.vectors.list(user_id), key=lambda i: (i.created_at, i.id))
    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "user_id": user_id,
        "exported_at": utcnow().isoformat(),
        "embedder": embedder,
        "memories": [i.model_dump(mode="json") for i in items],
        "facts": {i.key: i.id for i in items if i.key and i.is_current},
        "graph": stores.graph.export(user_id),
        "history": [e.model_dump(mode="json") for e in stores.history.list(user_id)],
    }


def import_bundle(stores: Stores, user_id: str, bundle: object, *, embed: Embed) -> int:
    """Load a bundle into ``user_id``; returns the number of memories loaded. The whole bundle is
    validated before anything is written."""
    if not isinstance(bundle, Mapping) or bundle.get("format") != EXPORT_FORMAT:
        raise InvalidInputError("not a hybridmem export (missing format marker)")
    memories, history = bundle.get("memories", []), bundle.get("history", [])
    if not isinstance(memories, list) or not isinstance(history, list):
        raise InvalidInputError("an export's 'memories' and 'history' must be lists")
    try:
        items = [
            MemoryItem.model_validate({**m, "user_id": user_id}) for m in memories
        ]
        events = [HistoryEvent.model_validate(e) for e in history]
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"invalid memory in export: {exc}") from exc
    graph = bundle.get("graph")
    if graph is not None and not isinstance(graph, Mapping):
        raise InvalidInputError("an export's 'graph' must be an object")
    for start in range(0, len(items), IMPORT_CHUNK):
        chunk = items[start : start + IMPORT_CHUNK]
        stores.vectors.upsert(user_id, chunk, embed([i.text for i in chunk]))
        stores.lexical.add(user_id, [i.id for i in chunk], [i.text for i in chunk])
    stores.history.record(user_id, events)
    if graph:
        stores.graph.import_graph(user_id, graph)
    return len(items)
