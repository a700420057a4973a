"""NetworkXGraphStore on real files: persistence, canonical nodes, neighbourhood, isolation."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import networkx as nx
import pytest

from hybridmem.runtime.files import user_dir
from hybridmem.errors import ClosedError, CorruptStateError, InvalidInputError
from hybridmem.extract import RuleExtractor
from hybridmem.graph import store as graph_module
from hybridmem.graph.store import GRAPH_FILE, LOG_FILE, NetworkXGraphStore
from hybridmem.models import Entity, Extraction, GraphEntity, GraphRelation, Relation
from hybridmem.protocols import GraphStore


def ex(*relations: tuple[str, str, str], entities: tuple[str, ...] = ()) -> Extraction:
    return Extraction(
        entities=[Entity(name=n, type="product") for n in entities],
        relations=[Relation(subject=s, predicate=p, object=o) for s, p, o in relations],
        extractor="test",
    )


@pytest.fixture
def store(tmp_path: Path) -> NetworkXGraphStore:
    return NetworkXGraphStore(tmp_path)


def graph_file(tmp_path: Path, user_id: str) -> Path:
    return user_dir(tmp_path, user_id, create=False) / GRAPH_FILE


def test_round_trip_through_disk(tmp_path: Path) -> None:
    first = NetworkXGraphStore(tmp_path)
    first.add_extraction("u1", "m1", ex(("alice", "bought", "ROG laptop")))
    first.add_extraction("u1", "m2", ex(("Dell 4K monitor", "complements", "ROG laptop")))
    first.close()

    second = NetworkXGraphStore(tmp_path)
    assert second.relations("u1") == [
        GraphRelation(
            subject="alice",
            predicate="bought",
            object="ROG laptop",
            subject_key="alice",
            object_key="rog laptop",
            memory_ids=["m1"],
            confidence=1.0,
        ),
        GraphRelation(
            subject="Dell 4K monitor",
            predicate="complements",
            object="ROG laptop",
            subject_key="dell 4k monitor",
            object_key="rog laptop",
            memory_ids=["m2"],
            confidence=1.0,
        ),
    ]
    node = second.entity("u1", "ROG laptop")
    assert node is not None and node.memory_ids == ["m1", "m2"] and node.mentions == 2
    second.save("u1")  # folds the change log into the snapshot
    raw = json.loads(graph_file(tmp_path, "u1").read_text())
    assert raw["schema"] == 1 and {"nodes", "edges"} <= raw["graph"].keys()
    assert nx.node_link_graph(raw["graph"], edges="edges").number_of_edges() == 2


def test_same_entity_written_differently_is_one_node(store: NetworkXGraphStore) -> None:
    store.add_extraction("u", "m1", ex(entities=("ROG laptop",)))
    store.add_extraction("u", "m2", ex(entities=("the rog  Laptop",)))
    store.add_extraction("u", "m3", ex(("alice", "bought", "ROG Laptop.")))
    graph = store.export("u")["graph"]
    keys = [n["id"] for n in graph["nodes"]]
    assert sorted(keys) == ["alice", "rog laptop"]
    node = store.entity("u", "ROG LAPTOP")
    assert node is not None
    assert node.key == "rog laptop"
    assert node.name == "ROG laptop"  # the first surface form is the display name
    assert node.aliases == ["ROG Laptop.", "ROG laptop", "the rog Laptop"]
    assert node.mentions == 3 and node.memory_ids == ["m1", "m2", "m3"]
    assert node.first_seen is not None and node.last_seen is not None
    assert node.first_seen <= node.last_seen and node.first_seen.utcoffset() == timedelta(0)


def test_readding_a_memory_is_idempotent(store: NetworkXGraphStore) -> None:
    for _ in range(3):
        store.add_extraction("u", "m1", ex(("alice", "bought", "ROG laptop")))
    edge = store.export("u")["graph"]["edges"][0]
    assert edge["weight"] == 1 and edge["memory_ids"] == ["m1"]
    alice = store.entity("u", "alice")
    assert alice is not None and alice.mentions == 1


def test_memory_reachable_only_through_the_graph(store: NetworkXGraphStore) -> None:
    store.add_extractions(
        "u",
        [
            ("m1", ex(("alice", "bought", "ROG laptop"))),
            ("m2", ex(("Dell 4K monitor", "complements", "ROG laptop"))),
            ("m3", ex(("Dell 4K monitor", "needs", "USB-C cable"))),  # no word of the query
            ("m4", ex(("USB-C cable", "sold_at", "Fnac"))),
        ],
    )
    seeds = store.entities_in("u", "Which screen fits my ROG laptop?")
    assert seeds == ["rog laptop"]
    assert store.neighbourhood("u", seeds, hops=0) == {
        "m1": (0, "ROG laptop"),
        "m2": (0, "ROG laptop"),
    }
    one = store.neighbourhood("u", seeds, hops=1)
    assert one["m3"] == (1, "Dell 4K monitor -complements-> ROG laptop")
    assert "m4" not in one
    two = store.neighbourhood("u", seeds, hops=2)
    assert two["m4"] == (
        2,
        "Dell 4K monitor -complements-> ROG laptop, Dell 4K monitor -needs-> USB-C cable",
    )
    assert two["m1"][0] == 0  # the smallest hop count is kept


def test_co_mentions_connect_entities_without_a_relation(tmp_path: Path) -> None:
    store = NetworkXGraphStore(tmp_path)
    store.add_extraction("u", "m1", ex(entities=("Melanie", "support group")))
    store.add_extraction("u", "m2", ex(entities=("support group", "Tuesday meeting")))
    found = store.neighbourhood("u", ["Melanie"], hops=1)
    assert found["m2"] == (1, "Melanie -mentioned_with-> support group")
    strict = NetworkXGraphStore(tmp_path, co_mentions=False)
    assert "m2" not in strict.neighbourhood("u", ["Melanie"], hops=1)


def test_hub_does_not_pull_in_every_memory(store: NetworkXGraphStore) -> None:
    items = [(f"m{i}", ex(("user", "bought", f"gadget {i}"))) for i in range(30)]
    items.append(("d", ex(("gadget 0", "complements", "charger"))))
    store.add_extractions("u", items)
    found = store.neighbourhood("u", ["charger"], hops=2)
    # charger -> gadget 0 (hop 1) -> user (hop 2, a hub): only the edge's memory, not all 30
    assert found == {
        "d": (0, "charger"),
        "m0": (1, "gadget 0 -complements-> charger"),
    }


def test_neighbourhood_is_bounded(tmp_path: Path) -> None:
    store = NetworkXGraphStore(tmp_path, max_nodes=20, max_memories=15, hub_degree=10_000)
    store.add_extractions("u", [(f"m{i}", ex(("hub", "has", f"leaf {i}"))) for i in range(300)])
    # unrelated memories, so that "hub" is under a third of all of them (not an IDF hub)
    store.add_extractions("u", [(f"x{i}", ex((f"x{i}", "is", f"y{i}"))) for i in range(700)])
    found = store.neighbourhood("u", ["hub"], hops=3)
    assert len(found) == 15
    assert store.neighbourhood("u", ["unknown thing"], hops=2) == {}
    with pytest.raises(InvalidInputError):
        store.neighbourhood("u", ["hub"], hops=-1)


def test_remove_memory_removes_unsupported_edges_and_nodes(tmp_path: Path) -> None:
    store = NetworkXGraphStore(tmp_path)
    store.add_extractions(
        "u",
        [
            ("m1", ex(("alice", "bought", "ROG laptop"))),
            ("m2", ex(("alice", "bought", "ROG laptop"))),
            ("m3", ex(("alice", "returned", "ROG laptop"))),
            ("m4", ex(("Dell monitor", "complements", "ROG laptop"))),
        ],
    )
    store.remove_memory("u", ["m1", "m3"])
    rows = {(r.subject_key, r.predicate, r.object_key): r for r in store.relations("u")}
    assert set(rows) == {
        ("alice", "bought", "rog laptop"),
        ("dell monitor", "complements", "rog laptop"),
    }
    assert rows[("alice", "bought", "rog laptop")].memory_ids == ["m2"]  # still supported
    store.remove_memory("u", ["m4"])
    assert store.entity("u", "Dell monitor") is None  # no memory and no edge left
    assert store.neighbourhood("u", ["ROG laptop"], hops=1) == {"m2": (0, "ROG laptop")}
    fresh = NetworkXGraphStore(tmp_path)  # and it was saved
    assert [r.predicate for r in fresh.relations("u")] == ["bought"]
    assert fresh.entities_of("u", ["m1", "m2", "m4"]) == ["alice", "rog laptop"]


def test_relations_filtered_by_memory(store: NetworkXGraphStore) -> None:
    store.add_extraction("u", "m1", ex(("alice", "bought", "ROG laptop")))
    store.add_extraction("u", "m2", ex(("alice", "lives_in", "Lyon")))
    assert [r.object for r in store.relations("u", ["m2"])] == ["Lyon"]
    assert store.relations("u", ["nope"]) == []


def test_users_are_isolated(tmp_path: Path) -> None:
    store = NetworkXGraphStore(tmp_path)
    store.add_extraction("alice", "a1", ex(("alice", "bought", "ROG laptop")))
    store.add_extraction("bob", "b1", ex(("bob", "bought", "Kindle")))
    assert store.entities_in("alice", "Kindle ROG laptop") == ["rog laptop"]
    assert store.entities_in("bob", "Kindle ROG laptop") == ["kindle"]
    assert store.neighbourhood("bob", ["ROG laptop"], hops=2) == {}
    assert {r.object for r in store.relations("bob")} == {"Kindle"}
    assert graph_file(tmp_path, "alice") != graph_file(tmp_path, "bob")
    store.drop_user("alice")
    assert not graph_file(tmp_path, "alice").exists()
    assert store.relations("alice") == []
    assert NetworkXGraphStore(tmp_path).relations("bob")[0].memory_ids == ["b1"]


@pytest.mark.parametrize(
    "content",
    [b"{not json", b'{"schema": 1, "graph": 3}', b'{"schema": 99, "graph": {}}', b"\xff\xfe"],
)
def test_corrupt_file_raises_naming_the_file(tmp_path: Path, content: bytes) -> None:
    NetworkXGraphStore(tmp_path).add_extraction("u", "m1", ex(("a", "b", "c")))
    path = graph_file(tmp_path, "u")
    path.write_bytes(content)
    with pytest.raises(CorruptStateError, match=str(path)):
        NetworkXGraphStore(tmp_path).relations("u")


def test_atomic_saves_leave_no_temp_files(tmp_path: Path, store: NetworkXGraphStore) -> None:
    for i in range(5):
        store.add_extraction("u", f"m{i}", ex(("alice", "bought", f"thing {i}")))
    store.remove_memory("u", ["m0"])
    store.save("u")
    folder = graph_file(tmp_path, "u").parent
    assert sorted(p.name for p in folder.iterdir()) == sorted([GRAPH_FILE, LOG_FILE])


def test_without_autosave_nothing_is_written_until_save(tmp_path: Path) -> None:
    store = NetworkXGraphStore(tmp_path, autosave=False)
    store.add_extraction("u", "m1", ex(("alice", "bought", "ROG laptop")))
    assert not graph_file(tmp_path, "u").exists()
    store.close()  # close saves what is pending
    assert NetworkXGraphStore(tmp_path).entities_in("u", "rog laptop") == ["rog laptop"]


def test_another_instance_sees_new_writes(tmp_path: Path) -> None:
    reader, writer = NetworkXGraphStore(tmp_path), NetworkXGraphStore(tmp_path)
    assert reader.entities_in("u", "Kindle") == []
    writer.add_extraction("u", "m1", ex(("alice", "bought", "Kindle")))
    assert reader.entities_in("u", "Kindle") == ["kindle"]
    reader.add_extraction("u", "m2", ex(("alice", "lives_in", "Lyon")))  # merges, loses nothing
    assert len(writer.relations("u")) == 2


def test_concurrent_writes_from_threads(store: NetworkXGraphStore) -> None:
    def work(n: int) -> None:
        for i in range(10):
            store.add_extraction("u", f"t{n}-{i}", ex(("alice", "bought", f"item {n} {i}")))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(NetworkXGraphStore(store.data_dir).relations("u")) == 40


def test_query_path(store: NetworkXGraphStore) -> None:
    store.add_extractions(
        "u",
        [
            ("m1", ex(("alice", "bought", "ROG laptop"))),
            ("m2", ex(("Dell 4K monitor", "complements", "ROG laptop"))),
            ("m3", ex(("Dell 4K monitor", "needs", "USB-C cable"))),
            ("m4", ex(("USB-C cable", "sold_at", "Fnac"))),
        ],
    )
    assert store.query_path("u", "Alice", "the dell 4k monitor") == [
        "alice -bought-> ROG laptop",
        "Dell 4K monitor -complements-> ROG laptop",
    ]
    assert len(store.query_path("u", "alice", "Fnac", max_depth=4)) == 4
    assert store.query_path("u", "alice", "Fnac", max_depth=3) == []
    assert store.query_path("u", "alice", "nobody") == []
    assert store.query_path("u", "alice", "alice") == []


def test_entities_in_matches_whole_words_longest_first(store: NetworkXGraphStore) -> None:
    store.add_extraction(
        "u", "m1", ex(entities=("Dell 4K monitor", "4K monitor", "Dell", "ROG laptop", "it"))
    )
    assert store.entities_in("u", "Is the dell 4k monitor, or a ROG laptop's screen, better?") == [
        "dell 4k monitor",
        "rog laptop",
    ]
    # "4K monitor" is a shorter form of the one Dell 4K monitor (hybridmem.graph.resolve): one node
    assert store.entities_in("u", "a 4K monitor from Dell") == ["dell 4k monitor", "dell"]
    assert store.entities_in("u", "Dellish monitors and it") == []  # no partial words, no "it"
    assert store.entities_in("u", "ROG - laptop") == []  # a lone punctuation token ends a name


def test_entities_in_resolves_aliases_among_10k_nodes(store: NetworkXGraphStore) -> None:
    nodes = [
        {
            "id": f"product {i}",
            "name": f"Product {i}",
            "type": "product",
            "aliases": [f"Product {i}", f"P{i}"],
            "memory_ids": [f"m{i}"],
        }
        for i in range(10_000)
    ]
    store.import_graph(
        "big",
        {
            "schema": 1,
            "graph": {
                "directed": True,
                "multigraph": False,
                "graph": {},
                "nodes": nodes,
                "edges": [],
            },
        },
    )
    text = "Compare product 42 with P9999 and something else entirely before Friday " * 3
    found = store.entities_in("big", text)  # (its speed is measured in bench/, not here)
    assert found == ["product 42", "product 9999"]  # the alias "P9999" resolves to its node
    assert len(store.entities("big")) == 10_000


def test_export_import_round_trip(store: NetworkXGraphStore) -> None:
    store.add_extraction("u", "m1", ex(("alice", "bought", "ROG laptop"), entities=("Kindle",)))
    bundle = json.loads(json.dumps(store.export("u")))  # JSON-safe
    store.import_graph("copy", bundle)
    assert store.relations("copy") == store.relations("u")
    assert store.entity("copy", "kindle") == store.entity("u", "kindle")
    with pytest.raises(InvalidInputError):
        store.import_graph("copy", {"schema": 1, "graph": {"nodes": "nope"}})


def test_a_long_predicate_survives_a_reload(tmp_path: Path) -> None:
    store = NetworkXGraphStore(tmp_path)
    store.add_extraction("u", "m1", ex(("alice", "ß" * 100, "Lyon")))  # casefolds to 200 chars
    (rel,) = NetworkXGraphStore(tmp_path).relations("u")
    assert rel.predicate == "s" * 100


def test_entities_are_typed_and_sorted_by_key(store: NetworkXGraphStore) -> None:
    at = datetime(2024, 3, 3, 12, 0, tzinfo=timezone.utc)
    store.add_extraction("u", "m2", ex(("Zoe", "bought", "ROG laptop")), at=at)
    store.add_extraction("u", "m1", ex(entities=("Kindle",)), at=at + timedelta(days=1))
    found = store.entities("u")
    assert [e.key for e in found] == ["kindle", "rog laptop", "zoe"]
    assert all(isinstance(e, GraphEntity) for e in found)
    kindle = found[0]
    assert (kindle.name, kindle.type, kindle.memory_ids) == ("Kindle", "product", ["m1"])
    assert kindle.first_seen == kindle.last_seen == at + timedelta(days=1)
    assert store.entities("nobody") == []


def test_graph_store_protocol_is_satisfied(store: NetworkXGraphStore) -> None:
    seam: GraphStore = store  # mypy checks the signatures; this checks that nothing is missing
    wanted = [n for n in vars(GraphStore) if not n.startswith("_")]
    assert wanted and all(callable(getattr(seam, n)) for n in wanted)


@pytest.mark.parametrize(
    ("edge", "node", "match"),
    [
        ({"predicates": ["likes"], "memory_ids": ["m1"], "confidence": 7}, {}, "between 0 and 1"),
        ({"predicates": ["likes"], "memory_ids": ["m1"], "confidence": None}, {}, "not a number"),
        ({"predicates": ["x" * 101]}, {}, "predicate"),
        ({"predicates": "likes"}, {}, "not a list"),
        ({"evidence": {"likes": ["m1"]}}, {}, "evidence"),
        ({}, {"first_seen": "last tuesday"}, "ISO 8601"),
        ({}, {"memory_ids": "m1"}, "not a list"),
    ],
)
def test_import_names_what_is_malformed(
    store: NetworkXGraphStore, edge: dict[str, object], node: dict[str, object], match: str
) -> None:
    store.add_extraction("u", "m1", ex(("alice", "bought", "ROG laptop")))
    plain = {
        "nodes": [{"id": "alice", **node}, {"id": "lyon"}],
        "edges": [{"source": "alice", "target": "lyon", **edge}],
    }
    with pytest.raises(InvalidInputError, match=match):
        store.import_graph("u", plain)
    assert [r.predicate for r in store.relations("u")] == ["bought"]  # the old graph stays


def test_imported_times_become_utc_datetimes(store: NetworkXGraphStore) -> None:
    nodes = [
        {"id": "alice", "first_seen": "2024-03-03T10:00Z", "last_seen": "2024-03-04T12:00+02:00"},
        {"id": "lyon", "first_seen": "2024-03-03T10:00:00"},  # naive: taken as UTC
    ]
    store.import_graph("u", {"nodes": nodes, "edges": []})
    alice, lyon = store.entities("u")
    assert alice.first_seen == datetime(2024, 3, 3, 10, tzinfo=timezone.utc)
    assert alice.last_seen == datetime(2024, 3, 4, 10, tzinfo=timezone.utc)
    assert lyon.first_seen == lyon.last_seen == datetime(2024, 3, 3, 10, tzinfo=timezone.utc)
    exported = {n["id"]: n for n in store.export("u")["graph"]["nodes"]}
    assert exported["alice"]["last_seen"] == "2024-03-04T10:00:00+00:00"


def test_import_of_a_plain_node_link_graph(store: NetworkXGraphStore) -> None:
    plain = {
        "directed": True,
        "multigraph": False,
        "graph": {},
        "nodes": [{"id": "alice"}, {"id": "lyon", "type": "place"}],
        "edges": [
            {"source": "alice", "target": "lyon", "predicates": ["lives_in"], "memory_ids": ["m9"]}
        ],
    }
    store.import_graph("u", plain)
    assert store.query_path("u", "alice", "Lyon") == ["alice -lives_in-> lyon"]
    assert store.relations("u", ["m9"])[0].predicate == "lives_in"


def test_close_is_idempotent_and_refuses_use(store: NetworkXGraphStore) -> None:
    store.add_extraction("u", "m1", ex(("a", "b", "c")))
    store.close()
    store.close()
    with pytest.raises(ClosedError, match="closed"):
        store.entities_in("u", "a")
    with pytest.raises(ClosedError):
        store.relations("u")
    with pytest.raises(ClosedError):
        store.drop_user("u")
    assert NetworkXGraphStore(store.data_dir).relations("u")  # nothing was deleted


def test_rule_extractor_builds_a_useful_graph(store: NetworkXGraphStore) -> None:
    rules = RuleExtractor()
    texts = {
        "m1": "Bought a ROG laptop for $1,899 on 3 March",
        "m2": "I want a 4K monitor for my ROG laptop",
        "m3": "The Dell 4K monitor pairs well with the ROG laptop",
        "m4": "I live in Lyon",
        "m5": "My name is Alice Martin",
        "m6": "I prefer Logitech mice",
        "m7": "The Dell 4K monitor needs a USB-C cable",
    }
    store.add_extractions(
        "c1", [(k, rules.extract(t, speaker="client_123")) for k, t in texts.items()]
    )
    seeds = store.entities_in("c1", "which monitor fits my ROG laptop?")
    assert seeds == ["rog laptop"]
    found = store.neighbourhood("c1", seeds, hops=1)
    assert found["m7"] == (1, "Dell 4K monitor -complements-> ROG laptop")
    assert "m4" not in found and "m6" not in found  # the speaker is a hub, not a shortcut
    # "a 4K monitor" (m2) is the one Dell 4K monitor of this user (hybridmem.graph.resolve), so the
    # path goes through what the user wants
    assert store.query_path("c1", "Lyon", "Dell 4K monitor") == [
        "client_123 -lives_in-> Lyon",
        "client_123 -wants-> Dell 4K monitor",
    ]


def test_hub_seeds_do_not_flood_the_neighbourhood(tmp_path: Path) -> None:
    store = NetworkXGraphStore(tmp_path)
    store.add_extractions(
        "u", [(f"m{i}", ex(("caroline", "said", f"thing {i}"))) for i in range(30)]
    )
    store.add_extractions("u", [("z", ex(("melanie", "painted", "a sunset")))])
    assert store.neighbourhood("u", ["caroline"], hops=1) == {}
    assert set(store.neighbourhood("u", ["melanie"], hops=1)) == {"z"}


# -- the change log ----------------------------------------------------------------------------

def test_an_add_appends_to_the_log_and_leaves_the_snapshot_alone(tmp_path: Path) -> None:
    store = NetworkXGraphStore(tmp_path)
    for i in range(20):
        store.add_extraction("u", f"m{i}", ex(("alice", "bought", f"thing {i}")))
    store.save("u")
    snapshot, log_file = graph_file(tmp_path, "u"), graph_file(tmp_path, "u").with_name(LOG_FILE)
    before = (snapshot.stat().st_mtime_ns, snapshot.stat().st_size)
    assert log_file.stat().st_size == 0
    store.add_extraction("u", "m-new", ex(("alice", "bought", "a Kindle")))
    assert (snapshot.stat().st_mtime_ns, snapshot.stat().st_size) == before
    lines = log_file.read_bytes().splitlines()
    assert len(lines) == 1 and b"Kindle" in lines[0]  # one line, about this memory only
    again = NetworkXGraphStore(tmp_path)  # snapshot + replayed log
    assert again.relations("u") == store.relations("u")
    kindle = again.entity("u", "kindle")
    assert kindle is not None and kindle.memory_ids == ["m-new"]


def test_the_log_is_folded_in_once_it_outgrows_the_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(graph_module, "COMPACT_MIN_BYTES", 2_000)
    store = NetworkXGraphStore(tmp_path)
    snapshot = graph_file(tmp_path, "u")
    sizes = []
    for i in range(60):
        store.add_extraction("u", f"m{i}", ex(("alice", "bought", f"thing {i}")))
        sizes.append(snapshot.with_name(LOG_FILE).stat().st_size)
    compactions = sum(1 for a, b in zip(sizes, sizes[1:]) if b < a)
    assert compactions >= 2  # and each one emptied the log
    assert max(sizes) <= max(2_000, snapshot.stat().st_size) + 400  # never far past the bound
    assert len(NetworkXGraphStore(tmp_path).relations("u")) == 60


def test_a_torn_last_line_is_dropped(tmp_path: Path) -> None:
    store = NetworkXGraphStore(tmp_path)
    store.add_extraction("u", "m1", ex(("alice", "bought", "ROG laptop")))
    log_file = graph_file(tmp_path, "u").with_name(LOG_FILE)
    whole = log_file.stat().st_size
    with log_file.open("ab") as handle:  # what a crash in the middle of an append leaves
        handle.write(b'{"op": "add", "at": "2026-01-01T00:00:00+00:00", "items": [["m2", {"ent')
    again = NetworkXGraphStore(tmp_path)
    assert [r.object for r in again.relations("u")] == ["ROG laptop"]
    assert log_file.stat().st_size == whole  # cut back to the last whole change
    again.add_extraction("u", "m3", ex(("alice", "lives_in", "Lyon")))
    assert len(NetworkXGraphStore(tmp_path).relations("u")) == 2


def test_a_bad_line_inside_the_log_is_corruption(tmp_path: Path) -> None:
    store = NetworkXGraphStore(tmp_path)
    store.add_extraction("u", "m1", ex(("alice", "bought", "ROG laptop")))
    log_file = graph_file(tmp_path, "u").with_name(LOG_FILE)
    log_file.write_bytes(b"not json\n" + log_file.read_bytes())
    with pytest.raises(CorruptStateError, match="graph.log"):
        NetworkXGraphStore(tmp_path).relations("u")


def test_erasing_a_memory_leaves_no_line_of_it(tmp_path: Path) -> None:
    store = NetworkXGraphStore(tmp_path)
    store.add_extraction("u", "m1", ex(("alice", "bought", "Quokkaphone")))
    store.add_extraction("u", "m2", ex(("alice", "lives_in", "Lyon")))
    store.remove_memory("u", ["m1"])  # superseded: the log keeps the history
    assert b"Quokkaphone" in graph_file(tmp_path, "u").with_name(LOG_FILE).read_bytes()
    store.remove_memory("u", ["m1"], erase=True)  # deleted: nothing of it may stay
    folder = graph_file(tmp_path, "u").parent
    assert all(b"quokkaphone" not in p.read_bytes().lower() for p in folder.iterdir())
    assert [r.object for r in NetworkXGraphStore(tmp_path).relations("u")] == ["Lyon"]


CRASH_IN_COMPACTION = r"""
import os, sys
from hybridmem.graph import store as graph
from hybridmem.graph import fileformat as _graphio
from hybridmem.graph import NetworkXGraphStore
from hybridmem.models import Extraction, Relation

