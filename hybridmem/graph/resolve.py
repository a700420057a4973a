"""Entity resolution: when a new name is an existing node under another form.

Exact forms already meet through :func:`hybridmem.text.entity_key` ("the ROG laptop" and "ROG
Laptop." are one key). This module adds *token containment*, for the way people shorten product
names: "ASUS ROG Strix G16 laptop", "ASUS ROG Strix G16", "ROG Strix laptop" and "the G16" name one
thing. Name ``a`` is a form of name ``b`` when (on entity-key words):

- every word of ``a`` is a word of ``b`` and ``a`` is shorter (a leading count like "three" and a
  plural last word, by :func:`hybridmem.text.singular`, do not count: "three Dell P2425H monitors"
  is "Dell P2425H monitor", "Apple Watches" is "Apple Watch");
- ``a`` has two or more words, or one word that is a model code (letters and digits: "K2",
  "WH-1000XM5") — a bare brand or common word ("Sony", "pixel") is too vague;
- the words ``b`` adds are not numbers or variant words (``pro``, ``max``, ``mini`` ...) and, if
  ``a`` already has a model code, not another code: "iPhone 15" is not "iPhone 15 Pro", nor
  "Pixel 8" "Pixel 8 128GB".

Two names are also one model when they share the first word (the brand) and a model code or a long
number, with no other code or variant word on either side ("Anker 563 dock" and "Anker 563 USB-C
docking station").

A name merges into an existing node only when exactly one node qualifies (two Dell monitors leave
"Dell monitor" alone), and only across compatible types (products, organisations and untyped
things, topic concepts; people and places only with products, else exact keys: "Sam" is not
"Sam Smith" in general).

*Fuzzy words* (rapidfuzz), for misspelt names: when two names already share a word (the anchor),
a word of one that is not in the other may stand for a word of the other when both are ordinary
words of 5+ letters at ``fuzz.ratio >= FUZZY_RATIO`` ("Logitec" / "Logitech", "Ergotorn" /
"Ergotron"), or when it is the tail of the other's model code after a digit or hyphen ("Sony
XM5s" is "Sony WH-1000XM5"). Model codes are never matched by edit distance: "XM4" is never
"XM5". Topic concepts are left out of fuzzy matching, since "pottery class" and "poetry class"
are as close by edit distance as a typo is.
Pure functions over a word index the graph keeps; no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set
from itertools import combinations, islice

from rapidfuzz import fuzz

from hybridmem.text import singular

__all__ = [
    "COMMON_WORD", "FUZZY_RATIO", "MAX_CHECKED", "MAX_SUBSET_WORDS", "MERGEABLE_TYPES",
    "NEVER_MERGED", "VARIANTS", "better_name", "compatible", "form_key", "is_form_of",
    "resolve_by_tokens",
]

#: Entity types whose names may be matched by containment (a product also takes a name the rules
#: typed as a person or place: "Wacom Intuos Pro" is three capitalised words).
MERGEABLE_TYPES = frozenset({"product", "org", "thing", "concept"})
NEVER_MERGED = frozenset({"date", "amount"})
#: Words that make a different model, not a longer name of the same one.
VARIANTS = frozenset(
    "pro max mini plus ultra lite air se xl xs xr mk2 mkii ii iii iv gen s e fe neo edge note "
    "studio slim go classic 2 3 4 5".split()
)


#: Least ``rapidfuzz.fuzz.ratio`` (0-100) at which two ordinary words are one misspelt word.
FUZZY_RATIO = 85.0
#: Shortest ordinary word matched by edit distance (shorter ones differ by one letter: "cable"
#: and "table" are 5, and need the anchor too).
FUZZY_MIN_LETTERS = 5

#: Nodes whose forms are checked against one new name, at most (see :func:`resolve_by_tokens`).
MAX_CHECKED = 32
#: A word more nodes than this hold is common: its nodes are not all candidates.
COMMON_WORD = 256
#: Longest name (distinct compared words) whose subsets are looked up as shorter forms.
MAX_SUBSET_WORDS = 8

#: Counts that open a name without being part of it ("three Dell P2425H monitors").
COUNTS = frozenset("two three four five six seven eight nine ten several multiple".split())
_MEASURE = re.compile(r"^\d+(?:[.,]\d+)?-?(?:inch|in|mm|cm|gb|tb|mb|w|hz|l|m|k)$")


def _code(word: str) -> bool:
    """A model code: letters and digits together ("g16", "wh-1000xm5", "27gp850"), not a
    measurement ("24-inch", "100w")."""
    return (
        len(word) >= 2 and any(c.isdigit() for c in word) and any(c.isalpha() for c in word)
        and not _MEASURE.match(word)
    )


def _norm(words: tuple[str, ...]) -> tuple[str, ...]:
    """The words compared: a leading count dropped, the last word singular."""
    if len(words) > 1 and words[0] in COUNTS:
        words = words[1:]
    return (*words[:-1], singular(words[-1])) if words else ()


def better_name(new: str, old: str) -> bool:
    """Whether ``new`` should become the display name of a node first seen as ``old``: it says
    more (more words) and does not open with a count ("three Dell P2425H monitors")."""
    first = new.split()[0].casefold() if new.split() else ""
    return len(new.split()) > len(old.split()) and first not in COUNTS


def _alike(word: str, other: str) -> bool:
    """A misspelling or an abbreviated model code of ``other`` (see the module docstring)."""
    if _code(word) or _code(other):
        tail = singular(word)
        return (
            _code(tail) and _code(other) and tail[0].isalpha() and len(other) > len(tail)
            and other.endswith(tail) and not other[-len(tail) - 1].isalpha()
        )
    return (
        len(word) >= FUZZY_MIN_LETTERS and len(other) >= FUZZY_MIN_LETTERS
        and word.isalpha() and other.isalpha() and fuzz.ratio(word, other) >= FUZZY_RATIO
    )


def _align(short: tuple[str, ...], long: tuple[str, ...]) -> tuple[str, ...]:
    """``short`` with each word that :func:`_alike` a word of ``long`` replaced by it, when the
    two already share a word (the anchor); else ``short`` unchanged."""
    shared = set(short) & set(long)
    if not shared:
        return short
    rest = [x for x in long if x not in shared]
    return tuple(
        w if w in shared else next((x for x in rest if _alike(w, x)), w) for w in short
    )


def is_form_of(short: tuple[str, ...], long: tuple[str, ...], *, fuzzy: bool = False) -> bool:
    """True when the name with words ``short`` is a shorter (or only inflected) form of the one
    with words ``long``; ``fuzzy``: also through misspelt words (see the module docstring)."""
    if fuzzy:
        short = _align(short, long)
    ta, tb = _norm(short), _norm(long)
    if ta == tb:
        return bool(ta)
    a, b = set(ta), set(tb)
    if not a < b:
        return _same_model(short, long, a, b)
    short = tuple(a)
    if len(short) == 1 and not _code(short[0]):
        return False
    extra = b - a
    if extra & VARIANTS or any(w.isdigit() for w in extra):
        return False  # "Pixel 9 Pro", "item 0 1": another model, another item
    return not (any(_code(w) for w in short) and any(_code(w) for w in extra))


def _same_model(
    first: tuple[str, ...], second: tuple[str, ...], a: set[str], b: set[str]
) -> bool:
    """Two names of one model said differently: the same first word (the brand), a shared model
    code or long number, and no other code or variant word on either side ("Anker 563 dock" /
    "Anker 563 USB-C docking station"; not "Sony WH-1000XM4" / "Sony WH-1000XM5")."""
    if not first or not second or first[0] != second[0]:
        return False
    if not any(_code(w) or (w.isdigit() and len(w) >= 3) for w in a & b):
        return False
    differ = a ^ b
    return not (differ & VARIANTS) and not any(_code(w) or w.isdigit() for w in differ)


def compatible(first: str, second: str) -> bool:
    """Whether nodes of these two types may be one entity under two names."""
    if first in NEVER_MERGED or second in NEVER_MERGED:
        return False
    if "product" in (first, second):
        return True
    return first in MERGEABLE_TYPES and second in MERGEABLE_TYPES


def form_key(words: tuple[str, ...]) -> frozenset[str]:
    """The compared words of a name (a leading count dropped, the last word singular), as a
    set: the key under which the graph indexes each alias for :func:`resolve_by_tokens`."""
    return frozenset(_norm(words))


def resolve_by_tokens(
    words: tuple[str, ...],
    type_: str,
    index: Mapping[str, Mapping[str, None]],
    by_form: Mapping[frozenset[str], Set[str]],
    forms: Callable[[str], Iterable[tuple[str, ...]]],
    type_of: Callable[[str], str],
) -> str | None:
    """The one existing node that ``words`` (a new name's entity-key words) is a form of, or that
    is a form of it; None when none or several qualify.

    ``index``: word -> node keys holding it (insertion-ordered); ``by_form``: :func:`form_key`
    of an alias -> node keys; ``forms``: node key -> the word tuples of its aliases; ``type_of``:
    node key -> type.

    Bounded work, whatever the graph holds (a catalogue of 5,000 products of one brand shares
    "vexo" and "kettle" with every new one): the candidates are

    1. every node with an alias whose compared words are a subset of the new name's — one
       lookup per subset (names of at most :data:`MAX_SUBSET_WORDS` distinct words), so every
       shorter form is found however common its words are;
    2. every node holding a *rare* word of the name (one that at most :data:`COMMON_WORD` nodes
       hold: a model code, a distinctive word) — a longer form holds them all, and two names of
       one model share its code;
    3. when every word is common, the first :data:`MAX_CHECKED` nodes holding the least common
       one (insertion order: the oldest first).

    They are checked best first (most of the name's words held, then by key) and at most
    :data:`MAX_CHECKED` compatible ones; the answer is None as soon as two qualify. What this
    gives up: a node that shares only common words with the name and is a form of it only
    through a misspelt word, or that lies beyond the cap.
    """
    if type_ in NEVER_MERGED or not words:
        return None
    distinct = sorted(set(words), key=lambda w: (len(index.get(w, ())), w))
    postings = [index.get(w, {}) for w in distinct]
    candidates: dict[str, None] = {}
    normed = sorted(form_key(words))
    if len(normed) <= MAX_SUBSET_WORDS:
        for size in range(1, len(normed) + 1):
            for subset in combinations(normed, size):
                candidates.update(dict.fromkeys(sorted(by_form.get(frozenset(subset), ()))))
    rare = [p for p in postings if len(p) <= COMMON_WORD]
    for posting in rare:
        candidates.update(posting)
    if not rare and postings:
        candidates.update(dict.fromkeys(islice(postings[0], MAX_CHECKED)))
    held = {key: sum(key in p for p in postings) for key in candidates}
    found: set[str] = set()
    checked = 0
    for key in sorted(held, key=lambda k: (-held[k], k)):
        other = type_of(key)
        if not compatible(type_, other):
            continue
        checked += 1
        if checked > MAX_CHECKED:
            break
        fuzzy = "concept" not in (type_, other)
        if any(is_form_of(words, f, fuzzy=fuzzy) or is_form_of(f, words, fuzzy=fuzzy)
               for f in forms(key)):
            found.add(key)
            if len(found) > 1:
                return None
    return found.pop() if found else None
