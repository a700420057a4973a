"""Rule-based extraction: entities and relations from plain text, offline and deterministic.

:class:`RuleExtractor` is the default ``Extractor`` seam; :mod:`~hybridmem.extract.concepts`
finds the concept words the graph links on. Imports the ground floor only.
"""

from hybridmem.extract.rules import RuleExtractor

__all__ = ["RuleExtractor"]
