"""The entity spans of one sentence: dates and amounts, then the names and products between them.

How a sentence is read: dates and amounts are masked first, so "May" or "1,899" never become
names. Capitalised runs become names ("Alice Martin"), with a sentence-initial word kept only
when it does not look like a verb or filler ("Bought a ..."). Runs with digits, camel case or a
product noun become products ("Dell 4K monitor", "iPhone 15"). Each run is typed from its words
and neighbours: product, org, place, person, else thing.

- :class:`Span` — where a found text sits in its sentence, and its entity type.
- :func:`find_masks` — the dates and amounts of a sentence.
- :func:`find_spans` — the named and product-like runs of a sentence, outside its masks.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridmem.extract.lexicon import (
    AMOUNT,
    BRANDS,
    CALENDAR,
    DATE,
    JUNK,
    ORG_SUFFIX,
    PERSON_CUES,
    PERSON_NEXT,
    PLACE_CUES,
    PRODUCT_NOUNS,
    STARTERS,
    TOKEN,
    VERBISH_NEXT,
)

__all__ = ["Span", "find_masks", "find_spans"]


@dataclass(frozen=True)
class Span:
    """A text found at ``[start, end)`` of its sentence, with its entity type."""

    start: int
    end: int
    text: str
    type: str


def _is_cap(tok: str) -> bool:
    """Capitalised, camel-cased (iPhone) or a model-like mix of letters and digits (4K, XM5)."""
    c = tok[0]
    if c.isupper():
        return tok.lower() not in {"i", "i'm", "i've", "i'd", "i'll", "i’m", "ok"}
    if c.islower():
        return any(ch.isupper() for ch in tok[1:])
    return any(ch.isalpha() for ch in tok)  # starts with a digit and has letters


def find_masks(sentence: str) -> list[Span]:
    """Dates and amounts, found first so that "May" or "1,899" never become names."""
    out = [
        Span(m.start(), m.end(), m.group().rstrip("."), "date") for m in DATE.finditer(sentence)
    ]
    out += [
        Span(m.start(), m.end(), m.group(), "amount")
        for m in AMOUNT.finditer(sentence)
        if not any(s.start <= m.start() < s.end for s in out)
    ]
    return out


def _type_run(words: list[str], prev: str, nxt: str, extended: bool) -> str:
    """The entity type of a run of words, from its words and the words around it."""
    lower = [w.lower() for w in words]
    if extended or any(w[0].islower() or any(ch.isdigit() for ch in w) for w in words):
        return "product"
    if any(w[1:] != w[1:].lower() and not w.isupper() for w in words):
        return "product"  # PlayStation, MacBook
    if lower[-1] in ORG_SUFFIX:
        return "org"
    if lower[0] in BRANDS:
        return "product" if len(words) > 1 else "org"
    if prev in PLACE_CUES:
        return "place"

    verbish = len(nxt) > 3 and nxt.endswith(("ed", "s"))
    cue = 2 <= len(words) <= 3 or prev in PERSON_CUES or nxt in PERSON_NEXT or verbish
    if cue and all(w.isalpha() and w[0].isupper() and w[1:].islower() for w in words):
        return "person"
    return "thing"


def find_spans(sentence: str, masks: list[Span]) -> list[Span]:
    """Capitalised runs ("Alice Martin"), product-like runs ("Dell 4K monitor", "iPhone 15")."""
    toks = [
        m
        for m in TOKEN.finditer(sentence)
        if not any(s.start < m.end() and m.start() < s.end for s in masks)
    ]
    words = [m.group() for m in toks]
    lows = [w.lower() for w in words]
    first = 0
    while first < len(toks) and lows[first] in {"just", "also", "so", "and", "oh", "well"}:
        first += 1

    def joined(i: int) -> bool:  # token i follows token i-1 separated by whitespace only
        return i > 0 and sentence[toks[i - 1].end() : toks[i].start()].isspace()

    out: list[Span] = []
    i, n = 0, len(toks)
    while i < n:
        if not _is_cap(words[i]):
            i += 1
            continue

        # The run: capitalised words, short numbers, and "of"/"de"/"&" between capitals.
        j = i + 1
        while j < n and joined(j):
            w = words[j]
            if _is_cap(w) or (w.isdigit() and len(w) <= 4):
                j += 1
            elif (
                lows[j] in {"of", "de", "&"}
                and j + 1 < n
                and joined(j + 1)
                and _is_cap(words[j + 1])
            ):
                j += 2
            else:
                break
        start = i
        while start < j and lows[start] in STARTERS:
            start += 1
        i = j
        if start >= j:
            continue

        # One or two lower-case words after it that end in a product noun belong to it.
        run = list(range(start, j))
        extended = False
        for k in (j, j + 1):  # "ROG laptop", "Logitech wireless mouse"
            if (
                k < n
                and lows[k] in PRODUCT_NOUNS
                and all(joined(x) and words[x].islower() for x in range(j, k + 1))
            ):
                run = list(range(start, k + 1))
                extended = True
                i = k + 1
                break

        # What a run is not: a date word, a bare model number, a verb opening the sentence,
        # a role or a unit.
        core = [words[x] for x in run]
        if all(lows[x] in CALENDAR for x in run):
            continue
        if not extended and all(
            not w[0].isupper() and not (w[0].islower() and not w.islower()) for w in core
        ):
            continue  # only "2nd", "10am", "4K" on their own
        prev = lows[run[0] - 1] if run[0] > 0 else ""
        nxt = lows[run[-1] + 1] if run[-1] + 1 < n else ""
        if len(run) == 1 and run[0] == first and not extended:
            low = lows[run[0]]
            if low.endswith(("ed", "ing", "ly")) or nxt in VERBISH_NEXT:
                continue  # "Bought a ...", "Loving the ..." at a sentence start
        if all(lows[x] in JUNK or lows[x].isdigit() for x in run):
            continue  # roles, units, bare numbers
        if len(run) == 1 and run[0] == first and not extended and lows[run[0]] not in BRANDS:
            acts = nxt in PERSON_NEXT or (len(nxt) > 3 and nxt.endswith(("ed", "s")))
            if not acts and words[run[0]][1:].islower():
                continue  # a capitalised sentence opener ("Found ...", "Drop ..."), not a name

        text = sentence[toks[run[0]].start() : toks[run[-1]].end()]
        if text.endswith(("'s", "’s")):
            text = text[:-2]
        out.append(
            Span(
                toks[run[0]].start(),
                toks[run[-1]].end(),
                text,
                _type_run(core, prev, nxt, extended),
            )
        )
    return out
