"""Write-path rules: what counts as a duplicate, what contradicts what, and what a merged memory
looks like. Pure functions, no I/O: :mod:`hybridmem.write.writer` applies them to the stores.

Cheap first, models last: a normalised-text hash finds identical memories; token Jaccard and
embedding cosine find near-duplicates; a functional predicate with a new object (``lives_in``,
``works_at``, ``name`` ...) marks a contradiction that supersedes the older memory. An LLM judge is
only asked about pairs in the undecided cosine band (its instruction is
:data:`hybridmem.prompts.JUDGE_PROMPT`, its reply :data:`JUDGE_SCHEMA`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, Literal

from hybridmem.models import AddRequest, Knowledge, MemoryItem, MetadataValue, Relation
from hybridmem.read.ranking import last_written
from hybridmem.prompts import JUDGE_PROMPT as JUDGE_PROMPT  # re-exported: the writer reads it here
from hybridmem.text import content_words, entity_key

__all__ = [
    "FUNCTIONAL_PREDICATES",
    "JUDGE_SCHEMA",
    "Verdict",
    "bumped",
    "conflicting",
    "corroborated",
    "doomed",
    "functional",
    "jaccard",
    "knowledge_of",
    "merge_metadata",
    "merged",
    "near_duplicate",
    "parse_verdict",
    "richer_text",
    "substitution",
]

#: Predicates with one current value per subject: a new object replaces the old one.
FUNCTIONAL_PREDICATES = frozenset(
    {"lives_in", "name", "works_at", "status", "age", "email", "phone", "job", "title", "is"}
)
#: Predicates that are functional only between objects of the same kind ("wired mice" replaces
#: "wireless mice", but "matte screens" does not replace "Logitech mice").
SAME_HEAD_PREDICATES = frozenset({"prefers", "likes", "loves", "hates", "uses"})

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
Verdict = Literal["UPDATE", "KEEP_BOTH", "DUPLICATE"]
JUDGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "verdict": {"type": "string", "enum": ["UPDATE", "KEEP_BOTH", "DUPLICATE"]},
        "reason": {"type": "string"},
    },
    "required": ["verdict"],
}


def jaccard(a: str, b: str) -> float:
    """Jaccard similarity of the content-word sets of two texts (0 when either has none)."""
    left, right = set(content_words(a)), set(content_words(b))
    if not left or not right:
        return 0.0
    return len(left & right) / len(left | right)


def near_duplicate(
    a: str, b: str, cosine: float, *, jaccard_min: float = 0.6, cosine_min: float = 0.68
) -> bool:
    """True when two texts say (nearly) the same: token Jaccard or embedding cosine above its bar.

    Two guards come first, because a small embedder scores a restated sentence with one value
    changed as close as a paraphrase (MiniLM: "I prefer wired mice" / "I prefer wireless mice"
    .9), and merging those would lose a fact (``bench/dedup_calibration.py`` measures this):

    - different numbers (order ids, prices, dates, quantities): "order 1041" and "order 1042";
    - a *substitution*: the same content words but one or two swapped on each side, with at least
      as many shared ("I live in Lyon" / "I live in Berlin", "my cat is called Pixel" / "my dog is
      called Pixel"). That is an update or another fact, never a rewording; a paraphrase changes
      more of the words."""
    if sorted(_NUMBER.findall(a)) != sorted(_NUMBER.findall(b)):
        return False
    if substitution(a, b):
        return False
    return cosine >= cosine_min or jaccard(a, b) >= jaccard_min


def substitution(a: str, b: str) -> bool:
    """True when ``b`` is ``a`` with one or two content words swapped for others (see
    :func:`near_duplicate`)."""
    left, right = set(content_words(a)), set(content_words(b))
    shared, only_a, only_b = left & right, left - right, right - left
    return (
        bool(shared) and 1 <= len(only_a) <= 2 and 1 <= len(only_b) <= 2
        and len(shared) >= max(len(only_a), len(only_b))
    )


def richer_text(a: str, b: str) -> str:
    """The text that carries more: more content words, then longer."""
    return max((a, b), key=lambda t: (len(set(content_words(t))), len(t)))


def merge_metadata(
    old: Mapping[str, MetadataValue], new: Mapping[str, MetadataValue]
) -> dict[str, MetadataValue]:
    """Union of two metadata dicts; the older value wins a conflict (it was there first)."""
    return {**new, **old}


def corroborated(kept: float, kept_source: str, new: float, new_source: str) -> float:
    """The confidence of a memory after the same fact arrived again (a merge or an identical
    restatement), from the kept memory's and the new one's confidences and sources.

    - Same source (the user saying it again): ``max(kept, new)``, no boost. A source repeating
      itself is not independent evidence — someone unsure of a fact stays unsure however often
      they say it — and the repetition is already counted in ``mention_count``, which the
      frequency ranking term reads; boosting here would count it twice.
    - Different sources (the user and the assistant, or a fact distilled by a model and then
      stated by the user): the noisy-OR ``1 - (1 - kept) * (1 - new)``. Two sources that agree
      each had their own chance to be wrong, so the fact is likelier true than either alone
      says. It never exceeds 1, equals 1 only if one side was certain, and is never below the
      max.
    """
    if kept_source == new_source:
        return max(kept, new)
    return max(kept, new, 1.0 - (1.0 - kept) * (1.0 - new))


def bumped(base: MemoryItem, request: AddRequest, now: datetime) -> MemoryItem:
    """An identical memory said again: one more mention, the confidence of
    :func:`corroborated`, the higher importance."""
    return base.model_copy(update={
        "mention_count": base.mention_count + 1,
        "confidence": corroborated(base.confidence, base.source, request.confidence,
                                   request.source),
        "importance": max(base.importance, request.importance),
        "metadata": merge_metadata(base.metadata, request.metadata),
        "knowledge": knowledge_of(base.knowledge, request.knowledge),
        "updated_at": now,
    })


def merged(into: MemoryItem, new: MemoryItem, now: datetime) -> MemoryItem:
    """``new`` folded into the near-duplicate ``into``: the richer text, the union of metadata,
    the mentions added up, the confidence of :func:`corroborated`, the higher importance."""
    return into.model_copy(update={
        "text": richer_text(into.text, new.text),
        "mention_count": into.mention_count + new.mention_count,
        "confidence": corroborated(into.confidence, into.source, new.confidence, new.source),
        "importance": max(into.importance, new.importance),
        "metadata": merge_metadata(into.metadata, new.metadata),
        "knowledge": knowledge_of(into.knowledge, new.knowledge),
        "updated_at": now,
    })


def knowledge_of(first: Knowledge | None, second: Knowledge | None) -> Knowledge | None:
    """What the caller stated about two memories that become one: both statements, each
    entity and relation once."""
    return first | second if first else (second or None)


def doomed(
    items: Iterable[MemoryItem], *, now: datetime, min_importance: float, idle_days: float
) -> tuple[list[MemoryItem], list[MemoryItem]]:
    """The retention policy: (expired memories, idle ones) — idle means importance below
    ``min_importance`` and neither read nor written for ``idle_days``: not returned by a search
    (``last_accessed_at``), not created, updated, merged into or said again
    (:func:`~hybridmem.read.ranking.last_written`). A write counts like a read because a fact the
    user keeps restating is in use even when no search has returned it yet."""
    cutoff = now - timedelta(days=idle_days)
    expired, idle = [], []
    for item in items:
        touched = last_written(item, now)
        if item.last_accessed_at is not None:
            touched = max(touched, item.last_accessed_at)
        if item.expires_at is not None and item.expires_at <= now:
            expired.append(item)
        elif item.importance < min_importance and touched < cutoff:
            idle.append(item)
    return expired, idle


def _head(name: str) -> str:
    words = content_words(name)
    return words[-1] if words else ""


def conflicting(new: Relation, old: Relation) -> bool:
    """True when ``new`` contradicts ``old``: same subject and functional predicate, new object.

    Names are compared by :func:`hybridmem.text.entity_key`, exactly as the graph keys its nodes,
    so "the ROG laptop" and "ROG laptop" are one subject here as they are one node there."""
    if new.predicate != old.predicate or entity_key(new.subject) != entity_key(old.subject):
        return False
    if entity_key(new.object) == entity_key(old.object):
        return False
    if new.predicate in FUNCTIONAL_PREDICATES:
        return True
    if new.predicate in SAME_HEAD_PREDICATES:
        head = _head(new.object)
        return bool(head) and head == _head(old.object)
    return False


def functional(relations: Iterable[Relation]) -> list[Relation]:
    """The relations that can supersede something."""
    return [
        r for r in relations if r.predicate in FUNCTIONAL_PREDICATES | SAME_HEAD_PREDICATES
    ]


def parse_verdict(text: str) -> Verdict | None:
    """The judge's verdict from its JSON reply, None when unreadable."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        value = json.loads(text[start : end + 1]).get("verdict")
    except (ValueError, AttributeError):
        return None
    return value if value in ("UPDATE", "KEEP_BOTH", "DUPLICATE") else None
