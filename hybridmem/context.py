"""Context assembly and packing: what enters a context, in what order, within a token budget.

:func:`assemble` decides what may enter and in which priority: the three best memories first, then
conversation summaries, relations of the top memories, the other memories, and key facts the
search did not find. :func:`build_context` packs them, counted exactly with tiktoken.

The whole text, headers, separators and the ``<memory>`` wrapper included, never exceeds
``max_tokens``. Lines are taken greedily in priority order; a line is never cut unless the single
best memory alone is larger than the budget (then it is truncated with a marker). Stored text is
escaped (``<`` and ``&``) so a memory cannot close the wrapper and pose as instructions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from hybridmem.models import Context, ContextLine, GraphRelation, Hit, MemoryItem
from hybridmem.protocols import TokenCounter

__all__ = ["ContextCandidate", "assemble", "build_context", "line_of"]

#: Memories placed before summaries and relations; the rest follow them.
LEADING_MEMORIES = 3
#: Most relations of the top memories offered to a context.
MAX_RELATIONS = 8

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


def line_of(item: MemoryItem) -> str:
    """A memory as one context line: its date, who said it (unless the user), its text, and
    when it stopped being valid if it did."""
    who = "" if item.source == "user" else f"({item.source}) "
    old = "" if item.is_current else (
        f" (superseded {item.invalid_at:%Y-%m-%d})" if item.invalid_at else " (superseded)"
    )
    return f"[{item.created_at:%Y-%m-%d}] {who}{item.text}{old}"


def _section(item: MemoryItem) -> Section:
    if item.key:
        return "facts"
    return "episodes" if item.kind == "summary" else "memories"


def assemble(
    hits: Sequence[Hit],
    *,
    facts: Sequence[MemoryItem] = (),
    relations: Sequence[GraphRelation] = (),
    episodes: Sequence[Hit] = (),
) -> list[ContextCandidate]:
    """Every line that may enter a context, best first: the top memories, summaries, relations,
    the other memories, then key facts. Facts and episodes the search already found appear once,
    in the section of the memory itself."""
    found = {h.item.id for h in hits}
    memories = [ContextCandidate(_section(h.item), line_of(h.item), h.item.id, h.why) for h in hits]
    summaries = [
        ContextCandidate("episodes", line_of(h.item), h.item.id, h.why)
        for h in episodes if h.item.id not in found
    ]
    edges = [
        ContextCandidate("relations", str(r), None, "graph relation of the top memories")
        for r in relations[:MAX_RELATIONS]
    ]
    keyed = [
        ContextCandidate("facts", line_of(f), f.id, "key fact") for f in facts if f.id not in found
    ]
    lead = memories[:LEADING_MEMORIES]
    return lead + summaries + edges + memories[LEADING_MEMORIES:] + keyed


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
                tokens=counter.count(text),  # counted above: the counter remembers it
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
