"""Concept phrases: the topics a sentence is about ("pottery class", "adoption agency"), found
offline by rule, so memories about one topic meet at one graph node even when nobody names a
product or a person. Pure and cheap (a regex tokenizer and a few word lists); the LLM extractor
remains the upgrade when an endpoint is configured.

A concept is two or three lower-case words after a determiner or a preposition ("a pottery class",
"to the adoption agency"), with vague leading adjectives dropped ("a great support group" ->
"support group") and the last word made singular by :func:`hybridmem.text.singular` ("adoption
agencies" -> "adoption agency").
Single words are left out: they are too common to link anything (the lexical index has them).
"""

from __future__ import annotations

import re
from collections.abc import Set

from hybridmem.text import singular

__all__ = ["concepts"]


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


#: Words that open a noun phrase: the concept after them is the thing talked about.
OPENERS = _words("a an the my our your his her their this that these those some another any every")
#: Prepositions that, like determiners, open a noun phrase ("went to pottery class").
PREPOSITIONS = _words("to at in for about with from into on of")
#: Adjectives and quantities that open phrases without naming a topic ("a great time").
VAGUE = _words(
    "great good nice new old little big lot lots few bit couple long hard same other whole real "
    "amazing wonderful beautiful awesome lovely cool fun best first last next own huge small "
    "tough special different perfect favorite favourite fantastic incredible terrible bad "
    "most more many much such very quite so really kind sort type way part thing things "
    "stuff time times day days moment moments one ones"
)
#: Words that end a concept (verbs, adverbs, pronouns and time words seen after openers).
STOP = _words(
    "been being going doing getting making having seeing to of for with at by in on as is are "
    "was were be it its than then too very so just really also how what when where why who "
    "lately ago weekend weekends tonight everyday anyway together yesterday today tomorrow "
    "and or but because since while if i you he she we they me him us them"
)
_TOKEN = re.compile(r"[A-Za-z][A-Za-z'’-]*|[^\sA-Za-z]+")
_WORD = re.compile(r"^[a-z][a-z-]*[a-z]$")


def concepts(sentence: str, stop: Set[str] = frozenset()) -> list[str]:
    """The concept phrases of one sentence, in order, without repeats. ``stop``: more words that
    end a phrase (the rule extractor passes its verbs and fillers)."""
    ends = (stop - VAGUE) | STOP | PREPOSITIONS
    toks = [m.group() for m in _TOKEN.finditer(sentence)]
    out: dict[str, None] = {}
    i, n = 0, len(toks)
    while i < n:
        low = toks[i].lower()
        if low not in OPENERS and low not in PREPOSITIONS:
            i += 1
            continue
        j = i + 1
        while j < n and toks[j].lower() in OPENERS:
            j += 1
        phrase: list[str] = []
        while j < n and len(phrase) < 4:
            tok = toks[j]
            if not _WORD.match(tok) or tok in ends:
                break
            if tok in VAGUE and any(w not in VAGUE for w in phrase):
                break  # "the lake last weekend": the phrase ended before "last"
            phrase.append(tok)
            j += 1
        while phrase and phrase[0] in VAGUE:
            phrase = phrase[1:]
        if 2 <= len(phrase) <= 3 and phrase[-1] not in VAGUE:
            out[" ".join(phrase[:-1] + [singular(phrase[-1])])] = None
        i = max(j, i + 1)
    return list(out)
