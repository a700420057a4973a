"""hybridmem.text: one normaliser shared by graph keys, dedup, contradiction and lexical search."""

from __future__ import annotations

import pytest

from hybridmem.text import content_words, entity_key, normalise, text_hash, words


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("ROG laptop", "rog laptop"),
        ("the rog  Laptop", "rog laptop"),
        ("ROG Laptop.", "rog laptop"),
        ("  “ROG laptop”, ", "rog laptop"),
        ("Alice's", "alice"),
        ("Ｆｕｌｌwidth", "fullwidth"),  # NFKC
        ("STRASSE", "strasse"),
        ("Straße", "strasse"),  # casefold
        ("$1,899", "$1,899"),
        ("The", "the"),  # a lone determiner is kept rather than emptied
        ("mice", "mice"),  # no plural stripping
    ],
)
def test_entity_key(name: str, key: str) -> None:
    assert entity_key(name) == key


def test_words_drop_pure_punctuation_and_keep_meaningful_signs() -> None:
    assert words("Bought it - for $1,899 (50% off) #deal & more!") == [
        "bought", "it", "for", "$1,899", "50%", "off", "#deal", "&", "more",
    ]
    assert words("   ") == []


def test_normalise_and_hash_ignore_case_spacing_and_edge_punctuation() -> None:
    assert normalise("  I bought the ROG  laptop. ") == "i bought the rog laptop"
    assert text_hash("I bought the ROG laptop.") == text_hash("i bought  the rog LAPTOP")
    assert text_hash("I bought the ROG laptop") != text_hash("I bought a ROG laptop")
    assert entity_key("the ROG laptop") == entity_key("ROG laptop")  # normalise keeps "the"
    assert normalise("the ROG laptop") != normalise("ROG laptop")


def test_content_words_are_what_a_full_text_index_holds() -> None:
    assert content_words("The NEAR near, Near!") == ["near"]
    question = "Which monitor fits my ROG laptop?"
    assert content_words(question) == ["monitor", "fits", "rog", "laptop"]
    assert content_words("the and of") == []
    assert content_words("USB-C cable") == ["usb", "c", "cable"]
