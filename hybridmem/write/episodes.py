"""Episodes: a summary of the conversation turns since the last summary, written by the model.

Pure helpers; :meth:`hybridmem.Memory.summarize` makes the one model call and stores the result
as a memory of kind ``"summary"`` through the normal write path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hybridmem.errors import InvalidInputError
from hybridmem.filters import AllOf, Condition, eq
from hybridmem.models import AddRequest, MemoryItem
from hybridmem.prompts import SUMMARY_PROMPT
from hybridmem.protocols import ChatMessage, VectorStore

__all__ = [
    "MAX_SUMMARY_CHARS",
    "MAX_SUMMARY_TURNS",
    "still_unsummarized",
    "summary_messages",
    "summary_request",
    "turn_requests",
    "unsummarized",
]

#: Most turns (and characters) one summary episode covers.
MAX_SUMMARY_TURNS = 200
MAX_SUMMARY_CHARS = 12_000


def unsummarized(vectors: VectorStore, user_id: str) -> list[MemoryItem]:
    """Turns newer than the newest summary episode, oldest first."""
    summaries = vectors.list(user_id, where=eq("kind", "summary"))
    since = max((s.created_at.timestamp() for s in summaries), default=0.0)
    where = AllOf((eq("kind", "turn"), Condition("created_at_ts", "$gt", since)))
    return sorted(vectors.list(user_id, where=where), key=lambda i: (i.created_at, i.id))


def summary_messages(turns: list[MemoryItem]) -> list[ChatMessage]:
    """The request for one summary of ``turns`` (the latest characters if they are many), under
    :data:`hybridmem.prompts.SUMMARY_PROMPT`."""
    transcript = "\n".join(f"{t.source}: {t.text}" for t in turns)
    return [
        {"role": "system", "content": SUMMARY_PROMPT},
        {"role": "user", "content": transcript[-MAX_SUMMARY_CHARS:]},
    ]


def summary_request(turns: list[MemoryItem], summary: str) -> AddRequest:
    """The memory that stores a summary, dated like the last turn it covers."""
    return AddRequest(
        text=summary.strip()[:MAX_SUMMARY_CHARS], kind="summary", source="system",
        created_at=turns[-1].created_at,
        metadata={"turns": len(turns), "first_turn": turns[0].id, "last_turn": turns[-1].id},
    )


def still_unsummarized(vectors: VectorStore, user_id: str, turns: list[MemoryItem]) -> bool:
    """True when no summary covering the last of ``turns`` was stored meanwhile."""
    return any(t.id == turns[-1].id for t in unsummarized(vectors, user_id))


def turn_requests(messages: object) -> list[dict[str, Any]]:
    """Chat messages (``{"role", "content"}``) as the add requests of conversation turns."""
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise InvalidInputError("messages must be a list of {'role': ..., 'content': ...}")
    items = []
    for message in messages:
        if not isinstance(message, Mapping) or "content" not in message:
            raise InvalidInputError("each message needs 'role' and 'content'")
        role = message.get("role", "user")
        if not isinstance(role, str) or role not in {"user", "assistant", "system"}:
            raise InvalidInputError(f"message role must be user, assistant or system, not {role!r}")
        items.append({"text": message["content"], "kind": "turn", "source": role})
    return items
