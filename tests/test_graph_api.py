"""``Memory.graph``, ``Memory.export_graph``, ``hybridmem graph export`` and ``GET
/v1/users/{user_id}/graph``: the user's entity graph as a NetworkX DiGraph, in time (``as_of``)
and in files NetworkX reads back, the same bytes from every face; and the ``graph.json`` a clean
close leaves."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import get_args

import httpx
import networkx as nx
import pytest
from typer.testing import CliRunner

from hybridmem import InvalidInputError, Memory, Settings
from hybridmem.cli import app
from hybridmem.cli.commands import GraphFormatOpt
from hybridmem.graph import NetworkXGraphStore
from hybridmem.graph.export import graph_bytes
from hybridmem.models import GRAPH_FORMATS, GraphFormat
from hybridmem.server import create_app
from hybridmem.graph.store import GRAPH_FILE, LOG_FILE
from hybridmem.models import Entity, Extraction, Relation
from hybridmem.runtime.files import user_dir
from uvicorn_thread import serve

JAN = datetime(2026, 1, 10, tzinfo=timezone.utc)
FEB = datetime(2026, 2, 1, tzinfo=timezone.utc)
MAR = datetime(2026, 3, 10, tzinfo=timezone.utc)
USER = "client_1"


def _fill(mem: Memory) -> tuple[str, str]:
    first = mem.add(USER, "I bought the ROG laptop.", created_at=JAN).id
    second = mem.add(USER, "The Dell 4K monitor complements the ROG laptop.", created_at=MAR).id
    return first, second


@pytest.fixture()
def mem(make_settings: Callable[..., Settings]) -> Iterator[Memory]:
    with Memory(make_settings(embedder="hash")) as memory:
        yield memory


def test_graph_is_a_copy_with_the_documented_attributes(mem: Memory) -> None:
    first, second = _fill(mem)
    g = mem.graph(USER)
    assert isinstance(g, nx.DiGraph)
    assert set(g.nodes) == {e.key for e in mem.entities(USER)}
    relations = mem.relations(USER)
    assert set(g.edges) == {(r.subject_key, r.object_key) for r in relations}
    laptop = g.nodes["rog laptop"]
    assert laptop["name"] == "ROG laptop" and isinstance(laptop["type"], str)
    assert laptop["memory_ids"] == {first, second} and laptop["mentions"] == 2
    assert "ROG laptop" in laptop["aliases"]
    assert laptop["first_seen"].utcoffset() == timedelta(0)
    assert laptop["first_seen"] <= laptop["last_seen"]
    for r in relations:
        attrs = g.edges[r.subject_key, r.object_key]
        assert r.predicate in attrs["predicates"]
        assert set(attrs["evidence"][r.predicate]) == set(r.memory_ids)
        assert attrs["weight"] == len(attrs["memory_ids"])
    laptop["memory_ids"].clear()  # a copy: nothing stored changes
    g.remove_node("rog laptop")
    assert mem.graph(USER).nodes["rog laptop"]["memory_ids"] == {first, second}


def test_as_of_keeps_what_memories_recorded_by_then_support(mem: Memory) -> None:
    first, _ = _fill(mem)
    assert mem.graph(USER, as_of=datetime(2025, 1, 1)).number_of_nodes() == 0
    then = mem.graph(USER, as_of=FEB)
    assert "rog laptop" in then and "dell 4k monitor" not in then
    assert then.nodes["rog laptop"]["memory_ids"] == {first}
    assert then.nodes["rog laptop"]["mentions"] == 1
    assert all(a["memory_ids"] == {first} for _, _, a in then.edges(data=True))
    assert nx.utils.graphs_equal(mem.graph(USER, as_of=MAR), mem.graph(USER))
    assert mem.graph("nobody").number_of_nodes() == 0


def test_close_folds_the_log_into_a_graph_json_networkx_reads(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "hm", embedder="hash")
    with Memory(settings) as mem:
        _fill(mem)
        expected = mem.graph(USER)
    folder = user_dir(tmp_path / "hm", USER, create=False)
    assert not (folder / LOG_FILE).exists() or (folder / LOG_FILE).stat().st_size == 0
    data = json.loads((folder / GRAPH_FILE).read_text(encoding="utf-8"))
    g = nx.node_link_graph(data["graph"], edges="edges")
    assert set(g.nodes) == set(expected.nodes) and set(g.edges) == set(expected.edges)
    with Memory(settings) as again:
        assert nx.utils.graphs_equal(again.graph(USER), expected)


def _ex(subject: str, obj: str) -> Extraction:
    return Extraction(entities=[Entity(name=subject), Entity(name=obj)],
                      relations=[Relation(subject=subject, predicate="likes", object=obj)],
                      extractor="test")


def test_close_folds_users_the_cache_let_go_and_writes_of_another_store(tmp_path: Path) -> None:
    store = NetworkXGraphStore(tmp_path, max_open=1)
    other = NetworkXGraphStore(tmp_path)
    for i in range(3):  # one user in the cache at a time: the others were let go, logs unfolded
        store.add_extractions(f"u{i}", [(f"m{i}", _ex("alice", f"thing {i}"))])
    other.add_extractions("u0", [("m9", _ex("bob", "thing 9"))])
    store.close()
    for i in range(3):
        folder = user_dir(tmp_path, f"u{i}", create=False)
        assert (folder / LOG_FILE).stat().st_size == 0
        data = json.loads((folder / GRAPH_FILE).read_text(encoding="utf-8"))
        g = nx.node_link_graph(data["graph"], edges="edges")
        assert ("alice", f"thing {i}") in g.edges
    assert "bob" in NetworkXGraphStore(tmp_path).graph("u0")  # the other store's write was kept
    other.close()


def test_cli_exports_graphml_gexf_and_node_link_that_networkx_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir = tmp_path / "hm"
    with Memory(Settings(data_dir=data_dir, embedder="hash")) as mem:
        _fill(mem)
        expected = mem.graph(USER)
    monkeypatch.setenv("HYBRIDMEM_EMBEDDER", "hash")
    runner = CliRunner()
    readers = {"graphml": nx.read_graphml, "gexf": nx.read_gexf}
    for fmt, read in readers.items():
        out = tmp_path / f"g.{fmt}"
        result = runner.invoke(app, ["graph", "export", USER, "--format", fmt, "--out", str(out),
                                     "--data-dir", str(data_dir)])
        assert result.exit_code == 0, result.output
        back = read(out)
        assert set(back.nodes) == set(expected.nodes), fmt
        assert set(back.edges) == set(expected.edges), fmt
        node = back.nodes["rog laptop"]
        assert node["name"] == "ROG laptop" and node["mentions"] == 2
        assert set(json.loads(node["memory_ids"])) == expected.nodes["rog laptop"]["memory_ids"]
        assert node["first_seen"] == expected.nodes["rog laptop"]["first_seen"].isoformat()
    result = runner.invoke(app, ["graph", "export", USER, "--data-dir", str(data_dir)])
    assert result.exit_code == 0, result.output
    back = nx.node_link_graph(json.loads(result.stdout), edges="edges")
    assert set(back.nodes) == set(expected.nodes) and set(back.edges) == set(expected.edges)
    assert sorted(back.nodes["rog laptop"]["memory_ids"]) == sorted(
        expected.nodes["rog laptop"]["memory_ids"])
    result = runner.invoke(app, ["graph", "export", USER, "--as-of", "2025-01-01",
                                 "--data-dir", str(data_dir)])
    assert json.loads(result.stdout)["nodes"] == []
    result = runner.invoke(app, ["graph", "export", USER, "--format", "svg"])
    assert result.exit_code == 2
    result = runner.invoke(app, ["graph", "export", "", "--data-dir", str(data_dir)])
    assert result.exit_code == 1 and "error:" in result.output


def test_rest_serves_the_graph_networkx_reads_back_in_every_format(mem: Memory) -> None:
    first, _ = _fill(mem)
    expected = mem.graph(USER)
    with serve(create_app(mem, api_keys=[])) as url, httpx.Client(base_url=url, timeout=30) as c:
        path = f"/v1/users/{USER}/graph"
        got = c.get(path, params={"format": "graphml"})
        assert got.status_code == 200, got.text
        assert got.headers["content-type"] == "application/graphml+xml"
        back = nx.read_graphml(io.BytesIO(got.content))
        assert set(back.nodes) == set(expected.nodes) and set(back.edges) == set(expected.edges)
        node = back.nodes["rog laptop"]
        assert node["mentions"] == 2 and set(json.loads(node["memory_ids"])) == (
            expected.nodes["rog laptop"]["memory_ids"])
        # one serialiser for every face: the body is the bytes the library writes
        assert got.content == mem.export_graph(USER, format="graphml")

        got = c.get(path, params={"format": "gexf"})
        assert got.headers["content-type"] == "application/gexf+xml"
        back = nx.read_gexf(io.BytesIO(got.content))
        assert set(back.nodes) == set(expected.nodes) and set(back.edges) == set(expected.edges)

        got = c.get(path)  # node-link JSON by default
        assert got.headers["content-type"] == "application/json"
        back = nx.node_link_graph(got.json(), edges="edges")
        assert set(back.nodes) == set(expected.nodes) and set(back.edges) == set(expected.edges)

        then = c.get(path, params={"as_of": FEB.isoformat(), "format": "graphml"})
        back = nx.read_graphml(io.BytesIO(then.content))
        assert set(back.nodes) == set(mem.graph(USER, as_of=FEB).nodes)
        assert "dell 4k monitor" not in back and json.loads(
            back.nodes["rog laptop"]["memory_ids"]) == [first]
        assert c.get(path, params={"as_of": "2025-01-01"}).json()["nodes"] == []

        bad = c.get(path, params={"format": "svg"})
        assert bad.status_code == 422 and "graphml" in bad.text
        bad = c.get("/v1/users/a..b/graph")
        assert bad.status_code == 422 and bad.json()["error"]["type"] == "InvalidUserIdError"
        doc = c.get("/openapi.json").json()["paths"]["/v1/users/{user_id}/graph"]["get"]
        assert doc["operationId"] == "graph"
        assert set(doc["responses"]["200"]["content"]) == set(GRAPH_FORMATS.values())


def test_one_list_of_formats_for_every_face(mem: Memory) -> None:
    assert set(GRAPH_FORMATS) == set(get_args(GraphFormat)) == {f.value for f in GraphFormatOpt}
    for bad in ("svg", "GraphML", None):
        with pytest.raises(InvalidInputError, match="node-link, graphml, gexf"):
            mem.export_graph(USER, format=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError):
            graph_bytes(nx.DiGraph(), bad)  # type: ignore[arg-type]
    assert nx.node_link_graph(json.loads(mem.export_graph(USER)), edges="edges").number_of_nodes() == 0
