"""A chat stream whose endpoint hangs up mid-reply, over the real wire: the OpenAI-wire server
(``Reply.cut_stream``) drops the connection after a delta, through the official client, our
``OpenAIChat``, :meth:`Memory.chat_stream` and the REST service on a real uvicorn."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import hybridmem
from hybridmem import Memory, Settings
from hybridmem.errors import BackendError
from hybridmem.offline import HashEmbedder
from hybridmem.server import create_app
from openai_wire import OpenAIWireServer, Reply
from uvicorn_thread import serve




@pytest.fixture
def memory(tmp_path: Path, openai_server: OpenAIWireServer) -> Iterator[Memory]:
    settings = Settings(data_dir=tmp_path / "hm", base_url=openai_server.base_url,
                        api_key="sk-test", max_retries=0, extractor="rules")
    with Memory(settings, embedder=HashEmbedder(64)) as mem:
        yield mem


def test_the_wire_server_really_cuts_the_stream(openai_server: OpenAIWireServer) -> None:
    openai_server.script(Reply.cut_stream(1, content="Hello there, friend"))
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client() as client, pytest.raises(httpx.RemoteProtocolError):
        with client.stream("POST", f"{openai_server.base_url}/chat/completions",
                           json=body) as response:
            assert response.status_code == 200
            for _ in response.iter_lines():
                pass


def test_chat_stream_yields_what_came_then_raises_and_stores_nothing(
    memory: Memory, openai_server: OpenAIWireServer
) -> None:
    openai_server.script(Reply.cut_stream(1, content="Hello there, friend"))
    got: list[str] = []
    with pytest.raises(BackendError):
        for delta in memory.chat_stream("u", "hi"):
            got.append(delta)
    assert got == ["Hello "]
    assert memory.count("u") == 0  # a broken exchange is not remembered
    (request,) = openai_server.requests_to("chat")
    assert request.body["stream"] is True


def test_a_stream_that_breaks_ends_with_an_error_event(
    memory: Memory, openai_server: OpenAIWireServer
) -> None:
    openai_server.script(Reply.cut_stream(1, content="Hello there, friend"))
    with serve(create_app(memory, api_keys=[])) as url, httpx.Client(base_url=url) as c:
        with c.stream("POST", "/v1/users/u/chat",
                      json={"message": "hi", "stream": True}) as response:
            assert response.status_code == 200  # already streaming when it broke
            lines = [line for line in response.iter_lines() if line]
    assert lines[0] == 'data: {"delta": "Hello "}'
    assert lines[1] == "event: error"
    error = json.loads(lines[2].removeprefix("data: "))["error"]
    assert error["type"] == "BackendUnavailableError", error  # the hang-up is mapped, by class
    assert issubclass(getattr(hybridmem, error["type"]), BackendError)
    assert "sk-test" not in lines[2]
    assert len(lines) == 3, lines  # and no [DONE]
