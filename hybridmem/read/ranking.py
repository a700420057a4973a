"""Fusion ranking: pure functions, no I/O. Every score can be explained.

Signals per candidate memory ``m``:

- vector: rank ``r_v(m)`` among the cosine-nearest memories (and the similarity itself);
- lexical: rank ``r_l(m)`` by SQLite FTS5 ``bm25()``;
- graph: ``g(m)``, the activation that reached ``m`` over the memory–entity graph and the episodic
  links from the best vector/lexical hits and the query's entities, plus query focus for hits that
  name the query's entities and, among those, topic: the query's cosine to the closest name of
  the hit's other entities and concepts (see :mod:`hybridmem.graph.activation`;
  a caller that only knows hop counts ``h(m)`` gets ``g = GRAPH_DAMPING ** h``); graph candidates
  are ranked by ``g``, ``r_g(m)``;
- recency: ``d(m) = 0.5 ** (idle_days / half_life_days)``, where ``idle_days`` counts from the
  memory's last write (created, updated, merged into or said again), not only from its creation;
- frequency: ``f(m) = min(1, ln(1 + n) / ln(1 + FREQUENCY_CAP))`` with ``n`` the evidence beyond
  the first write: ``(mention_count - 1) + access_count`` (restatements merged into the memory,
  and searches that returned it);
- importance ``i(m)`` and confidence ``c(m)`` in [0, 1].

Weighted fusion (the default, ``fusion="weighted"``), with ``max_bm25`` the best lexical score
among the candidates::

    base(m)  = w_v * sim(m) + w_l * bm25(m) / max_bm25 + w_g * g(m)
    score(m) = base(m) * (1 - w_r + w_r * d(m)) * (1 + w_f * f(m)) * (1 + w_i * (i(m) - 0.5))
               * (0.5 + 0.5 * c(m))

Defaults ``w_v = w_l = w_g = 1``, ``w_r = w_f = w_i = 0``. A signal that did not find ``m``
contributes 0. ``w_r`` (recency_weight) is clamped to [0, 1]; 0 disables decay. ``w_f``
(frequency_weight) is clamped to [0, 1] and ``f`` to [0, 1], so frequency at most doubles a
score: it reorders memories of similar relevance and never lifts an irrelevant one (base 0)
above a relevant one; the log makes the first restatements count most (``f`` = .15 at
``n = 1``, .52 at 10, 1 from :data:`FREQUENCY_CAP` = 100 on). The graph's seeds are the
``graph_seeds`` best candidates by ``base`` without the graph term, each with mass
``base(s) / max(base(best), 1)`` (:func:`graph_seeds`): ``g`` is in units of the best hit's
score, or of a perfect one-signal match when even the best hit is weaker than that — so a memory
the graph alone reached never outranks the hit that reached it.

RRF fusion (``fusion="rrf"``, ``k = rrf_k = 60`` as in Cormack et al. 2009) replaces ``base`` by
``w_v / (k + r_v) + w_l / (k + r_l) + w_g * g / (k + r_g)``.

Why these defaults (``bench/locomo.py``, LoCoMo dev split, categories 1-4; see docs/benchmarks.md):
weighted fusion beats RRF (R@10 .663 / MRR .492 against .592 / .426 without a graph). With graph
activation, ``w_g = 1`` measured best among 0.2 / 0.5 / 1 / 2 on two dev conversations (R@10 .673
-> .723, R@2000tok .845 -> .890, MRR .479 -> .490); 2 raised R@20 but cost MRR (.430). Almost all
of the gain comes from episodic links: a turn next to a strong hit (the answer after a question).
Query focus (``graph_focus`` 0.4) and the topic signal (``graph_topic`` 0.45; multi-hop R@10
.465 -> .504 on all five dev conversations) are what the graph adds for questions about one
person. Both are on by default; the topic signal's node names are embedded when they are written
(:mod:`hybridmem.graph.name_vectors`), never in a search. Recency decay is off: LoCoMo questions
ask about any point of a long history, and decay lowered MRR there.
Frequency is off too: LoCoMo stores conversation turns, which are never merged, so only access
counts feed it there — and those came from the benchmark's own questions, so it lifted turns many
questions return (R@10 .752 -> .743, MRR .535 -> .528 at ``w_f = 1`` from zero counts; .753 ->
.747 / .737 at ``w_f`` .3 / 1 after a full pass of searches). Restated facts, which it exists
for, are not in that benchmark.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from hybridmem.models import MemoryItem, ScoreBreakdown

__all__ = [
    "FREQUENCY_CAP", "GRAPH_DAMPING", "Candidate", "Weights", "best", "breakdown", "decay",
    "explain", "frequency", "fuse", "graph_seeds", "graph_signal", "last_written", "uses_history",
]

#: Each graph hop multiplies the graph signal by this factor.
GRAPH_DAMPING = 0.5
#: Evidence count (restatements + accesses) at which the frequency signal reaches its maximum 1.
FREQUENCY_CAP = 100


@dataclass
class Candidate:
    """What the retrievers found about one memory (None: that retriever did not find it)."""

    memory_id: str
    vector: float | None = None
    vector_rank: int | None = None
    lexical: float | None = None
    lexical_rank: int | None = None
    graph: float | None = None  # the graph signal; None: GRAPH_DAMPING ** graph_hops
    graph_hops: int | None = None
    graph_path: str | None = None
    graph_rank: int | None = None
    age_days: float | None = None
    #: Days since the memory was last written (created, updated, merged into, said again); the
    #: decay counts from here. None: from ``age_days``.
    idle_days: float | None = None
    mentions: int = 1
    accesses: int = 0
    importance: float = 0.5
    confidence: float = 1.0


@dataclass(frozen=True)
class Weights:
    """Fusion weights and constants (see the module docstring)."""

    vector: float = 1.0
    lexical: float = 1.0
    graph: float = 1.0
    recency: float = 0.0
    half_life_days: float = 30.0
    frequency: float = 0.0
    importance: float = 0.0
    rrf_k: float = 60.0
    fusion: Literal["rrf", "weighted"] = "weighted"


def decay(age_days: float, half_life_days: float) -> float:
    """``0.5 ** (age / half_life)``: 1 for a new memory, 0.5 after one half-life; never increases
    with age. Negative ages (clock skew, future dates) count as 0."""
    return float(0.5 ** (max(age_days, 0.0) / half_life_days))


def last_written(item: MemoryItem, now: datetime) -> datetime:
    """When the memory was last written as of ``now``: its ``updated_at`` (an update, a merge, the
    same fact said again) when that is not after ``now``, else its ``created_at``. Decay counts
    from here, so a fact the user restated yesterday is as fresh as one first said yesterday;
    a search ``as_of`` a past time ignores writes made after it (only the last one is known)."""
    if item.created_at <= item.updated_at <= now:
        return item.updated_at
    return item.created_at


def frequency(mentions: int, accesses: int) -> float:
    """``min(1, ln(1 + n) / ln(1 + FREQUENCY_CAP))`` with ``n = (mentions - 1) + accesses``: 0 for
    a memory written once and never returned, 1 from :data:`FREQUENCY_CAP` on; never decreases
    as ``n`` grows. Log-scaled because the tenth restatement says less than the first."""
    n = max(mentions - 1, 0) + max(accesses, 0)
    return min(1.0, math.log1p(n) / math.log1p(FREQUENCY_CAP))


def graph_signal(c: Candidate) -> float | None:
    """The graph's evidence for a candidate: its activation, or ``GRAPH_DAMPING ** hops``."""
    if c.graph is not None:
        return c.graph
    return None if c.graph_hops is None else float(GRAPH_DAMPING**c.graph_hops)


