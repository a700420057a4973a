"""The OpenAI-compatible routes (``/v1/chat/completions``, ``/v1/models``) over a real uvicorn, driven
by the official ``openai`` client (sync and async), LangChain's ``ChatOpenAI`` and raw httpx, with
the real OpenAI-wire server on 127.0.0.1 as the upstream endpoint. The shared service runs once
per Chroma mode (embedded, and a real `chroma run`); every test uses users of its own, and waits
for the service's stores with :meth:`OpenAIProxy.drain` before it asserts what was stored."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from hybridmem import Memory, Settings
from hybridmem.offline import LocalEmbedder
from hybridmem.server import create_app
from openai_wire import OpenAIWireServer, RecordedRequest, Reply
from uvicorn_thread import free_port, serve

CLIENT_KEY = "client-key-0123"
UPSTREAM_KEY = "sk-upstream-secret-9876"
PROMPT_START = "Long-term memory of this user"


@dataclass
class Proxy:
    url: str
    memory: Memory
    app: Any
    wire: OpenAIWireServer

    def openai(self, **kwargs: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=CLIENT_KEY, max_retries=0,
                             timeout=30, **kwargs)

    def aopenai(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=CLIENT_KEY, max_retries=0,
                                  timeout=30)

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30,
                            headers={"Authorization": f"Bearer {CLIENT_KEY}"})

    @property
    def stats(self) -> Any:
        return self.app.state.openai_proxy.stats

    def drain(self) -> None:
        """Return once every exchange answered so far is stored (or skipped, or failed)."""
        assert self.app.state.openai_proxy.drain(timeout=30), "stores still pending after 30 s"

    def chats(self) -> list[RecordedRequest]:
        return self.wire.requests_to("chat")

    def turns(self, user: str) -> list[str]:
        return [m.text for m in self.memory.list(user, where={"kind": "turn"})]


def settings_for(path: Path, wire: OpenAIWireServer, **extra: Any) -> Settings:
    # no distillation: the upstream requests these tests read are the route's own
    return Settings(data_dir=path, extractor="rules", judge=False, episode_turns=0,
                    distill=False, base_url=wire.base_url, api_key=UPSTREAM_KEY,
                    server_api_key=CLIENT_KEY, **extra)


@pytest.fixture(scope="module", params=["embedded", "server"])
def _service(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
             embedder: LocalEmbedder, _openai_wire_session: OpenAIWireServer) -> Iterator[Proxy]:
    """One service per Chroma mode: embedded, and a real `chroma run` (shared by the session)."""
    chroma_url = request.getfixturevalue("chroma_server") if request.param == "server" else None
    settings = settings_for(tmp_path_factory.mktemp("proxy") / "hm", _openai_wire_session,
                            proxy_model_map="house-model=gpt-4o-mini", chroma_url=chroma_url)
    with Memory(settings, embedder=embedder) as memory:
        app = create_app(memory)
        with serve(app) as url:
            yield Proxy(url, memory, app, _openai_wire_session)


@pytest.fixture()
def proxy(_service: Proxy, openai_server: OpenAIWireServer) -> Proxy:
    return _service  # openai_server: the upstream is reset around each test


@pytest.fixture()
def user() -> str:
    return f"u-{uuid.uuid4().hex[:10]}"


def eventually(check: Callable[[], bool], seconds: float = 120) -> None:
    """Poll ``check`` until it holds, failing after ``seconds`` (a hang, never a slow machine)."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.02)


def memory_message(request: RecordedRequest) -> str:
    first = request.messages[0]
    assert first["role"] == "system" and first["content"].startswith(PROMPT_START), first
    return str(first["content"])


