"""One user's graph in memory: the DiGraph, the indexes derived from it, the two changes that
can happen to it (memories' extractions added, memories removed) and the lookups those indexes
answer (which node a name means, which known entities a text names). No I/O: the store
(:mod:`hybridmem.graph.store`) loads, persists and locks; this module only keeps the graph right."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import TypeVar

import networkx as nx

from hybridmem.graph.fileformat import MAX_PREDICATE, refresh_edge
from hybridmem.graph.resolve import better_name, form_key, resolve_by_tokens
from hybridmem.models import Extraction
from hybridmem.text import entity_key, predicate_key, words

K = TypeVar("K")

__all__ = ["LOG_FILE", "MAX_NGRAM", "Stamp", "UserGraph", "edge_label", "stamp_of"]

LOG_FILE = "graph.log"
#: Longest entity name (in words) that :meth:`UserGraph.entities_in` can recognise.
MAX_NGRAM = 6
_NOT_ENTITIES = frozenset({"i", "me", "my", "you", "it", "we", "us", "he", "she", "they", "this"})
Edge = tuple[str, str]
#: (mtime_ns, size) of a file, None when it does not exist.
Stamp = tuple[int, int] | None


def stamp_of(path: Path | None) -> Stamp:
    """A file's (mtime_ns, size), to notice that another writer changed it."""
    if path is None:
        return None
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    return (info.st_mtime_ns, info.st_size)


#: Episodic links an add declares: True (the batch is one episode), False, or (before, after) pairs.
Links = bool | Sequence[tuple[str, str]]