graph.COMPACT_MIN_BYTES = 1_500
def die(path):  # the snapshot is written, the log not yet emptied: the worst moment
    os._exit(9)
graph.truncate = die
store = NetworkXGraphStore(sys.argv[1])
for i in range(100):
    rel = Relation(subject="alice", predicate="bought", object=f"thing {i}")
    store.add_extraction("u", f"m{i}", Extraction(relations=[rel]))
    print(i, flush=True)
"""


def test_a_crash_during_compaction_loses_nothing(tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", CRASH_IN_COMPACTION, str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 9, done.stderr
    acknowledged = len(done.stdout.split())  # adds that returned before the crash
    relations = NetworkXGraphStore(tmp_path).relations("u")
    # every acknowledged add survives, plus the one whose compaction died (its line was written)
    assert {r.object for r in relations} == {f"thing {i}" for i in range(acknowledged + 1)}


def test_a_load_that_replayed_much_folds_the_log_into_the_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hybridmem.runtime.files import user_lock

    monkeypatch.setattr(graph_module, "FOLD_MIN_BYTES", 1)
    writer = NetworkXGraphStore(tmp_path)
    for i in range(30):
        writer.add_extraction("u", f"m{i}", ex(("alice", "bought", f"thing {i}")))
    exported = writer.export("u")
    snapshot = graph_file(tmp_path, "u")
    log_file = snapshot.with_name(LOG_FILE)
    logged = log_file.read_bytes()
    assert not snapshot.exists() and logged.count(b"\n") == 30
    with user_lock(tmp_path, "u"):  # a writer holds the user: the load neither waits nor writes
        assert NetworkXGraphStore(tmp_path).export("u") == exported
    assert not snapshot.exists() and log_file.read_bytes() == logged
    reader = NetworkXGraphStore(tmp_path)
    assert reader.export("u") == exported
    assert snapshot.exists() and log_file.stat().st_size == 0  # folded: same graph, no log
    assert NetworkXGraphStore(tmp_path).export("u") == exported
    writer.add_extraction("u", "m-new", ex(("alice", "bought", "a Kindle")))  # writers go on
    kindle = NetworkXGraphStore(tmp_path).entity("u", "kindle")
    assert kindle is not None and kindle.memory_ids == ["m-new"]


def test_graph_from_reads_node_link_in_one_checked_pass() -> None:
    from hybridmem.graph.fileformat import graph_from

    g = graph_from({"nodes": [{"id": "alice", "extra": 1}, {"id": "alice", "type": "person"}],
                    "edges": [{"source": "alice", "target": "lyon", "predicates": ["lives_in"],
                               "memory_ids": ["m1"]}], "graph": {"next": {"m1": "m2"}}})
    assert g.nodes["alice"]["type"] == "person" and g.nodes["alice"]["extra"] == 1
    assert g.nodes["lyon"]["name"] == "lyon" and g.nodes["lyon"]["memory_ids"] == set()
    assert g.edges["alice", "lyon"]["evidence"] == {"lives_in": {"m1": 1.0}}
    assert g.graph["next"] == {"m1": "m2"}
    for bad in ({"nodes": [{"id": ["a"]}], "edges": []}, {"nodes": [{"id": "a"}]},
                {"nodes": [], "edges": [{"source": "a"}]}, {"nodes": [], "edges": [], "graph": 3}):
        with pytest.raises(ValueError):
            graph_from(bad)


def test_a_slow_load_of_one_user_holds_up_no_other_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with NetworkXGraphStore(tmp_path) as writer:
        writer.add_extraction("slow", "m1", ex(("Ana", "bought", "ROG laptop")))
        writer.save("slow")
        writer.add_extraction("quick", "m2", ex(("Bo", "bought", "Dell monitor")))
    reading, release = threading.Event(), threading.Event()
    released: list[bool] = []  # whether the slow load was let go by us (not by its time-out)
    parse = graph_module.from_json_bytes

    def slow_parse(raw: bytes) -> nx.DiGraph[str]:
        if b"ROG laptop" in raw:  # the slow user's snapshot: its load waits until released
            reading.set()
            released.append(release.wait(15))
        return parse(raw)

    monkeypatch.setattr(graph_module, "from_json_bytes", slow_parse)
    store = NetworkXGraphStore(tmp_path)
    loading = threading.Thread(target=store.entities, args=("slow",))
    loading.start()
    try:
        assert reading.wait(30)
        # while "slow" is being loaded, another user's reads and writes go through
        assert [e.name for e in store.entities("quick")] == ["Bo", "Dell monitor"]
        store.add_extraction("quick", "m3", ex(("Bo", "prefers", "matte screens")))
        assert "matte screens" in {e.name for e in store.entities("quick")}
    finally:
        release.set()
        loading.join(30)
    assert released == [True]  # the slow load was still waiting all along
    assert "ROG laptop" in {e.name for e in store.entities("slow")}
    store.close()


def test_keyed_locks_keep_only_keys_in_use() -> None:
    from hybridmem.runtime.locks import UserLocks

    locks = UserLocks()
    with locks.hold("a"):
        with locks.hold("a"):  # re-entrant in one thread
            assert locks.busy("a") and not locks.busy("b")
        got = threading.Event()

        def take() -> None:
            with locks.hold("a"):
                got.set()

        other = threading.Thread(target=take)
        other.start()
        assert not got.wait(0.2)  # another thread waits while this one holds the key
    other.join(30)
    assert got.is_set() and not locks.busy("a")  # it got the key once released, then let go
    with locks.hold("b"):
        pass
    assert not locks.busy("b")  # nothing is left of a key nobody holds


def test_a_load_runs_without_garbage_collections_and_restores_the_collector(
    tmp_path: Path,
) -> None:
    """Loading builds many containers and no garbage: the cyclic collector waits until the end
    (one young-generation run when it is back on, instead of one every 700 containers), then
    is on again (and stays off for a caller that had switched it off)."""
    import gc

    first = NetworkXGraphStore(tmp_path)
    first.add_extractions("u", [(f"m{i}", ex((f"person {i}", "bought", f"thing {i}")))
                                for i in range(400)])
    first.save("u")
    first.close()
    runs: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            runs.append(info["generation"])

    for collecting in (True, False):
        (gc.enable if collecting else gc.disable)()
        store = NetworkXGraphStore(tmp_path)
        gc.callbacks.append(count)
        try:
            assert store.entities_in("u", "what did person 7 buy?") == ["person 7"]
        finally:
            gc.callbacks.remove(count)
            store.close()
            assert gc.isenabled() is collecting
            gc.enable()
    assert len(runs) <= 1, runs



def test_a_load_leaves_its_graph_in_the_oldest_generation_unless_the_process_froze_objects(
    tmp_path: Path,
) -> None:
    """What a load built goes to the collector's oldest generation when it ends, so young
    collections do not walk the new graph again; a process that froze objects itself keeps
    them frozen (the load then leaves its objects where they are)."""
    import gc

    first = NetworkXGraphStore(tmp_path)
    first.add_extractions("u", [(f"m{i}", ex((f"person {i}", "bought", f"thing {i}")))
                                for i in range(200)])
    first.save("u")
    first.close()

    def generation(obj: object) -> int:
        return next(n for n in (0, 1, 2) if any(o is obj for o in gc.get_objects(n)))

    assert gc.isenabled()
    store = NetworkXGraphStore(tmp_path)
    try:
        store.entities_in("u", "person 7")
        attrs = store._state("u").graph.nodes["person 7"]  # white-box: the cached graph
        assert generation(attrs) == 2 and gc.get_freeze_count() == 0
    finally:
        store.close()
    from hybridmem.graph.fileformat import gc_paused

    with gc_paused():  # a pause that builds no graph (a snapshot's serialising) promotes nothing
        young = {"made while paused": [1]}
    assert generation(young) != 2

    kept = {"frozen by the process": [1]}
    gc.freeze()
    store = NetworkXGraphStore(tmp_path)
    try:
        store.entities_in("u", "person 7")
        attrs = store._state("u").graph.nodes["person 7"]
        tracked = gc.get_objects()  # every generation, not the frozen objects
        assert not any(o is kept for o in tracked)  # still frozen
        assert generation(attrs) != 2
    finally:
        store.close()
        gc.unfreeze()

def _general(attrs: dict[str, object]) -> dict[str, object]:
    """An edge's attributes as the general (normalising) path derives them."""
    from hybridmem.graph.fileformat import _evidence, refresh_edge

    out = dict(attrs)
    out["evidence"] = _evidence(out, "edge")
    refresh_edge(out)
    return out