def _base(c: Candidate, w: Weights, max_lexical: float, *, graph: bool = True) -> float:
    g = graph_signal(c) if graph else None
    if w.fusion == "weighted":
        score = w.vector * (c.vector or 0.0)
        if c.lexical is not None and max_lexical > 0:
            score += w.lexical * c.lexical / max_lexical
        if g is not None:
            score += w.graph * g
        return score
    score = 0.0
    if c.vector_rank is not None:
        score += w.vector / (w.rrf_k + c.vector_rank)
    if c.lexical_rank is not None:
        score += w.lexical / (w.rrf_k + c.lexical_rank)
    if g is not None and c.graph_rank is not None:
        score += w.graph * g / (w.rrf_k + c.graph_rank)
    return score


def graph_seeds(candidates: list[Candidate], weights: Weights, n: int) -> list[tuple[str, float]]:
    """Every candidate with its seed mass, best first: the ``n`` best before the graph step carry
    mass (where graph activation starts), the others 0 (they do not spread, but query focus may
    still lift them; see :mod:`hybridmem.graph.activation`). Ties go in memory-id order.

    Weighted fusion: the mass is the score divided by ``max(best score, 1)`` — 1 being a perfect
    match of one signal — so the graph never lends a neighbour more than its seed had: when even
    the best hit matches weakly, what the graph brings in is weak too, and a memory reached only
    through the graph cannot outrank the hit that reached it. RRF: divided by the best score (its
    scores are all far below 1)."""
    max_lexical = max((c.lexical or 0.0 for c in candidates), default=0.0)
    # (-score, id) tuples: a float first sorts fast; equal tuples are equal seeds
    scored = sorted([(-_base(c, weights, max_lexical, graph=False), c.memory_id)
                     for c in candidates])
    top = -scored[0][0] if scored else 0.0
    if top <= 0:
        return [(m, 0.0) for _s, m in scored]
    unit = max(top, 1.0) if weights.fusion == "weighted" else top
    return [(m, -neg / unit if i < n and -neg > 0 else 0.0)
            for i, (neg, m) in enumerate(scored)]


