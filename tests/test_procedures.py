"""Procedures (how-to memories) and per-section context budgets, end to end on real stores."""

from __future__ import annotations

import pytest

from hybridmem import InvalidInputError, Memory

ROUTER = "To reset the router: hold the reset button for 10 seconds, then wait for the green light."


def test_a_procedure_is_stored_searched_and_shown_in_its_own_section(
    mem: Memory, unique_user: str
) -> None:
    steps = mem.add(unique_user, ROUTER, kind="procedure", category="support")
    mem.add_many(unique_user, ["I bought a Netgear Nighthawk router.", "I live in Leeds."])
    assert steps.kind == "procedure"
    assert [i.id for i in mem.list(unique_user, where={"kind": "procedure"})] == [steps.id]
    assert mem.search(unique_user, "how do I reset my router?", limit=1)[0].item.id == steps.id
    ctx = mem.context(unique_user, "the router is stuck, what do I do?", max_tokens=300)
    assert "Procedures (steps that worked before):\n- [" in ctx.text
    assert [line.memory_id for line in ctx.lines if line.section == "procedures"] == [steps.id]


def test_a_procedure_gets_a_place_even_when_other_memories_rank_higher(
    mem: Memory, unique_user: str
) -> None:
    """Procedures are searched apart (like episodes): 30 router memories outrank it, yet the
    context still shows the steps."""
    mem.add_many(unique_user, [f"Router note {i}: the router light was blinking on day {i}."
                               for i in range(30)])
    steps = mem.add(unique_user, ROUTER, kind="procedure")
    ctx = mem.context(unique_user, "router light blinking", limit=5, max_tokens=400)
    assert steps.id in [line.memory_id for line in ctx.lines]


def test_key_facts_are_not_the_first_thing_dropped_when_tight(
    mem: Memory, unique_user: str
) -> None:
    mem.remember(unique_user, "plan", "gold support until 2027")
    mem.add_many(unique_user, [
        f"Laptop ticket {i}: the laptop fan was loud during a video call on day {i} of the month."
        for i in range(20)])
    ctx = mem.context(unique_user, "laptop fan loud", max_tokens=120)
    assert ctx.tokens <= 120
    assert any(line.section == "facts" and "gold support" in line.text for line in ctx.lines)
    assert any(line.section == "memories" for line in ctx.lines)
    # Naming the budgets moves the shares: no share for facts, all of it for memories ...
    none = mem.context(unique_user, "laptop fan loud", max_tokens=120,
                       budgets={"facts": 0, "memories": 120})
    assert not any(line.section == "facts" for line in none.lines) and none.tokens <= 120
    # ... while a share a section cannot use goes to the others.
    roomy = mem.context(unique_user, "laptop fan loud", max_tokens=2000, budgets={"facts": 1500})
    assert sum(line.section == "memories" for line in roomy.lines) == 20


def test_bad_budgets_are_refused(mem: Memory, unique_user: str) -> None:
    with pytest.raises(InvalidInputError, match="unknown sections"):
        mem.context(unique_user, "anything", budgets={"fact": 100})
    with pytest.raises(InvalidInputError, match="non-negative integer"):
        mem.context(unique_user, "anything", budgets={"facts": -1})


def test_min_score_leaves_weak_hits_out(mem: Memory, unique_user: str) -> None:
    mem.add_many(unique_user, ["I bought a ROG Strix laptop.", "My cat is called Miso."])
    hits = mem.search(unique_user, "which laptop did I buy?", min_score=0)
    assert len(hits) == 2
    strong = mem.search(unique_user, "which laptop did I buy?", min_score=hits[0].score)
    assert [h.item.id for h in strong] == [hits[0].item.id]
    assert mem.search(unique_user, "which laptop did I buy?", min_score=99) == []
    ctx = mem.context(unique_user, "which laptop did I buy?", min_score=hits[0].score)
    assert "ROG" in ctx.text and "Miso" not in ctx.text
    with pytest.raises(InvalidInputError, match="min_score"):
        mem.search(unique_user, "laptop", min_score=-1)


def test_the_min_score_setting_is_the_default(make_settings: object, unique_user: str) -> None:
    from hybridmem.offline import HashEmbedder

    with Memory(make_settings(min_score=50.0), embedder=HashEmbedder()) as mem:  # type: ignore[operator]
        mem.add(unique_user, "I bought a ROG Strix laptop.")
        assert mem.search(unique_user, "laptop") == []
        assert len(mem.search(unique_user, "laptop", min_score=0)) == 1
