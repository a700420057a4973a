"""Graph activation (hybridmem.graph.activation) on a real NetworkXGraphStore: episodic links between the
memories of one batch, IDF-like specificity, attributes that are never bridges, readable paths."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import networkx as nx

from hybridmem import Memory, Settings
from hybridmem.graph.store import GRAPH_FILE, NetworkXGraphStore
from hybridmem.models import Entity, Extraction
from hybridmem.offline import LocalEmbedder


def ents(*named: tuple[str, str]) -> Extraction:
    return Extraction(entities=[Entity(name=n, type=t) for n, t in named], extractor="test")


NONE = Extraction()


def test_a_batch_is_an_episode_and_neighbours_are_one_step_apart(tmp_path: Path) -> None:
    store = NetworkXGraphStore(tmp_path, session=0.0)  # the session share: the next test
    store.add_extractions("u", [("q", NONE), ("a", NONE), ("later", NONE)])
    store.add_extractions("u", [("other", NONE)])
    found = store.activation("u", [("q", 1.0)], "what did I say?", hops=1, episodic=0.5)
    assert set(found) == {"a"}  # not "later" (two away), not "other" (another batch)
    score, hops, path = found["a"]
    assert score == 0.5 and hops == 1 and path == "said just after hit 1"
    before = store.activation("u", [("a", 1.0)], "", hops=1)
    assert set(before) == {"q", "later"} and before["q"][2] == "said just before hit 1"
    assert store.activation("u", [("a", 1.0)], "", hops=1, episodic=0.0) == {}


def test_a_hit_lends_a_little_to_the_rest_of_its_conversation(tmp_path: Path) -> None:
    store = NetworkXGraphStore(tmp_path, session=0.6)
    turns = [f"t{i:02d}" for i in range(40)]
    store.add_extractions("u", [(t, NONE) for t in turns])
    store.add_extractions("u", [("other", NONE)])  # another conversation: nothing
    found = store.activation("u", [("t10", 1.0)], "", hops=1, episodic=0.5)
    near = {"t09", "t11"}
    around = set(turns[:9]) | set(turns[12:36])  # 9 before (all there are), 24 after
    assert set(found) == near | around
    assert all(found[m][0] == 0.5 for m in near)  # the neighbours: their episodic share only
    assert {found[m][0] for m in around} == {0.6 / len(around)}
    assert found["t12"][2] == "said in the same conversation as hit 1"
    assert set(NetworkXGraphStore(tmp_path, session=0.0).activation(
        "u", [("t10", 1.0)], "", hops=1)) == near


def test_episodic_links_survive_reload_and_forgetting_splices_them(tmp_path: Path) -> None:
    store = NetworkXGraphStore(tmp_path)
    store.add_extractions("u", [("a", NONE), ("b", NONE), ("c", NONE)])
    store.add_extractions("u", [("b", NONE), ("a", NONE)])  # re-adding changes no link
    store.save("u")
    data = json.loads((next(tmp_path.rglob(GRAPH_FILE))).read_text())
    graph = nx.node_link_graph(data["graph"], edges="edges")
    assert graph.graph["next"] == {"a": "b", "b": "c"}
    store.close()
    again = NetworkXGraphStore(tmp_path)
    assert set(again.activation("u", [("b", 1.0)], "", hops=1)) == {"a", "c"}
    again.remove_memory("u", ["b"], erase=True)
    assert set(again.activation("u", [("a", 1.0)], "", hops=1)) == {"c"}
    again.close()
    assert set(NetworkXGraphStore(tmp_path).activation("u", [("c", 1.0)], "", hops=1)) == {"a"}


def test_a_specific_entity_passes_on_more_than_a_common_one(tmp_path: Path) -> None:
    store = NetworkXGraphStore(tmp_path)
    common = [(f"c{i}", ents(("Caroline", "person"))) for i in range(12)]
    store.add_extractions("u", common[:1] + [("seed", ents(("Caroline", "person"),
                                                          ("adoption agency", "concept")))])
    for item in common[1:]:
        store.add_extractions("u", [item])
    store.add_extractions("u", [("rare", ents(("adoption agency", "concept")))])
    found = store.activation("u", [("seed", 1.0)], "", hops=1, episodic=0.0)
    assert found["rare"][0] > 5 * found["c5"][0] > 0
    assert found["rare"][2] == "adoption agency, shared with hit 1"


def test_dates_and_amounts_are_not_bridges_and_query_entities_seed(tmp_path: Path) -> None:
    store = NetworkXGraphStore(tmp_path)
    store.add_extractions("u", [("m1", ents(("$1,899", "amount"), ("May 2028", "date")))])
    store.add_extractions("u", [("m2", ents(("$1,899", "amount"), ("May 2028", "date")))])
    store.add_extractions("u", [("m3", ents(("pottery class", "concept")))])
    store.add_extractions("u", [("m4", NONE)])
    assert store.activation("u", [("m1", 1.0)], "", hops=1) == {}
    found = store.activation("u", [], "How was the pottery class?", hops=0)
    assert set(found) == {"m3"} and found["m3"][1:] == (0, "pottery class (named in the query)")


def test_query_focus_lifts_hits_naming_a_hub_and_never_brings_one_in(tmp_path: Path) -> None:
    """Melanie and Caroline each say half the turns (hubs, never spread through), yet among the
    hits Melanie's turns are the ones a question about her wants; a turn of hers that no retriever
    found stays out."""
    store = NetworkXGraphStore(tmp_path, focus=0.4)
    for i in range(140):
        who = "Melanie" if i % 2 else "Caroline"
        store.add_extractions("u", [(f"t{i:02d}", ents((who, "person")))])
    hits = [("t01", 0.0), ("t04", 0.0), ("t08", 0.0)]  # candidates beyond the best: mass 0
    found = store.activation("u", hits, "What did Melanie paint?", hops=1, episodic=0.0)
    assert set(found) == {"t01"}  # Caroline's turns get nothing, t03.. were not hits
    score, hops, path = found["t01"]
    assert score == 0.4 and hops == 0 and path == "Melanie (named in the query)"
    both = store.activation("u", hits, "Did Melanie meet Caroline?", hops=1, episodic=0.0)
    assert {m: s for m, (s, _h, _p) in both.items()} == {"t01": 0.2, "t04": 0.2, "t08": 0.2}
    assert list(both) == ["t01", "t04", "t08"]  # ties in memory-id order
    off = NetworkXGraphStore(tmp_path, focus=0.0)
    assert off.activation("u", hits, "What did Melanie paint?", hops=1, episodic=0.0) == {}


def test_episodes_survive_a_reopen_another_writer_and_an_import(
    make_settings: Callable[..., Settings], embedder: LocalEmbedder, unique_user: str
) -> None:
    """In server mode a reopened Memory (like another process) rebuilds the graph from records:
    each names the memory written before it, so the conversation's links come back; an import
    keeps the export's episodes. Both Chroma modes."""
    settings = make_settings(extractor="rules")
    with Memory(settings, embedder=embedder) as mem:
        items = mem.add_many(unique_user, ["Alice: I adopted a dog.", "Bob: What is its name?",
                                           "Alice: Rex, after my grandfather."])
        mem.add(unique_user, "Bob: Unrelated, later.")
        bundle = json.loads(json.dumps(mem.export(unique_user)))
    a, b, c = (i.id for i in items)
    want = {a: b, b: c}
    with Memory(settings, embedder=embedder) as again:
        assert again.export(unique_user)["graph"]["graph"]["graph"]["next"] == want
        found = again._stores.graph.activation(unique_user, [(b, 1.0)], "", hops=1)
        assert {m for m, (_s, _h, path) in found.items() if path.startswith("said just")} == {a, c}
        again.import_(unique_user + "-copy", bundle)
        assert again.export(unique_user + "-copy")["graph"]["graph"]["graph"]["next"] == want


