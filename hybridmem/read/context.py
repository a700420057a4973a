"""Context assembly and packing: what enters a context, in what order, within a token budget.

:func:`assemble` decides what may enter and in which priority: the three best memories first, then
procedures and conversation summaries, relations of the top memories, the other memories, and key
facts the search did not find. :func:`build_context` packs them, counted exactly with tiktoken.

Per-section budgets. Each section (facts, relations, procedures, episodes, memories) has a share of
the budget (:data:`DEFAULT_SHARES` of ``max_tokens``, or the tokens a caller names in
``budgets``). Packing takes three passes: the best line of each section with a share (in
:data:`RESERVE_ORDER`: the best memory, then a key fact, ...), so a share too small for one line is
not wasted; then, over the candidates in priority order, each line that fits its section's share;
then, in the room that is left, every other line that fits. So a section is guaranteed its share
when it has lines to fill it (key facts are not the first thing dropped when the budget is tight),
and a share a section cannot use goes to the others, best first. A section with a budget
of 0 gets only what is left at the end.

A line enters once: lines equal under :func:`hybridmem.text.normalise` are one line, in the
place of the first. The whole text, headers, separators and the ``<memory>`` wrapper included,
never exceeds ``max_tokens``. A line is never cut unless nothing at all fits and the single best
memory alone is larger than the budget (then it is truncated with a marker). Stored text is
escaped (``<`` and ``&``) so a memory cannot close the wrapper and pose as instructions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import get_args

from hybridmem.errors import InvalidInputError
from hybridmem.models import Context, ContextLine, GraphRelation, Hit, MemoryItem, Section
from hybridmem.protocols import TokenCounter
from hybridmem.text import normalise

__all__ = [
    "DEFAULT_SHARES",
    "ContextCandidate",
    "assemble",
    "build_context",
    "line_of",
    "section_budgets",
]

#: Memories placed before procedures, summaries and relations; the rest follow them.
LEADING_MEMORIES = 3
#: Most relations of the top memories offered to a context.
MAX_RELATIONS = 8

SECTIONS: tuple[Section, ...] = get_args(Section)
SECTION_ORDER: tuple[Section, ...] = ("facts", "relations", "procedures", "episodes", "memories")
HEADERS: dict[Section, str] = {
    "facts": "Known facts:",
    "relations": "Relations:",
    "procedures": "Procedures (steps that worked before):",
    "episodes": "Conversation summaries:",
    "memories": "Memories (most relevant first):",
}
#: Each section's guaranteed share of ``max_tokens`` when the caller names no budget for it.
#: They add up to 1, so with the defaults every section can fill its share; what one leaves
#: unused goes to the others in priority order. Memories get the most: they are what the
#: search ranked for this query; key facts, procedures and summaries a fixed slice each.
DEFAULT_SHARES: dict[Section, float] = {
    "facts": 0.15, "relations": 0.10, "procedures": 0.15, "episodes": 0.15, "memories": 0.45,
}
#: Whose best line is placed first when the budget is tight: the best memory (what the search
#: ranked first for this query), then a key fact, a procedure, a summary, a relation.
RESERVE_ORDER: tuple[Section, ...] = ("memories", "facts", "procedures", "episodes", "relations")
OPEN, CLOSE = "<memory>", "</memory>"
TRUNCATED = " …[truncated]"


@dataclass(frozen=True)
class ContextCandidate:
    """A line that may go into the context, in priority order."""

    section: Section
    text: str
    memory_id: str | None = None
    why: str = ""


def line_of(item: MemoryItem, *, as_of: datetime | None = None) -> str:
    """A memory as one context line: its date, who said it (unless the user), its text, and
    when it stopped being valid if it did (by ``as_of``, when the context looks at the past)."""
    who = "" if item.source == "user" else f"({item.source}) "
    ended = not item.is_current and (
        as_of is None or item.invalid_at is None or item.invalid_at <= as_of)
    old = "" if not ended else (
        f" (superseded {item.invalid_at:%Y-%m-%d})" if item.invalid_at else " (superseded)"
    )
    return f"[{item.created_at:%Y-%m-%d}] {who}{item.text}{old}"


def _section(item: MemoryItem) -> Section:
    if item.key:
        return "facts"
    if item.kind == "procedure":
        return "procedures"
    return "episodes" if item.kind == "summary" else "memories"


def assemble(
    hits: Sequence[Hit],
    *,
    facts: Sequence[MemoryItem] = (),
    relations: Sequence[GraphRelation] = (),
    episodes: Sequence[Hit] = (),
    procedures: Sequence[Hit] = (),
    as_of: datetime | None = None,
) -> list[ContextCandidate]:
    """Every line that may enter a context, best first: the top memories, procedures, summaries,
    relations, the other memories, then key facts. Facts, procedures and episodes the search
    already found appear once, in the section of the memory itself."""
    found = {h.item.id for h in hits}

    def line(item: MemoryItem) -> str:
        return line_of(item, as_of=as_of)

    memories = [ContextCandidate(_section(h.item), line(h.item), h.item.id, h.why) for h in hits]
    steps = [
        ContextCandidate("procedures", line(h.item), h.item.id, h.why)
        for h in procedures if h.item.id not in found
    ]
    summaries = [
        ContextCandidate("episodes", line(h.item), h.item.id, h.why)
        for h in episodes if h.item.id not in found
    ]
    edges = [
        ContextCandidate("relations", str(r), None, "graph relation of the top memories")
        for r in relations[:MAX_RELATIONS]
    ]
    keyed = [
        ContextCandidate("facts", line(f), f.id, "key fact") for f in facts if f.id not in found
    ]
    lead = memories[:LEADING_MEMORIES]
    return lead + steps + summaries + edges + memories[LEADING_MEMORIES:] + keyed


def section_budgets(
    max_tokens: int, budgets: Mapping[str, int] | None = None
) -> dict[Section, int]:
    """Each section's token share: ``budgets[section]`` where given, else its
    :data:`DEFAULT_SHARES` of ``max_tokens``. Unknown sections and negative or non-integer
    budgets are refused with :class:`InvalidInputError`."""
    given = dict(budgets or {})
    unknown = sorted(set(given) - set(SECTIONS), key=str)
    if unknown:
        raise InvalidInputError(
            f"budgets names unknown sections {unknown}; use {', '.join(SECTIONS)}")
    out: dict[Section, int] = {}
    for section in SECTIONS:
        value = given.get(section)
        if value is None:
            out[section] = int(DEFAULT_SHARES[section] * max_tokens)
        elif not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidInputError(
                f"budgets[{section!r}] must be a non-negative integer, got {value!r}")
        else:
            out[section] = value
    return out


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
    candidates: list[ContextCandidate],
    *,
    counter: TokenCounter,
    max_tokens: int,
    budgets: Mapping[str, int] | None = None,
) -> Context:
    """Pack ``candidates`` (best first) into at most ``max_tokens`` tokens, duplicates removed:
    each section up to its share first (see :func:`section_budgets`), then the rest of the room
    in priority order.

    Two lines are duplicates when their :func:`hybridmem.text.normalise` forms are equal (they
    differ only in case, width, spacing or the punctuation around words: "I bought a ROG laptop."
    and "i bought a  ROG laptop"); the first, higher-priority one is kept. A line with no words
    (empty, or punctuation only) is left out."""
    shares = section_budgets(max_tokens, budgets)
    lines: list[tuple[ContextCandidate, str]] = []
    seen: set[str] = set()
    for cand in candidates:
        key = normalise(cand.text)
        if key and key not in seen:
            seen.add(key)
            lines.append((cand, "- " + _escape(" ".join(cand.text.split()))))
    costs = [counter.count(text) + 1 for _, text in lines]
    header = {s: counter.count(HEADERS[s]) + 1 for s in SECTIONS}
    used = counter.count(f"{OPEN}\n\n{CLOSE}")
    spent: dict[Section, int] = dict.fromkeys(SECTIONS, 0)
    taken: dict[int, str] = {}
    firsts = {cand.section: i for i, (cand, _) in reversed(list(enumerate(lines)))}
    passes = (
        [firsts[s] for s in RESERVE_ORDER if s in firsts and shares[s] > 0],  # each best line
        range(len(lines)),  # then each section up to its share
        range(len(lines)),  # then whatever fits, best first
    )
    for number, order in enumerate(passes):
        for index in order:
            cand, text = lines[index]
            if index in taken:
                continue
            cost = costs[index] + (0 if spent[cand.section] else header[cand.section])
            if used + cost > max_tokens or (
                    number == 1 and spent[cand.section] + cost > shares[cand.section]):
                continue
            taken[index] = text
            spent[cand.section] += cost
            used += cost
    if not taken:
        first = next((i for i, (c, _) in enumerate(lines) if c.section == "memories"), None)
        if first is not None:
            text = lines[first][1]
            room = max_tokens - used - header["memories"] - 1 - counter.count(TRUNCATED)
            cut = counter.truncate(text, room)
            if len(cut) > 2:
                taken[first] = cut + TRUNCATED
    chosen = [
        ContextLine(section=lines[i][0].section, text=text, memory_id=lines[i][0].memory_id,
                    why=lines[i][0].why, tokens=counter.count(text))
        for i, text in sorted(taken.items())
    ]
    text = _render(chosen)
    tokens = counter.count(text)
    while tokens > max_tokens and chosen:  # estimates can be off by BPE merges at line joins
        chosen.pop()
        text = _render(chosen)
        tokens = counter.count(text)
    return Context(
        text=text, tokens=tokens, max_tokens=max_tokens, lines=chosen, encoding=counter.encoding
    )