def test_the_plain_edge_path_derives_what_the_general_path_does() -> None:
    from hybridmem.graph.fileformat import _plain_edge

    plain: list[dict[str, object]] = [
        {"evidence": {"lives_in": {"m1": 0.6, "m2": 1.0}, "likes": {"m2": 0.0}}, "extra": [1]},
        {"evidence": {"x": {"m": -0.0}}},  # max() keeps -0.0; so must the plain path
        {"evidence": {}, "weight": 7, "confidence": 0.3},  # derived values are recomputed
        {"evidence": {"p" * 100: {"m": 0.5}}},
    ]
    for attrs in plain:
        fast = dict(attrs)
        assert _plain_edge(fast) is True
        assert fast == _general(attrs) and list(fast) == list(_general(attrs))
        assert [type(v) for v in fast.values()] == [type(v) for v in _general(attrs).values()]
    # anything not already normal is left to the general path, untouched
    for evidence in ({"p": {"m": 1}}, {"p": {"m": "0.5"}}, {"p": {1: 0.5}}, {"": {"m": 0.5}},
                     {" ": {"m": 0.5}}, {"p" * 101: {"m": 0.5}}, {"p": {"m": 1.5}},
                     {"p": {"m": float("nan")}}, {"p": {"m": float("inf")}}, {"p": [0.5]},
                     {"p": {"m": True}}, [("p", {"m": 0.5})]):
        attrs = {"evidence": evidence}
        assert _plain_edge(attrs) is False and attrs == {"evidence": evidence}


