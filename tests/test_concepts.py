"""Concept phrases found by rule (hybridmem.extract.concepts) and carried by the rule extractor."""

from __future__ import annotations

import pytest

from hybridmem.extract.concepts import concepts
from hybridmem.extract import RuleExtractor


@pytest.mark.parametrize(("sentence", "expected"), [
    ("I went to a pottery class yesterday and it was great.", ["pottery class"]),
    ("I contacted the adoption agencies about my plans.", ["adoption agency"]),
    ("Thanks for the great support group meeting!", ["support group meeting"]),
    ("Found a great new hiking trail near the lake last weekend.", ["hiking trail"]),
    ("We had a really fun time with my kids.", []),  # vague or single words are no topic
    ("I bought the ASUS ROG Strix G16 laptop.", []),  # names are the span rules' job
])
def test_concepts(sentence: str, expected: list[str]) -> None:
    assert concepts(sentence) == expected


def test_plural_concepts_meet_their_singular_and_the_extractor_switch() -> None:
    assert concepts("I signed up for pottery classes.") == ["pottery class"]
    assert concepts("We packed the moving boxes.") == concepts("We packed a moving box.")
    text = "Caroline: We talked about the adoption agency."
    found = {(e.name, e.type) for e in RuleExtractor().extract(text).entities}
    assert ("adoption agency", "concept") in found
    assert not RuleExtractor(concepts=False, speakers=False).extract(text).entities