def test_an_add_declares_its_links_and_a_reload_replays_them(tmp_path: Path) -> None:
    """Re-extraction redoes memories of many conversations in one call: links=False chains none
    of them; explicit pairs link exactly those; the log replays both as written."""
    store = NetworkXGraphStore(tmp_path)
    store.add_extractions("u", [("x", NONE), ("y", NONE), ("z", NONE)], links=False)
    store.add_extractions("u", [("p", NONE), ("q", NONE), ("r", NONE)], links=[("r", "p")])
    for s in (store, NetworkXGraphStore(tmp_path)):  # the second one reads the log
        assert s.activation("u", [("y", 1.0)], "", hops=1) == {}
        assert set(s.activation("u", [("p", 1.0)], "", hops=1)) == {"r"}
        assert set(s.activation("u", [("q", 1.0)], "", hops=1)) == set()


def test_topic_prefers_the_turn_whose_concepts_are_close_to_the_question(tmp_path: Path) -> None:
    """Focus lifts every turn of Melanie's alike; the topic signal (the query's cosine to a
    turn's concept names, real MiniLM vectors) puts her pottery class above her tax return for a
    question about her hobbies; it never touches Caroline's turn nor brings a memory in."""
    import numpy as np

    store = NetworkXGraphStore(tmp_path, focus=0.4, session=0.0)
    store.add_extractions("u", [
        ("t1", ents(("Melanie", "person"), ("pottery class", "concept"))),
        ("t2", ents(("Melanie", "person"), ("tax return", "concept"))),
        ("t3", ents(("Caroline", "person"), ("painting class", "concept"))),
    ], links=False)
    query = "What hobbies does Melanie have?"
    model = LocalEmbedder()
    qvec = np.asarray(model.embed_batch([query])[0])

    def similar(keys: Sequence[str], texts: Sequence[str]) -> list[float]:
        assert len(keys) == len(texts)
        return (np.asarray(model.embed_batch(list(texts))) @ qvec).tolist()

    hits = [("t1", 0.0), ("t2", 0.0), ("t3", 0.0)]
    plain = store.activation("u", hits, query, hops=1, episodic=0.0)
    assert plain["t1"][0] == plain["t2"][0] and "t3" not in plain  # focus: both alike
    found = store.activation("u", hits, query, hops=1, episodic=0.0, topic=0.3, similar=similar)
    assert set(found) == set(plain)  # the same memories: Caroline's turn gets nothing
    assert found["t1"][0] > found["t2"][0] > plain["t2"][0]
    assert store.activation("u", hits, query, hops=1, episodic=0.0, topic=0.0,
                            similar=similar) == plain