# -- the memory in, the exchange stored ----------------------------------------------------------
def test_the_sync_client_gets_an_answer_with_the_users_memory(proxy: Proxy, user: str) -> None:
    proxy.memory.add(user, "My locker code is 4417 at the Lyon gym.")
    caller = [{"role": "system", "content": "Answer in one line."},
              {"role": "user", "content": "What is my locker code at the gym?"}]
    raw = proxy.openai().chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=caller, user=user)  # type: ignore[arg-type]
    reply = raw.parse()
    assert reply.choices[0].message.content == "ok: What is my locker code at the gym?"
    assert raw.headers["x-hybridmem-memory"].startswith("on; context_tokens=")
    (sent,) = proxy.chats()
    assert "4417" in memory_message(sent)
    assert sent.messages[1:] == caller  # the caller's own messages, unchanged, after it
    assert sent.api_key == UPSTREAM_KEY and CLIENT_KEY not in json.dumps(sent.headers)
    assert sent.body["user"] == user
    proxy.drain()
    assert proxy.turns(user) == ["What is my locker code at the gym?",
                                 "ok: What is my locker code at the gym?"]


def test_the_header_names_the_user_over_the_body(proxy: Proxy, user: str) -> None:
    proxy.memory.add(user, "My bike is a red Brompton.")
    proxy.openai().chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "Which bike do I ride?"}],
        user="someone-else", extra_headers={"X-HybridMem-User": user})
    assert "Brompton" in memory_message(proxy.chats()[0])
    proxy.drain()
    assert len(proxy.turns(user)) == 2 and proxy.memory.count("someone-else") == 0


def test_without_a_user_the_request_passes_untouched_and_nothing_is_stored(
    proxy: Proxy
) -> None:
    proxy.drain()  # the stores of earlier tests are done
    before = proxy.stats.stored
    body = {"model": "gpt-4o-mini", "temperature": 0.3,
            "messages": [{"role": "user", "content": "Hello there"}]}
    with proxy.http() as c:
        answer = c.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200 and answer.headers["x-hybridmem-memory"] == "off (no user)"
    assert proxy.chats()[0].body == body
    proxy.drain()
    assert proxy.stats.stored == before


def test_a_user_without_memories_gets_no_memory_message(proxy: Proxy, user: str) -> None:
    messages = [{"role": "user", "content": "Hello, who am I?"}]
    raw = proxy.openai().chat.completions.with_raw_response.create(
        model="m", messages=messages, user=user)  # type: ignore[arg-type]
    assert raw.headers["x-hybridmem-memory"] == "on; context_tokens=0; store=on"
    assert proxy.chats()[0].messages == messages
    proxy.drain()
    assert len(proxy.turns(user)) == 2


def test_two_users_never_see_each_others_memory(proxy: Proxy) -> None:
    alice, bob = f"alice-{uuid.uuid4().hex[:6]}", f"bob-{uuid.uuid4().hex[:6]}"
    proxy.memory.add(alice, "My safe combination is 7-31-4159, the secret of my house.")
    proxy.memory.add(bob, "My house has a blue door.")
    client = proxy.openai()
    question = [{"role": "user", "content": "What is the secret combination of my house safe?"}]
    client.chat.completions.create(model="gpt-4o-mini", messages=question, user=bob)  # type: ignore[arg-type]
    client.chat.completions.create(model="gpt-4o-mini", messages=question, user=alice)  # type: ignore[arg-type]
    to_bob, to_alice = proxy.chats()
    assert "7-31-4159" not in to_bob.text and "blue door" in to_bob.text
    assert "7-31-4159" in to_alice.text and "blue door" not in to_alice.text
    proxy.drain()
    assert len(proxy.turns(bob)) == 2 and len(proxy.turns(alice)) == 2
    assert not any("7-31-4159" in m.text for m in proxy.memory.list(bob))


