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
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from hybridmem import Settings
from hybridmem.offline import LocalEmbedder
from openai_wire import OpenAIWireServer

if TYPE_CHECKING:
    from hybridmem import Memory

ENV_PREFIXES = ("HYBRIDMEM_", "OPENAI_")


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


@pytest.fixture()
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "hm")


@pytest.fixture()
def mem(settings: Settings, embedder: LocalEmbedder) -> Iterator[Memory]:
    """A Memory on a fresh data dir with the real local embedder and rule extractor."""
    from hybridmem import Memory  # imported on use, so store-level tests never import the facade

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
    deadline = time.monotonic() + 30
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
