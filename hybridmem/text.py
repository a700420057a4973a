"""The one text normaliser, singulariser and tokenizer: graph keys, dedup, contradiction, lexical.

Every comparison of texts or names in hybridmem goes through here, so two parts can never disagree
about whether "the ROG laptop" and "ROG Laptop." are the same thing (the graph merging them while
the contradiction rule kept them apart was a real bug).

- :func:`words`: NFKC, casefolded, split on whitespace, punctuation stripped from the ends of each
  word, a possessive "'s" dropped. "$", "%", "#", "&", "+" and "@" carry meaning and stay.
- :func:`normalise`: those words joined by single spaces (exact-duplicate detection, hashing).
- :func:`entity_key`: :func:`normalise` without one leading "the/a/an/my" (graph node keys).
- :func:`content_words`: the alphanumeric runs of :func:`normalise` without stopwords (lexical
  queries, Jaccard similarity, head nouns).
- :func:`singular`: a crude, suffix-only singular of one word (the last word of concept phrases,
  and of names compared by entity resolution).
- :func:`predicate_key`: a relation's verb phrase as a snake_case key ("Lives in" -> "lives_in").
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

__all__ = [
    "STOPWORDS",
    "content_words",
    "entity_key",
    "normalise",
    "predicate_key",
    "singular",
    "text_hash",
    "words",
]

#: Leading words an entity name may carry without naming another entity.
DETERMINERS = frozenset({"the", "a", "an", "my"})
# Punctuation stripped from the ends of words; "$", "%", "#", "&", "+" and "@" carry meaning.
_PUNCT = "!\"'()*,-./:;<=>?[\\]^_`{|}~“”‘’«»…–—¿¡·•"
_ALNUM = re.compile(r"\w+", re.UNICODE)
# What separates the words of a predicate key: spaces and hyphens ("lives in", "lives-in").
_PREDICATE_GAP = re.compile(r"[\s\-]+")
# Plural endings that take "es" ("boxes", "glasses", "watches", "dishes").
_ES_PLURALS = ("ches", "shes", "sses", "xes")
# Word endings that look plural but are not ("glass", "bus", "analysis", the possessive "'s").
_NOT_PLURAL = ("ss", "us", "is", "'s", "’s")
#: Function words that match nearly every memory; dropping them keeps OR-queries selective.
STOPWORDS = frozenset(
    """a an and are as at be been but by can could did do does for from had has have he her hers him
    his how i if in into is it its me my of on or our she so than that the their them then there these
    they this to us was we were what when where which who whom why will with would you your yours
    about after all also am any before being both did doing during each few further here just more
    most no nor not now only other over own same should some such too under until up very while""".split()
)


def _word(token: str) -> str:
    word = token.strip(_PUNCT)
    if word.endswith(("'s", "’s")):
        word = word[:-2].rstrip(_PUNCT)
    return word


def words(text: str) -> list[str]:
    """The normalised words of ``text``, in order (empty strings for pure punctuation dropped)."""
    return [w for w in map(_word, unicodedata.normalize("NFKC", text).casefold().split()) if w]


def normalise(text: str) -> str:
    """Case-, width-, spacing- and edge-punctuation-insensitive form of a text."""
    return " ".join(words(text))


def entity_key(name: str) -> str:
    """The graph key of an entity name: :func:`normalise`, one leading determiner dropped.

    Plurals are kept as they are ("mice" stays "mice"): naive stemming merges distinct products
    ("AirPods", "Glasses") and would be wrong more often than it helps.
    """
    found = words(name)
    if len(found) > 1 and found[0] in DETERMINERS:
        found = found[1:]
    return " ".join(found)


def content_words(text: str) -> list[str]:
    """The alphanumeric runs of :func:`normalise` (as a full-text index tokenizes them, so a
    query word is a word the index holds) without stopwords, first occurrence order, no repeats."""
    seen: dict[str, None] = {}
    for word in _ALNUM.findall(normalise(text)):
        if word not in STOPWORDS:
            seen.setdefault(word, None)
    return list(seen)


def singular(word: str) -> str:
    """A crude singular of one lower-case word, so "adoption agencies" meets "adoption agency" and
    "Dell monitors" meets "Dell monitor".

    Suffix rules only, first match wins: "-ies" -> "-y" ("agencies"); "-ches", "-shes", "-sses"
    and "-xes" lose "es" ("watches", "dishes", "glasses", "boxes"); otherwise one final "s" goes,
    except after "s", "u" or "i" ("glass", "bus", "analysis") and in a possessive. The first two
    rules need five letters or more ("pies" -> "pie", "axes" -> "axe"), the last one four ("its"
    and "gas" stay). Irregular plurals stay ("mice"), and nouns in "-ie" or "-che" come out wrong
    ("movies" -> "movy", "headaches" -> "headach"), so their two forms do not meet.
    """
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 4 and word.endswith(_ES_PLURALS):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith(_NOT_PLURAL):
        return word[:-1]
    return word


def predicate_key(phrase: str) -> str:
    """The key of a relation's verb phrase, so a rule and a model name one relation alike: NFKC,
    casefolded, each run of spaces and hyphens one "_", none at either end ("Lives in",
    "lives-in" and " lives  in " are all "lives_in"). Underscores and other signs stay."""
    folded = unicodedata.normalize("NFKC", phrase).casefold()
    return "_".join(part for part in _PREDICATE_GAP.split(folded) if part)


def text_hash(text: str) -> str:
    """Hash of :func:`normalise`: equal for texts that differ only in case, spacing or the
    punctuation around words (exact-duplicate detection)."""
    return hashlib.sha256(normalise(text).encode("utf-8")).hexdigest()[:32]
