"""Time travel: ``as_of`` on search, context and facts shows the memory as it stood then — on the
demo data's Lyon -> Berlin move and preference changes, and on a key fact's values."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from hybridmem import Context, InvalidInputError, Memory, Settings
from hybridmem.offline import LocalEmbedder
from hybridmem.read.access import Extras

ROOT = Path(__file__).resolve().parent.parent
USERS = ("alice_martin", "client_123", "client_456")
JULY = datetime(2026, 7, 1, tzinfo=timezone.utc)  # after the first preferences, before the changes


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory, embedder: LocalEmbedder) -> Iterator[Memory]:
    """Three demo users loaded in file (time) order, as the demo stores them."""
    rows = [json.loads(line) for line in
            (ROOT / "hybridmem" / "demo_data" / "memories.jsonl").read_text(encoding="utf-8").splitlines() if line]
    settings = Settings(data_dir=tmp_path_factory.mktemp("tt"), extractor="rules")
    with Memory(settings, embedder=embedder) as mem:
        for user in USERS:
            mem.add_many(user, [{k: v for k, v in r.items() if k != "user_id"}
                                for r in rows if r["user_id"] == user])
        yield mem


def _texts(hits: list[Any]) -> list[str]:
    return [h.item.text for h in hits]


def test_where_she_lived_before_the_move(demo: Memory) -> None:
    now = _texts(demo.search("alice_martin", "where does she live?", limit=3))
    assert "Berlin" in now[0] and not any("Lyon" in t for t in now)
    then = _texts(demo.search("alice_martin", "where does she live?", limit=3, as_of=JULY))
    assert then[0] == "I live in Lyon."
    assert not any("Berlin" in t for t in then)  # not recorded yet in July


def test_preferences_as_they_were_in_july(demo: Memory) -> None:
    mice = _texts(demo.search("client_123", "wired or wireless mice?", limit=5, as_of=JULY))
    assert mice[0].startswith("I prefer wireless mice")
    assert not any("wired mice now" in t for t in mice)
    assert "wired mice now" in _texts(demo.search("client_123", "wired or wireless mice?"))[0]
    phones = _texts(demo.search("client_456", "iPhone or Android?", limit=5, as_of=JULY))
    assert phones[0].startswith("I prefer iPhones") and not any("Android now" in t for t in phones)


def test_context_as_of_shows_the_past_as_current(demo: Memory) -> None:
    ctx = demo.context("alice_martin", "where does she live?", as_of=JULY, max_tokens=300)
    assert "I live in Lyon." in ctx.text and "Berlin" not in ctx.text
    assert "superseded" not in ctx.text  # in July, Lyon was simply true
    everything = demo.context("alice_martin", "where does she live?", include_superseded=True,
                              max_tokens=300)
    assert "I live in Lyon. (superseded 2026-10-03)" in everything.text


def test_as_of_before_anything_finds_nothing(demo: Memory) -> None:
    early = datetime(2020, 1, 1, tzinfo=timezone.utc)
    assert demo.search("alice_martin", "where does she live?", as_of=early) == []
    assert demo.context("alice_martin", "where?", as_of=early).text == ""


def test_facts_as_of_and_naive_times_are_utc(mem: Memory, unique_user: str) -> None:
    """A key fact keeps its old value as superseded history; as_of picks the value of the time
    (also on the Chroma server, where the filter is compiled to Chroma's where)."""
    mem.remember(unique_user, "plan", "silver")
    between = datetime.now(timezone.utc)
    mem.remember(unique_user, "plan", "gold")
    assert [f.text for f in mem.facts(unique_user)] == ["plan: gold"]
    assert [f.text for f in mem.facts(unique_user, as_of=between)] == ["plan: silver"]
    naive = between.replace(tzinfo=None)  # naive times are UTC
    assert [f.text for f in mem.facts(unique_user, as_of=naive)] == ["plan: silver"]
    assert mem.facts(unique_user, as_of=datetime(2020, 1, 1)) == []
    assert [h.item.text for h in mem.search(unique_user, "which plan?", as_of=between)] == [
        "plan: silver"]
    both = mem.search(unique_user, "which plan?", as_of=datetime.now(timezone.utc),
                      include_superseded=True)
    assert sorted(h.item.text for h in both) == ["plan: gold", "plan: silver"]


def test_context_asks_about_current_facts_now_and_every_fact_as_of(
        mem: Memory, unique_user: str) -> None:
    """A context about now shows current key facts only, and asks only about those; one as_of
    a past time asks about every fact, so a value superseded since is shown there."""
    mem.remember(unique_user, "plan", "silver")
    between = datetime.now(timezone.utc)
    gold = mem.remember(unique_user, "plan", "gold")
    mem.forget(unique_user, gold.id)  # silver stays superseded: no current value is left
    assert mem.facts(unique_user) == []

    def facts(ctx: Context) -> list[str]:
        return [line.text for line in ctx.lines if line.section == "facts"]

    assert facts(mem.context(unique_user, "which plan?")) == []
    assert any("plan: silver" in t for t in facts(mem.context(unique_user, "which plan?",
                                                             as_of=between)))
    extras = Extras(mem._stores)  # what each kind of context asks: (facts, episodes, procedures)
    assert extras.of(unique_user, current=True) == (False, False, False)
    assert extras.of(unique_user, current=False) == (True, False, False)


def test_as_of_must_be_a_time(mem: Memory) -> None:
    with pytest.raises(InvalidInputError, match="as_of must be a datetime"):
        mem.search("u1", "anything", as_of="2026-01-01")  # type: ignore[arg-type]
