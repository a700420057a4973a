"""Chat, LLM extraction and episodes through a real OpenAI-wire server on 127.0.0.1, driven by the
official openai client — no mocks of our classes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from hybridmem import BackendAuthError, Memory
from hybridmem.offline import LocalEmbedder
from openai_wire import OpenAIWireServer, Reply, count_tokens


@pytest.fixture()
def llm_mem(make_settings: Any, openai_server: OpenAIWireServer, embedder: LocalEmbedder
            ) -> Iterator[Memory]:
    s = make_settings(base_url=openai_server.base_url, api_key="sk-test", chat_model="test-model",
                      max_retries=0, request_timeout=5, episode_turns=0)
    with Memory(s, embedder=embedder) as mem:
        yield mem


EXTRACTION = {
    "entities": [{"name": "client_9", "type": "person"}, {"name": "ROG laptop", "type": "product"}],
    "relations": [{"subject": "client_9", "predicate": "bought", "object": "ROG laptop",
                   "confidence": 0.9}],
}


def test_chat_sends_context_and_key_and_stores_the_exchange(
    llm_mem: Memory, openai_server: OpenAIWireServer
) -> None:
    llm_mem.add("client_9", "I bought the ROG laptop last spring.", infer=False)
    openai_server.script(Reply.text("Try the Dell 4K monitor."))
    reply = llm_mem.chat("client_9", "Which monitor fits my laptop?")
    assert (reply.text, reply.model) == ("Try the Dell 4K monitor.", "test-model")
    assert reply.usage.completion_tokens == 6  # Try the Dell 4K monitor . (the server's count)
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 6
    assert "ROG laptop" in reply.context.text
    chat = [r for r in openai_server.requests_to("chat") if r.body.get("model") == "test-model"]
    sent = chat[0]
    assert sent.api_key == "sk-test"
    assert sent.messages[0]["role"] == "system" and "<memory>" in sent.messages[0]["content"]
    assert "I bought the ROG laptop" in sent.messages[0]["content"]
    assert sent.messages[-1] == {"role": "user", "content": "Which monitor fits my laptop?"}
    turns = llm_mem.list("client_9", where={"kind": "turn"})
    assert [(t.source, t.text) for t in turns] == [
        ("user", "Which monitor fits my laptop?"), ("assistant", "Try the Dell 4K monitor.")]


def test_chat_stream_yields_deltas_and_stores(llm_mem: Memory, openai_server: OpenAIWireServer) -> None:
    openai_server.script(Reply.text("Streaming works fine"))
    parts = list(llm_mem.chat_stream("u", "Say something"))
    assert len(parts) > 1 and "".join(parts) == "Streaming works fine"
    assert openai_server.requests_to("chat")[0].body["stream"] is True
    assert [t.text for t in llm_mem.list("u", where={"source": "assistant"})] == [
        "Streaming works fine"]


def test_endpoint_errors_become_backend_errors(llm_mem: Memory, openai_server: OpenAIWireServer) -> None:
    openai_server.script(Reply.error(401, "bad key"))
    with pytest.raises(BackendAuthError) as info:
        llm_mem.chat("u", "hello")
    assert "sk-test" not in str(info.value)


def test_llm_extraction_feeds_the_graph_with_usage(
    llm_mem: Memory, openai_server: OpenAIWireServer
) -> None:
    openai_server.script(Reply.text(json.dumps(EXTRACTION)))
    item = llm_mem.add("client_9", "I bought a ROG laptop")
    assert (item.extractor, item.needs_extraction) == ("llm:test-model", False)
    assert llm_mem.query_path("client_9", "client_9", "ROG laptop") == [
        "client_9 -bought-> ROG laptop"]
    assert len(openai_server.requests_to("chat")) == 1  # exactly one call per memory
    assert llm_mem.usage.completion_tokens == count_tokens(json.dumps(EXTRACTION))


def test_infer_false_never_calls_the_model(llm_mem: Memory, openai_server: OpenAIWireServer) -> None:
    item = llm_mem.add("u", "I live in Lyon", infer=False)
    assert item.extractor == "rules" and openai_server.requests_to("chat") == []


def test_failed_extraction_keeps_the_memory_and_marks_it(
    llm_mem: Memory, openai_server: OpenAIWireServer
) -> None:
    openai_server.script(Reply.invalid_json(), Reply.invalid_json())
    item = llm_mem.add("u", "I bought a standing desk from Fully")
    assert item.needs_extraction and item.extractor == "rules"
    assert llm_mem.get("u", item.id).needs_extraction
    assert llm_mem.search("u", "standing desk")[0].item.id == item.id
    openai_server.script(Reply.error(500, "down"))
    second = llm_mem.add("u", "I returned the monitor arm")
    assert second.needs_extraction and llm_mem.count("u") == 2


def test_batch_extraction_is_one_call_per_sixteen(
    llm_mem: Memory, openai_server: OpenAIWireServer
) -> None:
    llm_mem.add_many("u", [f"Fact number {i} about product P{i}" for i in range(20)])
    assert len(openai_server.requests_to("chat")) == 2


def test_episodes_are_summarised_and_get_a_place_in_context(
    make_settings: Any, openai_server: OpenAIWireServer, embedder: LocalEmbedder
) -> None:
    s = make_settings(base_url=openai_server.base_url, api_key="sk-test", max_retries=0,
                      episode_turns=4, extractor="rules")
    with Memory(s, embedder=embedder) as mem:
        openai_server.script(Reply.text("The user asked about a late parcel; it was reshipped."))
        mem.add_messages("u", [
            {"role": "user", "content": "Where is my parcel?"},
            {"role": "assistant", "content": "It is delayed at the depot."},
            {"role": "user", "content": "Can you reship it?"},
            {"role": "assistant", "content": "Done, a new one ships today."},
        ])
        summaries = mem.list("u", where={"kind": "summary"})
        assert [i.text for i in summaries] == [
            "The user asked about a late parcel; it was reshipped."]
        assert "Where is my parcel?" in openai_server.requests_to("chat")[0].text
        assert mem.summarize("u") is None  # nothing new since
        ctx = mem.context("u", "what happened with the parcel?", max_tokens=400)
        assert "Conversation summaries:" in ctx.text