def fuse(candidates: list[Candidate], weights: Weights,
         limit: int | None = None) -> list[tuple[Candidate, ScoreBreakdown]]:
    """Score and sort candidates, best first; ties in memory-id order, so that a copy of a user
    (export, import) ranks exactly as the original, whatever order its stores list memories in.
    With ``limit``, only the ``limit`` best are returned — the same as slicing the full result —
    and only they get a :class:`ScoreBreakdown` (a search scores a few hundred candidates to
    return ten; building a pydantic model for each of the others was most of fusion's cost).
    :func:`best` and :func:`breakdown` are its two halves."""
    return [(c, breakdown(c, score, weights)) for score, c in best(candidates, weights, limit)]


def uses_history(weights: Weights) -> bool:
    """Whether a candidate's score depends on its ages and counts (``age_days``, ``idle_days``,
    ``mentions``, ``accesses``): only with a recency or frequency weight. Without, a search fills
    them in for the hits it returns only, after :func:`best` (they are what their
    :func:`breakdown` reports)."""
    return min(max(weights.recency, 0.0), 1.0) > 0 or min(max(weights.frequency, 0.0), 1.0) > 0


def best(candidates: list[Candidate], weights: Weights,
         limit: int | None = None) -> list[tuple[float, Candidate]]:
    """The fused score of each candidate (see the module docstring), best first, ties in
    memory-id order (then in the given order); the ``limit`` best with ``limit``. A candidate
    without ``age_days`` or ``idle_days`` is not decayed."""
    max_lexical = max((c.lexical or 0.0 for c in candidates), default=0.0)
    recency_w = min(max(weights.recency, 0.0), 1.0)
    frequency_w = min(max(weights.frequency, 0.0), 1.0)
    # (-score, id, position): tuples of a float first sort fast, and never compare candidates
    scored: list[tuple[float, str, int, Candidate]] = []
    for n, c in enumerate(candidates):
        score = _base(c, weights, max_lexical)
        idle = c.age_days if c.idle_days is None else c.idle_days
        if idle is not None:
            score *= 1.0 - recency_w + recency_w * decay(idle, weights.half_life_days)
        if frequency_w > 0:
            score *= 1.0 + frequency_w * frequency(c.mentions, c.accesses)
        score *= 1.0 + weights.importance * (c.importance - 0.5)
        score *= 0.5 + 0.5 * c.confidence
        scored.append((-score, c.memory_id, n, c))
    scored.sort()
    if limit is not None:
        del scored[max(limit, 0):]
    return [(-neg, c) for neg, _id, _n, c in scored]


def breakdown(c: Candidate, score: float, weights: Weights) -> ScoreBreakdown:
    """The signals behind a candidate's fused ``score`` (from :func:`best`)."""
    idle = c.age_days if c.idle_days is None else c.idle_days
    return ScoreBreakdown(
        vector=c.vector,
        vector_rank=c.vector_rank,
        lexical=c.lexical,
        lexical_rank=c.lexical_rank,
        graph=graph_signal(c),
        graph_hops=c.graph_hops,
        graph_path=c.graph_path,
        recency=None if idle is None else decay(idle, weights.half_life_days),
        age_days=c.age_days,
        frequency=frequency(c.mentions, c.accesses),
        importance=c.importance,
        confidence=c.confidence,
        fused=score,
    )


def _age(days: float) -> str:
    if days < 1 / 24:
        return "just now"
    if days < 1:
        return f"{days * 24:.0f} hours old"
    if days < 60:
        return f"{days:.0f} days old"
    if days < 730:
        return f"{days / 30.44:.0f} months old"
    return f"{days / 365.25:.1f} years old"


def explain(b: ScoreBreakdown) -> str:
    """A one-line reason, e.g. ``vector .71 #2 · bm25 #3 · graph: a -bought-> b (1 hop) · 3 days old``."""
    parts = []
    if b.vector is not None:
        parts.append(f"vector {b.vector:.2f}" + (f" #{b.vector_rank}" if b.vector_rank else ""))
    if b.lexical_rank is not None:
        parts.append(f"bm25 #{b.lexical_rank}")
    if b.graph_hops is not None:
        hops = "1 hop" if b.graph_hops == 1 else f"{b.graph_hops} hops"
        parts.append(f"graph: {b.graph_path} ({hops})" if b.graph_path else f"graph ({hops})")
    if b.age_days is not None:
        parts.append(_age(b.age_days))
    if b.confidence is not None and b.confidence < 1.0:
        parts.append(f"confidence {b.confidence:.2f}")
    return " · ".join(parts)
