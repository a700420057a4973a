"""The boundary of the Python API: bad input is a typed error and changes nothing; imports are
validated whole before anything is written.

Hypothesis drives the API with hostile texts (lone surrogates, controls, bidi marks), metadata,
filters and limits: every refusal is a :class:`HybridMemError` subclass, and a refused call leaves
the user's memories as they were.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from hybridmem import Memory, Settings
from hybridmem.errors import HybridMemError, InvalidInputError, InvalidUserIdError, NotFoundError
from hybridmem.models import MAX_SAFE_INT, is_valid_unicode
from hybridmem.offline import LocalEmbedder

pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")

# -- named cases (hostile inputs, each a typed error) ----------------------------------------------


@pytest.mark.parametrize("user_id", ["a\ud800", "a\u202eb", "a\x85", "a\ufffd", "a\u2066b"])  # noqa: PT014
def test_bad_user_ids_are_refused(mem: Memory, user_id: str) -> None:
    with pytest.raises(InvalidUserIdError):
        mem.add(user_id, "hello")


@pytest.mark.parametrize(("call", "kwargs"), [
    ("add", {"text": "a\ud800b"}),
    ("add", {"text": "fine", "metadata": {"k": "\udc00"}}),
    ("add", {"text": "fine", "metadata": ["a"]}),
    ("add", {"text": "fine", "metadata": {"big": MAX_SAFE_INT + 1}}),
    ("add", {"text": "fine", "metadata": {"small": -MAX_SAFE_INT - 1}}),
    ("add", {"text": "fine", "category": "\ud800"}),
    ("search", {"query": "\ud800"}),
    ("search", {"query": "x", "where": {"a": {"$in": "abc"}}}),
    ("search", {"query": "x", "where": {"$and": [{}]}}),
    ("search", {"query": "x", "where": {"a": {"$in": []}}}),
    ("search", {"query": "x", "where": {"a": {"$gt": "a"}}}),
    ("search", {"query": "x", "where": {"a": None}}),
    ("search", {"query": "x", "where": {"a": float("nan")}}),
    ("search", {"query": "x", "where": {"a": {"$in": [1, "a"]}}}),
    ("list", {"where": {"created_at": {"$gte": "not a date"}}}),
])
def test_bad_input_is_a_typed_error_and_stores_nothing(mem: Memory, call: str,
                                                       kwargs: dict[str, Any]) -> None:
    mem.add("u", "already here")
    with pytest.raises(InvalidInputError):
        getattr(mem, call)("u", **kwargs)
    assert mem.count("u") == 1


_SURROGATE_ID = st.builds(
    lambda head, lone, tail: head + lone + tail,
    st.text(alphabet="abcdef0123456789", max_size=20),
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
    st.text(alphabet="abcdef0123456789", max_size=20),
)
_MEMORY_ID_CALLS = ["get", "forget", "update", "history"]
_USER_ID_CALLS = ["add", "search", "list", "count", "get", "forget", "history", "stats",
                  "export", "entities", "relations", "facts", "context", "graph", "prune",
                  "refresh", "summarize", "reextract", "remember", "add_messages", "query_path"]


def _call_with_ids(mem: Memory, call: str, user_id: str, memory_id: str) -> object:
    """Call ``call`` with the ids and the least other arguments it takes."""
    if call in ("add", "search", "context"):
        return getattr(mem, call)(user_id, "laptop")
    if call in ("get", "forget", "history"):
        return getattr(mem, call)(user_id, memory_id)
    if call == "update":
        return mem.update(user_id, memory_id, text="new")
    if call == "remember":
        return mem.remember(user_id, "city", "Lyon")
    if call == "add_messages":
        return mem.add_messages(user_id, [{"role": "user", "content": "hello"}])
    if call == "query_path":
        return mem.query_path(user_id, "laptops", "memory")
    return getattr(mem, call)(user_id)


@pytest.mark.parametrize("call", _MEMORY_ID_CALLS)
def test_memory_ids_with_a_lone_surrogate_are_invalid_input(mem: Memory, call: str) -> None:
    item = mem.add("u", "already here")
    with pytest.raises(InvalidInputError, match="memory_id is not valid Unicode"):
        _call_with_ids(mem, call, "u", "\ud800")
    assert [i.id for i in mem.list("u")] == [item.id]
    assert [e.action for e in mem.history("u")] == ["add"]


@settings(max_examples=80, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bad=_SURROGATE_ID, call=st.sampled_from(_MEMORY_ID_CALLS + _USER_ID_CALLS),
       which=st.sampled_from(["memory_id", "user_id"]))
def test_a_lone_surrogate_anywhere_in_an_id_is_invalid_input(
    fuzz_mem: Memory, bad: str, call: str, which: str
) -> None:
    if which == "memory_id" and call not in _MEMORY_ID_CALLS:
        which = "user_id"
    expected = InvalidUserIdError if which == "user_id" else InvalidInputError
    before = _state(fuzz_mem, "fuzz")
    with pytest.raises(expected, match=f"{which} is not valid Unicode"):
        _call_with_ids(fuzz_mem, call, bad if which == "user_id" else "fuzz",
                       bad if which == "memory_id" else "0" * 32)
    assert _state(fuzz_mem, "fuzz") == before


def test_metadata_ints_up_to_2_53_round_trip(mem: Memory) -> None:
    item = mem.add("u", "big numbers", metadata={"hi": MAX_SAFE_INT, "lo": -MAX_SAFE_INT})
    again = mem.get("u", item.id).metadata
    assert again == {"hi": MAX_SAFE_INT, "lo": -MAX_SAFE_INT}
    assert all(type(v) is int for v in again.values())


def test_iso_dates_filter_created_at(mem: Memory) -> None:
    from datetime import datetime, timezone
    old = mem.add("u", "an old memory", created_at=datetime(2020, 5, 1, tzinfo=timezone.utc))
    new = mem.add("u", "a new memory", created_at=datetime(2024, 5, 1, tzinfo=timezone.utc))
    assert [i.id for i in mem.list("u", where={"created_at": {"$gte": "2024-01-01"}})] == [new.id]
    assert [i.id for i in mem.list("u", where={"created_at": {"$lt": "2024-01-01"}})] == [old.id]


# -- imports ---------------------------------------------------------------------------------------


@pytest.fixture()
def bundle(mem: Memory) -> dict[str, Any]:
    mem.add_many("src", ["Ann bought a ROG laptop", "Ann lives in Berlin"])
    mem.remember("src", "tea", "green")
    return json.loads(json.dumps(mem.export("src")))


def _state(mem: Memory, user_id: str) -> Any:
    exported = mem.export(user_id)
    return exported["memories"], exported["graph"], len(exported["history"])


def _broken(bundle: dict[str, Any], how: str) -> dict[str, Any]:
    b = copy.deepcopy(bundle)
    graph = b["graph"]["graph"]
    if how == "multigraph":
        graph["multigraph"] = True
    elif how == "undirected":
        graph["directed"] = False
    elif how == "first_seen":
        graph["nodes"][0]["first_seen"] = 5
    elif how == "confidence":
        graph["edges"][0]["evidence"] = {"bought": {b["memories"][0]["id"]: 7}}
    elif how == "graph_cites_unknown":
        graph["nodes"][0]["memory_ids"] = ["not-in-the-bundle"]
    elif how == "late_bad_id":
        b["memories"][-1]["id"] = "bad\u202eid"
    elif how == "late_bad_text":
        b["memories"][-1]["text"] = "bad \ud800 text"
    elif how == "duplicate_id":
        b["memories"].append(dict(b["memories"][0]))
    elif how == "forged_event":
        b["history"].append({"memory_id": "someone-elses", "action": "update", "cause": "x"})
    elif how == "forged_delete":  # says a memory the user has was deleted
        b["history"].append({"memory_id": "LIVE", "action": "delete", "cause": "x"})
    elif how == "bad_event":
        b["history"].append({"memory_id": b["memories"][0]["id"], "action": "explode"})
    elif how == "fact_mismatch":
        b["facts"] = {"tea": b["memories"][0]["id"]}
    elif how == "memories_not_list":
        b["memories"] = {"a": 1}
    elif how == "bad_metadata":
        b["memories"][0]["metadata"] = {"n": 2**60}
    elif how == "no_format":
        del b["format"]
    return b


BROKEN = ["multigraph", "undirected", "first_seen", "confidence", "graph_cites_unknown",
          "late_bad_id", "late_bad_text", "duplicate_id", "forged_event", "bad_event",
          "fact_mismatch", "memories_not_list", "bad_metadata", "no_format", "forged_delete"]


@pytest.mark.parametrize("how", BROKEN)
def test_a_bad_bundle_is_refused_whole(mem: Memory, bundle: dict[str, Any], how: str) -> None:
    live = mem.add("dst", "Dst already has a memory")
    before = _state(mem, "dst")
    broken = json.loads(json.dumps(_broken(bundle, how)).replace("LIVE", live.id))
    with pytest.raises(InvalidInputError):
        mem.import_("dst", broken)
    assert _state(mem, "dst") == before
    oslo = mem.add("dst", "Dst lives in Oslo")  # the user still works
    assert mem.search("dst", "Oslo")[0].item.id == oslo.id
    assert "] Dst lives in Oslo\n" in mem.context("dst", "Oslo").text


def test_an_import_keeps_history_and_adds_one_import_event(mem: Memory,
                                                           bundle: dict[str, Any]) -> None:
    assert mem.import_("dst", bundle) == 3
    history = mem.history("dst")
    imported = [e for e in history if e.action == "import"]
    assert sorted(e.memory_id for e in imported) == sorted(m["id"] for m in bundle["memories"])
    kept = {e["id"] for e in bundle["history"]}
    assert kept <= {e.id for e in history}
    assert mem.facts("dst")[0].key == "tea"
    assert [str(r) for r in mem.relations("dst")] == [str(r) for r in mem.relations("src")]


def test_the_history_of_deleted_memories_is_importable(mem: Memory) -> None:
    gone = mem.add("src", "Soon forgotten")
    mem.add("src", "Kept")
    mem.forget("src", gone.id)
    bundle = json.loads(json.dumps(mem.export("src")))
    assert mem.import_("dst", bundle) == 1
    assert [e.action for e in mem.history("dst", gone.id)] == ["add", "delete"]


def test_existing_ids_are_refused_unless_overwrite(mem: Memory, bundle: dict[str, Any]) -> None:
    with pytest.raises(InvalidInputError, match="overwrite=True"):
        mem.import_("src", bundle)
    changed = copy.deepcopy(bundle)
    changed["memories"][0]["text"] = "Ann bought a Zenbook laptop"
    assert mem.import_("src", changed, overwrite=True) == 3
    assert mem.get("src", bundle["memories"][0]["id"]).text == "Ann bought a Zenbook laptop"
    assert mem.count("src") == 3


def test_an_import_merges_into_the_users_graph(mem: Memory, bundle: dict[str, Any]) -> None:
    mem.add("dst", "Bob owns a bike")
    before = {str(r) for r in mem.relations("dst")}
    mem.import_("dst", bundle)
    after = {str(r) for r in mem.relations("dst")}
    assert before and before < after


# -- hypothesis over the Python API ----------------------------------------------------------------

_HOSTILE = st.one_of(
    st.text(max_size=30),
    st.text(alphabet=st.characters(codec=None, categories=("Cs", "Cc", "Cf", "Zs", "Co")),
            max_size=10),
    st.sampled_from(["\ud800", "a\udfffb", "\x00", "..", "a/b", "\u202e", "\x85", "\ufffd", " ",
                     "x" * 20_001]),
)
_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), _HOSTILE)
_METADATA = st.one_of(
    st.none(), st.lists(_SCALAR, max_size=2), _HOSTILE,
    st.dictionaries(st.one_of(_HOSTILE, st.sampled_from(["a", "b.c", "_x"])), _SCALAR,
                    max_size=3),
)
_OPERAND = st.one_of(_SCALAR, st.lists(_SCALAR, max_size=3), st.dictionaries(_HOSTILE, _SCALAR,
                                                                             max_size=2))
_WHERE = st.one_of(
    st.none(), _HOSTILE, st.lists(_SCALAR, max_size=2),
    st.recursive(
        st.dictionaries(
            st.one_of(st.sampled_from(["a", "kind", "importance", "created_at", "current"]),
                      _HOSTILE),
            st.one_of(_SCALAR, st.dictionaries(
                st.sampled_from(["$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin",
                                 "$bad"]), _OPERAND, max_size=2)),
            max_size=3),
        lambda inner: st.dictionaries(st.sampled_from(["$and", "$or", "$not"]),
                                      st.one_of(st.lists(inner, max_size=3), inner), max_size=2),
        max_leaves=8,
    ),
)
_LIMIT = st.one_of(st.integers(min_value=-5, max_value=2000), st.none(), st.floats(), _HOSTILE,
                   st.booleans())


@pytest.fixture(scope="module")
def fuzz_mem(tmp_path_factory: pytest.TempPathFactory,
             embedder: LocalEmbedder) -> Iterator[Memory]:
    settings = Settings(data_dir=tmp_path_factory.mktemp("fuzz") / "hm", extractor="rules")
    with Memory(settings, embedder=embedder) as memory:
        memory.add_many("fuzz", [{"text": f"memory number {n} about laptops",
                                  "metadata": {"a": n}} for n in range(5)])
        yield memory


@st.composite
def _call(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    user = draw(st.one_of(st.just("fuzz"), _HOSTILE))
    name = draw(st.sampled_from(["add", "add_many", "add_messages", "search", "list", "context",
                                 "get", "update", "remember", "import_", "forget_id"]))
    text = draw(_HOSTILE)
    if name == "add":
        return name, {"user_id": user, "text": text, "metadata": draw(_METADATA),
                      "category": draw(st.one_of(st.just("general"), _HOSTILE)),
                      "importance": draw(st.one_of(st.just(0.5), _SCALAR))}
    if name == "add_many":
        return name, {"user_id": user, "items": draw(st.one_of(
            _HOSTILE, st.lists(st.one_of(_HOSTILE, st.dictionaries(
                st.sampled_from(["text", "metadata", "kind", "bogus"]), _SCALAR)), max_size=3)))}
    if name == "add_messages":
        return name, {"user_id": user, "messages": draw(st.one_of(_HOSTILE, st.lists(
            st.dictionaries(st.sampled_from(["role", "content"]), _SCALAR), max_size=3)))}
    if name in ("search", "context"):
        return name, {"user_id": user, "query": text, "where": draw(_WHERE),
                      "limit": draw(_LIMIT)}
    if name == "list":
        return name, {"user_id": user, "where": draw(_WHERE), "limit": draw(_LIMIT),
                      "offset": draw(st.one_of(st.integers(-3, 3), _HOSTILE))}
    memory_id = text if is_valid_unicode(text) else "x"  # surrogates: test_memory_ids_... below
    if name in ("get", "forget_id"):
        return name, {"user_id": user, "memory_id": memory_id}
    if name == "update":
        return name, {"user_id": user, "memory_id": memory_id, "text": draw(_HOSTILE),
                      "metadata": draw(_METADATA)}
    if name == "remember":
        return name, {"user_id": user, "key": text, "value": draw(_HOSTILE)}
    return name, {"user_id": user, "bundle": draw(st.one_of(
        _WHERE, st.fixed_dictionaries({"format": st.just("hybridmem-export"),
                                       "memories": st.lists(_METADATA, max_size=2),
                                       "graph": _WHERE, "history": st.lists(_METADATA,
                                                                            max_size=2)})))}


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(call=_call())
def test_the_api_refuses_only_with_typed_errors_and_half_stores_nothing(
    fuzz_mem: Memory, call: tuple[str, dict[str, Any]]
) -> None:
    name, kwargs = call
    note(repr(call))
    before = fuzz_mem.count("fuzz")
    method = fuzz_mem.forget if name == "forget_id" else getattr(fuzz_mem, name)
    try:
        method(**kwargs)
    except HybridMemError as exc:
        assert type(exc).__module__ == "hybridmem.errors"
        assert exc.status_code == (404 if isinstance(exc, NotFoundError) else 422), exc
        assert fuzz_mem.count("fuzz") == before  # refused: nothing stored, nothing lost
