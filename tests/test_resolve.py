"""Entity resolution: token containment and shared model codes merge one product's names into one
node; distinct models, people and vague words stay apart. Checked on the shipped demo data."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import pytest

from hybridmem.graph.state import UserGraph
from hybridmem.extract import RuleExtractor
from hybridmem.graph.resolve import (
    COMMON_WORD,
    MAX_CHECKED,
    compatible,
    is_form_of,
    resolve_by_tokens,
)
from hybridmem.text import entity_key

ROOT = Path(__file__).resolve().parent.parent


def w(name: str) -> tuple[str, ...]:
    return tuple(entity_key(name).split())


@pytest.mark.parametrize(("short", "long"), [
    ("ROG Strix laptop", "ASUS ROG Strix G16 laptop"),
    ("ASUS ROG Strix G16", "ASUS ROG Strix G16 laptop"),
    ("G16", "ASUS ROG Strix G16"),
    ("Sony headphones", "Sony WH-1000XM5 headphones"),
    ("Dell P2425H", "three Dell P2425H 24-inch monitors"),
    ("Anker 563 dock", "Anker 563 USB-C docking station"),
    ("adoption agencies", "adoption agency"),
    ("Apple Watches", "Apple Watch"),  # a plural in "-es" (hybridmem.text.singular)
    ("two Keychron switch boxes", "Keychron switch box"),
])
def test_forms_of_one_name(short: str, long: str) -> None:
    assert is_form_of(w(short), w(long)) or is_form_of(w(long), w(short))


@pytest.mark.parametrize(("typo", "name"), [
    ("Logitec MX Master 3S", "Logitech MX Master 3S"),
    ("Ergotorn LX monitor arm", "Ergotron LX monitor arm"),
    ("Apple MacBok Air", "Apple MacBook Air"),
    ("Sony XM5s", "Sony WH-1000XM5"),  # the tail of a model code, not an edit
])
def test_misspelt_names_are_forms_only_when_fuzzy(typo: str, name: str) -> None:
    assert is_form_of(w(typo), w(name), fuzzy=True) or is_form_of(w(name), w(typo), fuzzy=True)
    assert not is_form_of(w(typo), w(name)) and not is_form_of(w(name), w(typo))


@pytest.mark.parametrize(("a", "b"), [
    ("Sony XM4", "Sony WH-1000XM5"),  # model codes are never edit-distance matched
    ("Sony WH-1000XM4", "Sony WH-1000XM5"),
    ("Logitec", "Logitech MX Master 3S"),  # no anchor: no shared word
    ("Dell cable", "Dell table"),  # ordinary words under 5 letters... and 80 < 85
])
def test_fuzzy_matching_keeps_distinct_names_apart(a: str, b: str) -> None:
    assert not is_form_of(w(a), w(b), fuzzy=True) and not is_form_of(w(b), w(a), fuzzy=True)


@pytest.mark.parametrize(("a", "b"), [
    ("iPhone 15", "iPhone 15 Pro"),
    ("Sony WH-1000XM4", "Sony WH-1000XM5"),
    ("Dell XPS 14 laptop", "Dell XPS 16 laptop"),
    ("Sony", "Sony WH-1000XM5 headphones"),  # a bare brand is too vague
    ("laptop", "ROG laptop"),
    ("MX Keys S", "MX Master 3S"),
])
def test_distinct_names_stay_apart(a: str, b: str) -> None:
    assert not is_form_of(w(a), w(b)) and not is_form_of(w(b), w(a))


def test_types_that_never_merge() -> None:
    assert compatible("product", "person")  # "Wacom Intuos Pro" typed as a person by the rules
    assert not compatible("person", "person") and not compatible("place", "org")
    assert not compatible("amount", "product") and not compatible("date", "thing")


def demo_graphs() -> dict[str, UserGraph]:
    """Each demo user's graph as the write path builds it (rule extractor, one memory a write)."""
    rules, graphs = RuleExtractor(), {}
    by_user: dict[str, list[dict[str, str]]] = defaultdict(list)
    for line in (ROOT / "hybridmem" / "demo_data" / "memories.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        by_user[record["user_id"]].append(record)
    now = datetime.now(timezone.utc)
    for user, records in by_user.items():
        st = graphs[user] = UserGraph(user, None)
        for i, r in enumerate(records):
            speaker = user if r["source"] == "user" else r["source"]
            st.add([(f"m{i}", rules.extract(r["text"], speaker=speaker))], now)
    return graphs


#: Every surface form the demo data uses for one real product, per user.
ONE_PRODUCT = {
    "client_123": [
        ["ASUS ROG Strix G16 laptop", "ASUS ROG Strix G16", "ROG Strix laptop", "G16"],
        ["Logitech MX Master 3S mouse", "MX Master 3S"],
        ["Ergotron LX monitor arm", "Ergotron LX monitor"],
    ],
    "bob_chen": [
        ["Lenovo ThinkPad X1 Carbon", "ThinkPad X1 Carbon"],
        ["Keychron K2 mechanical keyboard", "Keychron K2", "K2"],
        ["CalDigit TS4 dock", "CalDigit TS4", "CalDigit TS4 Thunderbolt dock"],
        ["LG UltraGear 27GP850 gaming monitor", "LG UltraGear 27GP850"],
    ],
    "client_456": [
        ["Google Pixel 9", "Pixel 9"],
        ["Sony WH-1000XM5 headphones", "Sony headphones", "WH-1000XM5"],
        ["B-2140", "Order B-2140"],
    ],
    "alice_martin": [
        ["Apple MacBook Air 15", "MacBook Air 15"],
        ["BenQ PD2706U designer monitor", "BenQ PD2706U"],
        ["Wacom Intuos Pro M pen tablet", "Wacom Intuos Pro", "Intuos Pro"],
    ],
    "client_789": [
        ["Anker 563 USB-C docking station", "Anker 563 dock",
         "five Anker 563 USB-C docking stations"],
        ["Dell P2425H", "three Dell P2425H 24-inch monitors"],
        ["Jabra Evolve2 75", "Replacement Jabra Evolve2 75"],
    ],
}


def test_demo_graph_has_one_node_per_real_product() -> None:
    graphs = demo_graphs()
    for user, products in ONE_PRODUCT.items():
        st = graphs[user]
        nodes = [[st.resolve(name) for name in names] for names in products]
        for names, keys in zip(products, nodes):
            assert None not in keys and len(set(keys)) == 1, (user, dict(zip(names, keys)))
        assert len({keys[0] for keys in nodes}) == len(products), user  # and products stay apart


#: Misspelt or abbreviated names a user might write for the demo's products, per user.
TYPOS = {
    "client_123": {"Logitec MX Master 3S mouse": "MX Master 3S",
                   "Ergotorn LX monitor": "Ergotron LX monitor arm"},
    "bob_chen": {"Lenovo Thinkpad X1 Carbn": "ThinkPad X1 Carbon"},
    "client_456": {"Sony XM5s": "WH-1000XM5"},
    "alice_martin": {"BenQ PD2706U designr monitor": "BenQ PD2706U"},
}


def test_demo_graph_with_misspelt_variants_has_one_node_per_real_product() -> None:
    graphs, rules, now = demo_graphs(), RuleExtractor(), datetime.now(timezone.utc)
    for user, typos in TYPOS.items():
        st = graphs[user]
        before = {k for k, a in st.graph.nodes(data=True) if a["type"] == "product"}
        for i, typo in enumerate(typos):
            st.add([(f"typo{i}", rules.extract(f"The {typo} arrived today."))], now)
        for typo, name in typos.items():
            assert st.resolve(typo) == st.resolve(name) is not None, (user, typo)
        products = ONE_PRODUCT[user]
        assert len({st.resolve(names[0]) for names in products}) == len(products), user
        after = {k for k, a in st.graph.nodes(data=True) if a["type"] == "product"}
        assert after == before, (user, after - before)  # no new product node


def test_demo_graph_has_no_role_unit_or_number_nodes() -> None:
    for user, st in demo_graphs().items():
        keys = set(st.graph)
        assert not keys & {"agent", "ghz", "hz", "w", "we've", "we'll", "found", "drop"}, user
        assert not [k for k in keys if k.replace(",", "").replace(".", "").isdigit()], user


# -- bounded work, whatever the graph holds ------------------------------------------------------
def _catalogue(n: int) -> UserGraph:
    """A user who bought ``n`` distinct products of one brand: every name shares two words."""
    rules, st, now = RuleExtractor(), UserGraph("u", None), datetime.now(timezone.utc)
    st.add([(f"m{i}", rules.extract(f"I bought the Vexo K{i} kettle from Shop{i % 97} for ${i}.",
                                    speaker="u")) for i in range(n)], now, links=False)
    return st


def test_a_catalogue_of_one_brand_checks_a_bounded_number_of_nodes() -> None:
    st = _catalogue(600)
    assert len(st.words["vexo"]) == len(st.words["kettle"]) == 600  # every node is a candidate
    asked: list[str] = []

    def forms(key: str) -> list[tuple[str, ...]]:
        asked.append(key)
        return [tuple(c.split()) for c in st.forms[key]]

    def type_of(key: str) -> str:
        return str(st.graph.nodes[key]["type"])

    for name in ("Vexo K9999 kettle", "Vexo kettle", "Vexo K17", "Vexo kettles"):
        asked.clear()
        resolve_by_tokens(w(name), "product", st.words, st.by_form, forms, type_of)
        assert len(asked) <= MAX_CHECKED, (name, len(asked))


def test_a_catalogue_of_one_brand_still_merges_forms_and_keeps_products_apart() -> None:
    st = _catalogue(600)
    now = datetime.now(timezone.utc)
    assert st.graph.number_of_nodes() >= 600 and "vexo k17 kettle" in st.graph
    rules = RuleExtractor()
    st.add([("short", rules.extract("The Vexo K17 is great.", speaker="u"))], now, links=False)
    assert st.mem_nodes["short"] & {"vexo k17 kettle"}  # a shorter form, through its rare code
    st.add([("new", rules.extract("I bought the Vexo K9999 kettle.", speaker="u"))], now,
           links=False)
    assert "vexo k9999 kettle" in st.graph  # a new product is a node of its own
    st.add([("vague", rules.extract("I love my Vexo kettle.", speaker="u"))], now, links=False)
    assert not st.mem_nodes["vague"] & set(st.words["k17"])  # many qualify: merged into none


def test_a_shorter_form_made_of_common_words_is_still_found() -> None:
    """"Vexo kettle" shares only words hundreds of nodes hold, yet a longer name finds it as its
    shorter form (by the exact-form index, not by scanning every node with "vexo")."""
    st, now = _catalogue(300), datetime.now(timezone.utc)
    st.add([("vague", RuleExtractor().extract("I bought the Vexo kettle.", speaker="u"))], now,
           links=False)
    assert "vexo kettle" in st.graph and len(st.words["vexo"]) > COMMON_WORD
    found = resolve_by_tokens(w("Vexo K12345 kettle"), "product", st.words, st.by_form,
                              lambda k: [tuple(c.split()) for c in st.forms[k]],
                              lambda k: str(st.graph.nodes[k]["type"]))
    assert found == "vexo kettle"
