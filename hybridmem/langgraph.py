"""LangGraph's long-term store on hybridmem: ``HybridMemStore(memory)`` is a
:class:`langgraph.store.base.BaseStore`, so a compiled graph (``graph.compile(store=...)``) keeps
its memories in per-user hybridmem collections and searches them with hybrid search.

Needs the ``langgraph`` extra: ``pip install 'hybridmem[langgraph]'``.

How LangGraph's items map onto memories
---------------------------------------
- **Namespace**: its first label is the hybridmem **user id** (``("user-42", "prefs")`` belongs to
  user ``user-42``), so users stay isolated exactly as everywhere else in hybridmem; the labels
  after it (at most :data:`MAX_DEPTH`) are a path inside that user, kept in the memory's metadata.
  A namespace (or a search prefix) without a user id is refused: memories are never searched
  across users.
- **Item**: one memory of kind ``turn`` and category ``langgraph`` per ``(namespace, key)``. Kind
  ``turn`` because a store item is a verbatim record: hybridmem never merges turns as duplicates,
  so two keys holding equal values stay two items. The value (a JSON object) is kept whole in the
  metadata (``lg.value``); the memory's *text*, which is embedded, indexed and extracted into the
  graph with the offline rules, is the value's fields named by ``index`` (LangGraph's ``put``
  argument; by default the whole value as JSON). ``index=False`` stores the item unsearchable
  by ``query`` (still found by ``get``, listing and ``filter``). A new value for a key updates
  that memory in place (``Memory.update``), ``put(..., None)`` (delete) forgets it. Items are
  read with superseded memories included: a newer memory contradicting an item's text (hybridmem
  keeps both, bi-temporally) never hides the item from the store.
- **Search**: with a ``query``, hybridmem's hybrid search (vector, lexical, graph) ranks the items
  under the namespace prefix and ``SearchItem.score`` is its fused score; without one, items come
  oldest first. ``filter`` matches value fields (``{"kind": "pref"}``, or with ``$eq``, ``$ne``,
  ``$gt``, ``$gte``, ``$lt``, ``$lte``; dotted names reach nested fields) and is applied to the
  candidates here, so a filtered search considers at most ``MAX_LIMIT`` of them.
- **list_namespaces** needs a ``prefix`` match condition naming the user (there is no listing of
  users); ``suffix`` conditions and ``*`` wildcards after the user work as in LangGraph.
- TTLs are not supported (``supports_ttl`` is False): memories have their own retention
  (``expires_at``, :meth:`Memory.prune`).

``abatch`` runs ``batch`` in a worker thread (``Memory`` is thread-safe); puts are serialised by
one lock per store, so two concurrent puts of one new key never make two items.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import anyio.to_thread

try:
    from langgraph.store.base import (
        BaseStore,
        GetOp,
        Item,
        ListNamespacesOp,
        MatchCondition,
        Op,
        PutOp,
        Result,
        SearchItem,
        SearchOp,
    )
except ImportError as exc:  # pragma: no cover - exercised by a subprocess test
    raise ImportError(
        "the LangGraph store needs LangGraph: pip install 'hybridmem[langgraph]'") from exc

from hybridmem import Memory
from hybridmem.errors import InvalidInputError
from hybridmem.models import MAX_LIMIT, MemoryItem

__all__ = ["CATEGORY", "MAX_DEPTH", "HybridMemStore"]

#: The category of every memory this store writes (so a store never sees other memories).
CATEGORY = "langgraph"
#: Most namespace labels after the user id.
MAX_DEPTH = 8
_OPS = {"$eq", "$ne", "$gt", "$gte", "$lt", "$lte"}


def _path(labels: Iterable[str]) -> str:
    return json.dumps(list(labels), ensure_ascii=False)


def _split(namespace: tuple[str, ...], what: str) -> tuple[str, tuple[str, ...]]:
    """(user id, the path after it); InvalidInputError when there is no user or it is too deep."""
    if not namespace or not all(isinstance(label, str) and label for label in namespace):
        raise InvalidInputError(
            f"a {what} must start with a user id and hold non-empty strings, got {namespace!r}")
    if len(namespace) - 1 > MAX_DEPTH:
        raise InvalidInputError(f"a {what} may hold at most {MAX_DEPTH} labels after the user id")
    return namespace[0], tuple(namespace[1:])


class HybridMemStore(BaseStore):
    """A LangGraph store over one :class:`~hybridmem.Memory` (see the module docstring for the
    mapping). ``infer=True`` extracts each item with the configured extractor (an LLM when one
    is set) instead of the offline rules."""

    supports_ttl: bool = False

    def __init__(self, memory: Memory, *, infer: bool = False) -> None:
        if not isinstance(memory, Memory):
            raise InvalidInputError(f"HybridMemStore needs a Memory, got {type(memory).__name__}")
        self.memory = memory
        self.infer = infer
        self._puts = threading.Lock()

    def __repr__(self) -> str:
        return f"HybridMemStore({self.memory!r})"

    # -- the two methods BaseStore asks for ------------------------------------------------------
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run the operations in order; one result per operation (None for a put)."""
        results: list[Result] = []
        for op in ops:
            if isinstance(op, GetOp):
                results.append(self._get(op.namespace, op.key))
            elif isinstance(op, PutOp):
                self._put(op)
                results.append(None)
            elif isinstance(op, SearchOp):
                results.append(self._search(op))
            elif isinstance(op, ListNamespacesOp):
                results.append(self._namespaces(op))
            else:
                raise InvalidInputError(f"unknown store operation {type(op).__name__}")
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """:meth:`batch` in a worker thread."""
        ops = list(ops)
        return await anyio.to_thread.run_sync(self.batch, ops)

    # -- operations --------------------------------------------------------------------------------
    def _find(self, user: str, path: tuple[str, ...], key: str) -> MemoryItem | None:
        found = self.memory.list(user, category=CATEGORY, limit=1, include_superseded=True,
                                 where={"lg.ns": _path(path), "lg.key": key})
        return found[0] if found else None

    def _get(self, namespace: tuple[str, ...], key: str) -> Item | None:
        user, path = _split(namespace, "namespace")
        found = self._find(user, path, key)
        return _item(found, Item) if found else None

    def _put(self, op: PutOp) -> None:
        user, path = _split(op.namespace, "namespace")
        with self._puts:
            old = self._find(user, path, op.key)
            if op.value is None:
                if old is not None:
                    self.memory.forget(user, old.id)
                return
            value = dict(op.value)
            metadata: dict[str, Any] = {
                "lg.key": op.key, "lg.ns": _path(path), "lg.depth": len(path),
                "lg.value": json.dumps(value, ensure_ascii=False, default=str),
                "lg.indexed": op.index is not False,
                **{f"lg.p{k}": _path(path[:k]) for k in range(1, len(path) + 1)},
            }
            text = _text(value, op.index)
            if old is not None:
                self.memory.update(user, old.id, text=text, metadata=metadata)
            else:
                self.memory.add(user, text, kind="turn", category=CATEGORY, source="langgraph",
                                metadata=metadata, infer=self.infer)

    def _search(self, op: SearchOp) -> list[SearchItem]:
        user, path = _split(op.namespace_prefix, "namespace prefix")
        where: dict[str, Any] = {f"lg.p{len(path)}": _path(path)} if path else {}
        want = op.offset + op.limit
        if op.limit < 1 or op.offset < 0 or want > MAX_LIMIT:
            raise InvalidInputError(f"offset + limit must be within 1..{MAX_LIMIT}")
        take = MAX_LIMIT if op.filter else want
        scored: list[tuple[MemoryItem, float | None]]
        if op.query:
            hits = self.memory.search(user, op.query, limit=take, category=CATEGORY,
                                      where={**where, "lg.indexed": True},
                                      include_superseded=True)
            scored = [(h.item, h.score) for h in hits]
        else:
            items = self.memory.list(user, category=CATEGORY, where=where or None, limit=take,
                                     include_superseded=True)
            scored = [(i, None) for i in items]
        found = [_item(i, SearchItem, score) for i, score in scored]
        if op.filter:
            found = [f for f in found if _matches(f.value, op.filter)]
        return found[op.offset : want]

    def _namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        conditions = tuple(op.match_conditions or ())
        users = {c.path[0] for c in conditions if c.match_type == "prefix" and c.path
                 and c.path[0] != "*"}
        if len(users) != 1:
            raise InvalidInputError(
                "list_namespaces needs one prefix condition naming the user, e.g. "
                "prefix=('user-42',): hybridmem does not list users")
        (user,) = users
        seen: set[tuple[str, ...]] = set()
        offset = 0
        while page := self.memory.list(user, category=CATEGORY, limit=MAX_LIMIT, offset=offset,
                                       include_superseded=True):
            offset += len(page)
            for item in page:
                seen.add((user, *json.loads(str(item.metadata["lg.ns"]))))
        matched = {ns[: op.max_depth] if op.max_depth is not None else ns
                   for ns in seen if all(_match(ns, c) for c in conditions)}
        return sorted(matched)[op.offset : op.offset + op.limit]