def test_the_memory_message_fits_the_budget_of_the_request(proxy: Proxy, user: str) -> None:
    proxy.memory.add_many(user, [f"Note {i}: I keep my spare keys in drawer {i}."
                                 for i in range(30)])
    client = proxy.openai()
    for budget in (60, 200):
        client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "Where are my keys?"}],
            user=user, extra_body={"hybridmem": {"max_context_tokens": budget, "store": False}})
    small, large = (memory_message(r) for r in proxy.chats())
    assert proxy.memory.tokens.count(small) <= 60 < proxy.memory.tokens.count(large) <= 200
    proxy.drain()
    assert proxy.turns(user) == []  # store: false


def test_the_query_is_the_last_user_messages_text_parts(proxy: Proxy, user: str) -> None:
    proxy.memory.add(user, "My passport expires in March 2031.")
    proxy.memory.add(user, "My favourite tea is a smoky lapsang.")
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Which tea do I like?"},
        {"role": "assistant", "content": "A smoky lapsang."},
        {"role": "user", "content": [{"type": "text", "text": "When does my passport"},
                                     {"type": "text", "text": "expire?"}]},
    ]
    proxy.openai().chat.completions.create(model="m", messages=messages, user=user)  # type: ignore[arg-type]
    (sent,) = proxy.chats()
    assert "March 2031" in memory_message(sent) and sent.messages[1:] == messages
    proxy.drain()
    assert proxy.turns(user)[0] == "When does my passport\nexpire?"


def test_the_store_chat_setting_turns_storing_off(
    tmp_path: Path, embedder: LocalEmbedder, openai_server: OpenAIWireServer, user: str
) -> None:
    settings = settings_for(tmp_path / "hm", openai_server, store_chat=False)
    with Memory(settings, embedder=embedder) as memory:
        app = create_app(memory)
        with serve(app) as url:
            memory.add(user, "I collect vintage fountain pens.")
            client = openai.OpenAI(base_url=url + "/v1", api_key=CLIENT_KEY, max_retries=0)
            raw = client.chat.completions.with_raw_response.create(
                model="m", user=user, messages=[{"role": "user", "content": "What do I collect?"}])
            assert raw.headers["x-hybridmem-memory"].endswith("store=off")
            assert "fountain pens" in openai_server.requests_to("chat")[0].text
            assert app.state.openai_proxy.drain(timeout=30)
            assert memory.list(user, where={"kind": "turn"}) == []
            stored = client.chat.completions.with_raw_response.create(
                model="m", user=user, messages=[{"role": "user", "content": "Remember: blue ink."}],
                extra_body={"hybridmem": {"store": True}})
            assert stored.headers["x-hybridmem-memory"].endswith("store=on")
            assert app.state.openai_proxy.drain(timeout=30)
            assert len(memory.list(user, where={"kind": "turn"})) == 2


def test_fields_pass_through_and_the_hybridmem_field_does_not(proxy: Proxy, user: str) -> None:
    schema = {"name": "answer", "strict": True, "schema": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": False}}
    fmt = {"type": "json_schema", "json_schema": schema}
    reply = proxy.openai().chat.completions.create(
        model="house-model", messages=[{"role": "user", "content": "Where do I live?"}],
        user=user, response_format=fmt, temperature=0.2, n=1, seed=7,  # type: ignore[arg-type]
        extra_body={"hybridmem": {"min_score": 0.0}, "top_k": 5, "vendor": {"x": [1, 2]}})
    assert reply.choices[0].message.content == "{}"
    sent = proxy.chats()[0].body
    assert sent["model"] == "gpt-4o-mini"  # mapped by proxy_model_map
    assert sent["response_format"] == fmt and sent["seed"] == 7 and sent["n"] == 1
    assert sent["temperature"] == 0.2 and sent["top_k"] == 5 and sent["vendor"] == {"x": [1, 2]}
    assert "hybridmem" not in sent


def test_the_models_list_names_the_mapped_models(proxy: Proxy) -> None:
    names = [m.id for m in proxy.openai().models.list()]
    assert {"gpt-4o-mini", "text-embedding-3-small", "house-model"} <= set(names)


# -- streaming -----------------------------------------------------------------------------------
def test_the_async_client_streams_and_the_exchange_is_stored(proxy: Proxy, user: str) -> None:
    proxy.memory.add(user, "I play the cello in an orchestra.")
    proxy.wire.script("You play the cello, in an orchestra.")

    async def run() -> tuple[list[str], Any]:
        client = proxy.aopenai()
        stream = await client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "Which instrument?"}],
            user=user, stream=True, stream_options={"include_usage": True})
        pieces, usage = [], None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
            usage = chunk.usage or usage
        await client.close()
        return pieces, usage

    pieces, usage = asyncio.run(run())
    assert "".join(pieces) == "You play the cello, in an orchestra." and len(pieces) > 3
    assert usage is not None and usage.total_tokens > 0
    sent = proxy.chats()[0]
    assert sent.body["stream_options"] == {"include_usage": True} and "cello" in sent.text
    proxy.drain()
    assert proxy.turns(user)[1] == "You play the cello, in an orchestra."


