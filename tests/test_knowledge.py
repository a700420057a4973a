"""Caller-supplied knowledge: the entities and relations a caller states with ``add`` join the
graph exactly like extracted ones (resolution, evidence, search's ``why``, forget, export and
import, crash recovery), through every face (library, async, REST, MCP); and ``query_path(k=)``
returns the k shortest paths with their predicates."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings as hsettings
from hypothesis import strategies as st

import crash_harness
from hybridmem import (
    AsyncMemory,
    GraphPath,
    InvalidInputError,
    Knowledge,
    Memory,
    Settings,
)
from hybridmem.models import MAX_ENTITIES, MAX_NAME_CHARS, MAX_PATHS, MAX_RELATIONS, to_request
from hybridmem.server import create_app
from uvicorn_thread import serve

USER = "shop_1"


@pytest.fixture()
def mem(make_settings: Callable[..., Settings]) -> Iterator[Memory]:
    with Memory(make_settings(embedder="hash", extractor="rules")) as memory:
        yield memory


def _node_of(mem: Memory, user: str, name: str) -> dict[str, Any]:
    key = next(e.key for e in mem.entities(user) if name in e.aliases or e.name == name)
    return dict(mem.graph(user).nodes[key])


# -- the boundary ----------------------------------------------------------------------------------
def _acceptable(name: str) -> bool:
    """The documented rule, written from Unicode categories: non-blank, at most
    MAX_NAME_CHARS, encodable, and no control (Cc), bidi control, BOM, U+FFFD or non-character."""
    bidi = {"\u061c", "\u200e", "\u200f", *map(chr, range(0x202A, 0x202F)),
            *map(chr, range(0x2066, 0x206A)), "\ufeff", "\ufffd", "\ufffe", "\uffff"}
    if not name.strip() or len(name) > MAX_NAME_CHARS:
        return False
    if any(0xD800 <= ord(c) <= 0xDFFF for c in name):
        return False
    return not any(unicodedata.category(c) == "Cc" or c in bidi for c in name)


NAMES = st.one_of(
    st.text(min_size=0, max_size=8),
    st.text(alphabet=st.sampled_from("ab \t\x00\x07\x85\u200e\u202e\ufeff\ufffd\ud800é-"),
            max_size=6),
    st.integers(MAX_NAME_CHARS - 1, MAX_NAME_CHARS + 1).map(lambda n: "x" * n),
)


@hsettings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=NAMES, as_relation=st.booleans())
def test_a_caller_name_is_accepted_exactly_when_the_rule_allows_it(
    name: str, as_relation: bool
) -> None:
    body: dict[str, Any] = {"text": "a catalogue line"}
    if as_relation:
        body["relations"] = [{"subject": "Acme", "predicate": "sells", "object": name}]
    else:
        body["entities"] = [name]
    if _acceptable(name):
        knowledge = to_request(body).knowledge
        assert knowledge is not None
        assert name in ([knowledge.relations[0].object] if as_relation
                        else [knowledge.entities[0].name])
    else:
        with pytest.raises(InvalidInputError):
            to_request(body)


def test_limits_are_typed_errors_and_nothing_is_written(mem: Memory) -> None:
    mem.add(USER, "Order 1 shipped.", entities=[f"SKU-{n}" for n in range(MAX_ENTITIES)],
            relations=[(f"SKU-{n}", "part_of", "Kit") for n in range(MAX_RELATIONS)])
    before = (mem.count(USER), len(mem.entities(USER)))
    bad: list[dict[str, Any]] = [
        {"entities": [f"SKU-{n}" for n in range(MAX_ENTITIES + 1)]},
        {"relations": [("a", "b", f"c{n}") for n in range(MAX_RELATIONS + 1)]},
        {"entities": ["  "]},
        {"entities": [{"name": "SKU-9", "type": "x\x1b[31m"}]},
        {"relations": [("a", "", "b")]},
        {"relations": [("a", "b")]},
        {"entities": [{"name": "SKU-9", "colour": "red"}]},
    ]
    for fields in bad:
        with pytest.raises(InvalidInputError):
            mem.add(USER, "Order 2 shipped.", **fields)
        with pytest.raises(InvalidInputError):
            mem.add_many(USER, ["Order 3 shipped.", {"text": "Order 2 shipped.", **fields}])
    assert (mem.count(USER), len(mem.entities(USER))) == before  # no half-write
    # a repeat may not push the memory it repeats beyond the limits either
    with pytest.raises(InvalidInputError, match="more than"):
        mem.add(USER, "Order 1 shipped.", entities=["SKU-new"])
    assert (mem.count(USER), len(mem.entities(USER))) == before
    assert mem.list(USER)[0].mention_count == 1


# -- the graph, search, forget, export and import ------------------------------------------------
def test_caller_entities_join_the_graph_merged_with_extraction(mem: Memory) -> None:
    item = mem.add(
        USER, "Alice bought the ROG laptop.",
        entities=[{"name": "rog laptop", "type": "product"}, "SKU-4471",
                  {"name": "Asus", "type": "brand"}],
        relations=[("SKU-4471", "is_sku_of", "ROG laptop"), ("ROG laptop", "made_by", "Asus")],
    )
    g = mem.graph(USER)
    # the caller's "rog laptop" and the extractor's "ROG laptop" resolve to one node
    laptops = [k for k, a in g.nodes(data=True) if "rog laptop" in {x.lower() for x in a["aliases"]}]
    assert len(laptops) == 1
    laptop = g.nodes[laptops[0]]
    assert laptop["type"] == "product" and laptop["memory_ids"] == {item.id}
    sku = next(k for k, a in g.nodes(data=True) if a["name"] == "SKU-4471")
    assert g.edges[sku, laptops[0]]["evidence"] == {"is_sku_of": {item.id: 1.0}}
    asus = next(k for k, a in g.nodes(data=True) if a["name"] == "Asus")
    assert g.nodes[asus]["type"] == "brand"
    assert "made_by" in g.edges[laptops[0], asus]["predicates"]
    # and what the rules found in the text is there too
    assert any(r.predicate == "bought" for r in mem.relations(USER))
    assert item.knowledge is not None and mem.get(USER, item.id).knowledge == item.knowledge


def test_a_caller_entity_explains_a_search_hit(mem: Memory) -> None:
    """The text never names the product: only the caller's knowledge links them."""
    order = mem.add(USER, "Order 88 left the warehouse on Tuesday.",
                    entities=[{"name": "Studio Pro X", "type": "product"}])
    mem.add(USER, "The customer prefers email over phone calls.")
    hits = mem.search(USER, "Studio Pro X", limit=5)
    hit = next(h for h in hits if h.item.id == order.id)
    assert hit.breakdown.graph is not None and "Studio Pro X" in hit.why
    assert hits[0].item.id == order.id


