"""One gathering per context(): its memories, summaries and procedures come from one
nearest-neighbour search. The memories are what search() ranks first; without the graph (whose
one activation starts from the memories' candidates) so is every section."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from chromadb.api.models.Collection import Collection

from hybridmem import Memory, Settings
from hybridmem.chroma.vector import ChromaVectorStore
from hybridmem.filters import Filter, all_of, eq, parse_where
from hybridmem.models import MemoryItem
from hybridmem.offline import HashEmbedder, LocalEmbedder

THINGS = ["kettle", "laptop", "monitor", "tent", "camera", "lamp"]
PEOPLE = ["Alice", "Bob", "Carol"]
BASE = datetime(2025, 1, 1, tzinfo=timezone.utc)
QUESTIONS = [f"what did {p} buy, the {t}?" for p in PEOPLE for t in THINGS[:4]]


def _fill(mem: Memory, user: str) -> None:
    requests: list[dict[str, Any]] = []
    for i in range(90):
        who, what = PEOPLE[i % 3], THINGS[i % 6]
        requests.append({"text": f"{who} bought the {what} number {i} on trip {i % 7}",
                         "created_at": BASE + timedelta(hours=i)})
    for i in range(12):
        requests.append({"kind": "summary", "created_at": BASE + timedelta(hours=5 * i),
                         "text": f"Summary of chat {i}: {PEOPLE[i % 3]} talked about the "
                                 f"{THINGS[(i * 5) % 6]} and the {THINGS[(i + 2) % 6]}"})
    for i in range(6):
        requests.append({"kind": "procedure", "created_at": BASE + timedelta(hours=3 * i),
                         "text": f"To return a {THINGS[i]}: print the label, then call "
                                 f"{PEOPLE[(i + 1) % 3]}"})
    mem.add_many(user, requests)
    mem.remember(user, "shop", "prefers the Shop11 store")


@pytest.fixture()
def queries(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """How many nearest-neighbour searches reach Chroma (the real ones, counted on the way)."""
    calls = [0]
    real = Collection.query

    def counted(self: Collection, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Collection, "query", counted)
    yield calls


@pytest.mark.parametrize("graph_weight", [0.0, 1.0])
def test_each_section_is_what_its_own_search_ranks_first(
    make_settings: Any, embedder: LocalEmbedder, unique_user: str, graph_weight: float
) -> None:
    settings: Settings = make_settings(graph_weight=graph_weight)
    with Memory(settings, embedder=embedder) as mem:
        _sections_match_searches(mem, unique_user, exact=graph_weight == 0)


def _sections_match_searches(mem: Memory, unique_user: str, *, exact: bool) -> None:
    _fill(mem, unique_user)
    for question in QUESTIONS:
        ctx = mem.context(unique_user, question, max_tokens=4000)
        shown = {section: [line.memory_id for line in ctx.lines if line.section == section]
                 for section in ("memories", "episodes", "procedures")}
        hits = mem.search(unique_user, question, limit=30)
        summaries = mem.search(unique_user, question, limit=2, where={"kind": "summary"})
        procedures = mem.search(unique_user, question, limit=3, where={"kind": "procedure"})
        assert summaries and procedures, question
        # a summary or procedure among the memories' hits is shown once, in its own section
        by_kind = {kind: {h.item.id for h in hits if h.item.kind == kind}
                   for kind in ("summary", "procedure")}
        if exact:
            assert set(shown["episodes"]) == by_kind["summary"] | {h.item.id for h in summaries}
            assert set(shown["procedures"]) == (by_kind["procedure"]
                                                | {h.item.id for h in procedures})
        else:  # the graph signal comes from the memories' neighbourhood
            assert by_kind["summary"] <= set(shown["episodes"]) != set(), question
            assert by_kind["procedure"] <= set(shown["procedures"]) != set(), question
            kinds = {mem.get(unique_user, m).kind for m in shown["episodes"]}
            assert kinds == {"summary"}
            assert {mem.get(unique_user, m).kind for m in shown["procedures"]} == {"procedure"}
        assert shown["memories"] == [h.item.id for h in hits
                                     if h.item.kind not in ("summary", "procedure")
                                     and h.item.key is None], question


def test_one_context_is_one_nearest_neighbour_search(
    mem: Memory, unique_user: str, queries: list[int]
) -> None:
    _fill(mem, unique_user)
    mem.context(unique_user, "warm up the reads")  # loads what a first touch loads
    for question in QUESTIONS:
        before = queries[0]
        ctx = mem.context(unique_user, question)
        assert {line.section for line in ctx.lines} >= {"episodes", "procedures", "memories"}
        assert queries[0] - before == 1, question


def test_a_written_summary_is_ranked_at_the_next_context(mem: Memory, unique_user: str) -> None:
    """The summaries' vectors are kept between contexts; a write (add, update, forget) shows in
    the next one."""
    _fill(mem, unique_user)
    question = "the zeppelin ride over the glacier"
    first = mem.context(unique_user, question, max_tokens=4000)
    fresh = mem.add(unique_user, "Summary of chat 99: Carol described the zeppelin ride over the "
                    "glacier", kind="summary")
    shown = [line.memory_id for line in mem.context(unique_user, question, max_tokens=4000).lines
             if line.section == "episodes"]
    assert fresh.id in shown and fresh.id not in [line.memory_id for line in first.lines]
    mem.update(unique_user, fresh.id, text="Summary of chat 99: Carol sold her old kettle")
    again = mem.search(unique_user, question, limit=2, where={"kind": "summary"})
    assert fresh.id not in [h.item.id for h in again[:1]]
    mem.forget(unique_user, fresh.id)
    assert fresh.id not in [line.memory_id for line in
                            mem.context(unique_user, question, max_tokens=4000).lines]


#: Section filters and the ids of _records() each keeps: equalities on system fields alone
#: (decided by a lookup in the record copy), with other conditions, and look-alikes that are not
#: such equalities (a metadata key named like a system field, $ne, $in, a number, $or).
SECTION_FILTERS: list[tuple[str, Filter | None, list[str]]] = [
    ("no filter", None, ["f", "s1", "s2", "p", "old", "key"]),
    ("current", eq("current", True), ["f", "s1", "p", "key"]),
    ("kind", eq("kind", "summary"), ["s1", "s2"]),
    ("kind and current", all_of(eq("kind", "summary"), eq("current", True)), ["s1"]),
    ("kind and metadata", all_of(eq("kind", "summary"), eq("topic", "tents")), ["s2"]),
    ("metadata named kind", parse_where({"$and": [{"current": True}, {"kind": "summary"}]}),
     ["s1"]),
    ("with $or", all_of(eq("current", True), eq("kind", "procedure"),
                                 parse_where({"$or": [{"topic": "tents"}, {"has_key": False}]})),
     ["p"]),
    ("$ne", parse_where({"kind": {"$ne": "summary"}}), ["f", "p", "old", "key"]),
    ("$in", parse_where({"kind": {"$in": ["summary", "procedure"]}}), ["s1", "s2", "p"]),
    ("a number", all_of(eq("current", True), parse_where({"importance": 0.9})), ["p"]),
    ("has_key", eq("has_key", True), ["key"]),
    ("nothing", all_of(eq("kind", "summary"), eq("has_key", True)), []),
]


def _records(user: str) -> list[MemoryItem]:
    t0 = datetime(2025, 3, 1, tzinfo=timezone.utc)

    def item(id_: str, text: str, **fields: Any) -> MemoryItem:
        return MemoryItem(id=id_, user_id=user, text=text, created_at=t0, updated_at=t0, **fields)

    return [
        item("f", "Alice bought a tent", metadata={"topic": "tents", "kind": "summary"}),
        item("s1", "Summary: tents and lamps", kind="summary"),
        item("s2", "Summary: the old tent", kind="summary", superseded_by="s1",
             metadata={"topic": "tents"}),
        item("p", "To pitch a tent: stakes first", kind="procedure", importance=0.9),
        item("old", "Alice wanted a lamp", superseded_by="f"),
        item("key", "Prefers green tents", key="tent colour"),
    ]


@pytest.mark.parametrize("cached", [True, False], ids=["record copy", "chroma"])
def test_sections_are_hydrated_as_their_filters_say(
    tmp_path: Any, unique_user: str, cached: bool
) -> None:
    """get_sections hydrates every section from one read; from the record copy a section's
    top-level equalities on system fields are tested by a lookup, the rest by the filter: each
    section keeps exactly the records its filter matches, in the order of the ids asked."""
    emb = HashEmbedder(32)
    with ChromaVectorStore(embedder_name=emb.name, dimension=32, path=tmp_path / "c",
                           cache_records=cached, background_load=False) as store:
        records = _records(unique_user)
        store.upsert(unique_user, records, emb.embed_batch([r.text for r in records]))
        for _ in range(2):  # the record copy loads at the second miss
            store.list(unique_user)
        asked = ["key", "p", "missing", "old", "s2", "s1", "f"]
        got = store.get_sections(unique_user, asked, [f for _n, f, _w in SECTION_FILTERS])
        for (name, _f, want), items in zip(SECTION_FILTERS, got, strict=True):
            assert [i.id for i in items] == [i for i in asked if i in want], name
        assert all(i == next(r for r in records if r.id == i.id) for i in got[0])
