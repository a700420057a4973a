"""The one text normaliser and content-word tokenizer: graph keys, dedup, contradiction, lexical.

Every comparison of texts or names in hybridmem goes through here, so two parts can never disagree
about whether "the ROG laptop" and "ROG Laptop." are the same thing (the graph merging them while
the contradiction rule kept them apart was a real bug).

- :func:`words`: NFKC, casefolded, split on whitespace, punctuation stripped from the ends of each
  word, a possessive "'s" dropped. "$", "%", "#", "&", "+" and "@" carry meaning and stay.
- :func:`normalise`: those words joined by single spaces (exact-duplicate detection, hashing).
- :func:`entity_key`: :func:`normalise` without one leading "the/a/an/my" (graph node keys).
- :func:`content_words`: the alphanumeric runs of :func:`normalise` without stopwords (lexical
  queries, Jaccard similarity, head nouns).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

__all__ = ["STOPWORDS", "content_words", "entity_key", "normalise", "text_hash", "words"]

#: Leading words an entity name may carry without naming another entity.
DETERMINERS = frozenset({"the", "a", "an", "my"})
# Punctuation stripped from the ends of words; "$", "%", "#", "&", "+" and "@" carry meaning.
_PUNCT = "!\"'()*,-./:;<=>?[\\]^_`{|}~“”‘’«»…–—¿¡·•"
_ALNUM = re.compile(r"\w+", re.UNICODE)
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


def text_hash(text: str) -> str:
    """Hash of :func:`normalise`: equal for texts that differ only in case, spacing or the
    punctuation around words (exact-duplicate detection)."""
    return hashlib.sha256(normalise(text).encode("utf-8")).hexdigest()[:32]
