"""Rule-based extraction: entities and relations from plain text, offline and deterministic.

:class:`RuleExtractor` is the default ``Extractor`` seam. Imports the ground floor only.

- :mod:`~hybridmem.extract.rules` — :class:`RuleExtractor` and its relation rules.
- :mod:`~hybridmem.extract.spans` — the entity spans of a sentence (dates, amounts, names).
- :mod:`~hybridmem.extract.concepts` — the concept words the graph links on.
- :mod:`~hybridmem.extract.lexicon` — the word lists, regular expressions and verb table.
"""

from hybridmem.extract.rules import RuleExtractor

__all__ = ["RuleExtractor"]
