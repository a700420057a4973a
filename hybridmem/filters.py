"""The typed filter every store seam takes: a small tree of conditions, never a backend's dict.

Callers write filters in the familiar Chroma-like syntax; :func:`parse_where` validates that once, at
the boundary, into :data:`Filter` values, and each store compiles them into its own query language
(:mod:`hybridmem.chroma.vector` for Chroma) or evaluates them in Python — with the same meaning on every
path (a property test checks both return the same ids). The facade builds its own conditions with
:func:`eq` and :func:`all_of`, so no module above the stores knows how a store spells a filter.

The filter language (``where=`` of ``list``, ``search`` and ``context``; the REST ``where`` field)
--------------------------------------------------------------------------------------------------

A filter is a JSON object. Each key names a field and maps to a value (equality) or to one
``{operator: operand}``; several keys are all required::

    {"category": "purchase"}                                   # equality
    {"importance": {"$gte": 0.5}, "kind": "fact"}              # both must hold
    {"$or": [{"category": "work"}, {"project": "apollo"}]}     # project: a metadata key
    {"created_at": {"$gte": "2024-01-01"}}                     # dates as ISO 8601
    {"kind": {"$in": ["fact", "summary"]}, "source": {"$ne": "assistant"}}

======================  ========================================================================
Operator                Meaning
======================  ========================================================================
``$eq`` / ``$ne``       equal / not equal (a bare value means ``$eq``)
``$gt`` ``$gte``        greater than (or equal); numbers and dates only
``$lt`` ``$lte``        less than (or equal); numbers and dates only
``$in`` / ``$nin``      one of / none of a non-empty list of values of one type (at most 1000)
``$and`` / ``$or``      every / at least one of a non-empty list of filters
======================  ========================================================================

**Fields.** The memory's own fields: ``kind``, ``category``, ``source``, ``importance``,
``confidence``, ``mention_count``, ``access_count``, ``needs_extraction``, ``extractor``, ``key``,
``superseded_by``, ``current`` (not superseded or invalidated), ``has_key`` (set by ``remember``),
``text_hash``, and the times ``created_at``, ``updated_at``, ``valid_from``, ``invalid_at``,
``expires_at``, ``last_accessed_at``. Any other name is a key of the memory's ``metadata`` (letters,
digits, ``_``, ``.``, ``-``; starting with a letter or ``_``).

**Times.** A time field takes an ISO 8601 date or datetime (``"2024-01-01"``,
``"2024-01-01T12:00:00+02:00"``; without a zone it is UTC) or epoch seconds. ``<time>_ts`` names
the same field in epoch seconds (``{"created_at_ts": {"$lt": 1700000000}}``) and takes either form.

**Values.** Strings, numbers and booleans; numbers compare across int and float, booleans and
strings only with their own kind (``{"n": true}`` does not match ``n: 1``). A condition on a
metadata key the memory lacks never matches, except ``$ne`` and ``$nin``.

**Refused** with ``InvalidInputError`` (HTTP 422), never silently ignored: unknown operators or
fields that are neither a memory field nor a valid metadata key, null values, NaN and infinities,
lists or objects as values, empty or mixed-type ``$in`` lists, ordering on strings or booleans, a
time that is not ISO 8601, empty ``$and``/``$or`` lists, nesting deeper than 8 levels, more than
256 conditions, text that is not valid Unicode.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timezone
from typing import Any, Literal, Union

from hybridmem.errors import InvalidInputError
from hybridmem.models import _METADATA_KEY, as_utc, is_valid_unicode

__all__ = [
    "OPERATORS",
    "SYSTEM_FIELDS",
    "AllOf",
    "AnyOf",
    "Condition",
    "Filter",
    "Scalar",
    "all_of",
    "as_of_filter",
    "eq",
    "memory_filter",
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
_TS_FIELDS = frozenset(f"{name}_ts" for name in _TIME_FIELDS)
#: The memory fields a filter names (times without their ``_ts``), for messages.
_PUBLIC = (SYSTEM_FIELDS - _TS_FIELDS) | set(_TIME_FIELDS)
#: Fields stored as floats only (no int record to mis-compare, see :func:`_int_safe`).
_FLOAT_FIELDS = frozenset({"importance", "confidence"}) | _TS_FIELDS
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


def memory_filter(
    where: Mapping[str, Any] | None, *, category: str | None = None, current_only: bool = True,
    as_of: datetime | None = None,
) -> Filter | None:
    """The filter of a list/search call: the caller's ``where``, a category, and (unless
    superseded memories are wanted) only current memories — or, with ``as_of``, only the
    memories that were current at that time (see :func:`as_of_filter`)."""
    validity: Filter | None
    if as_of is None:
        validity = eq("current", True) if current_only else None
    else:
        validity = as_of_filter(as_of, valid_only=current_only)
    return all_of(
        parse_where(where),
        eq("category", category) if category is not None else None,
        validity,
    )


def as_of_filter(as_of: datetime, *, valid_only: bool = True) -> Filter:
    """The memories as they stood at ``as_of`` (time travel over the bi-temporal fields).

    A memory existed at ``t`` when it was recorded by then (``created_at <= t``); it was valid at
    ``t`` when, besides, it had not yet been invalidated: it is still current, or its
    ``invalid_at`` (the time the memory that superseded it became valid) is after ``t``. With
    ``valid_only=False`` every memory recorded by ``t`` matches (the past with its own history).
    Deleted memories are gone for good, and an updated text is shown as it is now."""
    t = as_utc(as_of).timestamp()
    recorded = Condition("created_at_ts", "$lte", t)
    if not valid_only:
        return recorded
    return AllOf((recorded, AnyOf((eq("current", True), Condition("invalid_at_ts", "$gt", t)))))


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


def _field(key: str) -> str:
    """The stored field a filter key names: ``created_at`` means ``created_at_ts``."""
    if not is_valid_unicode(key):
        raise InvalidInputError("a filter field name is not valid Unicode")
    if key in _TIME_FIELDS:
        return f"{key}_ts"
    if key not in SYSTEM_FIELDS and not _METADATA_KEY.match(key):
        raise InvalidInputError(
            f"unknown filter field {key!r}: use a memory field ({', '.join(sorted(_PUBLIC))}) "
            "or a metadata key (letters, digits, '_', '.', '-')"
        )
    return key


def _epoch(key: str, value: object) -> object:
    """A time operand as epoch seconds: ISO 8601 strings (naive = UTC) and datetimes converted,
    numbers kept, anything else left for :func:`_scalar` to judge."""
    if isinstance(value, datetime):
        return as_utc(value).timestamp()
    if isinstance(value, date):
        return datetime.combine(value, time(), tzinfo=timezone.utc).timestamp()
    if isinstance(value, str):
        try:
            return as_utc(datetime.fromisoformat(value.strip())).timestamp()
        except ValueError:
            raise InvalidInputError(
                f"filter value for {key!r} must be an ISO 8601 time such as '2024-01-01' or "
                f"'2024-01-01T12:00:00Z', or epoch seconds; got {value[:40]!r}"
            ) from None
    return value


def _condition(key: str, value: object) -> Filter:
    """One field's condition; see :func:`_int_safe` for fractional numbers."""
    return _int_safe(_plain_condition(key, value))


