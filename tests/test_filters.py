"""hybridmem.filters: parse_where's accepted forms and every refusal its docstring lists."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

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
from hybridmem.models import MemoryItem
from hybridmem.chroma.vector import ChromaVectorStore, matches


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
    ({"n": {"$in": [1, 2]}}, Condition("n", "$in", (1, 2), metadata=True)),
    ({"n": {"$in": [1, 2.0]}}, Condition("n", "$in", (1.0, 2.0), metadata=True)),  # one type
    ({"n": {"$in": [1, 2.5]}},  # a fraction: see test_fractional_operands_mean_the_same...
     AnyOf((Condition("n", "$eq", 1.0, metadata=True),
            AllOf((Condition("n", "$eq", 2.5, metadata=True),
                   Condition("n", "$ne", 2, metadata=True)))))),
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
    assert "created_at" not in SYSTEM_FIELDS  # times are stored as epoch seconds, *_ts
    # ... and a time's own name means that field (not a metadata key of the same name)
    assert parse_where({"created_at": 1}) == Condition("created_at_ts", "$eq", 1)


@pytest.mark.parametrize(("where", "want"), [
    ({"created_at": {"$gte": "2024-01-01"}}, Condition("created_at_ts", "$gte", 1704067200.0)),
    ({"created_at_ts": {"$gte": "2024-01-01"}}, Condition("created_at_ts", "$gte", 1704067200.0)),
    ({"updated_at": {"$lt": "2024-01-01T02:00:00+02:00"}},
     Condition("updated_at_ts", "$lt", 1704067200.0)),
    ({"expires_at": {"$lte": "2024-01-01T00:00:00"}},  # naive: UTC
     Condition("expires_at_ts", "$lte", 1704067200.0)),
    ({"valid_from": {"$in": ["2024-01-01", "2024-01-02"]}},
     Condition("valid_from_ts", "$in", (1704067200.0, 1704153600.0))),
    ({"created_at": {"$gt": datetime(2024, 1, 1, tzinfo=timezone.utc)}},
     Condition("created_at_ts", "$gt", 1704067200.0)),
    ({"created_at": {"$gt": 1700000000}}, Condition("created_at_ts", "$gt", 1700000000)),
])
def test_times_take_iso_8601(where: dict[str, Any], want: Condition) -> None:
    assert parse_where(where) == want


@pytest.mark.parametrize("where", [
    {"created_at": {"$gte": "yesterday"}},
    {"created_at": {"$gte": "2024-13-01"}},
    {"updated_at": {"$in": ["2024-01-01", "soon"]}},
    {"created_at": {"$gt": True}},
    {"bad key!": 1},
    {"9lives": 1},
    {"\ud800": 1},
    {"a": {"$eq": "\udfff"}},
])
def test_bad_times_fields_and_text_are_refused(where: dict[str, Any]) -> None:
    with pytest.raises(InvalidInputError):
        parse_where(where)


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
    deepest = parse_where(nested(MAX_DEPTH))
    for n in reversed(range(MAX_DEPTH)):
        assert isinstance(deepest, AllOf) and len(deepest.parts) == 2
        assert deepest.parts[1] == Condition(f"k{n}", "$eq", n, metadata=True)
        deepest = deepest.parts[0]
    assert deepest == Condition("color", "$eq", "red", metadata=True)
    widest = parse_where({"$and": [{f"k{n}": n} for n in range(MAX_CONDITIONS)]})
    assert widest == AllOf(tuple(Condition(f"k{n}", "$eq", n, metadata=True)
                                 for n in range(MAX_CONDITIONS)))
    assert parse_where({"n": {"$in": list(range(MAX_IN_VALUES))}}) == Condition(
        "n", "$in", tuple(range(MAX_IN_VALUES)), metadata=True)


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


# the same meaning on every path: Chroma's where (list) and the Python evaluation (get) ----------

_KEYS = ("a", "b", "c")
_POOL = st.one_of(st.sampled_from([0, 1, 2, -1, 2**40]), st.sampled_from([0.0, 0.5, 1.0, 1.5]),
                  st.booleans(), st.sampled_from(["x", "y", "", "X", "ü"]))
_TIMES = [datetime(2023, 6, 1, tzinfo=timezone.utc), datetime(2024, 1, 1, tzinfo=timezone.utc),
          datetime(2024, 7, 1, 12, tzinfo=timezone.utc)]


def _operand(op: str, field: str) -> st.SearchStrategy[Any]:
    if field == "created_at":
        iso = st.sampled_from(["2023-01-01", "2024-01-01", "2024-01-01T00:00:00Z", "2025-01-01",
                               "2024-07-01T12:00:00+00:00"])
        return st.lists(iso, min_size=1, max_size=3) if op in ("$in", "$nin") else iso
    if field == "importance":
        number = st.sampled_from([0.0, 0.25, 0.5, 1, 0.75])
        return st.lists(number, min_size=1, max_size=3) if op in ("$in", "$nin") else number
    if op in ("$gt", "$gte", "$lt", "$lte"):
        return st.sampled_from([0, 1, 0.5, -1, 1.5, 2**40])
    if op in ("$in", "$nin"):
        return st.one_of(
            st.lists(st.sampled_from([0, 1, 2, 0.5, 2**40]), min_size=1, max_size=3),
            st.lists(st.sampled_from(["x", "y", "X"]), min_size=1, max_size=3),
            st.lists(st.booleans(), min_size=1, max_size=2),
        )
    return _POOL


@st.composite
def _condition(draw: st.DrawFn) -> dict[str, Any]:
    field = draw(st.sampled_from([*_KEYS, "kind", "category", "importance", "current",
                                  "created_at"]))
    ops = ["$eq", "$ne", "$in", "$nin"]
    if field in ("importance", "created_at", *_KEYS):
        ops += ["$gt", "$gte", "$lt", "$lte"]
    if field == "kind":
        return {field: draw(st.sampled_from(["fact", "turn", {"$ne": "turn"},
                                             {"$in": ["fact", "summary"]}]))}
    if field == "category":
        return {field: draw(st.sampled_from(["work", "home", {"$nin": ["work"]}]))}
    if field == "current":
        return {field: draw(st.booleans())}
    op = draw(st.sampled_from(ops))
    return {field: {op: draw(_operand(op, field))}}


_WHERE = st.recursive(
    _condition(),
    lambda inner: st.one_of(
        st.builds(lambda parts: {"$and": parts}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda parts: {"$or": parts}, st.lists(inner, min_size=1, max_size=3)),
    ),
    max_leaves=6,
)


@st.composite
def _store(draw: st.DrawFn) -> list[MemoryItem]:
    items = []
    for n in range(draw(st.integers(min_value=0, max_value=8))):
        created = draw(st.sampled_from(_TIMES))
        keys = draw(st.lists(st.sampled_from(_KEYS), unique=True, max_size=3))
        items.append(MemoryItem(
            id=f"m{n}", user_id="prop", text=f"memory {n}", created_at=created,
            updated_at=created, valid_from=created,
            kind=draw(st.sampled_from(["fact", "turn", "summary"])),
            category=draw(st.sampled_from(["work", "home"])),
            importance=draw(st.sampled_from([0.0, 0.25, 0.5, 1.0])),
            superseded_by=draw(st.sampled_from([None, None, "m0"])),
            metadata={k: draw(_POOL) for k in keys},
        ))
    return items


@pytest.mark.parametrize("op", ["$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin"])
@pytest.mark.parametrize("operand", [0.5, 1.5, -0.5, -1.5, 1e300])
def test_fractional_operands_mean_the_same_on_int_records(
    chroma_store: ChromaVectorStore, op: str, operand: float
) -> None:
    """Chroma truncates a float operand compared with an int record (n: 0 "equals" 0.5)."""
    numbers = [-2, -1, 0, 1, 2, 0.5, -0.5, 1.5, -1.5]
    items = [MemoryItem(id=f"n{i}", user_id="prop", text="t", created_at=_TIMES[0],
                        updated_at=_TIMES[0], metadata={"n": n}) for i, n in enumerate(numbers)]
    chroma_store.drop_user("prop")
    chroma_store.upsert("prop", items, [[1.0, float(n)] for n in range(len(items))])
    flt = parse_where({"n": {op: [operand] if op in ("$in", "$nin") else operand}})
    by_chroma = {i.id for i in chroma_store.list("prop", where=flt)}
    want = {i.id for i, n in zip(items, numbers) if _holds(op, n, operand)}
    assert by_chroma == want
    assert {i.id for i in chroma_store.get("prop", [i.id for i in items], where=flt)} == want


def _holds(op: str, a: float, b: float) -> bool:
    return {"$eq": a == b, "$ne": a != b, "$gt": a > b, "$gte": a >= b, "$lt": a < b,
            "$lte": a <= b, "$in": a == b, "$nin": a != b}[op]


@pytest.fixture(scope="module")
def chroma_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChromaVectorStore]:
    with ChromaVectorStore(embedder_name="prop", dimension=2,
                           path=tmp_path_factory.mktemp("prop")) as store:
        yield store


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(items=_store(), where=_WHERE)
def test_chroma_and_python_filters_return_the_same_ids(
    chroma_store: ChromaVectorStore, items: list[MemoryItem], where: dict[str, Any]
) -> None:
    """``list`` sends the compiled filter to Chroma; ``get`` evaluates it in Python."""
    chroma_store.drop_user("prop")
    chroma_store.upsert("prop", items, [[1.0, float(n)] for n in range(len(items))])
    flt = parse_where(where)
    note(f"where={where!r} items={[(i.id, _record(i)) for i in items]!r}")
    by_chroma = {i.id for i in chroma_store.list("prop", where=flt)}
    by_python = {i.id for i in chroma_store.get("prop", [i.id for i in items], where=flt)}
    assert by_chroma == by_python
    assert by_python == {i.id for i in items if matches(flt, _record(i))}


def _record(item: MemoryItem) -> dict[str, Any]:
    """The record Chroma holds for ``item``, read back through the store's own evaluation."""
    meta: dict[str, Any] = {f"meta.{k}": v for k, v in item.metadata.items()}
    meta.update(kind=item.kind, category=item.category, importance=item.importance,
                current=item.is_current, created_at_ts=item.created_at.timestamp())
    return meta
