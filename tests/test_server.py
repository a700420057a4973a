"""The REST service over a real uvicorn on 127.0.0.1, driven with httpx (no TestClient)."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import TypeAdapter

from hybridmem import AsyncMemory, Memory, Settings, __version__
from hybridmem.errors import ConfigError
from hybridmem.models import Hit
from hybridmem.offline import LocalEmbedder
from hybridmem.server import create_app
from openai_wire import OpenAIWireServer, Reply
from uvicorn_thread import free_port, serve

KEYS = "alpha-key-0123, beta-key-4567"
BODY_LIMIT = 100_000




@dataclass
class Service:
    url: str
    memory: Memory

    def client(self, key: str | None = "beta-key-4567") -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


@pytest.fixture(scope="module", params=["embedded", "server"])
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
    embedder: LocalEmbedder,
) -> Iterator[Service]:
    """One service per Chroma mode (embedded, and a real `chroma run`), keys from settings (two
    of them); tests use their own users."""
    chroma_url = request.getfixturevalue("chroma_server") if request.param == "server" else None
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("server") / "hm", server_api_key=KEYS,
        extractor="rules", base_url=None, chroma_url=chroma_url,
    )
    with Memory(settings, embedder=embedder) as memory:
        with serve(create_app(memory, max_body_bytes=BODY_LIMIT)) as url:
            yield Service(url, memory)


@pytest.fixture()
def client(service: Service) -> Iterator[httpx.Client]:
    with service.client() as c:
        yield c


def memories(user: str) -> str:
    return f"/v1/users/{user}/memories"


# -- service and auth ----------------------------------------------------------------------------
def test_health_needs_no_key(service: Service) -> None:
    with service.client(key=None) as c:
        response = c.get("/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "version": __version__}


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-key"},
        {"Authorization": "Bearer alpha-key-0123x"},
        {"Authorization": "Basic alpha-key-0123"},
        {"Authorization": "alpha-key-0123"},
        {"Authorization": "Bearer"},
    ],
    ids=["none", "wrong", "prefix", "basic", "no-scheme", "empty"],
)
def test_v1_refuses_a_missing_or_wrong_key(
    service: Service, unique_user: str, headers: dict[str, str]
) -> None:
    with httpx.Client(base_url=service.url, headers=headers) as c:
        answers = [
            c.get(memories(unique_user)),
            c.post(memories(unique_user), json={"text": "should not be stored"}),
            c.post(memories(unique_user), content=b"{not json"),  # 401 before any parsing
            c.delete(f"/v1/users/{unique_user}"),
            c.get("/v1/no-such-route"),
        ]
    for response in answers:
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.json()["error"]["type"] == "AuthenticationError"
    assert service.memory.count(unique_user) == 0


@pytest.mark.parametrize("key", ["alpha-key-0123", "beta-key-4567"])
def test_each_configured_key_is_accepted(service: Service, unique_user: str, key: str) -> None:
    with service.client(key=key) as c:
        assert c.post(memories(unique_user), json={"text": "key accepted"}).status_code == 201
        assert c.get(memories(unique_user)).status_code == 200


def test_logs_name_the_route_template_never_key_user_or_text(
    client: httpx.Client, unique_user: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="hybridmem.server.app"):
        client.post(memories(unique_user), json={"text": "my locker code is zebra-771"})
        httpx.get(client.base_url.join(memories(unique_user)))  # refused: no key
    lines = [r.getMessage() for r in caplog.records if r.name == "hybridmem.server.app"]
    assert any(line.startswith("POST /v1/users/{user_id}/memories 201 ") for line in lines)
    assert any(" 401 " in line for line in lines)
    for secret in ("zebra-771", "beta-key-4567", unique_user):
        assert secret not in caplog.text


# -- memories ------------------------------------------------------------------------------------
def test_memory_lifecycle(client: httpx.Client, service: Service, unique_user: str) -> None:
    one = client.post(
        memories(unique_user),
        json={"text": "Bought a ROG laptop", "category": "purchase", "importance": 0.8,
              "metadata": {"order": 1234, "channel": "web"}, "created_at": "2024-05-01T10:00:00Z"},
    )
    assert one.status_code == 201
    item = one.json()
    assert item["user_id"] == unique_user and item["category"] == "purchase"
    assert item["metadata"] == {"order": 1234, "channel": "web"}
    assert item["created_at"].startswith("2024-05-01T10:00:00")

    many = client.post(
        f"{memories(unique_user)}/batch",
        params={"infer": "false"},
        json={"memories": [{"text": "Prefers 4K monitors"}, {"text": "Lives in Lyon",
                                                             "category": "profile"}]},
    )
    assert many.status_code == 201
    assert [m["text"] for m in many.json()] == ["Prefers 4K monitors", "Lives in Lyon"]

    listed = client.get(memories(unique_user)).json()
    assert [m["text"] for m in listed][0] == "Bought a ROG laptop"  # oldest first
    assert len(listed) == 3
    assert len(client.get(memories(unique_user), params={"limit": 1, "offset": 1}).json()) == 1
    profile = client.get(memories(unique_user), params={"category": "profile"}).json()
    assert [m["text"] for m in profile] == ["Lives in Lyon"]

    url = f"{memories(unique_user)}/{item['id']}"
    assert client.get(url).json()["text"] == "Bought a ROG laptop"
    patched = client.patch(url, json={"text": "Bought a ROG Strix laptop", "importance": 0.9})
    assert patched.status_code == 200
    assert patched.json()["text"] == "Bought a ROG Strix laptop"
    assert patched.json()["importance"] == 0.9
    assert patched.json()["category"] == "purchase"  # untouched fields stay
    assert patched.json()["metadata"] == {"order": 1234, "channel": "web"}
    replaced = client.patch(url, json={"metadata": {"order": 1234}})  # metadata is replaced whole
    assert replaced.json()["metadata"] == {"order": 1234}
    assert client.patch(url, json={"metadata": {}}).json()["metadata"] == {}
    assert client.get(url).json()["metadata"] == {}

    exported = client.get(f"/v1/users/{unique_user}/export").json()
    assert exported["user_id"] == unique_user
    assert {m["text"] for m in exported["memories"]} == {
        "Bought a ROG Strix laptop", "Prefers 4K monitors", "Lives in Lyon"}

    assert client.delete(url).json() == {"deleted": 1}
    assert client.get(url).status_code == 404
    assert client.delete(f"/v1/users/{unique_user}").json() == {"deleted": 2}
    assert client.get(memories(unique_user)).json() == []
    assert service.memory.count(unique_user) == 0


def test_identical_text_is_returned_not_stored_twice(
    client: httpx.Client, unique_user: str
) -> None:
    first = client.post(memories(unique_user), json={"text": "Owns a cat named Miso"}).json()
    again = client.post(memories(unique_user), json={"text": "owns a cat named miso!"}).json()
    assert again["id"] == first["id"] and again["mention_count"] == 2
    assert len(client.get(memories(unique_user)).json()) == 1


def test_search_and_context(client: httpx.Client, unique_user: str) -> None:
    client.post(f"{memories(unique_user)}/batch", json={"memories": [
        {"text": "Bought a ROG Strix gaming laptop in March", "category": "purchase"},
        {"text": "Is allergic to peanuts", "category": "health"},
        {"text": "Wants a 4K monitor for photo editing", "category": "wish"},
    ]})
    hits = client.post(f"/v1/users/{unique_user}/search",
                       json={"query": "which laptop did they buy?", "limit": 2})
    assert hits.status_code == 200
    body = hits.json()
    assert [h["item"]["text"] for h in body] == ["Bought a ROG Strix gaming laptop in March",
                                                 "Wants a 4K monitor for photo editing"]
    assert body[0]["why"] and "fused" in body[0]["breakdown"]
    # written out without FastAPI's second validation: still exactly list[Hit] as JSON
    assert hits.headers["content-type"] == "application/json"
    as_hits = TypeAdapter(list[Hit])
    assert as_hits.dump_python(as_hits.validate_json(hits.content), mode="json") == body
    only = client.post(f"/v1/users/{unique_user}/search",
                       json={"query": "laptop", "category": "health"}).json()
    assert [h["item"]["text"] for h in only] == ["Is allergic to peanuts"]

    ctx = client.post(f"/v1/users/{unique_user}/context",
                      json={"query": "monitor for my laptop", "max_tokens": 40})
    assert ctx.status_code == 200
    monitor = body[1]["item"]["created_at"][:10]
    # 32 o200k tokens, counted once with tiktoken; the laptop line would not fit in 40
    assert ctx.json() | {"lines": None} == {
        "text": f"<memory>\nMemories (most relevant first):\n- [{monitor}] Wants a 4K monitor "
                "for photo editing\n</memory>",
        "tokens": 32, "max_tokens": 40, "lines": None, "encoding": "o200k_base"}
    assert [line["memory_id"] for line in ctx.json()["lines"]] == [body[1]["item"]["id"]]


# -- errors --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/memories", {"text": ""}),
        ("post", "/memories", {"text": "   "}),
        ("post", "/memories", {"text": "x", "importance": 1.5}),
        ("post", "/memories", {"text": "x", "metadata": {"nested": {"a": 1}}}),
        ("post", "/memories", {"text": "x", "metadata": {"tags": ["a", "b"]}}),
        ("post", "/memories", {"text": "x", "colour": "red"}),
        ("post", "/memories", {"memories": [{"text": "one shape: use /memories/batch"}]}),
        ("post", "/memories/batch", {"memories": []}),
        ("post", "/memories/batch", {"memories": [{"text": "ok"}, {"text": ""}]}),
        ("post", "/memories/batch", {"text": "a single memory"}),
        ("post", "/memories", None),
        ("post", "/messages", {"messages": [{"role": "robot", "content": "beep"}]}),
        ("post", "/messages", {"messages": []}),
        ("post", "/facts", {"key": "", "value": "x"}),
        ("post", "/search", {"query": "x", "limit": 0}),
        ("post", "/search", {"query": ""}),
        ("post", "/context", {"query": "x", "max_tokens": 0}),
        ("post", "/chat", {"message": ""}),
    ],
)
def test_bad_bodies_are_422(
    client: httpx.Client, service: Service, unique_user: str, method: str, path: str, body: Any
) -> None:
    url = f"/v1/users/{unique_user}{path}"
    response = (client.request(method, url, content=b"{not json")
                if body is None else client.request(method, url, json=body))
    assert response.status_code == 422
    assert response.json()["error"]["type"] == "RequestValidationError"
    assert response.json()["error"]["message"]
    assert service.memory.count(unique_user) == 0


def test_bad_query_parameters_are_422(client: httpx.Client, unique_user: str) -> None:
    for params in ({"limit": 0}, {"limit": 1001}, {"offset": -1}, {"kind": "note"}):
        response = client.get(memories(unique_user), params=params)
        assert response.status_code == 422, params


@pytest.mark.parametrize("user", ["%2E%2E", "a..b", "%20"])
def test_bad_user_ids_are_422_by_class(client: httpx.Client, user: str) -> None:
    for response in (
        client.get(f"/v1/users/{user}/memories"),
        client.post(f"/v1/users/{user}/memories", json={"text": "x"}),
        client.post(f"/v1/users/{user}/search", json={"query": "x"}),
    ):
        assert response.status_code == 422
        assert response.json()["error"]["type"] == "InvalidUserIdError"


def test_ids_that_are_not_utf8_are_422_by_class(client: httpx.Client, unique_user: str) -> None:
    """A lone surrogate percent-encoded (%ED%A0%80 is U+D800 in UTF-8's form) reaches the
    service as U+FFFD: refused as a bad id of the right class, never a 500."""
    lone = "%ED%A0%80"
    client.post(memories(unique_user), json={"text": "already here"})
    for response, kind in (
        (client.get(f"/v1/users/a{lone}/memories"), "InvalidUserIdError"),
        (client.get(f"/v1/users/{lone}/history"), "InvalidUserIdError"),
        (client.get(f"{memories(unique_user)}/ab{lone}"), "InvalidInputError"),
        (client.delete(f"{memories(unique_user)}/ab{lone}"), "InvalidInputError"),
        (client.patch(f"{memories(unique_user)}/{lone}", json={"text": "x"}), "InvalidInputError"),
        (client.get(f"/v1/users/{unique_user}/history?memory_id=ab{lone}"), "InvalidInputError"),
    ):
        assert (response.status_code, response.json()["error"]["type"]) == (422, kind), \
            response.request.url
    assert [m["text"] for m in client.get(memories(unique_user)).json()] == ["already here"]


def test_unknown_memory_is_404(client: httpx.Client, unique_user: str) -> None:
    url = f"{memories(unique_user)}/0123456789abcdef"
    for response in (client.get(url), client.patch(url, json={"importance": 0.1}),
                     client.delete(url)):
        assert response.status_code == 404
        assert response.json()["error"]["type"] == "NotFoundError"
    assert client.get("/v1/users/x/nothing-here").status_code == 404


def test_users_are_isolated(client: httpx.Client, unique_user: str) -> None:
    alice, bob = f"{unique_user}-alice", f"{unique_user}-bob"
    secret = client.post(memories(alice), json={"text": "My safe combination is 31-7-22, "
                                                "kept behind the blue painting"}).json()
    client.post(memories(bob), json={"text": "Likes hiking in the Alps"})
    for query in ("safe combination blue painting", "31-7-22", "what is behind the painting"):
        hits = client.post(f"/v1/users/{bob}/search", json={"query": query, "limit": 50}).json()
        assert all(h["item"]["user_id"] == bob for h in hits)
        assert secret["id"] not in {h["item"]["id"] for h in hits}
        ctx = client.post(f"/v1/users/{bob}/context", json={"query": query}).json()
        assert "31-7-22" not in ctx["text"]
    assert client.get(f"{memories(bob)}/{secret['id']}").status_code == 404
    assert client.delete(f"{memories(bob)}/{secret['id']}").status_code == 404
    assert client.delete(f"/v1/users/{bob}").json() == {"deleted": 1}
    assert client.get(f"{memories(alice)}/{secret['id']}").status_code == 200


def test_body_over_the_limit_is_413(
    client: httpx.Client, service: Service, unique_user: str
) -> None:
    big = json.dumps({"memories": [{"text": "x" * 10_000 + str(i)} for i in range(12)]}).encode()
    assert len(big) > BODY_LIMIT
    declared = client.post(memories(unique_user), content=big,
                           headers={"Content-Type": "application/json"})
    chunked = client.post(
        memories(unique_user), content=iter([big[i : i + 8192] for i in range(0, len(big), 8192)]),
        headers={"Content-Type": "application/json"},
    )
    for response in (declared, chunked):
        assert response.status_code == 413
        assert response.json()["error"]["type"] == "RequestTooLarge"
    assert service.memory.count(unique_user) == 0
    # Just under the limit, chunked: read whole and replayed to the route.
    fits = json.dumps({"memories": [{"text": "y" * 10_000 + str(i)} for i in range(9)]}).encode()
    assert len(fits) < BODY_LIMIT
    pieces = [fits[i : i + 4096] for i in range(0, len(fits), 4096)]
    response = client.post(f"{memories(unique_user)}/batch", content=iter(pieces),
                           headers={"Content-Type": "application/json"})
    assert response.status_code == 201 and len(response.json()) == 9


def test_a_body_limit_must_be_positive(service: Service) -> None:
    with pytest.raises(ConfigError, match="max_body_bytes"):
        create_app(service.memory, max_body_bytes=0)


ROUTES = {
    "/health": {"get": "health"},
    "/ready": {"get": "ready"},
    "/metrics": {"get": "metrics_text"},
    "/v1/users/{user_id}/memories": {"get": "list_memories", "post": "add_memory"},
    "/v1/users/{user_id}/memories/batch": {"post": "add_memories"},
    "/v1/users/{user_id}/memories/{memory_id}": {
        "get": "get_memory", "patch": "update_memory", "delete": "delete_memory"},
    "/v1/users/{user_id}/messages": {"post": "add_messages"},
    "/v1/users/{user_id}/prune": {"post": "prune"},
    "/v1/users/{user_id}/history": {"get": "history"},
    "/v1/users/{user_id}/facts": {"get": "facts", "post": "remember"},
    "/v1/users/{user_id}/search": {"post": "search"},
    "/v1/users/{user_id}/context": {"post": "context"},
    "/v1/users/{user_id}/entities": {"get": "entities"},
    "/v1/users/{user_id}/relations": {"get": "relations"},
    "/v1/users/{user_id}/path": {"get": "query_path"},
    "/v1/users/{user_id}/graph": {"get": "graph"},
    "/v1/users/{user_id}/paths": {"get": "query_paths"},
    "/v1/users/{user_id}/chat": {"post": "chat"},
    "/v1/users/{user_id}/stats": {"get": "stats"},
    "/v1/users/{user_id}/export": {"get": "export"},
    "/v1/users/{user_id}/import": {"post": "import_bundle"},
    "/v1/users/{user_id}": {"delete": "delete_user"},
    "/v1/chat/completions": {"post": "chat_completions"},
    "/v1/models": {"get": "list_models"},
}
#: The OpenAI-compatible routes answer a bad body with OpenAI's 400, not a 422.
OPENAI_ROUTES = {"/v1/chat/completions", "/v1/models"}


def test_openapi_lists_every_route_with_its_operation_id_and_one_error_body(
    service: Service,
) -> None:
    spec = httpx.get(f"{service.url}/openapi.json").json()
    paths = spec["paths"]
    assert {p: {m: op["operationId"] for m, op in ops.items()} for p, ops in paths.items()} == ROUTES
    assert "HTTPBearer" in spec["components"]["securitySchemes"]
    assert paths["/v1/users/{user_id}/search"]["post"]["security"] == [{"HTTPBearer": []}]
    assert "security" not in paths["/health"]["get"]
    schemas = spec["components"]["schemas"]
    for schema in ("MemoryItem", "Hit", "Context", "ChatReply", "SearchBody", "HistoryEvent",
                   "GraphEntity", "GraphRelation", "UserStats", "ErrorBody"):
        assert schema in schemas
    assert "HTTPValidationError" not in schemas  # FastAPI's default 422 body is not what we send
    error_ref = {"$ref": "#/components/schemas/ErrorBody"}
    # the service's own routes (outside /v1) document the errors they can answer
    service_routes = {"/health": (), "/ready": ("421", "503"), "/metrics": ("401", "421")}
    for path, ops in paths.items():
        for method, op in ops.items():
            statuses = service_routes.get(path, ("401", "404", "413", "421", "503") + (
                ("400",) if path in OPENAI_ROUTES else ("422",)))
            for status in statuses:
                body = op["responses"][status]["content"]["application/json"]["schema"]
                assert body == error_ref, (path, method, status)
    assert set(schemas["ErrorBody"]["properties"]) == {"error", "detail"}
    found = paths["/v1/users/{user_id}/search"]["post"]["responses"]["200"]
    assert found["content"]["application/json"]["schema"]["items"] == {
        "$ref": "#/components/schemas/Hit"}
    created = paths["/v1/users/{user_id}/memories"]["post"]["responses"]["201"]
    assert created["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/MemoryItem"}  # one shape: one memory in, one out


def test_docs_pages_load_every_asset_from_the_service(service: Service) -> None:
    """/docs and /redoc work offline: every script, style, icon and schema they name is a path on
    this service (no scheme, no host, no CDN) and answers 200 with content, with no key."""
    with service.client(key=None) as c:
        for page in ("/docs", "/redoc"):
            response = c.get(page)
            assert response.status_code == 200
            html = response.text
            assert "http://" not in html and "https://" not in html and "cdn" not in html
            urls = re.findall(r'(?:src|href|spec-url)="([^"]+)"|url: \'([^\']+)\'', html)
            assets = {a or b for a, b in urls}
            assert len(assets) >= 3, assets  # a script, the icon, the schema (+ a style)
            for asset in assets:
                assert asset.startswith("/") and not asset.startswith("//"), asset
                loaded = c.get(asset)
                assert loaded.status_code == 200, asset
                assert len(loaded.content) > 1000, asset
        assert '"validatorUrl": null' in c.get("/docs").text  # no badge fetched from elsewhere
        assert c.get("/docs/oauth2-redirect").status_code == 200
        assert "cdn" not in c.get("/openapi.json").text.lower()


def test_conversations_history_and_facts(client: httpx.Client, unique_user: str) -> None:
    base = f"/v1/users/{unique_user}"
    turns = client.post(f"{base}/messages", json={"messages": [
        {"role": "user", "content": "My cat Miso knocked my monitor off the desk."},
        {"role": "assistant", "content": "A monitor arm would keep it out of reach."},
    ]})
    assert turns.status_code == 201
    assert [(t["kind"], t["source"]) for t in turns.json()] == [("turn", "user"),
                                                                ("turn", "assistant")]
    fact = client.post(memories(unique_user), json={"text": "Lives in Lyon"}).json()
    only_turns = client.get(memories(unique_user), params={"kind": "turn"}).json()
    assert [m["kind"] for m in only_turns] == ["turn", "turn"]
    assert [m["id"] for m in client.get(memories(unique_user),
                                        params={"kind": "fact"}).json()] == [fact["id"]]

    first = client.post(f"{base}/facts", json={"key": "city", "value": "Lyon"})
    second = client.post(f"{base}/facts", json={"key": "city", "value": "Paris",
                                               "category": "profile"})
    assert first.status_code == second.status_code == 200
    assert second.json()["key"] == "city" and "Paris" in second.json()["text"]
    current = client.get(f"{base}/facts").json()
    assert [(f["key"], f["text"]) for f in current] == [("city", second.json()["text"])]
    assert client.get(f"{base}/facts", params={"category": "health"}).json() == []

    events = client.get(f"{base}/history").json()
    assert {"add", "supersede"} <= {e["action"] for e in events}
    mine = client.get(f"{base}/history", params={"memory_id": fact["id"]}).json()
    assert [e["action"] for e in mine] == ["add"] and mine[0]["memory_id"] == fact["id"]


def test_graph_stats_and_import(client: httpx.Client, service: Service, unique_user: str) -> None:
    base = f"/v1/users/{unique_user}"
    client.post(f"{memories(unique_user)}/batch", json={"memories": [
        {"text": "I bought the ROG Strix laptop."},
        {"text": "The Dell 4K monitor complements the ROG Strix laptop."},
    ]})
    entities = client.get(f"{base}/entities").json()
    relations = client.get(f"{base}/relations").json()
    assert entities == [e.model_dump(mode="json") for e in service.memory.entities(unique_user)]
    assert relations == [r.model_dump(mode="json") for r in service.memory.relations(unique_user)]
    assert any(r["predicate"] == "complements" for r in relations)
    path = client.get(f"{base}/path", params={"a": unique_user, "b": "Dell 4K monitor"})
    assert path.status_code == 200
    assert path.json() == service.memory.query_path(unique_user, unique_user, "Dell 4K monitor")
    assert any("-complements->" in edge for edge in path.json())
    assert client.get(f"{base}/path", params={"a": "x", "b": "y", "max_depth": 9}
                      ).status_code == 422  # the work cap
    stats = client.get(f"{base}/stats").json()
    assert stats == service.memory.stats(unique_user).model_dump(mode="json")
    assert stats["memories"] == 2 and stats["relations"] >= 2

    bundle = client.get(f"{base}/export").json()
    copy = f"{unique_user}-copy"
    imported = client.post(f"/v1/users/{copy}/import", json=bundle)
    assert imported.status_code == 201 and imported.json() == {"imported": 2}
    refused = client.post(f"/v1/users/{copy}-2/import", json={"format": "not-an-export"})
    assert refused.status_code == 422 and refused.json()["error"]["type"] == "InvalidInputError"
    assert sorted(m["text"] for m in client.get(memories(copy)).json()) == sorted(
        m["text"] for m in bundle["memories"])


def test_one_memory_posted_as_a_batch_is_told_where_batches_go(
    client: httpx.Client, unique_user: str
) -> None:
    response = client.post(memories(unique_user), json={"memories": [{"text": "x"}]})
    assert response.status_code == 422
    assert "/memories/batch" in response.json()["error"]["message"]


THINGS = (
    "kayak piano tulip saxophone glacier lantern bonsai violin compass meteor harbour quilt "
    "falcon cactus trumpet volcano origami walrus sapphire tractor bagpipe lighthouse mango "
    "parachute cathedral hedgehog telescope waffle jellyfish accordion canyon pretzel zeppelin "
    "orchid anvil flamingo igloo marimba sundial tornado"
).split()


def test_concurrent_adds_for_one_user_all_land(service: Service, unique_user: str) -> None:
    # Texts far apart (token Jaccard <= 0.5, so no near-duplicate merging): 8 threads x 5.
    def worker(thread: int) -> list[int]:
        with service.client() as c:
            return [
                c.post(memories(unique_user), json={
                    "text": f"Owns a {THINGS[thread * 5 + n]}"
                }).status_code
                for n in range(5)
            ]

    with ThreadPoolExecutor(max_workers=8) as pool:
        statuses = [s for result in pool.map(worker, range(8)) for s in result]
    assert statuses == [201] * 40
    assert service.memory.count(unique_user) == 40
    with service.client() as c:
        listed = c.get(memories(unique_user), params={"limit": 1000}).json()
    assert len({m["id"] for m in listed}) == 40


# -- chat through a real OpenAI-wire server ------------------------------------------------------
@pytest.fixture(scope="module")
def _chat_service(
    _openai_wire_session: OpenAIWireServer, embedder: LocalEmbedder,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Service]:
    settings = Settings(data_dir=tmp_path_factory.mktemp("chat") / "hm",
                        base_url=_openai_wire_session.base_url, api_key="sk-test", max_retries=0,
                        extractor="rules", server_api_key=None)
    with Memory(settings, embedder=embedder) as memory:
        with serve(create_app(memory)) as url:
            yield Service(url, memory)


@pytest.fixture()
def chat_service(_chat_service: Service, openai_server: OpenAIWireServer) -> Service:
    """No keys configured (the loopback mode: open without a bearer key), pointed at the session's
    OpenAI-wire server, which ``openai_server`` resets around each test."""
    return _chat_service


def _seed(c: httpx.Client, user: str) -> None:
    c.post(memories(user), json={"text": "Bought a ROG Strix laptop with a USB-C port"})
    c.post(memories(user), json={"text": "Lives in Lyon"})


QUESTION = "Which monitor would suit my ROG laptop?"


def test_chat_sends_the_context_to_the_endpoint(
    chat_service: Service, openai_server: OpenAIWireServer, unique_user: str
) -> None:
    with chat_service.client(key=None) as c:
        _seed(c, unique_user)
        response = c.post(f"/v1/users/{unique_user}/chat",
                          json={"message": QUESTION, "max_context_tokens": 200})
    assert response.status_code == 200
    reply = response.json()
    assert reply["text"] == f"ok: {QUESTION}"
    assert "ROG Strix laptop" in reply["context"]["text"]
    assert reply["context"]["tokens"] <= 200
    answer, distilled = openai_server.requests_to("chat")  # the reply, then the exchange's facts
    assert "ROG Strix laptop" in answer.text and QUESTION in answer.text
    assert answer.api_key == "sk-test"
    assert distilled.body["response_format"]["json_schema"]["name"] == "distill_key_facts"
    assert chat_service.memory.count(unique_user) == 4  # the exchange is remembered


def _sse_events(response: httpx.Response) -> list[str]:
    return [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]


def test_chat_streams_server_sent_events(
    chat_service: Service, openai_server: OpenAIWireServer, unique_user: str
) -> None:
    with chat_service.client(key=None) as c:
        _seed(c, unique_user)
        with c.stream("POST", f"/v1/users/{unique_user}/chat",
                      json={"message": QUESTION, "stream": True}) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            events = _sse_events(response)
    assert events[-1] == "[DONE]"
    deltas = [json.loads(e)["delta"] for e in events[:-1]]
    assert len(deltas) > 1
    assert "".join(deltas) == f"ok: {QUESTION}"
    answer, distilled = openai_server.requests_to("chat")  # the reply, then the exchange's facts
    assert answer.body["stream"] is True and "stream" not in distilled.body
    assert "ROG Strix laptop" in answer.text
    assert chat_service.memory.count(unique_user) == 4


@pytest.mark.parametrize(
    ("reply", "status", "kind"),
    [(Reply.error(429), 429, "BackendRateLimitError"),
     (Reply.error(401), 502, "BackendAuthError"),
     (Reply.error(503), 503, "BackendUnavailableError")],
)
@pytest.mark.parametrize("stream", [False, True])
def test_endpoint_failures_map_by_class(
    chat_service: Service, openai_server: OpenAIWireServer, unique_user: str,
    reply: Reply, status: int, kind: str, stream: bool,
) -> None:
    openai_server.script(reply)
    with chat_service.client(key=None) as c:
        response = c.post(f"/v1/users/{unique_user}/chat",
                          json={"message": "hello there", "stream": stream})
    assert response.status_code == status  # a failing stream fails before the first event
    assert response.json()["error"]["type"] == kind
    assert "sk-test" not in response.text
    assert chat_service.memory.count(unique_user) == 0


def _wait_for_chat_request(openai_server: OpenAIWireServer) -> None:
    """Until the endpoint has received the chat request (the slow reply is then in flight)."""
    deadline = time.monotonic() + 60
    while not openai_server.requests_to("chat"):
        assert time.monotonic() < deadline, "the chat request never reached the endpoint"
        time.sleep(0.02)


def test_a_slow_request_of_one_user_holds_up_no_other_user(
    chat_service: Service, openai_server: OpenAIWireServer, unique_user: str
) -> None:
    openai_server.script(Reply.held_back())
    other = unique_user + "-other"
    with ThreadPoolExecutor(1) as pool, chat_service.client(key=None) as c:
        slow = pool.submit(c.post, f"/v1/users/{unique_user}/chat", json={"message": "hi"})
        _wait_for_chat_request(openai_server)
        with chat_service.client(key=None) as d:
            assert d.post(memories(other), json={"text": "Lives in Lyon"}).status_code == 201
            found = d.post(f"/v1/users/{other}/context", json={"query": "where do I live?"})
        assert found.status_code == 200 and "Lyon" in found.json()["text"]
        assert not slow.done()  # the other user was answered while the slow chat was waiting
        openai_server.release()
        assert slow.result().status_code == 200


def test_a_request_that_cannot_start_is_refused_before_it_runs(
    chat_service: Service, openai_server: OpenAIWireServer, unique_user: str
) -> None:
    """With every slot taken, a request waits ``queue_timeout`` then gets 503 + Retry-After and
    has had no effect; /health is not gated; once the slot frees, the same request succeeds."""
    openai_server.script(Reply.held_back())
    app = create_app(AsyncMemory.from_memory(chat_service.memory), max_inflight=1,
                     queue_timeout=0.3)
    other = unique_user + "-other"
    with serve(app) as url, httpx.Client(base_url=url, timeout=60) as c, \
            ThreadPoolExecutor(1) as pool:
        slow = pool.submit(c.post, f"/v1/users/{unique_user}/chat", json={"message": "hi"})
        _wait_for_chat_request(openai_server)
        refused = c.post(memories(other), json={"text": "Lives in Lyon"})
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["type"] == "ServerBusy"
        assert c.get("/health").status_code == 200
        assert chat_service.memory.count(other) == 0
        openai_server.release()
        assert slow.result().status_code == 200
        assert c.post(memories(other), json={"text": "Lives in Lyon"}).status_code == 201


def test_create_app_refuses_what_is_not_a_memory() -> None:
    with pytest.raises(ConfigError):
        create_app(object())  # type: ignore[arg-type]


# -- CLI -----------------------------------------------------------------------------------------
def test_serve_refuses_a_public_host_without_a_key(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYBRIDMEM_", "OPENAI_"))}
    done = subprocess.run(
        [sys.executable, "-m", "hybridmem.cli", "serve", "--host", "0.0.0.0",
         "--data-dir", str(tmp_path / "hm")],
        capture_output=True, text=True, timeout=30, env=env,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "refusing" in lines[0] and "HYBRIDMEM_SERVER_API_KEY" in lines[0]
    assert not (tmp_path / "hm").exists()  # refused before touching any store


# -- the Host allow-list (DNS rebinding) -------------------------------------------------------------
def test_a_foreign_host_is_refused_by_default(
    embedder: LocalEmbedder, tmp_path: Path, unique_user: str
) -> None:
    settings = Settings(data_dir=tmp_path / "hm", extractor="rules")
    with Memory(settings, embedder=embedder) as memory:
        with serve(create_app(memory, api_keys=[])) as url, httpx.Client(base_url=url) as c:
            port = url.rsplit(":", 1)[1]
            for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example",
                         "localhost.", ""):
                for response in (c.get("/health", headers={"Host": host}),
                                 c.post(memories(unique_user), json={"text": "planted"},
                                        headers={"Host": host}),
                                 c.get("/openapi.json", headers={"Host": host})):
                    assert response.status_code == 421, host
                    assert response.json()["error"]["type"] == "HostNotAllowed"
            assert memory.count(unique_user) == 0
            for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", f"[::1]:{port}"):
                assert c.get("/health", headers={"Host": host}).status_code == 200, host


def test_allowed_hosts_come_from_settings_or_the_factory(
    embedder: LocalEmbedder, tmp_path: Path
) -> None:
    settings = Settings(data_dir=tmp_path / "hm", extractor="rules",
                        server_allowed_hosts="memory.example.com, 127.0.0.1")
    with Memory(settings, embedder=embedder) as memory:
        with serve(create_app(memory, api_keys=[])) as url, httpx.Client(base_url=url) as c:
            assert c.get("/health", headers={"Host": "memory.example.com"}).status_code == 200
            assert c.get("/health").status_code == 200  # 127.0.0.1:<port>
            assert c.get("/health", headers={"Host": "localhost"}).status_code == 421
        with serve(create_app(memory, api_keys=[], allowed_hosts=["*"])) as url:
            assert httpx.get(f"{url}/health", headers={"Host": "any.example"}).status_code == 200
        with pytest.raises(ConfigError, match="allowed_hosts"):
            create_app(memory, allowed_hosts=[])


def test_chat_without_an_endpoint_is_503_naming_the_setting(
    embedder: LocalEmbedder, tmp_path: Path, unique_user: str
) -> None:
    with Memory(Settings(data_dir=tmp_path / "hm", extractor="rules"), embedder=embedder) as mem:
        with serve(create_app(mem, api_keys=[])) as url, httpx.Client(base_url=url) as c:
            for stream in (False, True):
                response = c.post(f"/v1/users/{unique_user}/chat",
                                  json={"message": "hello", "stream": stream})
                assert response.status_code == 503
                assert response.json()["error"]["type"] == "EndpointNotConfigured"
                assert "HYBRIDMEM_BASE_URL" in response.json()["error"]["message"]
        assert mem.count(unique_user) == 0


def test_hybridmem_serve_answers_loopback_hosts_only(tmp_path: Path) -> None:
    """The real command, as a user runs it: a process bound to 127.0.0.1, keyless, loopback Hosts."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYBRIDMEM_", "OPENAI_"))}
    env["HYBRIDMEM_EMBEDDER"] = "hash"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hybridmem.cli", "serve", "--port", str(port),
         "--data-dir", str(tmp_path / "hm"), "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                health = httpx.get(f"{url}/health", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, "serve did not start"
                time.sleep(0.2)
        assert health.json()["version"] == __version__
        added = httpx.post(f"{url}/v1/users/u1/memories", json={"text": "I live in Lyon."})
        assert added.status_code == 201
        rebound = httpx.get(f"{url}/v1/users/u1/memories", headers={"Host": "attacker.example"})
        assert rebound.status_code == 421 and "Lyon" not in rebound.text
    finally:
        proc.terminate()
        proc.wait(timeout=30)