# -- helpers -------------------------------------------------------------------------------------
def _item(memory: MemoryItem, kind: type[Item], score: float | None = None) -> Any:
    """The LangGraph item (``Item`` or ``SearchItem``) of a store memory."""
    meta = memory.metadata
    namespace = (memory.user_id, *json.loads(str(meta["lg.ns"])))
    fields: dict[str, Any] = {
        "namespace": namespace, "key": str(meta["lg.key"]),
        "value": json.loads(str(meta["lg.value"])),
        "created_at": memory.created_at, "updated_at": memory.updated_at,
    }
    if kind is SearchItem:
        return SearchItem(**fields, score=score)
    return Item(**fields)


def _text(value: Mapping[str, Any], index: Literal[False] | list[str] | None) -> str:
    """What is embedded and indexed: the ``index`` fields' values, else the whole value."""
    if index:
        parts = [_field(value, name) for name in index]
        text = "\n".join(p if isinstance(p, str) else json.dumps(p, ensure_ascii=False, default=str)
                         for p in parts if p is not None)
        if text.strip():
            return text
    return json.dumps(value, ensure_ascii=False, default=str) or "{}"


def _field(value: Mapping[str, Any], name: str) -> Any:
    """A value field by dotted name (``"a.b"``), or None when it is missing."""
    current: Any = value
    for part in name.split("."):
        if not isinstance(current, Mapping) or part not in current:
            return None
        current = current[part]
    return current


def _matches(value: Mapping[str, Any], where: Mapping[str, Any]) -> bool:
    """LangGraph's filter on value fields: equality, or ``{op: operand}`` with comparison ops."""
    for name, wanted in where.items():
        actual = _field(value, name)
        ops = wanted if isinstance(wanted, Mapping) and wanted and set(wanted) <= _OPS else None
        if ops is None:
            if actual != wanted:
                return False
            continue
        for op, operand in ops.items():
            try:
                ok = {"$eq": lambda: actual == operand, "$ne": lambda: actual != operand,
                      "$gt": lambda: actual > operand, "$gte": lambda: actual >= operand,
                      "$lt": lambda: actual < operand, "$lte": lambda: actual <= operand}[op]()
            except TypeError:  # ordering across types (or against a missing field) never holds
                ok = False
            if not ok:
                return False
    return True


def _match(namespace: tuple[str, ...], condition: MatchCondition) -> bool:
    path = tuple(condition.path)
    if len(path) > len(namespace):
        return False
    part = namespace[: len(path)] if condition.match_type == "prefix" else namespace[-len(path):]
    return all(p == "*" or p == n for p, n in zip(path, part))