@dataclass
class UserGraph:
    """One user's graph and the indexes derived from it (rebuilt on load, never saved)."""

    user_id: str
    path: Path | None  # None: in-memory store
    graph: nx.DiGraph[str] = field(default_factory=nx.DiGraph)
    #: (mtime_ns, size) of the snapshot and of the log as last read or written
    stamp: tuple[Stamp, Stamp] | None = None
    snapshot_bytes: int = 0
    log_bytes: int = 0
    aliases: dict[str, set[str]] = field(default_factory=dict)  # canonical alias -> node keys
    mem_nodes: dict[str, set[str]] = field(default_factory=dict)
    #: memory id -> the edges it supports; None until first asked for (see :attr:`mem_edges`)
    edge_index: dict[str, set[Edge]] | None = None
    #: entity-key word -> node keys whose aliases hold it, in insertion order (for
    #: :mod:`hybridmem.graph.resolve`)
    words: dict[str, dict[str, None]] = field(default_factory=dict)
    #: node key -> the canonical forms (entity keys) of its name and aliases
    forms: dict[str, set[str]] = field(default_factory=dict)
    #: :func:`~hybridmem.graph.resolve.form_key` of a canonical form -> node keys that have it
    by_form: dict[frozenset[str], set[str]] = field(default_factory=dict)
    #: episodic links, derived from ``graph.graph["next"]`` (memory id -> the one written after it)
    prevs: dict[str, str] = field(default_factory=dict)

    @property
    def nexts(self) -> dict[str, str]:
        """Episodic links: memory id -> the memory written right after it in the same batch
        (kept in the graph's own attributes, so the node-link snapshot carries them)."""
        found = self.graph.graph.get("next")
        if not isinstance(found, dict):
            found = self.graph.graph["next"] = {}
        return found

    @property
    def mem_edges(self) -> dict[str, set[Edge]]:
        """Memory id -> the edges it supports, built on first use: a search never asks for it
        (only context, relations and forgetting do), and at 100k memories (81k edges) it was a
        fifth of indexing a loaded graph. Writes keep it current once built."""
        if self.edge_index is None:
            built: dict[str, set[Edge]] = {}
            for u, v, attrs in self.graph.edges(data=True):
                for mid in attrs["memory_ids"]:
                    built.setdefault(mid, set()).add((u, v))
            self.edge_index = built
        return self.edge_index

    @property
    def log_path(self) -> Path | None:
        return None if self.path is None else self.path.with_name(LOG_FILE)

    def stamps(self) -> tuple[Stamp, Stamp]:
        return stamp_of(self.path), stamp_of(self.log_path)

    def index(self) -> None:
        self.aliases.clear()
        self.mem_nodes.clear()
        self.edge_index = None
        self.words.clear()
        self.forms.clear()
        self.by_form.clear()
        self.prevs = {b: a for a, b in self.nexts.items()}
        for key, attrs in self.graph.nodes(data=True):
            for alias in {key, *attrs["aliases"]}:
                self._index_form(key, entity_key(alias))
            for mid in attrs["memory_ids"]:
                self.mem_nodes.setdefault(mid, set()).add(key)

    def _index_form(self, key: str, canon: str) -> None:
        """Enter one canonical form of node ``key`` in the alias, word and form indexes."""
        self.aliases.setdefault(canon, set()).add(key)
        found = self.forms.setdefault(key, set())
        if canon in found:
            return
        found.add(canon)
        for word in canon.split():
            self.words.setdefault(word, {})[key] = None
        if canon:
            self.by_form.setdefault(form_key(tuple(canon.split())), set()).add(key)

    def resolve(self, name: str, key: str | None = None) -> str | None:
        """The existing node a name or alias (or its canonical ``key``) refers to, or None."""
        key = entity_key(name) if key is None else key
        if key in self.graph:
            return key
        found = self.aliases.get(key)
        return min(found) if found else None

    def entities_in(self, text: str) -> list[str]:
        """Keys of known entities named in ``text``, longest match first (word n-grams, n <=
        :data:`MAX_NGRAM`).

        One dict lookup per n-gram in the alias index, so it costs the same at 10 nodes or 10k.
        Single pronoun-like words ("it", "my") never match.
        """
        # A token that is only punctuation (" - ") normalises to no word; it stays as "" so that
        # no n-gram spans it.
        tokens = [w for token in text.split() for w in words(token) or [""]]
        found: dict[str, None] = {}
        i, n = 0, len(tokens)
        while i < n:
            for size in range(min(MAX_NGRAM, n - i), 0, -1):
                gram = tokens[i : i + size]
                if not all(gram) or (size == 1 and gram[0] in _NOT_ENTITIES):
                    continue
                keys = self.aliases.get(" ".join(gram))
                if keys:
                    found.update(dict.fromkeys(sorted(keys)))
                    i += size
                    break
            else:
                i += 1
        return list(found)

    def add(self, items: Sequence[tuple[str, Extraction]], seen: datetime,
            links: Links = True) -> None:
        """Apply extractions to the in-memory graph and its indexes (idempotent). ``links``:
        True chains the items as one episode, False links none, (before, after) pairs link
        exactly those."""
        if links is True:
            self._link([m for m, _ in items])
        elif links is not False:
            for before, after in links:
                self._link([before, after])
        for memory_id, extraction in items:
            names = [e.name for e in extraction.entities]
            names += [n for r in extraction.relations for n in (r.subject, r.object)]
            keys = {n: entity_key(n) for n in dict.fromkeys(names)}
            types = {keys[e.name]: e.type for e in extraction.entities}
            for ent in extraction.entities:
                self._node(ent.name, keys[ent.name], ent.type, memory_id, seen)
            for rel in extraction.relations:
                u, v = (
                    self._node(n, keys[n], types.get(keys[n], "thing"), memory_id, seen)
                    for n in (rel.subject, rel.object)
                )
                if u is None or v is None or u == v:
                    continue
                if not self.graph.has_edge(u, v):
                    self.graph.add_edge(u, v, evidence={})
                attrs = self.graph.edges[u, v]
                # the one predicate key; cut after folding (casefolding can lengthen: "ß" -> "ss")
                pred = predicate_key(rel.predicate)[:MAX_PREDICATE] or "related_to"
                support = attrs["evidence"].setdefault(pred, {})
                support[memory_id] = max(support.get(memory_id, 0.0), rel.confidence)
                refresh_edge(attrs)
                if self.edge_index is not None:  # (else built from the graph when first asked)
                    self.edge_index.setdefault(memory_id, set()).add((u, v))

    def _resolve_form(self, canon: str, type_: str) -> str | None:
        """The one node this new name is a longer or shorter form of (see
        :mod:`hybridmem.graph.resolve`)."""
        g = self.graph
        return resolve_by_tokens(
            tuple(canon.split()), type_, self.words, self.by_form,
            lambda key: [tuple(c.split()) for c in sorted(self.forms.get(key, ()))],
            lambda key: str(g.nodes[key]["type"]),
        )

    def _link(self, memory_ids: Sequence[str]) -> None:
        """Episodic links between memories written one after the other in one batch (one
        ``add_many`` / ``add_messages`` call: a conversation's session, a question and its
        answer). A memory keeps the first links it got, so re-adding a memory (re-extraction, a
        replayed log) changes nothing."""
        nexts = self.nexts
        for a, b in pairwise(dict.fromkeys(memory_ids)):
            if a not in nexts and b not in self.prevs:
                nexts[a], self.prevs[b] = b, a

    def _unlink(self, memory_id: str) -> bool:
        """Drop a memory from its episode; its neighbours become each other's (the conversation
        went on without it)."""
        nexts = self.nexts
        before, after = self.prevs.pop(memory_id, None), nexts.pop(memory_id, None)
        if before is not None:
            del nexts[before]
        if after is not None:
            del self.prevs[after]
        if before is not None and after is not None:
            nexts[before], self.prevs[after] = after, before
        return before is not None or after is not None

    def _node(
        self, name: str, canon: str, type_: str, memory_id: str, seen: datetime
    ) -> str | None:
        """Create or update the node for ``name``; the same entity never becomes two nodes."""
        if not canon:
            return None
        key = self.resolve(name, canon)
        g = self.graph
        if key is None:
            key = self._resolve_form(canon, type_)
            if key is not None and better_name(name.strip(), g.nodes[key]["name"]):
                # "4K monitor" seen first, then "Dell 4K monitor"
                g.nodes[key]["name"] = name.strip()
        key = key or canon
        if key not in g:
            g.add_node(
                key,
                name=name.strip(),
                type=type_,
                aliases=set(),
                first_seen=seen,
                last_seen=seen,
                mentions=0,
                memory_ids=set(),
            )
        attrs = g.nodes[key]
        attrs["aliases"].add(" ".join(name.split()))
        if key == canon:  # a new node: its key is a form of its own
            self._index_form(key, entity_key(key))
        self._index_form(key, canon)
        if attrs["type"] == "thing" and type_ != "thing":
            attrs["type"] = type_  # a more specific type wins over the generic one
        attrs["last_seen"] = max(attrs["last_seen"] or seen, seen)
        attrs["first_seen"] = min(attrs["first_seen"] or seen, seen)
        if memory_id not in attrs["memory_ids"]:
            attrs["memory_ids"].add(memory_id)
            attrs["mentions"] = len(attrs["memory_ids"])
            self.mem_nodes.setdefault(memory_id, set()).add(key)
        return key

    def remove(self, memory_ids: Sequence[str]) -> bool:
        """Drop memories from the in-memory graph; True if anything changed."""
        g, changed = self.graph, False
        touched: set[str] = set()
        for mid in memory_ids:
            changed = self._unlink(mid) or changed
            for u, v in self.mem_edges.pop(mid, set()):
                if not g.has_edge(u, v):
                    continue
                attrs = g.edges[u, v]
                for pred in list(attrs["evidence"]):
                    attrs["evidence"][pred].pop(mid, None)
                    if not attrs["evidence"][pred]:
                        del attrs["evidence"][pred]
                refresh_edge(attrs)
                if not attrs["evidence"]:
                    g.remove_edge(u, v)
                touched.update((u, v))
                changed = True
            for key in self.mem_nodes.pop(mid, set()):
                if key in g:
                    g.nodes[key]["memory_ids"].discard(mid)
                    g.nodes[key]["mentions"] = len(g.nodes[key]["memory_ids"])
                    touched.add(key)
                    changed = True
        for key in touched:
            if key in g and not g.nodes[key]["memory_ids"] and g.degree(key) == 0:
                self._drop_node(key)
        return changed

    def _drop_node(self, key: str) -> None:
        """Remove a node and its entries in the alias and word indexes — what :meth:`index`
        would rebuild without it. Why not rebuild: :meth:`index` walks the whole graph (132 ms a
        forget at 10,000 memories), and every supersession and deletion removes memories."""
        for canon in self.forms.pop(key, set()):
            _discard(self.aliases, canon, key)
            _discard(self.by_form, form_key(tuple(canon.split())), key)
            for word in canon.split():
                held = self.words.get(word)
                if held is not None:
                    held.pop(key, None)
                    if not held:
                        del self.words[word]
        self.graph.remove_node(key)


def _discard(table: dict[K, set[str]], k: K, key: str) -> None:
    """Drop ``key`` from ``table[k]``, and the entry when it empties."""
    found = table.get(k)
    if found is not None:
        found.discard(key)
        if not found:
            del table[k]


def edge_label(g: nx.DiGraph[str], u: str, v: str) -> str:
    """An edge as text in its own direction: "Alice -bought/returned-> ROG laptop"."""
    preds = "/".join(g.edges[u, v]["predicates"])
    return f"{g.nodes[u]['name']} -{preds}-> {g.nodes[v]['name']}"
