"""hybridmem.filters: parse_where's accepted forms and every refusal its docstring lists."""

from __future__ import annotations

from typing import Any

import pytest

from hybridmem.errors import InvalidInputError
from hybridmem.filters import (
    MAX_CONDITIONS,
    MAX_DEPTH,
    MAX_IN_VALUES,
    SYSTEM_FIELDS,
    AllOf,
    AnyOf,
    Condition,
    all_of,
    conditions,
    eq,
    parse_where,
)


def nested(depth: int) -> dict[str, Any]:
    """A filter whose innermost condition sits ``depth`` ``$and`` levels down."""
    where: dict[str, Any] = {"color": "red"}
    for n in range(depth):
        where = {"$and": [where, {f"k{n}": n}]}
    return where


@pytest.mark.parametrize(("where", "want"), [
    (None, None),
    ({}, None),
    ({"category": "purchase"}, Condition("category", "$eq", "purchase")),
    ({"color": "red"}, Condition("color", "$eq", "red", metadata=True)),
    ({"importance": {"$gte": 0.5}}, Condition("importance", "$gte", 0.5)),
    ({"created_at_ts": {"$lt": 1700000000}}, Condition("created_at_ts", "$lt", 1700000000)),
    ({"needs_extraction": True}, Condition("needs_extraction", "$eq", True)),
    ({"n": {"$ne": 3}}, Condition("n", "$ne", 3, metadata=True)),
    ({"n": {"$in": [1, 2.5]}}, Condition("n", "$in", (1, 2.5), metadata=True)),
    ({"kind": {"$nin": ["turn", "summary"]}}, Condition("kind", "$nin", ("turn", "summary"))),
    ({"kind": "fact", "color": "red"},
     AllOf((Condition("kind", "$eq", "fact"), Condition("color", "$eq", "red", metadata=True)))),
    ({"$or": [{"kind": "fact"}, {"current": False}]},
     AnyOf((Condition("kind", "$eq", "fact"), Condition("current", "$eq", False)))),
    ({"$and": [{"kind": "fact"}]}, Condition("kind", "$eq", "fact")),
    ({"$and": [{}, {"kind": "fact"}]}, Condition("kind", "$eq", "fact")),
    ({"$and": [{"$or": [{"a": 1}, {"b": 2}]}, {"kind": "fact"}]},
     AllOf((AnyOf((Condition("a", "$eq", 1, metadata=True),
                   Condition("b", "$eq", 2, metadata=True))),
            Condition("kind", "$eq", "fact")))),
    ({"note": "ünicode ✓"}, Condition("note", "$eq", "ünicode ✓", metadata=True)),
])
def test_valid_forms(where: dict[str, Any] | None, want: Any) -> None:
    assert parse_where(where) == want


def test_system_fields_and_metadata_keys() -> None:
    assert {"kind", "key", "current", "has_key", "text_hash", "created_at_ts"} <= SYSTEM_FIELDS
    assert "created_at" not in SYSTEM_FIELDS  # times are filtered as epoch seconds, *_ts
    assert parse_where({"created_at": 1}) == Condition("created_at", "$eq", 1, metadata=True)


def test_helpers() -> None:
    kind, color = eq("kind", "summary"), eq("color", "red")
    assert kind == Condition("kind", "$eq", "summary") and color.metadata
    assert all_of() is None and all_of(None, None) is None
    assert all_of(None, kind) is kind
    assert all_of(kind, None, color) == AllOf((kind, color))
    assert conditions(None) == () and conditions(AnyOf((kind, AllOf((color, kind))))) == (
        kind, color, kind)
    assert hash(AllOf((kind, color))) == hash(AllOf((kind, color)))  # frozen values


def test_limits_are_inclusive() -> None:
    assert parse_where(nested(MAX_DEPTH)) is not None
    assert parse_where({"$and": [{f"k{n}": n} for n in range(MAX_CONDITIONS)]}) is not None
    assert parse_where({"n": {"$in": list(range(MAX_IN_VALUES))}}) is not None


@pytest.mark.parametrize(("where", "message"), [
    # not a dict
    ("category=purchase", "must be a dict"),
    ({"$and": ["category"]}, "must be a dict"),
    # unknown operators
    ({"a": {"$regex": "x"}}, "must be a value or one of"),
    ({"a": {"$eq": 1, "$ne": 2}}, "must be a value or one of"),
    ({"a": {}}, "must be a value or one of"),
    ({"$not": [{"a": 1}]}, "unknown filter operator"),
    ({"": 1}, "unknown filter operator"),
    # non-scalar or null values
    ({"a": [1, 2]}, "string, number or boolean, not list"),
    ({"a": {"$eq": {"b": 1}}}, "string, number or boolean, not dict"),
    ({"a": None}, "not NoneType"),
    ({"a": {"$ne": None}}, "not NoneType"),
    ({"a": {"$in": [1, None]}}, "not NoneType"),
    ({"a": "\ud800"}, "not valid Unicode"),
    # NaN and infinities
    ({"a": float("nan")}, "finite"),
    ({"a": {"$lt": float("inf")}}, "finite"),
    ({"a": {"$in": [1.0, float("-inf")]}}, "finite"),
    # empty or mixed-type $in lists, and lists that are not lists
    ({"a": {"$in": []}}, "non-empty list"),
    ({"a": {"$nin": "abc"}}, "non-empty list"),
    ({"a": {"$in": [1, "1"]}}, "one type"),
    ({"a": {"$in": [True, 1]}}, "one type"),
    ({"a": {"$in": list(range(MAX_IN_VALUES + 1))}}, f"at most {MAX_IN_VALUES}"),
    # ordering operators on non-numbers
    ({"a": {"$gt": "b"}}, "needs a number"),
    ({"a": {"$lte": True}}, "needs a number"),
    # empty $and / $or lists
    ({"$and": []}, "non-empty list"),
    ({"$or": {"a": 1}}, "non-empty list"),
    ({"$or": [{}, {}]}, "at least one non-empty filter"),
    # too deep, too many
    (nested(MAX_DEPTH + 1), "nested deeper"),
    ({"$or": [{f"k{n}": n} for n in range(MAX_CONDITIONS + 1)]}, f"more than {MAX_CONDITIONS}"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_refusals(where: Any, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message) as err:
        parse_where(where)
    assert isinstance(err.value, ValueError) and err.value.status_code == 422