def test_a_stream_the_upstream_cuts_ends_with_an_error_and_is_not_stored(
    proxy: Proxy, user: str
) -> None:
    proxy.wire.script(Reply.cut_stream(2, "one two three four five"))
    proxy.drain()  # the stores of earlier tests are done
    before = proxy.stats.stored
    stream = proxy.openai().chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "Count to five"}],
        user=user, stream=True)
    pieces: list[str] = []
    with pytest.raises(openai.APIError, match="cut the stream"):
        for chunk in stream:
            pieces.append(chunk.choices[0].delta.content or "")
    assert "".join(pieces) == "one two "
    proxy.drain()
    assert proxy.turns(user) == [] and proxy.stats.stored == before


def test_a_client_that_hangs_up_cancels_the_upstream_stream(proxy: Proxy, user: str) -> None:
    """The upstream counts a stream cut only when its peer hangs up before the end: a proxy
    that read the whole stream (60 s of it) would leave the count at 0."""
    words = " ".join(f"w{i}" for i in range(600))
    proxy.wire.script(Reply.dripping(0.1, words))
    body = {"model": "gpt-4o-mini", "stream": True, "user": user,
            "messages": [{"role": "user", "content": "Talk slowly"}]}
    with proxy.http() as c, c.stream("POST", "/v1/chat/completions", json=body) as answer:
        assert answer.status_code == 200
        for line in answer.iter_lines():
            if line.startswith("data:") and "w1" in line:
                break  # and hang up
    eventually(lambda: proxy.wire.streams_cut == 1)
    proxy.drain()
    assert proxy.turns(user) == []


# -- tools ---------------------------------------------------------------------------------------
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_tool_loop_works_and_only_its_final_answer_is_stored(
    proxy: Proxy, user: str, stream: bool
) -> None:
    proxy.memory.add(user, "I live in Lyon.")
    proxy.wire.script(Reply.calls_tool("get_weather", '{"city": "Lyon"}'),
                      "It is sunny in Lyon today.")
    client = proxy.openai()
    question: list[Any] = [{"role": "user", "content": "What is the weather where I live?"}]
    if stream:
        calls: dict[int, dict[str, str]] = {}
        for chunk in client.chat.completions.create(
                model="gpt-4o-mini", messages=question, tools=[WEATHER], tool_choice="auto",
                user=user, stream=True):
            for call in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
                entry = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                entry["id"] += call.id or ""
                entry["name"] += (call.function and call.function.name) or ""
                entry["arguments"] += (call.function and call.function.arguments) or ""
        call_id, name, arguments = calls[0]["id"], calls[0]["name"], calls[0]["arguments"]
    else:
        first = client.chat.completions.create(model="gpt-4o-mini", messages=question,
                                               tools=[WEATHER], tool_choice="auto", user=user)
        assert first.choices[0].finish_reason == "tool_calls"
        call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
        call_id, name, arguments = call.id, call.function.name, call.function.arguments  # type: ignore[union-attr]
    assert (name, json.loads(arguments)) == ("get_weather", {"city": "Lyon"})
    proxy.drain()
    assert proxy.turns(user) == []  # a reply that calls a tool is not an answer yet
    loop = [*question,
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function",
                 "function": {"name": name, "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": call_id, "content": '{"sky": "sunny"}'}]
    final = client.chat.completions.create(model="gpt-4o-mini", messages=loop, tools=[WEATHER],
                                           user=user)
    assert final.choices[0].message.content == "It is sunny in Lyon today."
    first_sent, second_sent = proxy.chats()
    assert first_sent.body["tools"] == [WEATHER] and first_sent.body["tool_choice"] == "auto"
    assert second_sent.messages[1:] == loop and "Lyon" in memory_message(second_sent)
    proxy.drain()
    assert proxy.turns(user) == ["What is the weather where I live?",
                                 "It is sunny in Lyon today."]


