"""The typed filter every store seam takes: a small tree of conditions, never a backend's dict.

Callers write filters in the familiar Chroma-like syntax (``{"category": "purchase"}``,
``{"importance": {"$gte": 0.5}}``, ``{"$or": [...]}``); :func:`parse_where` validates that once, at
the boundary, into :data:`Filter` values, and each store compiles them into its own query language
(:mod:`hybridmem.vector` for Chroma). The facade builds its own conditions with :func:`eq` and
:func:`all_of`, so no module above the stores knows how a store spells a filter.

Field names: :data:`SYSTEM_FIELDS` are the memory's own fields (times as epoch seconds under
``<name>_ts``; ``current``, ``has_key`` and ``text_hash`` are derived); any other name is a key of
the caller's ``metadata``. A condition on a missing metadata key never matches, except ``$ne`` and
``$nin``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Union

from hybridmem.errors import InvalidInputError

__all__ = [
    "OPERATORS",
    "SYSTEM_FIELDS",
    "AllOf",
    "AnyOf",
    "Condition",
    "Filter",
    "Scalar",
    "all_of",
    "eq",
    "parse_where",
]

Scalar = Union[str, int, float, bool]
Op = Literal["$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin"]
OPERATORS: frozenset[str] = frozenset({"$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin"})
_ORDERED = frozenset({"$gt", "$gte", "$lt", "$lte"})
_LISTS = frozenset({"$in", "$nin"})
_TIME_FIELDS = ("created_at", "updated_at", "valid_from", "invalid_at", "expires_at",
                "last_accessed_at")
#: Fields of a memory a filter may name directly; every other name is a metadata key.
SYSTEM_FIELDS: frozenset[str] = frozenset(
    {"kind", "category", "importance", "confidence", "source", "superseded_by", "mention_count",
     "access_count", "needs_extraction", "extractor", "key", "current", "has_key", "text_hash"}
    | {f"{name}_ts" for name in _TIME_FIELDS}
)
#: Deepest nesting of ``$and`` / ``$or`` accepted, and most conditions in one filter.
MAX_DEPTH = 8
MAX_CONDITIONS = 256
MAX_IN_VALUES = 1000


@dataclass(frozen=True)
class Condition:
    """``field op value``; ``metadata`` says whether ``field`` is a key of the caller's metadata."""

    field: str
    op: Op
    value: Scalar | tuple[Scalar, ...]
    metadata: bool = False


@dataclass(frozen=True)
class AllOf:
    """Every part matches."""

    parts: tuple[Filter, ...]


@dataclass(frozen=True)
class AnyOf:
    """At least one part matches."""

    parts: tuple[Filter, ...]


Filter = Union[Condition, AllOf, AnyOf]


def eq(field: str, value: Scalar) -> Condition:
    """A system-field equality (``eq("kind", "summary")``)."""
    return Condition(field, "$eq", value, metadata=field not in SYSTEM_FIELDS)


def all_of(*filters: Filter | None) -> Filter | None:
    """Join filters (None ones skipped); None when nothing is left."""
    present = tuple(f for f in filters if f is not None)
    if not present:
        return None
    return present[0] if len(present) == 1 else AllOf(present)


def parse_where(where: Mapping[str, Any] | None) -> Filter | None:
    """Validate a caller's Chroma-style ``where`` dict into a :data:`Filter` (None for no filter).

    Several keys at one level are joined with ``$and``. Refused with :class:`InvalidInputError`:
    unknown operators, non-scalar or null values, NaN and infinities, empty or mixed-type ``$in``
    lists, ordering operators on non-numbers, empty ``$and``/``$or`` lists, nesting deeper than
    :data:`MAX_DEPTH`, more than :data:`MAX_CONDITIONS` conditions.
    """
    if where is None:
        return None
    counter = [0]
    return _parse(where, 0, counter)


def _parse(where: object, depth: int, counter: list[int]) -> Filter | None:
    if not isinstance(where, Mapping):
        raise InvalidInputError("where must be a dict such as {'category': 'purchase'}")
    if depth > MAX_DEPTH:
        raise InvalidInputError(f"where is nested deeper than {MAX_DEPTH} levels")
    parts: list[Filter] = []
    for key, value in where.items():
        if key in ("$and", "$or"):
            if not isinstance(value, list) or not value:
                raise InvalidInputError(f"{key} needs a non-empty list of filters")
            inner = [p for p in (_parse(v, depth + 1, counter) for v in value) if p is not None]
            if not inner:
                raise InvalidInputError(f"{key} needs at least one non-empty filter")
            if len(inner) == 1:
                parts.append(inner[0])
            else:
                parts.append(AllOf(tuple(inner)) if key == "$and" else AnyOf(tuple(inner)))
            continue
        if not isinstance(key, str) or not key or key.startswith("$"):
            raise InvalidInputError(f"unknown filter operator {key!r}")
        counter[0] += 1
        if counter[0] > MAX_CONDITIONS:
            raise InvalidInputError(f"where has more than {MAX_CONDITIONS} conditions")
        parts.append(_condition(key, value))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else AllOf(tuple(parts))


def _condition(key: str, value: object) -> Condition:
    if isinstance(value, Mapping):
        if len(value) != 1 or next(iter(value)) not in OPERATORS:
            raise InvalidInputError(
                f"filter on {key!r} must be a value or one of {sorted(OPERATORS)}"
            )
        op, operand = next(iter(value.items()))
    else:
        op, operand = "$eq", value
    if op in _LISTS:
        if not isinstance(operand, list) or not operand:
            raise InvalidInputError(f"{op} on {key!r} needs a non-empty list of values")
        if len(operand) > MAX_IN_VALUES:
            raise InvalidInputError(f"{op} on {key!r} takes at most {MAX_IN_VALUES} values")
        values = tuple(_scalar(key, v) for v in operand)
        if len({_kind(v) for v in values}) > 1:
            raise InvalidInputError(f"{op} on {key!r} needs values of one type")
        checked: Scalar | tuple[Scalar, ...] = values
    else:
        checked = _scalar(key, operand)
        if op in _ORDERED and _kind(checked) != "number":
            raise InvalidInputError(f"{op} on {key!r} needs a number")
    return Condition(key, op, checked, metadata=key not in SYSTEM_FIELDS)


def _scalar(key: str, value: object) -> Scalar:
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidInputError(f"filter value for {key!r} must be a finite number")
    if isinstance(value, str):
        if any(0xD800 <= ord(c) <= 0xDFFF for c in value):
            raise InvalidInputError(f"filter value for {key!r} is not valid Unicode")
        return value
    if isinstance(value, (bool, int, float)):
        return value
    raise InvalidInputError(
        f"filter value for {key!r} must be a string, number or boolean, not "
        f"{type(value).__name__}"
    )


def _kind(value: Scalar) -> str:
    if isinstance(value, bool):
        return "bool"
    return "number" if isinstance(value, (int, float)) else "str"


def conditions(flt: Filter | None) -> Sequence[Condition]:
    """Every condition of a filter (for checks such as "does it name metadata?")."""
    if flt is None:
        return ()
    if isinstance(flt, Condition):
        return (flt,)
    return tuple(c for part in flt.parts for c in conditions(part))
