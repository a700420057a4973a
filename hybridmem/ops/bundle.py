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

All or nothing, across a crash too: once the bundle is checked, embedded and merged, everything the
import will write — the memories, the user's whole graph after the import, the history events with
their ids — is written to ``users/<hash>/import.json`` (temp file, fsync, rename: the commit point)
before any store is touched, and removed after the last. A process killed before the rename left
the user as it was; killed after it, the next :class:`~hybridmem.Memory` on the data dir finishes
the import before anything else (:func:`recover_imports`) — re-embedding the texts, since every
step is idempotent (upsert, index replacing the same id, the graph replaced whole, history events
inserted once by id). So the user is either wholly before or wholly after the import, never half
overwritten. A store *error* (not a crash) midway leaves the file too and raises
:class:`StorageError`: the import is finished at the next open, or by the next import of that user.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import networkx as nx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hybridmem.runtime.files import atomic_write_bytes, user_dir
from hybridmem.graph.fileformat import graph_from, node_link, refresh_edge
from hybridmem.stores import Stores
from hybridmem.errors import CorruptStateError, InvalidInputError, StorageError
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

__all__ = ["EXPORT_FORMAT", "EXPORT_VERSION", "IMPORT_FILE", "MAX_IMPORT", "Bundle",
           "ImportIntent", "export_bundle", "import_bundle", "recover_imports"]

log = logging.getLogger(__name__)

EXPORT_FORMAT = "hybridmem-export"
EXPORT_VERSION = 1
#: Memories embedded and written per step of an import.
IMPORT_CHUNK = 256
#: Most memories (and history events) one bundle may hold.
MAX_IMPORT = 100_000
#: The import in flight of a user, in its folder (see the module docstring).
IMPORT_FILE = "import.json"
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


class ImportIntent(BaseModel):
    """Everything one import writes, journaled before the first store is touched."""

    model_config = ConfigDict(extra="forbid")

    user_id: str
    items: list[MemoryItem]
    graph: dict[str, Any] | None = None  # the user's whole graph after the import (node-link)
    events: list[HistoryEvent]


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


def import_bundle(stores: Stores, user_id: str, bundle: object, *, embed: Embed, data_dir: Path,
                  overwrite: bool = False) -> int:
    """Load a bundle into ``user_id``; returns the number of memories loaded. Everything is
    validated, embedded and merged before anything is written, then journaled and written (see
    the module docstring). Call it holding the user's lock."""
    recover_imports(data_dir, stores, embed=embed, user_id=user_id)  # an earlier one first
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
    now = utcnow()
    intent = ImportIntent(
        user_id=user_id, items=items,
        graph=_merged_graph(stores, user_id, graph, existing) if graph is not None else None,
        events=[*history, *(HistoryEvent(memory_id=i.id, action="import", at=now,
                                         cause="imported from an export") for i in items)],
    )
    path = user_dir(data_dir, user_id) / IMPORT_FILE
    atomic_write_bytes(path, intent.model_dump_json().encode("utf-8"))  # the commit point
    try:
        _write(stores, intent, vectors)
    except Exception as exc:
        raise StorageError(
            f"an import into this user stopped midway ({type(exc).__name__}: {exc}); it is "
            "recorded and is finished when the data dir is next opened, or by the next import "
            "into this user"
        ) from exc
    path.unlink(missing_ok=True)
    return len(items)


def _write(stores: Stores, intent: ImportIntent, vectors: Sequence[list[float]]) -> None:
    """Every store write of an import; each is idempotent, so recovery may repeat them."""
    user_id, items = intent.user_id, intent.items
    for start in range(0, len(items), IMPORT_CHUNK):
        chunk = items[start : start + IMPORT_CHUNK]
        stores.vectors.upsert(user_id, chunk, vectors[start : start + IMPORT_CHUNK])
        stores.lexical.add(user_id, [i.id for i in chunk], [i.text for i in chunk])
    if intent.graph is not None:
        stores.graph.import_graph(user_id, intent.graph)
    stores.history.record(user_id, intent.events)


def recover_imports(data_dir: Path, stores: Stores, *, embed: Embed,
                    user_id: str | None = None) -> int:
    """Finish the imports a crash (or a store error) left journaled — every user's, or only
    ``user_id``'s; returns how many. Call before anything else reads or writes those users."""
    users = data_dir / "users"
    paths = ([user_dir(data_dir, user_id, create=False) / IMPORT_FILE] if user_id is not None
             else sorted(users.glob(f"*/{IMPORT_FILE}")))
    found = 0
    for path in paths:
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            continue
        try:
            intent = ImportIntent.model_validate_json(raw)
        except ValidationError as exc:
            raise CorruptStateError(
                f"the unfinished import {path} cannot be read ({exc}); move it away to drop "
                "it (the user then keeps what that import had written)") from exc
        log.warning("finishing an import of %d memories that was interrupted", len(intent.items))
        texts = [i.text for i in intent.items]
        vectors = [v for start in range(0, len(texts), IMPORT_CHUNK)
                   for v in embed(texts[start : start + IMPORT_CHUNK])]
        _write(stores, intent, vectors)
        path.unlink(missing_ok=True)
        found += 1
    return found


def _merged_graph(stores: Stores, user_id: str, graph: nx.DiGraph[str],
                  replaced: set[str]) -> dict[str, Any]:
    """The user's graph with ``graph`` merged in (as node-link). Evidence of ``replaced``
    memories is dropped from the *whole* user graph first — edges left without evidence and
    nodes left without memories or edges go, as when the graph store removes a memory — so an
    overwrite leaves nothing of what the old texts said."""
    mine = graph_from(stores.graph.export(user_id))
    if replaced:
        for u, v, edge in list(mine.edges(data=True)):
            cited: dict[str, dict[str, float]] = edge["evidence"]
            for predicate in list(cited):
                for memory_id in replaced & cited[predicate].keys():
                    del cited[predicate][memory_id]
                if not cited[predicate]:
                    del cited[predicate]
            refresh_edge(edge)
            if not cited:
                mine.remove_edge(u, v)
        for key in list(mine.nodes):
            node = mine.nodes[key]
            if node["memory_ids"] & replaced:
                node["memory_ids"] = node["memory_ids"] - replaced
                node["mentions"] = len(node["memory_ids"])
                if not node["memory_ids"] and mine.degree(key) == 0:
                    mine.remove_node(key)
    for key, attrs in graph.nodes(data=True):
        if key not in mine:
            mine.add_node(key, **attrs)
            continue
        node = mine.nodes[key]
        node["memory_ids"] = node["memory_ids"] | attrs["memory_ids"]
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
        for predicate, support in attrs["evidence"].items():
            evidence.setdefault(predicate, {}).update(support)
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
