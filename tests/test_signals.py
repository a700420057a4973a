"""Frequency, write-counting decay and corroborated confidence through a real Memory (embedded
Chroma and a real ``chroma run``): what the stored counts and times do to a search."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from hybridmem import Memory
from hybridmem.models import utcnow
from hybridmem.offline import LocalEmbedder
from hybridmem.read.ranking import decay, frequency


def test_search_ranks_by_the_stored_mention_and_access_counts(
    make_settings: Any, embedder: LocalEmbedder
) -> None:
    with Memory(make_settings(frequency_weight=1.0), embedder=embedder) as mem:
        for _ in range(3):  # said three times: one memory, mention_count 3
            tea = mem.add("ann", "I drink green tea every morning")
        coffee = mem.add("ann", "I drink black coffee every morning")
        assert mem.get("ann", tea.id).mention_count == 3
        hits = {h.item.id: h for h in mem.search("ann", "what do I drink every morning?")}
        assert hits[tea.id].breakdown.frequency == frequency(3, 0) > 0
        assert hits[coffee.id].breakdown.frequency == 0.0
        for _ in range(4):
            mem.search("ann", "black coffee")
        mem.flush_access()
        stored = mem.get("ann", coffee.id)
        assert stored.access_count >= 4
        hits = {h.item.id: h for h in mem.search("ann", "what do I drink every morning?")}
        assert hits[coffee.id].breakdown.frequency == frequency(1, stored.access_count) > 0


def test_a_restated_memory_decays_from_its_last_write(
    make_settings: Any, embedder: LocalEmbedder
) -> None:
    now = utcnow()
    long_ago = now - timedelta(days=200)
    settings = make_settings(recency_weight=1.0, half_life_days=30.0)
    with Memory(settings, embedder=embedder) as mem:
        chess = mem.add("bo", "I play chess on Sundays", created_at=long_ago)
        tennis = mem.add("bo", "I play tennis on Sundays", created_at=long_ago)
        assert mem.add("bo", "I play tennis on Sundays.").id == tennis.id  # said again today
        hits = mem.search("bo", "what do I play on Sundays?", limit=2)
        assert [h.item.id for h in hits] == [tennis.id, chess.id]
        assert hits[0].breakdown.recency is not None and hits[0].breakdown.recency > 0.99
        assert hits[1].breakdown.recency is not None and hits[1].breakdown.recency < 0.02
        assert hits[0].breakdown.age_days is not None and hits[0].breakdown.age_days > 199

        # as of 100 days ago, the restatement had not happened: both decay from their creation
        then = mem.search("bo", "what do I play on Sundays?", limit=2,
                          as_of=now - timedelta(days=100))
        for hit in then:
            assert hit.breakdown.recency is not None
            assert abs(hit.breakdown.recency - decay(100.0, 30.0)) < 1e-3


def test_a_fact_two_sources_agree_on_is_more_confident(
    make_settings: Any, embedder: LocalEmbedder
) -> None:
    with Memory(make_settings(), embedder=embedder) as mem:
        first = mem.add("cy", "My sister lives in Porto", confidence=0.6, source="assistant")
        again = mem.add("cy", "my sister lives in Porto", confidence=0.6, source="assistant")
        assert again.id == first.id and again.confidence == 0.6  # one source repeating itself
        said = mem.add("cy", "My sister lives in Porto.", confidence=0.5, source="user")
        assert said.id == first.id and abs(said.confidence - 0.8) < 1e-9
        assert mem.get("cy", first.id).mention_count == 3
