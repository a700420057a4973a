"""How a :class:`MemoryItem` is laid out as a flat Chroma record, and how filters are translated.

System fields are stored under their own names (times as epoch seconds); the caller's metadata
under ``meta.<key>``, so a user key can never overwrite a system field.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from hybridmem.errors import InvalidInputError
from hybridmem.models import MemoryItem, MetadataValue
from hybridmem.protocols import StoredRecord

__all__ = ["from_record", "normalise_text", "text_hash", "to_metadata", "translate_where"]

META_PREFIX = "meta."
_TIME_FIELDS = (
    "created_at",
    "updated_at",
    "valid_from",
    "invalid_at",
    "expires_at",
    "last_accessed_at",
)
_PLAIN_FIELDS = (
    "kind",
    "category",
    "importance",
    "confidence",
    "source",
    "superseded_by",
    "mention_count",
    "access_count",
    "needs_extraction",
    "extractor",
    "key",
)
#: Fields a ``where`` filter may name directly (anything else is caller metadata).
FILTERABLE = (
    frozenset(_PLAIN_FIELDS) | {f"{name}_ts" for name in _TIME_FIELDS} | {"current", "has_key"}
)
_OPERATORS = {"$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin"}
_SPACES = re.compile(r"\s+")
_PUNCT = re.compile(r"[^\w\s]")


def normalise_text(text: str) -> str:
    """Case-, whitespace- and punctuation-insensitive form of a text (for exact dedup)."""
    return _SPACES.sub(" ", _PUNCT.sub(" ", text.casefold())).strip()


def text_hash(text: str) -> str:
    """Hash of :func:`normalise_text`; equal for texts that differ only in case/spacing/punctuation."""
    return hashlib.sha256(normalise_text(text).encode("utf-8")).hexdigest()[:32]


def _ts(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _dt(value: MetadataValue) -> datetime | None:
    if value is None or isinstance(value, (str, bool)):
        return None
    return datetime.fromtimestamp(float(value), tz=timezone.utc)


def to_metadata(item: MemoryItem) -> dict[str, MetadataValue]:
    """The flat record metadata of ``item`` (None values are dropped by the store)."""
    meta: dict[str, MetadataValue] = {name: getattr(item, name) for name in _PLAIN_FIELDS}
    for name in _TIME_FIELDS:
        meta[f"{name}_ts"] = _ts(getattr(item, name))
    meta["current"] = item.is_current
    meta["has_key"] = item.key is not None
    meta["text_hash"] = text_hash(item.text)
    meta["user_id"] = item.user_id
    for key, value in item.metadata.items():
        meta[META_PREFIX + key] = value
    return meta


def from_record(record: StoredRecord) -> MemoryItem:
    """Rebuild a :class:`MemoryItem` from a stored record."""
    m = record.metadata
    fields: dict[str, Any] = {name: m[name] for name in _PLAIN_FIELDS if name in m}
    for name in _TIME_FIELDS:
        fields[name] = _dt(m.get(f"{name}_ts"))
    if fields.get("updated_at") is None:
        fields["updated_at"] = fields.get("created_at")
    fields["metadata"] = {
        k[len(META_PREFIX) :]: v for k, v in m.items() if k.startswith(META_PREFIX)
    }
    return MemoryItem(id=record.id, user_id=str(m.get("user_id", "")), text=record.text, **fields)


def translate_where(where: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Translate a caller's filter to record keys: system fields stay, others become ``meta.<key>``.

    Accepts Chroma's syntax: ``{"category": "purchase"}``, ``{"importance": {"$gte": 0.5}}``,
    ``{"$and": [...]}``, ``{"$or": [...]}``. Several keys at one level are joined with ``$and``.
    """
    if where is None:
        return None
    if not isinstance(where, Mapping):
        raise InvalidInputError("where must be a dict such as {'category': 'purchase'}")
    clauses: list[dict[str, Any]] = []
    for key, value in where.items():
        if key in ("$and", "$or"):
            if not isinstance(value, list) or not value:
                raise InvalidInputError(f"{key} needs a non-empty list of filters")
            parts = [p for p in (translate_where(v) for v in value) if p]
            clauses.append({key: parts} if len(parts) > 1 else parts[0])
            continue
        if not isinstance(key, str) or key.startswith("$"):
            raise InvalidInputError(f"unknown filter operator {key!r}")
        if isinstance(value, Mapping):
            bad = set(value) - _OPERATORS
            if bad or len(value) != 1:
                raise InvalidInputError(
                    f"filter on {key!r} must be a value or one of {sorted(_OPERATORS)}"
                )
        elif value is not None and not isinstance(value, (str, int, float, bool)):
            raise InvalidInputError(f"filter value for {key!r} must be a scalar")
        name = key if key in FILTERABLE else META_PREFIX + key
        clauses.append({name: value})
    if not clauses:
        return None
    return clauses[0] if len(clauses) == 1 else {"$and": clauses}


def matches(where: Mapping[str, Any] | None, metadata: Mapping[str, Any]) -> bool:
    """Evaluate a (translated) Chroma-style filter against one record's metadata in Python.

    Chroma answers ``get(ids=..., where=...)`` with a scan of the whole collection's metadata
    (~250 ms at 10k memories); fetching by id and filtering here costs microseconds. A missing key
    never matches (as in Chroma), except for ``$ne`` / ``$nin``.
    """
    if not where:
        return True
    for key, cond in where.items():
        if key == "$and":
            if not all(matches(c, metadata) for c in cond):
                return False
        elif key == "$or":
            if not any(matches(c, metadata) for c in cond):
                return False
        else:
            op, expected = next(iter(cond.items())) if isinstance(cond, Mapping) else ("$eq", cond)
            if not _compare(op, metadata.get(key), key in metadata, expected):
                return False
    return True


def _compare(op: str, value: Any, present: bool, expected: Any) -> bool:
    if op == "$ne":
        return not present or value != expected
    if op == "$nin":
        return not present or value not in expected
    if not present:
        return False
    if op == "$eq":
        return bool(value == expected)
    if op == "$in":
        return value in expected
    try:
        if op == "$gt":
            return bool(value > expected)
        if op == "$gte":
            return bool(value >= expected)
        if op == "$lt":
            return bool(value < expected)
        if op == "$lte":
            return bool(value <= expected)
    except TypeError:
        return False
    raise InvalidInputError(f"unknown filter operator {op!r}")


def and_filters(*filters: dict[str, Any] | None) -> dict[str, Any] | None:
    """Join filters with ``$and``, skipping None."""
    present = [f for f in filters if f]
    if not present:
        return None
    return present[0] if len(present) == 1 else {"$and": present}