def test_forget_export_and_import_treat_stated_and_extracted_alike(mem: Memory) -> None:
    said = mem.add(USER, "Alice bought the ROG laptop.")  # the rules find "ROG laptop"
    stated = mem.add(USER, "Ticket 5 was closed.", entities=["ROG laptop", "Ticket 5"],
                     relations=[("Ticket 5", "about", "ROG laptop")])
    laptop = next(e for e in mem.entities(USER) if e.name.lower() == "rog laptop")
    assert set(laptop.memory_ids) == {said.id, stated.id}

    bundle = json.loads(json.dumps(mem.export(USER)))
    graph_before = mem.graph(USER)
    mem.forget(USER)
    assert mem.graph(USER).number_of_nodes() == 0
    assert mem.import_(USER, bundle) == 2
    moved = mem.graph(USER)
    assert set(moved.nodes) == set(graph_before.nodes)
    assert {(u, v): a["evidence"] for u, v, a in moved.edges(data=True)} == {
        (u, v): a["evidence"] for u, v, a in graph_before.edges(data=True)}
    assert mem.get(USER, stated.id).knowledge == stated.knowledge

    mem.forget(USER, said.id)  # the node stays: the stated memory still supports it
    laptop = next(e for e in mem.entities(USER) if e.name.lower() == "rog laptop")
    assert laptop.memory_ids == [stated.id]
    assert [str(r) for r in mem.relations(USER)] == ["Ticket 5 -about-> ROG laptop"]
    mem.forget(USER, stated.id)  # and goes with the last memory that supports it
    assert mem.entities(USER) == [] and mem.relations(USER) == []
    assert mem.graph(USER).number_of_nodes() == 0