# -- LangChain -----------------------------------------------------------------------------------
def test_langchain_chat_openai_talks_to_the_service(proxy: Proxy, user: str) -> None:
    from langchain_openai import ChatOpenAI

    proxy.memory.add(user, "My dog is called Biscuit.")
    llm = ChatOpenAI(model="gpt-4o-mini", base_url=proxy.url + "/v1", api_key=CLIENT_KEY,
                     max_retries=0, default_headers={"X-HybridMem-User": user})
    answer = llm.invoke("What is my dog called?")
    assert answer.content == "ok: What is my dog called?"
    assert "Biscuit" in memory_message(proxy.chats()[0])
    streamed = "".join(str(c.content) for c in llm.stream("And my dog's name again?"))
    assert streamed == "ok: And my dog's name again?"
    proxy.drain()
    assert len(proxy.turns(user)) == 4


# -- errors --------------------------------------------------------------------------------------
BAD_BODIES = [
    ("malformed", b'{"model": "gpt-4o-mini", "messages": [', None),
    ("not an object", b'["model"]', None),
    ("no messages", b'{"model": "gpt-4o-mini"}', "messages"),
    ("empty messages", b'{"model": "gpt-4o-mini", "messages": []}', "messages"),
    ("messages a string", b'{"model": "gpt-4o-mini", "messages": "hi"}', "messages"),
    ("unknown role", b'{"model": "m", "messages": [{"role": "wizard", "content": "hi"}]}',
     "messages.0.role"),
    ("content a number", b'{"model": "m", "messages": [{"role": "user", "content": 5}]}',
     "messages.0.content"),
    ("model a number", b'{"model": 4, "messages": [{"role": "user", "content": "hi"}]}',
     "model"),
    ("stream a string", b'{"model": "m", "stream": "yes", "messages": [{"role": "user", '
     b'"content": "hi"}]}', "stream"),
    ("user a number", b'{"model": "m", "user": 12, "messages": [{"role": "user", '
     b'"content": "hi"}]}', "user"),
    ("bad hybridmem", b'{"model": "m", "hybridmem": {"max_context_tokens": -1}, "messages": '
     b'[{"role": "user", "content": "hi"}]}', "hybridmem.max_context_tokens"),
    ("unknown hybridmem", b'{"model": "m", "hybridmem": {"budget": 5}, "messages": '
     b'[{"role": "user", "content": "hi"}]}', "hybridmem.budget"),
    ("bad user id", b'{"model": "m", "user": "a\\u202eb", "messages": [{"role": "user", '
     b'"content": "hi"}]}', "user"),
]


@pytest.mark.parametrize(("body", "param"), [(b, p) for _, b, p in BAD_BODIES],
                         ids=[n for n, _, _ in BAD_BODIES])
def test_bad_input_is_a_400_in_openais_shape_and_reaches_nothing(
    proxy: Proxy, body: bytes, param: str | None
) -> None:
    with proxy.http() as c:
        answer = c.post("/v1/chat/completions", content=body,
                        headers={"Content-Type": "application/json"})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["message"]
    if param is not None:
        assert error["param"] == param
    assert proxy.wire.requests == []


