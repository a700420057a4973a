"""How a :class:`~hybridmem.models.MemoryItem` is laid out as a Chroma record, and filters on
that layout — written once, for :mod:`hybridmem.chroma.vector` (the only store that reads or writes it).

A record: id, document = text, and flat metadata with

- the system fields under their own names (``kind``, ``category``, ``importance``, ...),
- times as epoch seconds under ``<name>_ts`` (``created_at_ts``, ``invalid_at_ts``, ...),
- derived fields for filters: ``current`` (not superseded or invalidated), ``has_key``,
  ``text_hash`` (:func:`hybridmem.text.text_hash`) and ``user_id``,
- the caller's metadata under ``meta.<key>``, so a caller key can never overwrite a system field,
- the caller's stated entities and relations (:class:`~hybridmem.models.Knowledge`) as one JSON
  string under ``knowledge``.

Absent means None: Chroma stores no None values. Chroma *merges* metadata on ``upsert`` and
``update`` (a key left out keeps its old value), so writes send None for every field that is None
now and for every key the record had that the item no longer has: a write replaces the record.

A :data:`~hybridmem.filters.Filter` is compiled to a Chroma ``where`` (metadata conditions name
``meta.<key>``) by :func:`compile_where`, and evaluated in Python on a record's metadata by
:func:`matches`, because Chroma answers any ``where`` with a scan of every record's metadata.
Both evaluate alike: numbers compare across int and float, booleans and strings only with their
own kind, and a condition on a missing key never matches except ``$ne`` and ``$nin``.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Union

from hybridmem.errors import CorruptStateError, InvalidInputError
from hybridmem.filters import AllOf, AnyOf, Condition, Filter, Scalar
from hybridmem.models import Knowledge, MemoryItem
from hybridmem.text import text_hash

if TYPE_CHECKING:
    from chromadb.api.models.Collection import Collection
    from chromadb.api.types import Metadata, Where

__all__ = ["META_PREFIX", "Record", "archived", "compile_where", "matches", "parts_of", "replacing",
           "residual", "resolve", "rows", "stored", "to_item", "to_record"]

META_PREFIX = "meta."
_TIME_FIELDS = ("created_at", "updated_at", "valid_from", "invalid_at", "expires_at",
                "last_accessed_at")
_PLAIN_FIELDS = ("kind", "category", "importance", "confidence", "source", "superseded_by",
                 "mention_count", "access_count", "needs_extraction", "extractor", "key")
#: A record's metadata as written: None deletes a key (Chroma's update semantics).
Record = dict[str, Union[str, int, float, bool, None]]
_MISSING = object()


# -- the record layout ---------------------------------------------------------------------------
def to_record(item: MemoryItem) -> Record:
    """The flat record metadata of ``item``; None values delete keys when written."""
    meta: Record = {name: getattr(item, name) for name in _PLAIN_FIELDS}
    for name in _TIME_FIELDS:
        value: datetime | None = getattr(item, name)
        meta[f"{name}_ts"] = None if value is None else value.timestamp()
    meta["current"] = item.is_current
    meta["has_key"] = item.key is not None
    meta["text_hash"] = text_hash(item.text)
    meta["user_id"] = item.user_id
    meta["knowledge"] = item.knowledge.model_dump_json() if item.knowledge else None
    for key, val in item.metadata.items():
        meta[META_PREFIX + key] = val
    return meta


def replacing(collection: Collection, ids: Sequence[str], records: Sequence[Record]
               ) -> builtins.list[Metadata]:
    """``records`` plus None for each key the stored record has and the new one lacks (Chroma
    merges metadata on writes; None deletes a key)."""
    old = collection.get(ids=list(ids), include=["metadatas"])
    stale = {i: m for i, _, m in rows(old["ids"], None, old["metadatas"]) if m}
    return [{**{k: None for k in stale.get(i, {}) if k not in r}, **r}
            for i, r in zip(ids, records)]


def to_item(user_id: str, id_: str, text: str | None, meta: Mapping[str, Any] | None
             ) -> MemoryItem:
    """Rebuild a :class:`MemoryItem` from a stored record."""
    m = meta or {}
    fields: dict[str, Any] = {name: m[name] for name in _PLAIN_FIELDS if name in m}
    for name in _TIME_FIELDS:
        ts = m.get(f"{name}_ts")
        fields[name] = (datetime.fromtimestamp(float(ts), tz=timezone.utc)
                        if isinstance(ts, (int, float)) and not isinstance(ts, bool) else None)
    if fields["updated_at"] is None:
        fields["updated_at"] = fields["created_at"]
    fields["metadata"] = {k[len(META_PREFIX):]: v for k, v in m.items()
                          if k.startswith(META_PREFIX)}
    try:
        if isinstance(m.get("knowledge"), str):
            fields["knowledge"] = Knowledge.model_validate_json(m["knowledge"])
        return MemoryItem(id=id_, user_id=str(m.get("user_id", user_id)), text=text or "",
                          **fields)
    except ValueError as exc:  # pydantic's ValidationError
        raise CorruptStateError(
            f"the stored memory {id_} of {user_id!r} cannot be read back: {exc}") from exc


def rows(ids: Sequence[str], docs: Sequence[str | None] | None,
          metas: Sequence[Mapping[str, Any] | None] | None
          ) -> Iterable[tuple[str, str | None, Mapping[str, Any] | None]]:
    """Chroma's columns as (id, document, metadata) rows (a column not included is None)."""
    for n, id_ in enumerate(ids):
        yield id_, docs[n] if docs else None, metas[n] if metas else None