def test_a_repeat_adds_what_it_states_and_it_survives_a_reopen(
    make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(embedder="hash", extractor="rules")
    with Memory(settings) as mem:
        first = mem.add(USER, "Bought a desk lamp.", entities=["Lamp L1"])
        again = mem.add(USER, "Bought a desk lamp.", entities=["Lamp L1", "Warehouse 7"],
                        relations=[("Lamp L1", "stored_in", "Warehouse 7")])
        assert again.id == first.id and again.mention_count == 2
    with Memory(settings) as mem:
        item = mem.get(USER, first.id)
        assert item.knowledge is not None
        assert [e.name for e in item.knowledge.entities] == ["Lamp L1", "Warehouse 7"]
        assert [str(r) for r in mem.relations(USER) if r.predicate == "stored_in"] == [
            "Lamp L1 -stored_in-> Warehouse 7"]
        assert first.id in _node_of(mem, USER, "Warehouse 7")["memory_ids"]


def test_a_near_duplicate_folds_its_statement_into_the_memory_it_repeats(mem: Memory) -> None:
    """Once with a richer text (the memory is rewritten and re-extracted), once without (its
    fields change only): either way what the repeat stated joins the memory's evidence."""
    first = mem.add(USER, "Alice bought the ROG Strix laptop in March at the Lyon store",
                    entities=["SKU-1"])
    richer = mem.add(USER, "Alice bought the ROG Strix laptop in March at the Lyon store "
                     "downtown", entities=["SKU-2"])
    poorer = mem.add(USER, "Alice bought the ROG Strix laptop in March at Lyon store",
                     entities=["SKU-3"], relations=[("SKU-3", "replaces", "SKU-1")])
    assert first.id == richer.id == poorer.id and mem.count(USER) == 1
    assert poorer.knowledge is not None
    assert [e.name for e in poorer.knowledge.entities] == ["SKU-1", "SKU-2", "SKU-3"]
    for name in ("SKU-1", "SKU-2", "SKU-3", "ROG Strix laptop"):
        assert _node_of(mem, USER, name)["memory_ids"] == {first.id}
    assert [str(r) for r in mem.relations(USER) if r.predicate == "replaces"] == [
        "SKU-3 -replaces-> SKU-1"]


def test_re_extraction_keeps_what_the_caller_stated(
    make_settings: Callable[..., Settings], openai_server: Any
) -> None:
    from openai_wire import Reply

    settings = make_settings(embedder="hash", extractor="llm", base_url=openai_server.base_url,
                             api_key="sk-test", max_retries=0, request_timeout=5,
                             episode_turns=0)
    with Memory(settings) as mem:
        openai_server.script(Reply.error(500, "down"), Reply.error(500, "down"))
        item = mem.add(USER, "Ann bought a ROG laptop in Berlin", entities=["SKU-77"],
                       relations=[("SKU-77", "is_sku_of", "ROG laptop")])
        assert item.needs_extraction
        openai_server.reset()
        openai_server.script(json.dumps({
            "entities": [{"name": "ROG laptop", "type": "product"}],
            "relations": [{"subject": "Ann", "predicate": "bought", "object": "ROG laptop"}]}))
        assert mem.reextract(USER) == 1
        assert not mem.get(USER, item.id).needs_extraction
        assert sorted(str(r) for r in mem.relations(USER)) == [
            "Ann -bought-> ROG laptop", "SKU-77 -is_sku_of-> ROG laptop"]


def test_knowledge_union_keeps_each_statement_once() -> None:
    a = Knowledge(entities=["SKU-1", "Acme"], relations=[("SKU-1", "made_by", "Acme")])
    b = Knowledge(entities=["Acme", "Lamp"], relations=[("SKU-1", "made_by", "Acme")])
    both = a | b
    assert [e.name for e in both.entities] == ["SKU-1", "Acme", "Lamp"]
    assert len(both.relations) == 1 and (a | None) is a and not Knowledge()


# -- k shortest paths ------------------------------------------------------------------------------
def _catalogue(mem: Memory) -> None:
    """Two 2-hop routes and one 3-hop route from SKU-1 to Acme, all stated by the caller."""
    mem.add_many(USER, [
        {"text": "Catalogue line one.", "relations": [("SKU-1", "variant_of", "Lamp"),
                                                      ("Lamp", "made_by", "Acme")]},
        {"text": "Catalogue line two.", "relations": [("SKU-1", "sold_by", "Shop"),
                                                      ("Shop", "partner_of", "Acme")]},
        {"text": "Catalogue line three.", "relations": [("SKU-1", "ships_from", "Depot"),
                                                        ("Depot", "near", "Harbour"),
                                                        ("Harbour", "owned_by", "Acme")]},
    ])


def test_query_path_returns_the_k_shortest_paths_with_their_predicates(mem: Memory) -> None:
    _catalogue(mem)
    one = mem.query_path(USER, "SKU-1", "Acme")
    assert isinstance(one, list) and len(one) == 2 and all(isinstance(e, str) for e in one)
    paths = mem.query_path(USER, "sku-1", "ACME", k=MAX_PATHS)
    assert all(isinstance(p, GraphPath) for p in paths)
    assert [p.hops for p in paths] == [2, 2, 3]
    assert {tuple(map(tuple, p.predicates)) for p in paths[:2]} == {
        (("variant_of",), ("made_by",)), (("sold_by",), ("partner_of",))}
    assert paths[2].entities == ["SKU-1", "Depot", "Harbour", "Acme"]
    assert paths[2].edges == ["SKU-1 -ships_from-> Depot", "Depot -near-> Harbour",
                              "Harbour -owned_by-> Acme"]
    assert one == paths[0].edges
    assert [p.hops for p in mem.query_path(USER, "SKU-1", "Acme", k=1)] == [2]
    assert [p.hops for p in mem.query_path(USER, "SKU-1", "Acme", k=5, max_depth=2)] == [2, 2]
    assert mem.query_path(USER, "SKU-1", "nobody", k=3) == []
    for bad in ({"k": 0}, {"k": MAX_PATHS + 1}, {"k": True}, {"max_depth": 0},
                {"max_depth": 99}):
        with pytest.raises(InvalidInputError):
            mem.query_path(USER, "SKU-1", "Acme", **bad)


def test_the_path_search_stays_within_both_ends_reach(mem: Memory) -> None:
    """A hub with many spokes beside the route changes no answer: only nodes within max_depth
    of both ends are searched."""
    _catalogue(mem)
    mem.add(USER, "Shop inventory.", relations=[("Shop", "stocks", f"Item {n}")
                                                 for n in range(MAX_RELATIONS)])
    assert [p.hops for p in mem.query_path(USER, "SKU-1", "Acme", k=MAX_PATHS)] == [2, 2, 3]


@pytest.mark.anyio
async def test_async_memory_mirrors_the_parameters(make_settings: Callable[..., Settings]) -> None:
    async with AsyncMemory(make_settings(embedder="hash", extractor="rules")) as amem:
        item = await amem.add(USER, "Catalogue line.", entities=["SKU-9"],
                              relations=[("SKU-9", "variant_of", "Desk")])
        assert item.knowledge is not None
        assert await amem.query_path(USER, "SKU-9", "Desk") == ["SKU-9 -variant_of-> Desk"]
        paths = await amem.query_path(USER, "SKU-9", "Desk", k=2)
        assert [p.predicates for p in paths] == [[["variant_of"]]]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# -- crash recovery --------------------------------------------------------------------------------
WRITER = r"""
import sys
from hybridmem import Memory, Settings

data_dir, start, url = sys.argv[1], int(sys.argv[2]), sys.argv[3] or None
with Memory(Settings(data_dir=data_dir, embedder="hash", extractor="rules", chroma_url=url)) as mem:
    if mem._stores.leases is not None:  # as in crash_harness: a short lease
        mem._stores.leases.ttl = float(sys.argv[4])
    for n in range(start, start + 10_000):
        items = mem.add_many("crash-user", [
            {"text": f"Catalogue row {n}-{k}.", "entities": [f"SKU-{n}-{k}"],
             "relations": [[f"SKU-{n}-{k}", "variant_of", f"Model {n}"]]}
            for k in range(4)])
        print(" ".join(i.id for i in items), flush=True)
"""


def test_stated_knowledge_survives_a_kill_like_extracted_evidence(
    tmp_path: Path, chroma_url: str | None
) -> None:
    """Killed at random moments: no acknowledged memory is lost, every memory the vector store
    holds has its stated SKU in the graph with itself as evidence, and the graph cites no memory
    the vector store lacks (embedded: the
    journal file; server mode: the journal in the user's lease, taken over once it expires)."""
    rng = random.Random(20261204)
    data_dir = tmp_path / "hm"
    acknowledged: set[str] = set()
    for n in range(4 if chroma_url is None else 2):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(data_dir), str(n * 1000),
                                 chroma_url or "", str(crash_harness.SHORT_TTL)],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert proc.stdout is not None
        first = proc.stdout.readline()
        time.sleep(rng.uniform(0.0, 1.0))
        proc.send_signal(signal.SIGKILL)
        rest = proc.stdout.read()
        proc.wait(timeout=120)
        assert first, "the writer died before its first write"
        for line in [first, *rest.splitlines()]:
            acknowledged.update(line.split())
        with Memory(crash_harness.settings(data_dir, chroma_url)) as mem:
            crash_harness.recover(mem, "crash-user")
            mem.refresh("crash-user")
            items = {i.id: i for i in crash_harness.all_items(mem, "crash-user")}
            assert acknowledged <= set(items)
            by_name = {e.name: set(e.memory_ids) for e in mem.entities("crash-user")}
            for memory_id, item in items.items():  # acknowledged or not: no half-write
                assert item.knowledge is not None
                assert memory_id in by_name[item.knowledge.entities[0].name]
            cited = {m for ids in by_name.values() for m in ids}
            assert cited <= set(items)
            if chroma_url is None:
                journal = next((data_dir / "users").iterdir()) / "pending.json"
                assert not journal.exists() or journal.stat().st_size == 0