@pytest.mark.parametrize(("evidence", "match"), [
    ({"p": {"m": 1.5}}, "not between 0 and 1"), ({"p": {"m": float("nan")}}, "between 0 and 1"),
    ({"p": {"m": True}}, "is not a number"), ({"p": {"m": "x"}}, "is not a number"),
    ({" ": {"m": 0.5}}, "is not 1-100 characters"), ({"p" * 101: {"m": 0.5}}, "1-100"),
    ({"p": [0.5]}, "is not a {memory id: confidence}"),
])
def test_a_bad_edge_in_a_file_still_names_what_is_wrong(evidence: object, match: str) -> None:
    from hybridmem.graph.fileformat import from_json_bytes

    good = {"source": "a", "target": "b", "evidence": {"p": {"m": 0.5}}}
    bad = {"source": "a", "target": "c", "evidence": evidence}
    raw = json.dumps({"schema": 1, "graph": {"nodes": [], "edges": [good, bad]}}).encode()
    with pytest.raises(ValueError, match=match):
        from_json_bytes(raw)
    fixed = {**bad, "evidence": {"p": {"m": 1}}}  # an int confidence is normalised, not refused
    raw = json.dumps({"schema": 1, "graph": {"nodes": [], "edges": [good, fixed]}}).encode()
    loaded = from_json_bytes(raw).edges["a", "c"]
    assert loaded["evidence"] == {"p": {"m": 1.0}} and type(loaded["confidence"]) is float


