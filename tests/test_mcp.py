"""The MCP server end to end: the official SDK's own client (``stdio_client`` + ``ClientSession``)
talking to ``python -m hybridmem.mcp`` in a real subprocess, and once over streamable HTTP.
The hash embedder and a temporary data dir keep the server fast and offline."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent

from hybridmem import AsyncMemory, Memory, Settings
from hybridmem.errors import InvalidInputError, InvalidUserIdError
from hybridmem.mcp import create_server, main, run

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[1]
TOOLS = {"add_memory", "add_messages", "search_memories", "build_context", "remember_fact",
         "list_facts", "forget", "prune_memories", "query_path"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def server_env(data_dir: Path) -> dict[str, str]:
    return {"HYBRIDMEM_EMBEDDER": "hash", "HYBRIDMEM_DATA_DIR": str(data_dir),
            "PYTHONPATH": str(ROOT)}


@asynccontextmanager
async def stdio_session(data_dir: Path, *args: str) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=sys.executable, args=["-m", "hybridmem.mcp", *args],
                                   env=server_env(data_dir), cwd=str(data_dir.parent))
    with (data_dir.parent / "server.log").open("a", encoding="utf-8") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            yield session


def text_of(result: CallToolResult) -> str:
    assert result.content and isinstance(result.content[0], TextContent)
    return result.content[0].text


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    """Call a tool that must succeed; its structured result equals the JSON of its text."""
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, text_of(result)
    assert result.structured_content is not None
    assert json.loads(text_of(result)) == result.structured_content
    return result.structured_content


async def error(session: ClientSession, tool: str, **arguments: Any) -> str:
    result = await session.call_tool(tool, arguments)
    assert result.is_error
    text = text_of(result)
    assert "Traceback" not in text
    return text


async def test_stdio_end_to_end(tmp_path: Path) -> None:
    data = tmp_path / "hm"
    async with stdio_session(data) as session:
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert set(tools) == TOOLS
        for tool in tools.values():
            assert "user_id" in tool.input_schema["required"], tool.name
            assert tool.description and tool.output_schema
        assert tools["search_memories"].annotations.read_only_hint is True
        assert tools["forget"].annotations.destructive_hint is True

        item = await call(session, "add_memory", user_id="client_123",
                          text="Bought a ROG laptop in March", category="purchase",
                          importance=0.8, metadata={"order": 42})
        assert item["user_id"] == "client_123" and item["category"] == "purchase"
        assert item["metadata"] == {"order": 42}
        turns = await call(session, "add_messages", user_id="client_123", messages=[
            {"role": "user", "content": "I want a 4K monitor for it"},
            {"role": "assistant", "content": "Noted: a 4K monitor."}])
        assert [t["kind"] for t in turns["memories"]] == ["turn", "turn"]

        found = await call(session, "search_memories", user_id="client_123",
                           query="which laptop did I buy?", limit=5)
        assert found["hits"][0]["item"]["id"] == item["id"]
        assert {"score", "breakdown", "why"} <= set(found["hits"][0])
        assert (await call(session, "search_memories", user_id="someone_else",
                           query="laptop"))["hits"] == []

        ctx = await call(session, "build_context", user_id="client_123",
                         query="which laptop?", max_tokens=40)
        assert ctx == {**ctx, "tokens": 30, "max_tokens": 40, "text": (
            f"<memory>\nMemories (most relevant first):\n- [{item['created_at'][:10]}] "
            "Bought a ROG laptop in March\n</memory>")}

        fact = await call(session, "remember_fact", user_id="client_123", key="city",
                          value="Lyon")
        await call(session, "remember_fact", user_id="client_123", key="city", value="Paris")
        facts = (await call(session, "list_facts", user_id="client_123"))["memories"]
        assert [(f["key"], f["text"]) for f in facts] == [("city", "city: Paris")]
        assert fact["id"] != facts[0]["id"]

        assert (await call(session, "forget", user_id="client_123",
                           memory_id=item["id"]))["removed"] == 1
        assert "NotFoundError" in await error(session, "forget", user_id="client_123",
                                              memory_id=item["id"])
        refused = await error(session, "forget", user_id="client_123")
        assert refused.startswith("InvalidInputError:") and "confirm=true" in refused
        removed = await call(session, "forget", user_id="client_123", confirm=True)
        assert removed["removed"] == 4  # 2 turns, 2 values of city (one superseded)
        assert (await call(session, "search_memories", user_id="client_123",
                           query="laptop"))["hits"] == []

        bad = await error(session, "add_memory", user_id="../etc", text="x")
        assert bad.startswith("InvalidUserIdError: user_id must not contain '/', '\\'")
        assert "Traceback" not in bad
        assert (await error(session, "list_facts", user_id="")).startswith("InvalidUserIdError:")
        assert (await error(session, "search_memories", user_id="u", query="x",
                            limit=0)).startswith("InvalidInputError:")
        assert (await error(session, "build_context", user_id="u", query="x",
                            max_tokens=0)).startswith("InvalidInputError:")


async def test_fixed_user_has_no_user_parameter(tmp_path: Path) -> None:
    data = tmp_path / "hm"
    async with stdio_session(data, "--user", "alice") as session:
        tools = (await session.list_tools()).tools
        assert {t.name for t in tools} == TOOLS
        for tool in tools:
            assert "user_id" not in tool.input_schema.get("properties", {}), tool.name
        item = await call(session, "add_memory", text="Alice is vegetarian")
        assert item["user_id"] == "alice"
        hits = (await call(session, "search_memories", query="vegetarian"))["hits"]
        assert [h["item"]["id"] for h in hits] == [item["id"]]
        # An extra user_id is not a parameter: the SDK ignores it, the user stays alice.
        await call(session, "add_memory", text="Alice rides a bike", user_id="mallory")
    with Memory(Settings(data_dir=data, embedder="hash")) as mem:
        assert mem.count("alice") == 2 and mem.count("mallory") == 0


async def test_procedures_and_pruning(tmp_path: Path) -> None:
    data = tmp_path / "hm"
    old = datetime.now(timezone.utc) - timedelta(days=400)
    with Memory(Settings(data_dir=data, embedder="hash")) as mem:
        stale = mem.add("bob", "Asked once about gift wrapping.", importance=0.05, created_at=old)
        mem.add("bob", "Loyalty tier is gold.", importance=0.9, created_at=old)
    async with stdio_session(data) as session:
        tools = {t.name: t for t in (await session.list_tools()).tools}
        kind = tools["add_memory"].input_schema["properties"]["kind"]
        assert kind["enum"] == ["fact", "turn", "summary", "procedure"]
        assert tools["prune_memories"].annotations.destructive_hint is True

        # pruning first: a search counts as an access, and an accessed memory is not idle
        dry = await call(session, "prune_memories", user_id="bob")
        assert dry["dry_run"] is True and [m["id"] for m in dry["memories"]] == [stale.id]
        again = await call(session, "prune_memories", user_id="bob")
        assert [m["id"] for m in again["memories"]] == [stale.id]  # the dry run removed nothing
        done = await call(session, "prune_memories", user_id="bob", dry_run=False)
        assert done["dry_run"] is False and [m["id"] for m in done["memories"]] == [stale.id]
        assert (await call(session, "prune_memories", user_id="bob"))["memories"] == []
        bad = await error(session, "prune_memories", user_id="bob", min_importance=7)
        assert bad.startswith("InvalidInputError: min_importance")

        steps = await call(session, "add_memory", user_id="bob", kind="procedure",
                           text="To reset the router: hold the reset button for 10 seconds.")
        assert steps["kind"] == "procedure"
        assert (await call(session, "add_memory", user_id="bob",
                           text="I bought a Nighthawk router."))["kind"] == "fact"
        ctx = await call(session, "build_context", user_id="bob", query="how to reset my router")
        assert "procedures" in {line["section"] for line in ctx["lines"]}
        refused = await error(session, "add_memory", user_id="bob", text="x", kind="recipe")
        assert refused.startswith("InvalidInputError:") and "procedure" in refused

    with Memory(Settings(data_dir=data, embedder="hash")) as mem:
        assert sorted(m.text for m in mem.list("bob")) == [
            "I bought a Nighthawk router.", "Loyalty tier is gold.",
            "To reset the router: hold the reset button for 10 seconds."]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def http_server(tmp_path: Path) -> Callable[[], str]:
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> str:
        port = _free_port()
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("HYBRIDMEM_")},
               **server_env(tmp_path / "hm")}
        with (tmp_path / "http.log").open("ab") as log:  # the child keeps its own descriptor
            proc = subprocess.Popen(
                [sys.executable, "-m", "hybridmem.mcp", "--transport", "http", "--port", str(port)],
                env=env, stdout=log, stderr=log, cwd=str(tmp_path))
        procs.append(proc)
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return f"http://127.0.0.1:{port}/mcp"
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail((tmp_path / "http.log").read_text(errors="replace"))
                time.sleep(0.1)

    yield start  # type: ignore[misc]
    for proc in procs:
        proc.terminate()
        assert proc.wait(timeout=20) == 0  # uvicorn shuts down, then the memory is closed


async def test_streamable_http(http_server: Callable[[], str]) -> None:
    url = http_server()
    async with streamable_http_client(url) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        assert {t.name for t in (await session.list_tools()).tools} == TOOLS
        item = await call(session, "add_memory", user_id="bob", text="Bob owns a red kayak")
        hits = (await call(session, "search_memories", user_id="bob", query="kayak"))["hits"]
        assert hits[0]["item"]["id"] == item["id"]
        assert (await error(session, "list_facts", user_id="a/b")).startswith(
            "InvalidUserIdError:")
    # DNS rebinding: a page whose name resolves to 127.0.0.1 sends its own name as Host.
    port = url.split(":")[2].split("/")[0]
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "probe", "version": "1"}}}
    headers = {"Accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient(timeout=30) as raw:
        foreign = await raw.post(url, json=init, headers={**headers,
                                                          "Host": f"evil.example:{port}"})
        assert (foreign.status_code, foreign.text) == (421, "Invalid Host header")
        local = await raw.post(url, json=init, headers={**headers, "Host": f"localhost:{port}"})
        assert local.status_code == 200 and '"result"' in local.text


@pytest.mark.parametrize(("tool", "arguments", "refusal"), [
    ("forget", {"user_id": "u", "memory_id": "ab\ud800cd"},
     "InvalidInputError: memory_id is not valid Unicode (it holds a lone surrogate)"),
    ("list_facts", {"user_id": "a\udc00"},
     "InvalidUserIdError: user_id is not valid Unicode (it holds a lone surrogate)"),
    ("add_memory", {"user_id": "\udfff", "text": "x"},
     "InvalidUserIdError: user_id is not valid Unicode (it holds a lone surrogate)"),
])
async def test_a_lone_surrogate_in_an_id_is_a_typed_tool_error(
    tmp_path: Path, tool: str, arguments: dict[str, Any], refusal: str
) -> None:
    """JSON parsers on the wire refuse lone surrogates; in-process callers reach the tools."""
    memory = AsyncMemory(Settings(data_dir=tmp_path / "hm", embedder="hash"))
    try:
        await memory.add("u", "already here")
        result = await create_server(memory).call_tool(tool, arguments)
        assert result.is_error
        assert [c.text for c in result.content if isinstance(c, TextContent)] == [refusal]
        assert await memory.count("u") == 1
    finally:
        await memory.aclose()


def test_main_refuses_bad_arguments_and_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HYBRIDMEM_DATA_DIR", str(tmp_path / "hm"))
    monkeypatch.setenv("HYBRIDMEM_EMBEDDER", "hash")
    assert main(["--user", "../x"]) == 2
    assert "InvalidUserIdError" in capsys.readouterr().err
    monkeypatch.setenv("HYBRIDMEM_EMBEDDER", "no-such-embedder")
    assert main([]) == 2
    assert "invalid setting" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--transport", "carrier-pigeon"])
    # run() refuses before opening anything
    with pytest.raises(InvalidInputError, match="transport"):
        run(transport="carrier-pigeon")
    with pytest.raises(InvalidInputError, match="port"):
        run(transport="http", port=0)
    with pytest.raises(InvalidUserIdError):
        run(user_id="a/b")
    assert not (tmp_path / "hm").exists()


def test_version_runs_as_a_module() -> None:
    out = subprocess.run([sys.executable, "-m", "hybridmem.mcp", "--version"], check=False,
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0 and out.stdout.startswith("hybridmem ")
