"""Shared fixtures — real parts only: a real local embedder, a real `chroma run` server, real
files, and ``openai_server``: a real OpenAI-wire HTTP server on 127.0.0.1 (see openai_wire)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings

from hybridmem import Memory, Settings
from hybridmem.offline import LocalEmbedder
from openai_wire import OpenAIWireServer

ENV_PREFIXES = ("HYBRIDMEM_", "OPENAI_")

# Property tests: "ci" (the default) draws the same examples on every run, never fails on a slow
# example (deadline=None: a loaded machine is not a bug) and prints the blob that replays a
# failure (@reproduce_failure). "explore" draws fresh random examples: pass
# --hypothesis-profile=explore to hunt for new failures.
hypothesis_settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
hypothesis_settings.register_profile("explore", deadline=None, print_blob=True)
hypothesis_settings.load_profile("ci")


@pytest.fixture(scope="session")
def _openai_wire_session() -> Iterator[OpenAIWireServer]:
    with OpenAIWireServer() as server:
        yield server


@pytest.fixture
def openai_server(_openai_wire_session: OpenAIWireServer) -> Iterator[OpenAIWireServer]:
    """One server per test session, reset before and after each test: no requests, no scripts,
    default tunables. Point ``Settings(base_url=openai_server.base_url)`` at it."""
    _openai_wire_session.reset()
    yield _openai_wire_session
    _openai_wire_session.reset()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test sees the developer's HYBRIDMEM_* or OPENAI_* variables."""
    for name in list(os.environ):
        if name.startswith(ENV_PREFIXES):
            monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def embedder() -> LocalEmbedder:
    """The real offline embedder, loaded once per session."""
    return LocalEmbedder(threads=2)


@pytest.fixture()
def unique_user() -> str:
    """A user id no other test uses (the Chroma server fixture is shared by the session)."""
    return f"user-{uuid.uuid4().hex[:12]}"


def _empty_chroma_server(url: str) -> None:
    """Delete every collection of the session's Chroma server."""
    import chromadb
    from chromadb.config import Settings as ChromaSettings

    port = int(url.rsplit(":", 1)[1])
    client = chromadb.HttpClient(host="127.0.0.1", port=port,
                                 settings=ChromaSettings(anonymized_telemetry=False))
    for collection in client.list_collections():
        client.delete_collection(collection.name)


@pytest.fixture(params=["embedded", "server"])
def chroma_url(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """Each Memory test runs twice: on embedded Chroma (None) and on a real `chroma run` (its
    URL). The server is shared by the session, and tests that use it directly may leave
    collections (of any name and dimension), so it is emptied before and after a test."""
    if request.param == "embedded":
        yield None
        return
    url: str = request.getfixturevalue("chroma_server")
    _empty_chroma_server(url)
    yield url
    _empty_chroma_server(url)


@pytest.fixture()
def make_settings(tmp_path: Path, chroma_url: str | None) -> Callable[..., Settings]:
    """Settings on a fresh data dir (``name`` picks a second one) in this test's Chroma mode."""

    def make(name: str = "hm", **fields: Any) -> Settings:
        return Settings(data_dir=tmp_path / name, chroma_url=chroma_url, **fields)

    return make


@pytest.fixture()
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings()


@pytest.fixture()
def mem(settings: Settings, embedder: LocalEmbedder) -> Iterator[Memory]:
    """A Memory on a fresh data dir with the real local embedder and rule extractor."""
    with Memory(settings, embedder=embedder) as memory:
        yield memory


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def chroma_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `chroma run` on 127.0.0.1 (telemetry off), for server-mode tests."""
    exe = shutil.which("chroma") or str(Path(sys.executable).with_name("chroma"))
    path = tmp_path_factory.mktemp("chroma-server")
    port = _free_port()
    env = {**os.environ, "ANONYMIZED_TELEMETRY": "False"}
    proc = subprocess.Popen(
        [exe, "run", "--path", str(path), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120  # only a hang reaches it on a loaded machine
    while True:
        try:
            with urllib.request.urlopen(f"{url}/api/v2/heartbeat", timeout=1):
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("chroma run did not start")
            time.sleep(0.1)
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
