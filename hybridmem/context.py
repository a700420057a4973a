"""Context packing: the best lines that fit a token budget, counted exactly with tiktoken.

The whole text, headers, separators and the ``<memory>`` wrapper included, never exceeds
``max_tokens``. Lines are taken greedily in priority order; a line is never cut unless the single
best memory alone is larger than the budget (then it is truncated with a marker). Stored text is
escaped (``<`` and ``&``) so a memory cannot close the wrapper and pose as instructions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hybridmem.models import Context, ContextLine
from hybridmem.protocols import TokenCounter

__all__ = ["ContextCandidate", "build_context"]

Section = Literal["facts", "relations", "memories", "episodes"]
SECTION_ORDER: tuple[Section, ...] = ("facts", "relations", "episodes", "memories")
HEADERS: dict[Section, str] = {
    "facts": "Known facts:",
    "relations": "Relations:",
    "episodes": "Conversation summaries:",
    "memories": "Memories (most relevant first):",
}
OPEN, CLOSE = "<memory>", "</memory>"
TRUNCATED = " …[truncated]"


@dataclass(frozen=True)
class ContextCandidate:
    """A line that may go into the context, in priority order."""

    section: Section
    text: str
    memory_id: str | None = None
    why: str = ""


def _escape(text: str) -> str:
    """Neutralise markup: with ``<`` and ``&`` escaped no stored text can open or close a tag
    (``>`` stays readable, as in ``a -bought-> b``)."""
    return text.replace("&", "&amp;").replace("<", "&lt;")


def _render(lines: list[ContextLine]) -> str:
    if not lines:
        return ""
    parts = [OPEN]
    for section in SECTION_ORDER:
        chosen = [line for line in lines if line.section == section]
        if chosen:
            parts.append(HEADERS[section])
            parts.extend(line.text for line in chosen)
    parts.append(CLOSE)
    return "\n".join(parts)


def build_context(
    candidates: list[ContextCandidate], *, counter: TokenCounter, max_tokens: int
) -> Context:
    """Pack ``candidates`` (best first) into at most ``max_tokens`` tokens, duplicates removed."""
    chosen: list[ContextLine] = []
    seen: set[str] = set()
    overhead = counter.count(f"{OPEN}\n\n{CLOSE}")
    used = overhead
    sections: set[Section] = set()
    for cand in candidates:
        key = " ".join(cand.text.lower().split())
        if not key or key in seen:
            continue
        text = "- " + _escape(" ".join(cand.text.split()))
        cost = counter.count(text) + 1
        if cand.section not in sections:
            cost += counter.count(HEADERS[cand.section]) + 1
        if used + cost > max_tokens:
            if chosen or cand.section != "memories":
                continue
            room = max_tokens - used - (cost - counter.count(text)) - counter.count(TRUNCATED)
            cut = counter.truncate(text, room)
            if len(cut) <= 2:
                continue
            text, cost = cut + TRUNCATED, max_tokens - used
        seen.add(key)
        sections.add(cand.section)
        used += cost
        chosen.append(
            ContextLine(
                section=cand.section,
                text=text,
                memory_id=cand.memory_id,
                why=cand.why,
                tokens=counter.count(text),
            )
        )
    text = _render(chosen)
    tokens = counter.count(text)
    while tokens > max_tokens and chosen:  # estimates can be off by BPE merges at line joins
        chosen.pop()
        text = _render(chosen)
        tokens = counter.count(text)
    return Context(
        text=text, tokens=tokens, max_tokens=max_tokens, lines=chosen, encoding=counter.encoding
    )