# -- REST and MCP ----------------------------------------------------------------------------------
def test_rest_round_trip(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "hm", embedder="hash", extractor="rules",
                        base_url=None)
    with Memory(settings) as memory, serve(create_app(memory)) as url, \
            httpx.Client(base_url=f"{url}/v1/users/{USER}", timeout=30) as client:
        made = client.post("/memories", json={
            "text": "Catalogue line one.", "entities": ["SKU-1", {"name": "Lamp", "type": "product"}],
            "relations": [["SKU-1", "variant_of", "Lamp"], {"subject": "Lamp",
                                                            "predicate": "made_by",
                                                            "object": "Acme"}]})
        assert made.status_code == 201, made.text
        assert made.json()["knowledge"]["entities"][1] == {"name": "Lamp", "type": "product"}
        batch = client.post("/memories/batch", json={"memories": [
            {"text": "Catalogue line two.", "relations": [["SKU-1", "sold_by", "Shop"],
                                                          ["Shop", "partner_of", "Acme"]]}]})
        assert batch.status_code == 201
        names = {e["name"]: e for e in client.get("/entities").json()}
        assert names["Lamp"]["type"] == "product"
        assert names["SKU-1"]["memory_ids"] == sorted([made.json()["id"], batch.json()[0]["id"]])
        paths = client.get("/paths", params={"a": "SKU-1", "b": "Acme", "k": 5})
        assert paths.status_code == 200
        assert paths.json() == [p.model_dump(mode="json")
                                for p in memory.query_path(USER, "SKU-1", "Acme", k=5)]
        assert len(paths.json()) == 2 and paths.json()[0]["predicates"][0] in (
            ["variant_of"], ["sold_by"])
        assert client.get("/paths", params={"a": "SKU-1", "b": "Acme", "k": 0}).status_code == 422
        for body in ({"text": "x", "entities": ["bad\x00name"]},
                     {"text": "x", "entities": [f"S{n}" for n in range(MAX_ENTITIES + 1)]},
                     {"text": "x", "relations": [["only", "two"]]}):
            refused = client.post("/memories", json=body)
            assert refused.status_code == 422, refused.text
            assert refused.json()["error"]["type"]
        assert memory.count(USER) == 2


