"""The write-path rules (pure) and the supersession they drive through a real Memory."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hybridmem import Entity, Extraction, Memory, Relation, Settings
from hybridmem.models import AddRequest, MemoryItem, utcnow
from hybridmem.offline import LocalEmbedder
from hybridmem.prompts import JUDGE_PROMPT
from hybridmem.write.policy import (
    JUDGE_SCHEMA,
    bumped,
    conflicting,
    corroborated,
    doomed,
    merged,
    near_duplicate,
    parse_verdict,
)


def rel(subject: str, predicate: str, obj: str) -> Relation:
    return Relation(subject=subject, predicate=predicate, object=obj)


def test_conflicting_compares_names_as_the_graph_keys_them() -> None:
    # "the ROG laptop" and "ROG laptop." are one graph node, so they are one subject here too
    assert conflicting(rel("ROG laptop.", "status", "repaired"), rel("the ROG laptop", "status", "broken"))
    assert not conflicting(rel("ROG laptop", "status", "the broken"), rel("rog LAPTOP", "status", "broken"))
    assert not conflicting(rel("alice", "bought", "Kindle"), rel("alice", "bought", "ROG laptop"))
    # same-head predicates conflict only between objects of one kind
    assert conflicting(rel("u", "prefers", "wired mice"), rel("u", "prefers", "wireless mice"))
    assert not conflicting(rel("u", "prefers", "matte screens"), rel("u", "prefers", "Logitech mice"))


def test_near_duplicates_never_merge_different_numbers() -> None:
    assert near_duplicate("I ordered order 1041", "I ordered order 1041!", 0.5)
    assert not near_duplicate("order 1041 shipped", "order 1042 shipped", 0.99)


def test_a_swapped_value_is_never_a_duplicate() -> None:
    # MiniLM scores these like paraphrases (~.8-.9); merging them would lose a fact
    assert not near_duplicate("I live in Lyon.", "I live in Berlin.", 0.99)
    assert not near_duplicate("My cat is called Pixel.", "My dog is called Pixel.", 0.99)
    assert not near_duplicate("I teach maths at a secondary school.",
                              "I teach history at a secondary school.", 0.99)
    assert near_duplicate("I'm allergic to peanuts.", "I have a peanut allergy.", 0.9)
    # the price of the guard: a one-word synonym swap is kept as two memories
    assert not near_duplicate("My cat is called Pixel.", "My cat is named Pixel.", 0.95)


#: The demo data's planted near-duplicates (docs/demo-data.md; they must merge at the default)
#: and facts of the same shape that must not (bench/dedup_calibration.py measures the whole labelled set).
PLANTED = [
    ("I hate loud mechanical keyboards; the clatter bleeds into my microphone when I stream.",
     "Can't stand noisy mechanical keyboards. All that clicking drives me up the wall on voice calls."),
    ("I always want express shipping, I can't wait a week for a parcel.",
     "Please use express delivery for my orders. Standard shipping is just too slow for me."),
    ("I prefer one consolidated invoice per month instead of a separate invoice for every order.",
     "Please put everything on a single monthly invoice: one bill per month, not one per order."),
    ("I prefer matte screens, glossy ones reflect my office window.",
     "Matte displays only, please. A glossy panel catches all the glare from the window next to my desk."),
]
DISTINCT = [
    ("I hate loud mechanical keyboards.", "I love clicky mechanical keyboards."),
    ("I prefer matte screens.", "I prefer glossy screens."),
    ("I bought the ASUS ROG Strix laptop.", "I bought the Dell UltraSharp monitor."),
    ("I live in Lyon.", "I moved to Berlin, I live in Berlin now."),
]


def test_default_threshold_merges_the_planted_pairs_only(embedder: LocalEmbedder) -> None:
    s = Settings()
    for pairs, expected in ((PLANTED, True), (DISTINCT, False)):
        for a, b in pairs:
            va, vb = embedder.embed_batch([a, b])
            cosine = sum(x * y for x, y in zip(va, vb))
            assert near_duplicate(a, b, cosine, jaccard_min=s.dedup_jaccard,
                                  cosine_min=s.dedup_cosine) is expected, (a, b, cosine)


def item(text: str, **fields: object) -> MemoryItem:
    now = utcnow()
    return MemoryItem(id=text[:8], user_id="u", text=text, created_at=now, updated_at=now,
                      **fields)  # type: ignore[arg-type]


def test_bumped_and_merged_keep_the_most_of_both() -> None:
    now = utcnow()
    base = item("I like jazz", importance=0.3, metadata={"a": 1})
    again = bumped(base, AddRequest(text="i like JAZZ", importance=0.9, metadata={"a": 2, "b": 3}), now)
    assert (again.mention_count, again.importance, again.metadata) == (2, 0.9, {"a": 1, "b": 3})
    richer = merged(base, item("I really like smooth jazz", confidence=0.5), now)
    assert richer.text == "I really like smooth jazz" and richer.mention_count == 2
    assert richer.confidence == 1.0 and richer.id == base.id


def test_a_source_repeating_itself_keeps_the_higher_confidence() -> None:
    now = utcnow()
    base = item("I think I like jazz", confidence=0.6)
    again = bumped(base, AddRequest(text="I think I like jazz", confidence=0.5), now)
    assert again.confidence == 0.6 and again.mention_count == 2
    assert merged(base, item("I think I really like jazz", confidence=0.6), now).confidence == 0.6


def test_two_sources_that_agree_corroborate_by_noisy_or() -> None:
    now = utcnow()
    base = item("home city: Berlin", confidence=0.6, source="distilled")
    said = bumped(base, AddRequest(text="home city: berlin", confidence=0.5, source="user"), now)
    assert abs(said.confidence - (1 - 0.4 * 0.5)) < 1e-12
    other = item("home city is Berlin", confidence=0.5, source="assistant")
    assert abs(merged(base, other, now).confidence - 0.8) < 1e-12


@given(st.floats(0, 1), st.floats(0, 1), st.booleans())
def test_corroborated_stays_a_confidence_never_below_either(a: float, b: float, same: bool) -> None:
    c = corroborated(a, "user", b, "user" if same else "assistant")
    assert max(a, b) <= c <= 1.0
    assert c == corroborated(b, "user", a, "user" if same else "assistant")


def test_doomed_counts_a_recent_write_as_use() -> None:
    now = utcnow()
    old = now - timedelta(days=200)
    restated = MemoryItem(id="r", user_id="u", text="restated", importance=0.05, created_at=old,
                          updated_at=now - timedelta(days=1))
    read = MemoryItem(id="a", user_id="u", text="read", importance=0.05, created_at=old,
                      updated_at=old, last_accessed_at=now - timedelta(days=1))
    untouched = MemoryItem(id="i", user_id="u", text="idle", importance=0.05, created_at=old,
                           updated_at=old)
    assert doomed([restated, read, untouched], now=now, min_importance=0.1, idle_days=120) == (
        [], [untouched])


def test_doomed_splits_expired_and_idle() -> None:
    now = utcnow()
    old = now - timedelta(days=200)
    expired = item("expired one", expires_at=now - timedelta(seconds=1))
    idle = MemoryItem(id="idle", user_id="u", text="idle", importance=0.05, created_at=old,
                      updated_at=old)
    kept = item("recent but unimportant", importance=0.05)
    assert doomed([expired, idle, kept], now=now, min_importance=0.1, idle_days=120) == (
        [expired], [idle])


class TableExtractor:
    """A tiny real extractor: the relations a table gives each text (no model, no mock)."""

    name = "table"
    offline = True

    def __init__(self, table: dict[str, list[Relation]]) -> None:
        self.table = table

    def extract(self, text: str, *, speaker: str | None = None) -> Extraction:
        relations = self.table.get(text, [])
        names = {n for r in relations for n in (r.subject, r.object)}
        return Extraction(entities=[Entity(name=n) for n in sorted(names)], relations=relations,
                          extractor=self.name)


@pytest.fixture()
def table_mem(settings: Settings, embedder: LocalEmbedder) -> Iterator[Memory]:
    table = {
        "The ROG laptop is broken.": [rel("the ROG laptop", "status", "broken")],
        "ROG laptop got repaired.": [rel("ROG laptop", "status", "repaired")],
    }
    with Memory(settings, embedder=embedder, extractor=TableExtractor(table)) as mem:
        yield mem


def test_the_rog_laptop_is_superseded_by_rog_laptop(table_mem: Memory) -> None:
    old = table_mem.add("u1", "The ROG laptop is broken.")
    new = table_mem.add("u1", "ROG laptop got repaired.")
    stale = table_mem.get("u1", old.id)
    assert stale.superseded_by == new.id and not stale.is_current
    assert [i.id for i in table_mem.list("u1")] == [new.id]
    assert [e.action for e in table_mem.history("u1", old.id)] == ["add", "supersede"]
    (edge,) = table_mem.relations("u1")  # the old edge lost its only support
    assert (edge.subject_key, edge.predicate, edge.object) == ("rog laptop", "status", "repaired")


def test_the_judge_is_asked_for_exactly_the_verdicts_its_schema_allows() -> None:
    verdicts = JUDGE_SCHEMA["properties"]["verdict"]["enum"]
    assert all(v in JUDGE_PROMPT for v in verdicts)
    assert all(parse_verdict(f'{{"verdict": "{v}", "reason": "x"}}') == v for v in verdicts)