# -- which collection a record belongs in (see hybridmem.chroma.vector) ------------------------------
def archived(meta: Mapping[str, Any]) -> bool:
    """Whether a record belongs in the archive: it says it is not current."""
    return meta.get("current") is False


def stored(record: Record) -> dict[str, Any]:
    """A record as Chroma keeps it once written (a None value deletes the key)."""
    return {k: v for k, v in record.items() if v is not None}


def parts_of(where: Filter | None) -> tuple[bool, ...]:
    """The collections a filter can match in (False: hot, True: archive): one when it pins
    ``current`` at its top level, else both."""
    parts = where.parts if isinstance(where, AllOf) else (where,)
    for p in parts:
        if (isinstance(p, Condition) and p.field == "current" and not p.metadata
                and p.op == "$eq" and isinstance(p.value, bool)):
            return (not p.value,)
    return (False, True)


def residual(where: Filter | None) -> Filter | None:
    """``where`` without the top-level ``current`` pin the collection choice already applies."""
    if where is None or len(parts_of(where)) == 2:
        return where
    if isinstance(where, Condition):
        return None
    assert isinstance(where, AllOf)
    rest = tuple(p for p in where.parts if not (
        isinstance(p, Condition) and p.field == "current" and not p.metadata and p.op == "$eq"))
    return None if not rest else (rest[0] if len(rest) == 1 else AllOf(rest))


def resolve(a: tuple[bool, str, Mapping[str, Any]], b: tuple[bool, str, Mapping[str, Any]]
             ) -> tuple[tuple[bool, str, Mapping[str, Any]], tuple[bool, str, Mapping[str, Any]]]:
    """(winner, loser) of two copies of one record, (archived?, document, metadata) each: the
    copy in the collection its ``current`` names, else the more recently updated."""
    fits_a, fits_b = archived(a[2]) == a[0], archived(b[2]) == b[0]
    if fits_a != fits_b:
        return (a, b) if fits_a else (b, a)
    newer_b = float(b[2].get("updated_at_ts") or 0) > float(a[2].get("updated_at_ts") or 0)
    return (b, a) if newer_b else (a, b)


# -- filters: compiled for Chroma, evaluated in Python -------------------------------------------
def _key(cond: Condition) -> str:
    return META_PREFIX + cond.field if cond.metadata else cond.field


def compile_where(flt: Filter | None) -> Where | None:
    """A :data:`Filter` as a Chroma ``where`` on our record layout (None: no filter)."""
    if flt is None:
        return None
    if isinstance(flt, Condition):
        value = list(flt.value) if isinstance(flt.value, tuple) else flt.value
        return {_key(flt): {flt.op: value}}  # type: ignore[dict-item]  # op and value checked
    if isinstance(flt, AnyOf) and not flt.parts:
        raise InvalidInputError("an empty AnyOf matches nothing; leave the filter out instead")
    parts = [p for p in map(compile_where, flt.parts) if p is not None]
    if len(parts) <= 1:
        return parts[0] if parts else None
    return {"$and" if isinstance(flt, AllOf) else "$or": parts}


def matches(flt: Filter | None, meta: Mapping[str, Any] | None) -> bool:
    """Evaluate a filter on one record's metadata in Python, exactly as Chroma would.

    Chroma answers ``get(ids=..., where=...)`` with a scan of the whole collection's metadata
    (~250 ms at 10k memories); fetching by id and filtering here costs microseconds.
    """
    if flt is None:
        return True
    if isinstance(flt, Condition):
        value = (meta or {}).get(_key(flt), _MISSING)
        return _test(flt, _MISSING if value is None else value)
    if isinstance(flt, AllOf):
        return all(matches(p, meta) for p in flt.parts)
    if not flt.parts:
        raise InvalidInputError("an empty AnyOf matches nothing; leave the filter out instead")
    return any(matches(p, meta) for p in flt.parts)


def _test(cond: Condition, value: object) -> bool:
    expected = cond.value if isinstance(cond.value, tuple) else (cond.value,)
    if cond.op in ("$ne", "$nin"):
        return value is _MISSING or not any(_same(value, e) for e in expected)
    if value is _MISSING:
        return False
    if cond.op in ("$eq", "$in"):
        return any(_same(value, e) for e in expected)
    a, b = value, cond.value
    if not (isinstance(a, (int, float)) and isinstance(b, (int, float))
            and _number(a) and _number(b)):
        return False  # ordering compares numbers only (as in Chroma)
    if cond.op == "$gt":
        return a > b
    if cond.op == "$gte":
        return a >= b
    if cond.op == "$lt":
        return a < b
    if cond.op == "$lte":
        return a <= b
    raise InvalidInputError(f"unknown filter operator {cond.op!r}")


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _same(value: object, expected: Scalar) -> bool:
    """Chroma's equality: numbers across int and float; booleans and strings only with their own."""
    if _number(value) and _number(expected):
        return value == expected
    return type(value) is type(expected) and value == expected
