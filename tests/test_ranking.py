"""Pure ranking functions: decay, fusion, explanations."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hybridmem.read.ranking import (
    FREQUENCY_CAP,
    Candidate,
    Weights,
    best,
    breakdown,
    decay,
    explain,
    frequency,
    fuse,
    last_written,
    uses_history,
)

RRF = Weights(fusion="rrf")


@given(st.floats(0, 1e5), st.floats(0, 1e5), st.floats(0.01, 1e4))
def test_decay_is_monotone_and_bounded(a: float, b: float, half_life: float) -> None:
    young, old = sorted((a, b))
    assert 0.0 <= decay(old, half_life) <= decay(young, half_life) <= 1.0


def test_decay_half_life() -> None:
    assert decay(0, 30) == 1.0
    assert abs(decay(30, 30) - 0.5) < 1e-12
    assert decay(-5, 30) == 1.0


def test_rrf_rewards_agreement() -> None:
    both = Candidate("both", vector=0.5, vector_rank=2, lexical=3.0, lexical_rank=2)
    vec_only = Candidate("vec", vector=0.9, vector_rank=1)
    ranked = [c.memory_id for c, _ in fuse([vec_only, both], RRF)]
    assert ranked == ["both", "vec"]


def test_graph_only_candidate_is_ranked_and_explained() -> None:
    g = Candidate("g", graph_hops=1, graph_rank=1, graph_path="alice -bought-> rog laptop")
    for weights in (RRF, Weights()):
        (c, b), = fuse([g], weights)
        assert b.fused > 0 and b.graph == 0.5
    assert "graph: alice -bought-> rog laptop (1 hop)" in explain(b)


def test_recency_weight_zero_ignores_age_and_one_prefers_new() -> None:
    old = Candidate("old", vector=0.8, vector_rank=1, age_days=300)
    new = Candidate("new", vector=0.8, vector_rank=1, age_days=1)
    flat = fuse([old, new], Weights(recency=0.0))
    assert flat[0][1].fused > 0
    assert flat[0][1].fused == flat[1][1].fused
    decayed = fuse([old, new], Weights(recency=1.0, half_life_days=30))
    assert decayed[0][0].memory_id == "new"


def test_confidence_and_importance_scale_scores() -> None:
    sure = Candidate("sure", vector_rank=1, confidence=1.0)
    unsure = Candidate("unsure", vector_rank=1, confidence=0.2)
    assert fuse([unsure, sure], RRF)[0][0].memory_id == "sure"
    hi = Candidate("hi", vector_rank=1, importance=1.0)
    lo = Candidate("lo", vector_rank=1, importance=0.0)
    assert fuse([lo, hi], Weights(fusion="rrf", importance=1.0))[0][0].memory_id == "hi"


def test_weighted_fusion_mode() -> None:
    a = Candidate("a", vector=0.9, vector_rank=1, lexical=1.0, lexical_rank=2)
    b = Candidate("b", vector=0.2, vector_rank=2, lexical=5.0, lexical_rank=1)
    ranked = fuse([a, b], Weights(fusion="weighted", vector=1.0, lexical=0.1))
    assert ranked[0][0].memory_id == "a"


def test_explain_mentions_each_signal() -> None:
    c = Candidate("x", vector=0.71, vector_rank=2, lexical=2.0, lexical_rank=3, age_days=3)
    (_, b), = fuse([c], RRF)
    assert explain(b) == "vector 0.71 #2 · bm25 #3 · 3 days old"


def test_weighted_is_the_default_and_rewards_agreement() -> None:
    assert Weights().fusion == "weighted"
    both = Candidate("both", vector=0.5, vector_rank=2, lexical=3.0, lexical_rank=1)
    vec_only = Candidate("vec", vector=0.7, vector_rank=1)
    assert [c.memory_id for c, _ in fuse([vec_only, both], Weights())] == ["both", "vec"]


# -- the formula of ranking.py's docstring, computed by hand --------------------------------------
FULL = Candidate("m", vector=0.6, vector_rank=3, lexical=4.0, lexical_rank=2, graph_hops=2,
                 graph_rank=5, age_days=45.0, importance=0.9, confidence=0.4)
OTHER = Candidate("o", lexical=8.0, lexical_rank=1)  # max_bm25 = 8
TUNED = dict(vector=0.7, lexical=0.3, graph=0.2, recency=0.25, half_life_days=30.0,
             importance=0.5, rrf_k=60.0)


def _modifiers(w_r: float, w_i: float) -> float:
    d = 0.5 ** (45.0 / 30.0)
    return (1 - w_r + w_r * d) * (1 + w_i * (0.9 - 0.5)) * (0.5 + 0.5 * 0.4)


def test_weighted_score_is_the_documented_formula() -> None:
    scores = {c.memory_id: b.fused for c, b in fuse([FULL, OTHER], Weights(**TUNED))}
    base = 0.7 * 0.6 + 0.3 * 4.0 / 8.0 + 0.2 * 0.5 ** 2
    assert abs(scores["m"] - base * _modifiers(0.25, 0.5)) < 1e-12
    assert abs(scores["o"] - 0.3 * 8.0 / 8.0 * (0.5 + 0.5 * 1.0) * 1.0) < 1e-12


def test_rrf_score_is_the_documented_formula() -> None:
    scores = {c.memory_id: b.fused for c, b in fuse([FULL, OTHER], Weights(**TUNED, fusion="rrf"))}
    base = 0.7 / (60 + 3) + 0.3 / (60 + 2) + 0.2 * 0.5 ** 2 / (60 + 5)
    assert abs(scores["m"] - base * _modifiers(0.25, 0.5)) < 1e-12
    assert abs(scores["o"] - 0.3 / (60 + 1)) < 1e-12


def test_documented_defaults() -> None:
    from hybridmem.read.ranking import GRAPH_DAMPING

    w = Weights()
    assert (w.vector, w.lexical, w.graph, w.recency, w.frequency, w.importance, w.rrf_k) == (
        1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 60.0)
    assert GRAPH_DAMPING == 0.5
    # recency_weight is clamped to [0, 1]
    old = Candidate("x", vector=0.5, vector_rank=1, age_days=30.0)
    (_, b), = fuse([old], Weights(recency=3.0))
    assert abs(b.fused - 0.5 * 0.5) < 1e-12


def test_ties_rank_in_memory_id_order_whatever_the_input_order() -> None:
    tied = [Candidate(m, vector=0.5, vector_rank=1) for m in ("c", "a", "b")]
    assert [c.memory_id for c, _ in fuse(tied, Weights())] == ["a", "b", "c"]
    assert [c.memory_id for c, _ in fuse(tied[::-1], Weights())] == ["a", "b", "c"]


def test_graph_seeds_give_mass_to_the_best_few_and_list_every_candidate() -> None:
    from hybridmem.read.ranking import graph_seeds

    cands = [Candidate("lo", vector=0.2), Candidate("hi", vector=0.8), Candidate("mid", vector=0.5)]
    seeds = graph_seeds(cands, Weights(), 2)
    assert seeds == [("hi", 0.8), ("mid", 0.5), ("lo", 0.0)]  # "lo": focus only, never spreads


_maybe = st.none() | st.floats(0, 5, allow_nan=False)
_candidates = st.lists(
    st.builds(Candidate, memory_id=st.text("abcdef", min_size=1, max_size=3), vector=_maybe,
              lexical=_maybe, graph=_maybe, age_days=st.none() | st.floats(0, 1e3),
              importance=st.floats(0, 1), confidence=st.floats(0, 1)),
    max_size=40, unique_by=lambda c: c.memory_id)


@given(_candidates, st.integers(0, 50), st.sampled_from(["weighted", "rrf"]))
def test_fuse_with_a_limit_is_the_full_ranking_cut(cands: list[Candidate], limit: int,
                                                   fusion: str) -> None:
    """Breakdowns are built only for the returned candidates; the ranking itself is the same."""
    weights = Weights(fusion=fusion, recency=0.5, importance=0.3)  # type: ignore[arg-type]
    full = fuse(cands, weights)
    cut = fuse(cands, weights, limit)
    assert [(c.memory_id, b) for c, b in cut] == [(c.memory_id, b) for c, b in full[:limit]]
    assert len(cut) == min(limit, len(cands))


_weights = st.builds(Weights, recency=st.sampled_from([0.0, -1.0, 0.5, 1.0]),
                     frequency=st.sampled_from([0.0, -0.5, 0.3]),
                     importance=st.sampled_from([0.0, 0.3]),
                     fusion=st.sampled_from(["weighted", "rrf"]))
_history = st.tuples(st.floats(0, 1e3), st.floats(0, 1e3), st.integers(1, 300),
                     st.integers(0, 300))


@given(_candidates, st.data(), _weights, st.integers(0, 50))
def test_without_history_weights_no_score_depends_on_ages_and_counts(
    cands: list[Candidate], data: st.DataObject, weights: Weights, limit: int
) -> None:
    """A search fills ages and counts in for the hits it returns only, when ``uses_history``
    says no score depends on them: ranking the candidates without them (best) then filling
    the winners in gives what fuse gives on every candidate filled in."""
    bare = [Candidate(c.memory_id, vector=c.vector, lexical=c.lexical, graph=c.graph,
                      importance=c.importance, confidence=c.confidence) for c in cands]
    for c in cands:
        c.age_days, c.idle_days, c.mentions, c.accesses = data.draw(_history)
    full = fuse(cands, weights, limit)
    if uses_history(weights):
        return
    ranked = best(bare, weights, limit)
    assert [c.memory_id for _s, c in ranked] == [c.memory_id for c, _b in full]
    filled = {c.memory_id: c for c in cands}
    again = [breakdown(filled[c.memory_id], score, weights) for score, c in ranked]
    assert again == [b for _c, b in full]


def test_history_weights_are_the_recency_and_frequency_weights_once_clamped() -> None:
    assert not uses_history(Weights())
    assert not uses_history(Weights(recency=-1.0, frequency=-0.5, importance=0.5))
    assert uses_history(Weights(recency=0.1)) and uses_history(Weights(frequency=0.1))


@given(st.integers(1, 10_000), st.integers(0, 10_000), st.integers(0, 1000))
def test_frequency_is_monotone_and_bounded(mentions: int, accesses: int, more: int) -> None:
    f = frequency(mentions, accesses)
    assert 0.0 <= f <= frequency(mentions + more, accesses) <= 1.0
    assert f <= frequency(mentions, accesses + more)


def test_frequency_is_the_documented_log_scale() -> None:
    assert frequency(1, 0) == 0.0  # written once, never returned
    assert abs(frequency(2, 0) - 0.150) < 1e-3 and abs(frequency(1, 10) - 0.520) < 1e-3
    assert frequency(FREQUENCY_CAP + 1, 0) == 1.0 == frequency(1, 10 * FREQUENCY_CAP)


def test_frequency_weight_lifts_a_restated_memory_among_equals_only() -> None:
    once = Candidate("a", vector=0.6, vector_rank=1)
    restated = Candidate("b", vector=0.6, vector_rank=2, mentions=4, accesses=6)
    off = [c.memory_id for c, _ in fuse([once, restated], Weights())]
    on = fuse([once, restated], Weights(frequency=1.0))
    assert off == ["a", "b"]  # a tie: memory-id order
    assert [c.memory_id for c, _ in on] == ["b", "a"]
    (_, b_hit), (_, a_hit) = on
    assert abs(b_hit.fused - 0.6 * (1 + frequency(4, 6))) < 1e-12 and a_hit.fused == 0.6
    assert b_hit.frequency == frequency(4, 6) and a_hit.frequency == 0.0


def test_frequency_at_most_doubles_a_score() -> None:
    relevant = Candidate("a", vector=0.5, vector_rank=1)
    popular = Candidate("b", vector=0.24, vector_rank=2, mentions=10_000, accesses=10_000)
    # weight clamped to 1, signal to 1: 0.24 * 2 < 0.5 whatever the counts
    ranked = fuse([relevant, popular], Weights(frequency=50.0))
    assert [c.memory_id for c, _ in ranked] == ["a", "b"]
    assert abs(ranked[1][1].fused - 0.48) < 1e-12


def test_decay_counts_from_the_last_write() -> None:
    restated = Candidate("a", vector=0.5, vector_rank=1, age_days=300.0, idle_days=1.0)
    old = Candidate("b", vector=0.5, vector_rank=2, age_days=1.0, idle_days=300.0)
    ranked = fuse([old, restated], Weights(recency=1.0, half_life_days=30.0))
    assert [c.memory_id for c, _ in ranked] == ["a", "b"]
    assert ranked[0][1].recency == decay(1.0, 30.0) and ranked[0][1].age_days == 300.0


def test_last_written_ignores_writes_after_the_time_asked() -> None:
    from datetime import datetime, timedelta, timezone

    from hybridmem.models import MemoryItem

    created = datetime(2026, 1, 1, tzinfo=timezone.utc)
    updated = created + timedelta(days=100)
    item = MemoryItem(id="m", user_id="u", text="t", created_at=created, updated_at=updated)
    assert last_written(item, updated + timedelta(days=1)) == updated
    assert last_written(item, created + timedelta(days=50)) == created  # as_of before the update