@pytest.mark.anyio
async def test_mcp_round_trip(tmp_path: Path) -> None:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    root = Path(__file__).resolve().parents[1]
    data = tmp_path / "hm"
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "hybridmem.mcp"], cwd=str(tmp_path),
        env={"HYBRIDMEM_EMBEDDER": "hash", "HYBRIDMEM_DATA_DIR": str(data),
             "PYTHONPATH": str(root)})
    with (tmp_path / "server.log").open("a", encoding="utf-8") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            added = await session.call_tool("add_memory", {
                "user_id": USER, "text": "Catalogue line one.",
                "entities": ["SKU-1", {"name": "Lamp", "type": "product"}],
                "relations": [{"subject": "SKU-1", "predicate": "variant_of", "object": "Lamp"}]})
            assert not added.is_error and added.structured_content is not None
            assert added.structured_content["knowledge"]["entities"][0]["name"] == "SKU-1"
            found = await session.call_tool("query_path", {"user_id": USER, "a": "sku-1",
                                                           "b": "Lamp", "k": 2})
            assert not found.is_error and found.structured_content is not None
            assert found.structured_content["paths"] == [{
                "entities": ["SKU-1", "Lamp"], "predicates": [["variant_of"]],
                "edges": ["SKU-1 -variant_of-> Lamp"]}]
            bad = await session.call_tool("add_memory", {"user_id": USER, "text": "x",
                                                         "entities": ["\u202eevil"]})
            assert bad.is_error
            assert json.dumps([c.model_dump() for c in bad.content]).count("InvalidInputError")