def test_the_openai_client_sees_bad_requests_as_bad_requests(proxy: Proxy) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        proxy.openai().chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "wizard", "content": "hi"}])  # type: ignore[misc, list-item]
    assert caught.value.status_code == 400 and proxy.wire.requests == []


def test_a_wrong_client_key_is_a_401_and_never_reaches_the_endpoint(proxy: Proxy) -> None:
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert set(caught.value.body) == {"message", "type", "param", "code"}  # type: ignore[arg-type]
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    assert proxy.wire.requests == []


def test_upstream_errors_come_back_with_their_status_and_body(proxy: Proxy, user: str) -> None:
    proxy.wire.script(Reply.error(429, "Rate limit reached for requests."),
                      Reply.error(400, "Invalid parameter: 'seed'."))
    client = proxy.openai()
    question = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.RateLimitError) as limited:
        client.chat.completions.create(model="m", messages=question, user=user)  # type: ignore[arg-type]
    assert limited.value.response.headers["retry-after-ms"] == "10"
    with pytest.raises(openai.BadRequestError, match="'seed'"):
        client.chat.completions.create(model="m", messages=question, user=user, stream=True)  # type: ignore[arg-type]
    proxy.drain()
    assert proxy.turns(user) == []


def test_the_upstream_key_never_shows(proxy: Proxy, user: str,
                                      caplog: pytest.LogCaptureFixture) -> None:
    proxy.wire.required_key = "another-key"  # the wire's 401 echoes the key it was sent
    caplog.set_level(logging.DEBUG)
    with proxy.http() as c:
        answer = c.post("/v1/chat/completions", json={
            "model": "m", "user": user, "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 502 and answer.json()["error"]["code"] == "upstream_auth"
    assert UPSTREAM_KEY not in answer.text and "HYBRIDMEM_API_KEY" in answer.text
    assert UPSTREAM_KEY not in caplog.text


def test_an_unreachable_endpoint_is_a_502(tmp_path: Path, embedder: LocalEmbedder,
                                          openai_server: OpenAIWireServer) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    settings = Settings(data_dir=tmp_path / "hm", extractor="rules", base_url=dead)
    with Memory(settings, embedder=embedder) as memory, serve(create_app(memory)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.InternalServerError) as caught:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        assert caught.value.status_code == 502


def test_without_an_endpoint_the_route_is_a_503(tmp_path: Path, embedder: LocalEmbedder) -> None:
    with Memory(Settings(data_dir=tmp_path / "hm", extractor="rules"),
                embedder=embedder) as memory, serve(create_app(memory)) as url:
        answer = httpx.post(url + "/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert answer.status_code == 503
        assert answer.json()["error"]["type"] == "EndpointNotConfigured"


def test_a_failure_to_store_is_counted_never_a_failed_completion(proxy: Proxy, user: str) -> None:
    failures = proxy.stats.store_failures
    reply = proxy.openai().chat.completions.create(
        model="m", user=user, messages=[{"role": "user", "content": "a NUL \x00 in my text"}])
    assert reply.choices[0].message.content.startswith("ok: ")  # type: ignore[union-attr]
    proxy.drain()
    assert proxy.stats.store_failures == failures + 1 and proxy.turns(user) == []


# -- the CLI -------------------------------------------------------------------------------------
def test_serve_prints_the_base_url_for_openai_clients(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYBRIDMEM_", "OPENAI_"))}
    env["HYBRIDMEM_EMBEDDER"] = "hash"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hybridmem.cli", "serve", "--port", str(port),
         "--data-dir", str(tmp_path / "hm"), "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert f"base URL: http://127.0.0.1:{port}/v1 " in line
    finally:
        proc.terminate()
        proc.wait(timeout=30)
