"""Export and import: everything of one user as JSON-ready data, and back.

A bundle holds the memories (every field, ids and times kept), the key facts, the graph and the
history. Vectors are not exported: an import re-embeds with the configured embedder, so a bundle
also moves a user to another embedder.

An import validates the *whole* bundle (:class:`Bundle`) and embeds every text before it writes
anything, so a bad value anywhere — a memory, a fact, a graph node, a history event — refuses the
whole import with :class:`InvalidInputError` naming it, and the user is left as it was:

- memories: every field typed (:class:`MemoryItem`), ids unique and valid, texts and metadata valid;
- facts: ``{key: memory id}`` of memories in the bundle that carry that key;
- graph: a node-link *DiGraph* (``multigraph: true`` and undirected graphs refused) read by the
  graph store's own strict reader, whose evidence names only memories of the bundle;
- history: events about memories of the bundle, or of memories the history itself says were
  deleted (and the user does not have): anything else would be forged. Kept as imported, plus
  one ``import`` event per memory.

Ids the user already has are refused unless ``overwrite=True``. The imported graph is merged into
the user's graph (an overwritten memory's old evidence is replaced by the bundle's).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

import networkx as nx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hybridmem._graphio import graph_from, node_link, refresh_edge
from hybridmem.backends import Stores
from hybridmem.errors import InvalidInputError
from hybridmem.models import (
    HistoryEvent,
    MemoryItem,
    check_unicode,
    pydantic_message,
    utcnow,
    validate_memory_id,
    validate_metadata,
    validate_text,
)

__all__ = ["EXPORT_FORMAT", "EXPORT_VERSION", "MAX_IMPORT", "Bundle", "export_bundle",
           "import_bundle"]

EXPORT_FORMAT = "hybridmem-export"
EXPORT_VERSION = 1
#: Memories embedded and written per step of an import.
IMPORT_CHUNK = 256
#: Most memories (and history events) one bundle may hold.
MAX_IMPORT = 100_000
Embed = Callable[[Sequence[str]], list[list[float]]]


class Bundle(BaseModel):
    """A bundle as :func:`export_bundle` writes it, checked field by field and as a whole."""

    model_config = ConfigDict(extra="ignore")

    format: Literal["hybridmem-export"]
    version: Literal[1] = 1
    memories: list[dict[str, Any]] = Field(default_factory=list, max_length=MAX_IMPORT)
    facts: dict[str, str] = Field(default_factory=dict)
    graph: dict[str, Any] | None = None
    history: list[HistoryEvent] = Field(default_factory=list, max_length=MAX_IMPORT)

    @field_validator("history")
    @classmethod
    def _valid_text(cls, events: list[HistoryEvent]) -> list[HistoryEvent]:
        for event in events:
            for value in (event.id, event.memory_id, event.cause, event.text):
                if value is not None:
                    check_unicode(value, "a history event")
        return events


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


def check_bundle(user_id: str, bundle: object) -> tuple[list[MemoryItem], list[HistoryEvent],
                                                        nx.DiGraph[str] | None]:
    """The bundle's memories (owned by ``user_id``), history and graph, or
    :class:`InvalidInputError` naming the first thing wrong. Writes nothing."""
    if not isinstance(bundle, Mapping) or bundle.get("format") != EXPORT_FORMAT:
        raise InvalidInputError(f"not a hybridmem export (no \"format\": \"{EXPORT_FORMAT}\")")
    try:
        parsed = Bundle.model_validate(dict(bundle))
    except ValidationError as exc:
        raise InvalidInputError(f"invalid export: {pydantic_message(exc.errors())}") from exc
    items: list[MemoryItem] = []
    for n, raw in enumerate(parsed.memories):
        try:
            item = MemoryItem.model_validate({**raw, "user_id": user_id})
            validate_memory_id(item.id)
            validate_text(item.text, what="text")
            validate_metadata(item.metadata)
            for value in (item.category, item.source, item.key, item.extractor,
                          item.superseded_by):
                if value is not None:
                    check_unicode(value, "a field")
        except (ValidationError, InvalidInputError) as exc:
            detail = pydantic_message(exc.errors()) if isinstance(exc, ValidationError) else exc
            raise InvalidInputError(f"invalid memory {n} in export: {detail}") from exc
        items.append(item)
    ids = {i.id for i in items}
    if len(ids) != len(items):
        raise InvalidInputError("an export holds the same memory id twice")
    by_id = {i.id: i for i in items}
    for key, memory_id in parsed.facts.items():
        if memory_id not in by_id or by_id[memory_id].key != key:
            raise InvalidInputError(f"fact {key!r} names {memory_id!r}, not a memory of the "
                                    "export with that key")
    gone = {e.memory_id for e in parsed.history if e.action in ("delete", "expire")}
    forged = sorted({e.memory_id for e in parsed.history if e.memory_id not in ids} - gone
                    - {None}, key=str)
    if forged:
        raise InvalidInputError(f"the export's history names memories it does not hold: "
                                f"{', '.join(map(str, forged[:5]))}")
    if len({e.id for e in parsed.history}) != len(parsed.history):
        raise InvalidInputError("the export's history holds the same event id twice")
    return items, parsed.history, _check_graph(parsed.graph, ids)


def _check_graph(data: Mapping[str, Any] | None, ids: set[str]) -> nx.DiGraph[str] | None:
    if not data:
        return None
    inner = data.get("graph", data) if "schema" in data else data
    if not isinstance(inner, Mapping):
        raise InvalidInputError("the export's graph is not a node-link object")
    if inner.get("multigraph", False) is not False or inner.get("directed", True) is not True:
        raise InvalidInputError("the export's graph must be a directed graph, not a multigraph "
                                "(\"directed\": true, \"multigraph\": false)")
    try:
        graph = graph_from(data)
        cited: set[str] = set()
        for key, attrs in graph.nodes(data=True):
            check_unicode(key, "a graph node")
            for value in (attrs["name"], attrs["type"], *attrs["aliases"]):
                check_unicode(value, f"graph node {key!r}")
            cited |= attrs["memory_ids"]
        for _, _, attrs in graph.edges(data=True):
            for predicate in attrs["evidence"]:
                check_unicode(predicate, "a graph predicate")
            cited |= attrs["memory_ids"]
        cited |= {m for link in graph.graph["next"].items() for m in link}  # episodic links
    except ValueError as exc:  # InvalidInputError is one too
        raise InvalidInputError(f"invalid graph in export: {exc}") from exc
    unknown = sorted(cited - ids)
    if unknown:
        raise InvalidInputError(f"the export's graph cites memories it does not hold: "
                                f"{', '.join(unknown[:5])}")
    return graph


def import_bundle(stores: Stores, user_id: str, bundle: object, *, embed: Embed,
                  overwrite: bool = False) -> int:
    """Load a bundle into ``user_id``; returns the number of memories loaded. Everything is
    validated and embedded before anything is written (see the module docstring); a store that
    fails midway has the memories this import added removed again."""
    items, history, graph = check_bundle(user_id, bundle)
    ids = [i.id for i in items]
    existing = {i.id for i in stores.vectors.get(user_id, ids)} if ids else set()
    deleted = sorted({e.memory_id for e in history if e.memory_id is not None} - set(ids))
    if deleted and stores.vectors.get(user_id, deleted):
        raise InvalidInputError("the export's history says memories were deleted that this user "
                                "still has; refusing the forged events")
    if existing and not overwrite:
        raise InvalidInputError(
            f"{len(existing)} memories of the export already exist for this user (e.g. "
            f"{min(existing)!r}); pass overwrite=True to replace them"
        )
    vectors = [v for start in range(0, len(items), IMPORT_CHUNK)
               for v in embed([i.text for i in items[start : start + IMPORT_CHUNK]])]
    merged = _merged_graph(stores, user_id, graph, existing) if graph is not None else None
    now = utcnow()
    events = [*history, *(HistoryEvent(memory_id=i.id, action="import", at=now,
                                       cause="imported from an export") for i in items)]
    try:
        for start in range(0, len(items), IMPORT_CHUNK):
            chunk = items[start : start + IMPORT_CHUNK]
            stores.vectors.upsert(user_id, chunk, vectors[start : start + IMPORT_CHUNK])
            stores.lexical.add(user_id, [i.id for i in chunk], [i.text for i in chunk])
        if merged is not None:
            stores.graph.import_graph(user_id, merged)
        stores.history.record(user_id, events)
    except Exception:
        fresh = [i for i in ids if i not in existing]
        stores.vectors.delete(user_id, fresh)
        stores.lexical.delete(user_id, fresh)
        raise
    return len(items)


def _merged_graph(stores: Stores, user_id: str, graph: nx.DiGraph[str],
                  replaced: set[str]) -> dict[str, Any]:
    """The user's graph with ``graph`` merged in (as node-link): evidence of ``replaced``
    memories is dropped from the user's side first."""
    mine = graph_from(stores.graph.export(user_id))
    for key, attrs in graph.nodes(data=True):
        if key not in mine:
            mine.add_node(key, **attrs)
            continue
        node = mine.nodes[key]
        node["memory_ids"] = (node["memory_ids"] - replaced) | attrs["memory_ids"]
        node["aliases"] = node["aliases"] | attrs["aliases"]
        node["mentions"] = len(node["memory_ids"])
        node["first_seen"] = _earliest(node["first_seen"], attrs["first_seen"])
        node["last_seen"] = max((t for t in (node["last_seen"], attrs["last_seen"]) if t),
                                default=None)
    for u, v, attrs in graph.edges(data=True):
        if not mine.has_edge(u, v):
            mine.add_edge(u, v, **attrs)
            continue
        evidence = mine.edges[u, v]["evidence"]
        for support in evidence.values():
            for memory_id in replaced & support.keys():
                del support[memory_id]
        for predicate, support in attrs["evidence"].items():
            evidence.setdefault(predicate, {}).update(support)
        for predicate in [p for p, s in evidence.items() if not s]:
            del evidence[predicate]
        refresh_edge(mine.edges[u, v])
    links = {a: b for a, b in mine.graph["next"].items() if not {a, b} & replaced}
    taken = set(links.values())
    for a, b in graph.graph["next"].items():  # the export's episodic links, where still free
        if a not in links and b not in taken:
            links[a] = b
            taken.add(b)
    mine.graph["next"] = links
    return node_link(mine)


def _earliest(a: datetime | None, b: datetime | None) -> datetime | None:
    return min((t for t in (a, b) if t is not None), default=None)