def _int_safe(cond: Condition) -> Filter:
    """``cond`` with fractional number operands spelled so that Chroma agrees with Python.

    Chroma compares a record's *int* value with a float operand truncated to an int (``n: 0``
    matches ``{"$eq": 0.5}`` and ``{"$in": [0.5]}``; ``{"$lt": 0.5}`` misses it). For an operand
    ``f`` with a fraction, the truncation ``k`` is the only int it gets wrong, so one equality on
    ``k`` patches it: ``$eq f`` and ``$ne k`` ... (each patch is a no-op on floats and in Python,
    where ints compare with ``f`` exactly). ``$in`` / ``$nin`` become ``$or`` / ``$and`` of ``$eq`` /
    ``$ne``."""
    values = cond.value if isinstance(cond.value, tuple) else (cond.value,)
    if cond.field in _FLOAT_FIELDS or not any(_fractional(v) for v in values):
        return cond
    if cond.op in ("$in", "$nin"):
        one: Op = "$eq" if cond.op == "$in" else "$ne"
        parts = tuple(_int_safe(Condition(cond.field, one, v, cond.metadata)) for v in values)
        return AnyOf(parts) if cond.op == "$in" else AllOf(parts)
    f = float(cond.value)  # type: ignore[arg-type]  # a fractional float (checked)
    k = Condition(cond.field, "$eq", int(f), cond.metadata)  # int() truncates, as Chroma does
    not_k = Condition(cond.field, "$ne", int(f), cond.metadata)
    if cond.op == "$eq" or (cond.op == "$gte" and f > 0) or (cond.op == "$lte" and f < 0):
        return AllOf((cond, not_k))
    if cond.op == "$ne" or (cond.op == "$gt" and f < 0) or (cond.op == "$lt" and f > 0):
        return AnyOf((cond, k))
    return cond


def _fractional(value: object) -> bool:
    return isinstance(value, float) and math.isfinite(value) and not value.is_integer()


def _plain_condition(key: str, value: object) -> Condition:
    key = _field(key)
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
        if key in _TS_FIELDS:
            operand = [_epoch(key, v) for v in operand]
        values = tuple(_scalar(key, v) for v in operand)
        if len({_kind(v) for v in values}) > 1:
            raise InvalidInputError(f"{op} on {key!r} needs values of one type")
        if len({type(v) for v in values}) > 1:  # ints and floats: Chroma wants one type
            values = tuple(float(v) for v in values)
        checked: Scalar | tuple[Scalar, ...] = values
    else:
        checked = _scalar(key, _epoch(key, operand) if key in _TS_FIELDS else operand)
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
