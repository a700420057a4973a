"""Key facts distilled from conversation turns: the pure request/reply helpers, and
``Memory.add_messages`` against the real OpenAI-wire server on 127.0.0.1 — a good reply, garbage,
an HTTP 500 and a timeout (the turns are stored in every case), and the switch that turns it off."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from hybridmem import Memory
from hybridmem.models import MemoryItem, utcnow
from hybridmem.offline import LocalEmbedder
from hybridmem.prompts import DISTILL_PROMPT
from hybridmem.write.distill import (
    DISTILL_SCHEMA,
    DISTILLED_SOURCE,
    MAX_FACTS,
    distill_messages,
    fact_request,
    parse_facts,
)
from openai_wire import OpenAIWireServer, Reply

TURNS = [
    {"role": "user", "content": "I just moved to Berlin with my cat Pixel."},
    {"role": "assistant", "content": "Welcome to Berlin! How is Pixel settling in?"},
]
BERLIN = {"facts": [
    {"key": "Home City", "value": "Berlin", "category": "personal", "confidence": 0.9},
    {"key": "pet", "value": "a cat called Pixel", "category": "personal"},
    {"key": "", "value": "dropped: no key"},
]}


def turn(text: str, source: str = "user") -> MemoryItem:
    now = utcnow()
    return MemoryItem(id=text[:6], user_id="u", text=text, kind="turn", source=source,
                      created_at=now, updated_at=now)


def test_the_request_carries_the_turns_and_known_keys_as_data() -> None:
    system, user = distill_messages([turn("I live in Oslo"), turn("Nice!", "assistant")],
                                    ["diet"])
    assert system == {"role": "system", "content": DISTILL_PROMPT}
    assert json.loads(user["content"]) == {"known_keys": ["diet"], "turns": [
        {"role": "user", "content": "I live in Oslo"}, {"role": "assistant", "content": "Nice!"}]}
    assert DISTILL_SCHEMA["required"] == ["facts"] and '"facts"' in DISTILL_PROMPT


def test_parse_facts_validates_each_fact_and_refuses_garbage() -> None:
    facts = parse_facts('Here you go: {"facts": [{"key": " Home  City ", "value": "Oslo", '
                        '"confidence": 7}, {"key": "diet", "value": 3}, "nonsense", '
                        '{"key": "home city", "value": "Bergen", "category": null}]}')
    assert facts is not None and [(f.key, f.value, f.category, f.confidence) for f in facts] == [
        ("home city", "Bergen", "general", 1.0)]  # the last value of a key said twice
    assert parse_facts('{"facts": [{"key": "a", "value": "b", "confidence": 0.4}]}')[0].confidence \
        == 0.4  # type: ignore[index]
    many = json.dumps({"facts": [{"key": f"k{i}", "value": "v"} for i in range(50)]})
    assert len(parse_facts(many) or []) == MAX_FACTS
    odd = parse_facts('{"facts": [{"key": "a\\u0000b", "value": "v"}, {"key": "k", '
                      '"value": "\\ud800"}, {"key": "  ", "value": "v"}]}')
    assert odd == []  # NUL, a lone surrogate, a blank key: each fact dropped, not the reply
    for garbage in ("", "not json", '{"facts": "none"}', "[1, 2]", "{}", '{"facts": [1, 2'):
        assert parse_facts(garbage) is None, garbage
    assert parse_facts('{"facts": []}') == []


def test_a_fact_request_points_at_its_turns() -> None:
    (fact,) = parse_facts(json.dumps({"facts": [{"key": "diet", "value": "vegan"}]})) or []
    turns = [turn("I am vegan now"), turn("Noted", "assistant")]
    request = fact_request(fact, turns)
    assert (request.text, request.kind, request.source) == ("diet: vegan", "fact", DISTILLED_SOURCE)
    assert request.metadata == {"turns": 2, "first_turn": turns[0].id, "last_turn": turns[1].id}


@pytest.fixture()
def llm_settings(make_settings: Any, openai_server: OpenAIWireServer) -> Any:
    def make(**fields: Any) -> Any:
        defaults = {"base_url": openai_server.base_url, "extractor": "rules", "episode_turns": 0,
                    "max_retries": 0, "request_timeout": 5}
        return make_settings(**{**defaults, **fields})
    return make


@pytest.fixture()
def llm_mem(llm_settings: Any, embedder: LocalEmbedder) -> Iterator[Memory]:
    with Memory(llm_settings(), embedder=embedder) as mem:
        yield mem


def test_add_messages_stores_the_distilled_key_facts_of_its_turns(
    llm_mem: Memory, openai_server: OpenAIWireServer
) -> None:
    openai_server.script(json.dumps(BERLIN))
    stored = llm_mem.add_messages("ann", TURNS)
    assert [t.kind for t in stored] == ["turn", "turn"]
    facts = llm_mem.facts("ann")
    assert [(f.key, f.text, f.source) for f in facts] == [
        ("home city", "home city: Berlin", DISTILLED_SOURCE),
        ("pet", "pet: a cat called Pixel", DISTILLED_SOURCE)]
    assert facts[0].confidence == 0.9 and facts[0].category == "personal"
    assert facts[0].metadata["first_turn"] == stored[0].id
    assert facts[0].metadata["last_turn"] == stored[1].id
    (call,) = openai_server.requests_to("chat")
    assert call.body["response_format"]["json_schema"]["name"] == "distill_key_facts"
    assert json.loads(call.messages[-1]["content"])["turns"][0]["content"] == TURNS[0]["content"]
    assert "Known facts" in llm_mem.context("ann", "where do I live?").text

    # a new value for a known key supersedes the old one; the model is told the keys it has
    openai_server.script(json.dumps({"facts": [{"key": "home city", "value": "Lisbon"}]}))
    llm_mem.add_messages("ann", [{"role": "user", "content": "We relocated to Lisbon."}])
    assert [f.text for f in llm_mem.facts("ann")] == ["home city: Lisbon", "pet: a cat called Pixel"]
    sent = json.loads(openai_server.requests_to("chat")[-1].messages[-1]["content"])
    assert sent["known_keys"] == ["home city", "pet"]
    assert llm_mem.get("ann", facts[0].id).superseded_by is not None


@pytest.mark.parametrize("failure", ["garbage", "http 500", "timeout"])
def test_a_failed_distillation_keeps_the_turns_and_warns(
    failure: str, llm_settings: Any, embedder: LocalEmbedder, openai_server: OpenAIWireServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    reply = {"garbage": Reply.invalid_json(), "http 500": Reply.error(500),
             "timeout": Reply.slow(3.0, json.dumps(BERLIN))}[failure]
    with Memory(llm_settings(request_timeout=0.5), embedder=embedder) as mem:
        openai_server.script(reply)
        with caplog.at_level(logging.WARNING, logger="hybridmem.memory"):
            stored = mem.add_messages("bo", TURNS)
        assert [t.text for t in stored] == [m["content"] for m in TURNS]
        assert mem.count("bo") == 2 and mem.facts("bo") == []
        assert any("distillation failed" in r.getMessage() for r in caplog.records)


def test_distill_off_or_no_endpoint_makes_no_call(
    llm_settings: Any, make_settings: Any, embedder: LocalEmbedder,
    openai_server: OpenAIWireServer,
) -> None:
    with Memory(llm_settings(distill=False), embedder=embedder) as mem:
        mem.add_messages("cy", TURNS)
        assert mem.count("cy") == 2 and mem.facts("cy") == []
    with Memory(make_settings(name="offline"), embedder=embedder) as mem:
        mem.add_messages("dee", TURNS)  # (in server mode both Memories share one Chroma)
        assert mem.count("dee") == 2 and mem.facts("dee") == []
    assert openai_server.requests_to("chat") == []
