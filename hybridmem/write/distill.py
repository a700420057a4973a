"""Key facts distilled from conversation turns by the model: the request, its reply schema and
the validated reading of the reply. Pure, no I/O: :meth:`hybridmem.Memory.add_messages` makes
the one structured call and stores each fact as :meth:`hybridmem.Memory.remember` does (one
current value per key, older values superseded).

- :func:`distill_messages` — the request for the new turns, under
  :data:`hybridmem.prompts.DISTILL_PROMPT`, with the user's known keys so the model reuses them.
- :data:`DISTILL_SCHEMA` — the JSON schema of the reply.
- :func:`parse_facts` — the reply as :class:`DistilledFact` values, None when it is unreadable;
  facts with an unusable key or value are dropped one by one.
- :func:`fact_request` — the add request that stores one fact, pointing at the turns it came from.
- :data:`MAX_FACTS`, :data:`MAX_DISTILL_CHARS` — at most this many facts per call, from at most
  the latest this many characters of the turns.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hybridmem.errors import InvalidInputError
from hybridmem.models import AddRequest, MemoryItem, validate_text
from hybridmem.prompts import DISTILL_PROMPT
from hybridmem.protocols import ChatMessage

__all__ = ["DISTILL_SCHEMA", "DISTILLED_SOURCE", "MAX_DISTILL_CHARS", "MAX_FACTS", "MAX_KEY_CHARS",
           "DistilledFact", "distill_messages", "fact_request", "parse_facts"]

#: Most facts stored from one call (a longer list is cut: a reply that long is not key facts).
MAX_FACTS = 20
#: The latest characters of the turns one call sees.
MAX_DISTILL_CHARS = 12_000
#: Longest key (as :meth:`hybridmem.Memory.remember` accepts) and value.
MAX_KEY_CHARS = 100
MAX_VALUE_CHARS = 500
#: Known keys sent with the turns, so a new value lands on the key the user already has.
MAX_KNOWN_KEYS = 100
#: The ``source`` of a distilled fact: a model read it in the turns, nobody stated it as a fact.
DISTILLED_SOURCE = "distilled"

DISTILL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "facts": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "key": {"type": "string"},
                    "value": {"type": "string"},
                    "category": {"type": "string"},
                    "confidence": {"type": "number"},
                },
                "required": ["key", "value"],
            },
        },
    },
    "required": ["facts"],
}


@dataclass(frozen=True)
class DistilledFact:
    """One key fact the model read in the turns."""

    key: str
    value: str
    category: str = "general"
    confidence: float = 1.0


def distill_messages(turns: Sequence[MemoryItem], known_keys: Sequence[str]) -> list[ChatMessage]:
    """The request for the key facts of ``turns`` (the latest :data:`MAX_DISTILL_CHARS`
    characters when they are long), as JSON data under the instruction."""
    picked: list[dict[str, str]] = []
    left = MAX_DISTILL_CHARS
    for turn in reversed(turns):
        if left <= 0:
            break
        picked.append({"role": turn.source, "content": turn.text[-left:]})
        left -= len(turn.text)
    payload = {"known_keys": list(known_keys)[:MAX_KNOWN_KEYS], "turns": picked[::-1]}
    return [
        {"role": "system", "content": DISTILL_PROMPT},
        {"role": "user", "content": json.dumps(payload, ensure_ascii=False)},
    ]


def _text(raw: object, limit: int) -> str | None:
    """``raw`` with its whitespace collapsed, if it is a usable text of at most ``limit``
    characters (what :func:`hybridmem.models.validate_text` accepts), else None."""
    if not isinstance(raw, str):
        return None
    text = " ".join(raw.split())
    try:
        validate_text(text)
    except InvalidInputError:
        return None
    return text if len(text) <= limit else None


def _fact(raw: object) -> DistilledFact | None:
    if not isinstance(raw, dict):
        return None
    key, value = _text(raw.get("key"), MAX_KEY_CHARS), _text(raw.get("value"), MAX_VALUE_CHARS)
    if key is None or value is None:
        return None
    category = _text(raw.get("category"), 64) or "general"
    confidence = raw.get("confidence")
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not (
            math.isfinite(confidence)):
        confidence = 1.0
    return DistilledFact(key=key.lower(), value=value, category=category.lower(),
                         confidence=min(max(float(confidence), 0.0), 1.0))


def parse_facts(text: str) -> list[DistilledFact] | None:
    """The facts of a reply, None when the reply is not a JSON object with a ``facts`` list.
    Each fact is checked on its own: one without a usable key or value is dropped, a missing or
    odd category becomes "general", a confidence outside [0, 1] is clamped. A key said twice
    keeps its last value (one current value per key). At most :data:`MAX_FACTS`."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        raw = json.loads(text[start : end + 1])
    except ValueError:
        return None
    facts = raw.get("facts") if isinstance(raw, dict) else None
    if not isinstance(facts, list):
        return None
    by_key: dict[str, DistilledFact] = {}
    for item in facts:
        fact = _fact(item)
        if fact is not None:
            by_key.pop(fact.key, None)
            by_key[fact.key] = fact
    return list(by_key.values())[:MAX_FACTS]


def fact_request(fact: DistilledFact, turns: Sequence[MemoryItem]) -> AddRequest:
    """The add request of one distilled fact: ``"key: value"`` like a remembered fact, source
    :data:`DISTILLED_SOURCE`, dated like the last turn, with the turns it came from in its
    metadata (``turns``, ``first_turn``, ``last_turn``, as a summary episode has)."""
    return AddRequest(
        text=f"{fact.key}: {fact.value}", kind="fact", category=fact.category,
        confidence=fact.confidence, importance=0.8, source=DISTILLED_SOURCE,
        created_at=turns[-1].created_at,
        metadata={"turns": len(turns), "first_turn": turns[0].id, "last_turn": turns[-1].id},
    )