def test_the_edge_index_is_built_when_first_asked_and_kept_current() -> None:
    from hybridmem.graph.state import UserGraph

    def eager(st: UserGraph) -> dict[str, set[tuple[str, str]]]:
        out: dict[str, set[tuple[str, str]]] = {}
        for u, v, attrs in st.graph.edges(data=True):
            for mid in attrs["memory_ids"]:
                out.setdefault(mid, set()).add((u, v))
        return out

    seen = datetime(2026, 1, 1, tzinfo=timezone.utc)
    first = [("m1", ex(("Ana", "bought", "ROG laptop"), ("Ana", "lives in", "Lyon")))]
    later = [("m2", ex(("Ana", "bought", "ROG laptop"))), ("m3", ex(("Bo", "likes", "Lyon")))]
    asked, lazy = UserGraph("u", None), UserGraph("u", None)
    asked.add(first, seen)
    lazy.add(first, seen)
    assert asked.mem_edges == {"m1": {("ana", "rog laptop"), ("ana", "lyon")}}
    asked.add(later, seen)  # built before these writes: they update it
    lazy.add(later, seen)  # never built: the first use builds it from the graph
    assert lazy.edge_index is None
    assert asked.mem_edges == lazy.mem_edges == eager(asked) and len(eager(asked)) == 3
    asked.remove(["m1"])
    lazy.index()  # a reload forgets it again
    assert lazy.edge_index is None and lazy.remove(["m1"])
    assert asked.mem_edges == lazy.mem_edges == eager(lazy) and "m1" not in eager(lazy)
