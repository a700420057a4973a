"""The write-path rules (pure) and the supersession they drive through a real Memory."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from hybridmem import Entity, Extraction, Memory, Relation, Settings
from hybridmem.models import AddRequest, MemoryItem, utcnow
from hybridmem.offline import LocalEmbedder
from hybridmem.policy import bumped, conflicting, doomed, merged, near_duplicate


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
