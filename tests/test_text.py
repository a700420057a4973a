"""hybridmem.text: one normaliser, singulariser and predicate key shared by graph keys, dedup,
contradiction, concepts, entity resolution, extraction and lexical search."""

from __future__ import annotations

import pytest

from hybridmem.text import (
    content_words,
    entity_key,
    normalise,
    predicate_key,
    singular,
    text_hash,
    words,
)


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


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        ("agencies", "agency"),  # -ies -> -y
        ("batteries", "battery"),
        ("boxes", "box"),  # -xes, -sses, -ches, -shes lose "es"
        ("glasses", "glass"),
        ("watches", "watch"),
        ("dishes", "dish"),
        ("monitors", "monitor"),  # else one final "s" goes
        ("kids", "kid"),
        ("pies", "pie"),  # too short for "-ies"
        ("axes", "axe"),  # too short for "-es"
        ("glass", "glass"),  # -ss, -us, -is are not plurals
        ("bus", "bus"),
        ("analysis", "analysis"),
        ("its", "its"),  # three letters: left alone
        ("gas", "gas"),
        ("mice", "mice"),  # irregular plurals stay
        ("monitor", "monitor"),
    ],
)
def test_singular(word: str, expected: str) -> None:
    assert singular(word) == expected


def test_singular_is_idempotent_on_its_own_output() -> None:
    for word in ("agencies", "boxes", "glasses", "watches", "monitors", "bus", "analysis"):
        assert singular(singular(word)) == singular(word)


@pytest.mark.parametrize(
    ("phrase", "key"),
    [
        ("lives_in", "lives_in"),
        ("Lives in", "lives_in"),
        ("lives-in", "lives_in"),
        ("  lives \t in  ", "lives_in"),
        ("lives - in", "lives_in"),  # a run of spaces and hyphens is one "_"
        ("-bought-", "bought"),  # none at either end
        ("favorite color", "favorite_color"),
        ("go-to drink", "go_to_drink"),
        ("WORKS AT", "works_at"),
        ("Straße", "strasse"),  # casefolded
        ("ｏｗｎｓ", "owns"),  # NFKC
        ("is.a", "is.a"),  # other signs stay
        ("- -", ""),
    ],
)
def test_predicate_key(phrase: str, key: str) -> None:
    assert predicate_key(phrase) == key