def test_cli_add_with_knowledge_and_graph_path(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from hybridmem.cli import app

    monkeypatch.setenv("HYBRIDMEM_DATA_DIR", str(tmp_path / "hm"))
    monkeypatch.setenv("HYBRIDMEM_EMBEDDER", "hash")
    cli = CliRunner()

    def run(*args: str, code: int = 0) -> str:
        result = cli.invoke(app, list(args))
        assert result.exit_code == code, (result.exit_code, result.output)
        return result.output

    run("add", USER, "Catalogue line one.", "--entity", "SKU-1", "--entity", "Lamp",
        "--relation", "SKU-1 -variant_of-> Lamp", "--relation", "Lamp -made_by-> Acme")
    run("add", USER, "Catalogue line two.", "--relation", "SKU-1 -sold_by-> Shop",
        "--relation", "Shop -partner_of-> Acme")
    lines = run("graph", "path", USER, "SKU-1", "Acme", "-k", "3").splitlines()
    assert sorted(lines) == ["SKU-1 -sold_by-> Shop | Shop -partner_of-> Acme",
                             "SKU-1 -variant_of-> Lamp | Lamp -made_by-> Acme"]
    as_json = json.loads(run("graph", "path", USER, "SKU-1", "Acme", "--json"))
    assert len(as_json) == 1 and as_json[0]["edges"] == lines[0].split(" | ")
    assert run("graph", "path", USER, "SKU-1", "nobody") == ""
    run("add", USER, "x", "--relation", "no arrow here", code=2)
    run("add", USER, "x", "--entity", "bad\x07name", code=1)
    run("graph", "path", USER, "SKU-1", "Acme", "--max-depth", "99", code=2)
    with Memory(Settings(data_dir=tmp_path / "hm", embedder="hash")) as mem:
        assert mem.count(USER) == 2
