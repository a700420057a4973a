"""Write-path policy: what counts as a duplicate and what contradicts what. Pure functions, no I/O.

Cheap first, models last: a normalised-text hash finds identical memories; token Jaccard and
embedding cosine find near-duplicates; a functional predicate with a new object (``lives_in``,
``works_at``, ``name`` ...) marks a contradiction that supersedes the older memory. An LLM judge is
only asked about pairs in the undecided cosine band (see :data:`JUDGE_SCHEMA`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from hybridmem.lexical import content_words
from hybridmem.models import MetadataValue, Relation

__all__ = [
    "FUNCTIONAL_PREDICATES",
    "JUDGE_SCHEMA",
    "Verdict",
    "conflicting",
    "jaccard",
    "merge_metadata",
    "near_duplicate",
    "parse_verdict",
    "richer_text",
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
JUDGE_PROMPT = (
    "You maintain a user's long-term memory. Compare an OLD memory with a NEW one about the same "
    "user. Answer UPDATE if the new one replaces the old (the fact changed), DUPLICATE if they say "
    "the same thing, KEEP_BOTH if both stay true. Reply with JSON: {\"verdict\": ..., \"reason\": ...}."
)


def jaccard(a: str, b: str) -> float:
    """Jaccard similarity of the content-word sets of two texts (0 when either has none)."""
    left, right = set(content_words(a)), set(content_words(b))
    if not left or not right:
        return 0.0
    return len(left & right) / len(left | right)


def near_duplicate(
    a: str, b: str, cosine: float, *, jaccard_min: float = 0.6, cosine_min: float = 0.92
) -> bool:
    """True when two texts say (nearly) the same: token Jaccard or embedding cosine above its bar.

    Texts that mention different numbers (order ids, prices, dates, quantities) are never
    duplicates, however similar the rest: "order 1041" and "order 1042" are two facts."""
    if sorted(_NUMBER.findall(a)) != sorted(_NUMBER.findall(b)):
        return False
    return cosine >= cosine_min or jaccard(a, b) >= jaccard_min


def richer_text(a: str, b: str) -> str:
    """The text that carries more: more content words, then longer."""
    return max((a, b), key=lambda t: (len(set(content_words(t))), len(t)))


def merge_metadata(
    old: Mapping[str, MetadataValue], new: Mapping[str, MetadataValue]
) -> dict[str, MetadataValue]:
    """Union of two metadata dicts; the older value wins a conflict (it was there first)."""
    return {**new, **old}


def _head(name: str) -> str:
    words = content_words(name)
    return words[-1] if words else ""


def conflicting(
    new: Relation, old: Relation, *, canonical: Any = lambda s: " ".join(s.casefold().split())
) -> bool:
    """True when ``new`` contradicts ``old``: same subject and functional predicate, new object."""
    if new.predicate != old.predicate or canonical(new.subject) != canonical(old.subject):
        return False
    if canonical(new.object) == canonical(old.object):
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
    import json

    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        value = json.loads(text[start : end + 1]).get("verdict")
    except (ValueError, AttributeError):
        return None
    return value if value in ("UPDATE", "KEEP_BOTH", "DUPLICATE") else None
