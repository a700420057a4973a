"""hybridmem.openai_compat through the official ``openai`` client and a real server on 127.0.0.1."""

from __future__ import annotations

import json
import logging
import math
import socket
from pathlib import Path
from typing import Any

import openai
import pytest
from openai_wire import (
    FAULTS,
    OpenAIWireServer,
    Reply,
    count_tokens,
    hashed_vector,
    message_text,
)

from hybridmem import Memory
from hybridmem.config import NO_KEY, Settings
from hybridmem.errors import (
    BackendAuthError,
    BackendError,
    BackendRateLimitError,
    BackendUnavailableError,
    ConfigError,
    InvalidInputError,
)
from hybridmem.models import Relation, Usage
from hybridmem.openai_compat import LLMExtractor, OpenAIChat, OpenAIEmbedder, map_openai_error
from hybridmem.protocols import ChatModel, Embedder, Extractor

KEY = "sk-test-0123456789"
HELLO = [{"role": "user", "content": "hello there"}]


@pytest.fixture
def make_settings(openai_server: OpenAIWireServer, tmp_path: Path) -> Any:
    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "data_dir": tmp_path,
            "base_url": openai_server.base_url,
            "api_key": KEY,
            "max_retries": 0,
            "request_timeout": 2,
        }
        return Settings(**(values | overrides))

    return make


def usage_of(request_body: dict[str, Any], reply: str) -> Usage:
    """What the wire server reports for a request and its reply (its own token counting)."""
    prompt = count_tokens(" ".join(message_text(m) for m in request_body["messages"]))
    completion = count_tokens(reply)
    total = prompt + completion
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=total)


# embeddings -------------------------------------------------------------------------------------


def test_embed_batch_batches_in_order_and_normalises(openai_server, make_settings):
    embedder = OpenAIEmbedder(make_settings(embedding_batch_size=2))
    texts = ["ROG laptop", "4K monitor", "mechanical keyboard", "lives in Lyon", "likes tea"]

    vectors = embedder.embed_batch(texts)

    sent = openai_server.requests_to("embeddings")
    assert [r.body["input"] for r in sent] == [texts[0:2], texts[2:4], texts[4:5]]  # ceil(5/2)
    assert all(r.body["model"] == "text-embedding-3-small" for r in sent)
    assert all(r.body["encoding_format"] == "float" for r in sent)
    for text, vector in zip(texts, vectors):  # order kept
        assert vector == pytest.approx(hashed_vector(text, 64))
    assert all(math.isclose(math.fsum(x * x for x in v), 1.0) for v in vectors)
    assert embedder.name == "openai:text-embedding-3-small"
    assert embedder.dimension == 64
    assert len(openai_server.requests) == 3  # the dimension came from the replies, no probe
    assert embedder.embed_batch([]) == [] and len(openai_server.requests) == 3


def test_dimension_is_probed_once_then_cached(openai_server, make_settings):
    openai_server.dimension = 24
    embedder = OpenAIEmbedder(make_settings(embedding_model="nomic-embed-text"))

    assert embedder.dimension == 24
    assert embedder.dimension == 24
    assert len(embedder.embed_batch(["a text"])[0]) == 24
    assert len(openai_server.requests) == 2  # one probe, one real call
    assert embedder.name == "openai:nomic-embed-text"
    assert isinstance(embedder, Embedder)


def test_a_changed_dimension_is_refused(openai_server, make_settings):
    embedder = OpenAIEmbedder(make_settings())
    assert embedder.dimension == 64
    openai_server.dimension = 32  # "someone swapped the model behind the URL"
    with pytest.raises(BackendError, match="sizes"):
        embedder.embed_batch(["x"])


def test_a_known_dimension_skips_the_probe_and_is_checked(openai_server, make_settings):
    embedder = OpenAIEmbedder(make_settings())
    embedder.dimension = 128  # e.g. the size stored with a user's collection
    assert embedder.dimension == 128 and openai_server.requests == []
    with pytest.raises(BackendError, match="sizes"):
        embedder.embed_batch(["x"])  # the server answers 64-d vectors
    with pytest.raises(InvalidInputError):
        embedder.dimension = 0


def test_embeddings_use_their_own_url_and_key(openai_server, make_settings):
    with OpenAIWireServer() as other:
        explicit = OpenAIEmbedder(
            make_settings(embedding_base_url=other.base_url, embedding_api_key="sk-emb-key")
        )
        explicit.embed_batch(["x"])
        implicit = OpenAIEmbedder(make_settings(embedding_base_url=other.base_url))
        implicit.embed_batch(["y"])
        keys = [r.api_key for r in other.requests]
    assert keys == ["sk-emb-key", NO_KEY]  # api_key belongs to base_url only
    assert openai_server.requests == []


def test_embedding_errors_are_mapped(openai_server, make_settings):
    openai_server.script(Reply.error(429), endpoint="embeddings")
    with pytest.raises(BackendRateLimitError) as info:
        OpenAIEmbedder(make_settings()).embed_batch(["x"])
    assert isinstance(info.value.__cause__, openai.RateLimitError)


# chat -------------------------------------------------------------------------------------------


def test_complete_returns_text_usage_and_sends_the_key(openai_server, make_settings):
    chat = OpenAIChat(make_settings(chat_model="tiny-chat"))

    result = chat.complete(HELLO)

    (request,) = openai_server.requests
    assert result.text == "ok: hello there"
    assert result.model == "tiny-chat"
    assert result.usage == usage_of(request.body, result.text)
    assert result.usage.total_tokens > 0
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.body["messages"] == HELLO and request.body["model"] == "tiny-chat"
    assert "response_format" not in request.body
    assert isinstance(chat, ChatModel)


def test_openai_key_is_never_sent_to_a_third_party_base_url(openai_server, make_settings):
    chat = OpenAIChat(make_settings(api_key=None, openai_api_key="sk-openai-secret"))
    chat.complete(HELLO)
    embedder = OpenAIEmbedder(make_settings(api_key=None, openai_api_key="sk-openai-secret"))
    embedder.embed_batch(["x"])

    assert [r.api_key for r in openai_server.requests] == [NO_KEY, NO_KEY]
    for request in openai_server.requests:
        assert "sk-openai-secret" not in json.dumps(request.headers)


def test_json_schema_request_shape(openai_server, make_settings):
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    openai_server.script('{"answer": "42"}')

    chat = OpenAIChat(make_settings())
    result = chat.complete(HELLO, json_schema=schema, schema_name="my answer!")

    assert json.loads(result.text) == {"answer": "42"}
    assert openai_server.requests[0].body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "my_answer_", "schema": schema, "strict": False},
    }


def test_refused_json_schema_falls_back_to_json_object_and_remembers(openai_server, make_settings):
    openai_server.json_schema_supported = False
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    chat = OpenAIChat(make_settings())
    messages = [{"role": "system", "content": "Be brief."}, *HELLO]

    first = chat.complete(messages, json_schema=schema)
    second = chat.complete(messages, json_schema=schema)

    formats = [r.body["response_format"]["type"] for r in openai_server.requests]
    assert formats == ["json_schema", "json_object", "json_object"]  # refused once, remembered
    fallback = openai_server.requests[1].body["messages"]
    assert fallback[0]["role"] == "system" and fallback[0]["content"].startswith("Be brief.")
    assert json.dumps(schema) in fallback[0]["content"]  # json_object cannot carry the schema
    assert fallback[1:] == HELLO
    assert first.text == second.text == "{}"


def test_other_bad_requests_are_not_retried_without_json(openai_server, make_settings):
    openai_server.script(Reply.error(400, "maximum context length exceeded"))
    with pytest.raises(BackendError, match="HTTP 400") as info:
        OpenAIChat(make_settings()).complete(HELLO)
    assert type(info.value) is BackendError
    assert len(openai_server.requests) == 1


def test_stream_yields_deltas_and_records_usage(openai_server, make_settings):
    reply = "Hello there, this reply is streamed word by word."
    openai_server.script(reply)
    chat = OpenAIChat(make_settings())

    deltas = list(chat.stream(HELLO))

    (request,) = openai_server.requests
    assert "".join(deltas) == reply
    assert len(deltas) > 3
    assert request.body["stream"] is True
    assert request.body["stream_options"] == {"include_usage": True}
    assert chat.last_usage == usage_of(request.body, reply)


def test_stream_errors_are_mapped(openai_server, make_settings):
    openai_server.script(Reply.error(503))
    with pytest.raises(BackendUnavailableError):
        list(OpenAIChat(make_settings()).stream(HELLO))


# errors -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "error", "cause"),
    [
        (401, BackendAuthError, openai.AuthenticationError),
        (403, BackendAuthError, openai.PermissionDeniedError),
        (429, BackendRateLimitError, openai.RateLimitError),
        (500, BackendUnavailableError, openai.InternalServerError),
        (503, BackendUnavailableError, openai.InternalServerError),
        (404, BackendError, openai.NotFoundError),
    ],
)
def test_http_errors_map_to_the_error_tree(openai_server, make_settings, status, error, cause):
    openai_server.script(Reply.error(status, f"failed for key {KEY}"))
    with pytest.raises(BackendError) as info:
        OpenAIChat(make_settings()).complete(HELLO)
    assert type(info.value) is error
    assert isinstance(info.value.__cause__, cause)
    assert KEY not in str(info.value)
    assert openai_server.base_url.split("//")[1].split("/")[0] in str(info.value)  # host:port


def test_a_refused_key_is_masked_and_names_the_fix(openai_server, make_settings):
    openai_server.required_key = "sk-the-right-one"
    with pytest.raises(BackendAuthError, match="HYBRIDMEM_API_KEY") as info:
        OpenAIChat(make_settings(api_key="sk-wrong-but-secret")).complete(HELLO)
    assert "sk-wrong-but-secret" not in str(info.value)  # the server echoed it; we did not
    assert info.value.status_code == 502


def test_slow_reply_beyond_timeout_is_unavailable(openai_server, make_settings):
    openai_server.script(Reply.slow(5.0, "too late"))
    with pytest.raises(BackendUnavailableError, match="HYBRIDMEM_REQUEST_TIMEOUT") as info:
        OpenAIChat(make_settings(request_timeout=0.3)).complete(HELLO)
    assert isinstance(info.value.__cause__, openai.APITimeoutError)


def test_connection_refused_is_unavailable(make_settings):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(BackendUnavailableError, match="HYBRIDMEM_BASE_URL"):
        OpenAIChat(make_settings(base_url=f"http://127.0.0.1:{port}/v1")).complete(HELLO)


def test_client_retries_come_from_settings(openai_server, make_settings):
    openai_server.script(Reply.error(500), "recovered")
    result = OpenAIChat(make_settings(max_retries=1)).complete(HELLO)
    assert result.text == "recovered"
    assert len(openai_server.requests) == 2


def test_map_openai_error_handles_anything():
    error = map_openai_error(ValueError("boom sk-abcdefghijkl"))
    assert type(error) is BackendError
    assert "boom" in str(error) and "sk-abcdefghijkl" not in str(error)


def test_no_key_for_openai_itself_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        OpenAIChat(Settings(data_dir=tmp_path, base_url=None, api_key=None, openai_api_key=None))


def test_close_is_idempotent_and_a_closed_client_refuses_use(openai_server, make_settings):
    with OpenAIChat(make_settings()) as chat:
        chat.complete(HELLO)
    chat.close()
    with pytest.raises(BackendError, match="closed"):
        chat.complete(HELLO)
    assert len(openai_server.requests) == 1


def test_logs_one_info_line_per_call_without_key_or_text(openai_server, make_settings, caplog):
    caplog.set_level(logging.INFO, logger="hybridmem.openai_compat")
    chat = OpenAIChat(make_settings(chat_model="tiny-chat"))
    chat.complete([{"role": "user", "content": "my secret diary entry"}])

    (record,) = [r for r in caplog.records if r.name == "hybridmem.openai_compat"]
    line = record.getMessage()
    assert record.levelno == logging.INFO
    assert "tiny-chat" in line and " ms " in line and "127.0.0.1" in line
    assert KEY not in line and "diary" not in line
    assert KEY not in repr(chat)


# extraction -------------------------------------------------------------------------------------

FENCED_REPLY = """Here you go:
```json
{"entities": [{"name": "ROG laptop", "type": "Product"}, {"name": ""}, "junk",
              {"name": "rog laptop", "type": "product"}],
 "relations": [{"subject": "I", "predicate": "Bought", "object": "ROG laptop", "confidence": 0.9},
               {"subject": "client_123", "predicate": "lives in", "object": "Lyon"},
               {"subject": "x", "object": "no predicate"},
               {"subject": "4K monitor", "predicate": "complements", "object": "ROG laptop",
                "confidence": 7}]}
```"""


def test_extract_parses_tolerantly_and_uses_the_speaker(openai_server, make_settings):
    openai_server.script(FENCED_REPLY)
    extractor = LLMExtractor(OpenAIChat(make_settings()))

    found = extractor.extract("I bought a ROG laptop, I live in Lyon", speaker="client_123")

    assert [(e.name, e.type) for e in found.entities] == [("ROG laptop", "product")]
    assert found.relations == [
        Relation(subject="client_123", predicate="bought", object="ROG laptop", confidence=0.9),
        Relation(subject="client_123", predicate="lives_in", object="Lyon"),
        Relation(subject="4K monitor", predicate="complements", object="ROG laptop"),  # clamped
    ]
    assert found.extractor == "llm:gpt-4o-mini" == extractor.name
    (request,) = openai_server.requests
    assert found.usage == usage_of(request.body, FENCED_REPLY)
    fmt = request.body["response_format"]
    assert fmt["json_schema"]["name"] == "extraction"
    assert {"entities", "relations"} <= set(fmt["json_schema"]["schema"]["properties"])
    system, user = request.body["messages"]
    assert "speaker" in system["content"] and "lives_in" in system["content"]
    assert json.loads(user["content"]) == {
        "speaker": "client_123", "text": "I bought a ROG laptop, I live in Lyon"
    }
    assert isinstance(extractor, Extractor)


def test_invalid_json_once_is_retried(openai_server, make_settings):
    good = '{"entities": [{"name": "Lyon", "type": "place"}], "relations": []}'
    openai_server.script(Reply.invalid_json(), good)

    found = LLMExtractor(OpenAIChat(make_settings())).extract("I live in Lyon", speaker="ann")

    assert [e.name for e in found.entities] == ["Lyon"]
    first, second = openai_server.requests
    assert second.messages[:2] == first.messages
    assert second.messages[2]["role"] == "assistant"  # the bad reply, then the correction
    assert "JSON" in second.messages[3]["content"]
    assert found.usage.total_tokens > usage_of(second.body, good).total_tokens  # both summed


def test_invalid_json_twice_raises(openai_server, make_settings):
    openai_server.script(Reply.invalid_json(), '{"answer": "not an extraction"}', "unused")
    with pytest.raises(BackendError, match="JSON"):
        LLMExtractor(OpenAIChat(make_settings())).extract("I live in Lyon")
    assert len(openai_server.requests) == 2
    assert openai_server.pending == 1


def test_extract_works_when_json_schema_is_refused(openai_server, make_settings):
    openai_server.script(Reply.refuse_json_schema())
    found = LLMExtractor(OpenAIChat(make_settings())).extract("I live in Lyon", speaker="ann")
    assert found.entities == [] and found.relations == []  # the server's default extraction
    assert [r.body["response_format"]["type"] for r in openai_server.requests] == [
        "json_schema",
        "json_object",
    ]


def test_blank_text_needs_no_call(openai_server, make_settings):
    found = LLMExtractor(OpenAIChat(make_settings())).extract("  ")
    assert found.entities == [] and found.relations == [] and openai_server.requests == []


def test_extract_batch_aligns_results_by_index(openai_server, make_settings):
    texts = ["I bought a ROG laptop", "nothing here", "I live in Lyon"]
    results = [
        {"index": 2, "entities": [], "relations": [
            {"subject": "me", "predicate": "lives_in", "object": "Lyon"}]},
        {"index": 0, "entities": [{"name": "ROG laptop", "type": "product"}], "relations": [
            {"subject": "I", "predicate": "bought", "object": "ROG laptop"}]},
        {"index": 1, "entities": []},  # one list is enough
    ]
    reply = json.dumps({"results": results})
    openai_server.script(reply)

    found = LLMExtractor(OpenAIChat(make_settings())).extract_batch(texts, ["ann", None, "bob"])

    assert [[repr(r) for r in f.relations] for f in found] == [
        ["Relation(ann -bought-> ROG laptop)"],
        [],
        ["Relation(bob -lives_in-> Lyon)"],
    ]
    assert [e.name for e in found[0].entities] == ["ROG laptop"]
    (request,) = openai_server.requests
    assert request.body["response_format"]["json_schema"]["name"] == "extraction_batch"
    sent = json.loads(request.messages[1]["content"])["texts"]
    assert [(t["index"], t["speaker"], t["text"]) for t in sent] == [
        (0, "ann", texts[0]), (1, None, texts[1]), (2, "bob", texts[2])
    ]
    assert found[0].usage == usage_of(request.body, reply)
    assert found[1].usage == found[2].usage == Usage()  # counted once


def test_extract_batch_retries_a_misaligned_reply(openai_server, make_settings):
    openai_server.script(json.dumps({"results": [{"index": 0, "entities": [], "relations": []}]}))
    extractor = LLMExtractor(OpenAIChat(make_settings()))

    found = extractor.extract_batch(["one", "two"], ["ann", "ann"])  # default reply: aligned

    assert len(found) == 2 and len(openai_server.requests) == 2
    openai_server.script(Reply.invalid_json(), Reply.invalid_json())
    with pytest.raises(BackendError):
        extractor.extract_batch(["one", "two"])
    assert len(openai_server.requests) == 4


def test_extract_batch_checks_its_arguments(openai_server, make_settings):
    extractor = LLMExtractor(OpenAIChat(make_settings()))
    assert extractor.extract_batch([], []) == []
    with pytest.raises(InvalidInputError):
        extractor.extract_batch(["a", "b"], ["ann"])
    assert openai_server.requests == []


def test_an_abandoned_stream_releases_its_connection(openai_server, make_settings, caplog):
    caplog.set_level(logging.INFO, logger="hybridmem.openai_compat")
    openai_server.script("one two three four")
    chat = OpenAIChat(make_settings(max_retries=0))

    deltas = chat.stream(HELLO)
    assert next(deltas) == "one "
    deltas.close()  # the reader stops early

    assert chat.complete(HELLO).text == "ok: hello there"
    assert [r.getMessage().split()[-1] for r in caplog.records] == ["abandoned", "ok"]


def test_the_wire_server_speaks_the_clients_defaults(openai_server):
    client = openai.OpenAI(base_url=openai_server.base_url, api_key="k", max_retries=0)
    reply = client.embeddings.create(model="m", input="ROG laptop")  # base64 by default
    assert reply.data[0].embedding == pytest.approx(hashed_vector("ROG laptop", 64), abs=1e-6)
    assert openai_server.requests[0].body["encoding_format"] == "base64"
    assert [m.id for m in client.models.list()] == ["gpt-4o-mini", "text-embedding-3-small"]
    client.close()


# faults at the seam: every broken reply is a BackendError, and never loses a memory -----------


@pytest.mark.parametrize("fault", FAULTS)
def test_every_broken_reply_is_a_backend_error(openai_server, make_settings, fault):
    settings = make_settings()
    chat, embedder = OpenAIChat(settings), OpenAIEmbedder(settings)
    openai_server.script(Reply.broken(fault))
    with pytest.raises(BackendError):
        chat.complete(HELLO)
    openai_server.script(Reply.broken(fault))
    with pytest.raises(BackendError):
        chat.complete(HELLO, json_schema={"type": "object"})
    openai_server.script(Reply.broken(fault), endpoint="embeddings")
    with pytest.raises(BackendError):
        embedder.embed_batch(["a text"])
    openai_server.script(Reply.broken(fault))
    with pytest.raises(BackendError):
        list(chat.stream(HELLO))


def test_a_broken_stream_raises_after_its_partial_deltas(openai_server, make_settings):
    openai_server.script(Reply.broken("broken_stream", "one two three four five six"))
    deltas: list[str] = []
    with pytest.raises(BackendError):
        deltas.extend(OpenAIChat(make_settings()).stream(HELLO))
    assert "".join(deltas).split() == ["one", "two"]  # what arrived before the cut


def test_a_stream_that_ends_unfinished_is_an_error(openai_server, make_settings):
    openai_server.script(Reply.broken("no_choices"))
    with pytest.raises(BackendError, match="ended before the reply finished"):
        list(OpenAIChat(make_settings()).stream(HELLO))


def test_the_deadline_caps_every_attempt_of_a_call(openai_server, make_settings):
    """Each reply comes after 5 s, within request_timeout: only the deadline's share of it
    (0.9 s / 3 attempts) makes every attempt time out, so without it the first one succeeds."""
    openai_server.script(*[Reply.slow(5.0, "too late")] * 3)
    chat = OpenAIChat(make_settings(request_timeout=30, max_retries=2, request_deadline=0.9))
    with pytest.raises(BackendUnavailableError) as info:
        chat.complete(HELLO)
    assert isinstance(info.value.__cause__, openai.APITimeoutError)
    assert len(openai_server.requests) == 3


MEMORY_FAULTS = [Reply.broken(f) for f in FAULTS] + [Reply.error(500), Reply.error(401),
                                                     Reply.slow(5.0), Reply.invalid_json()]


@pytest.mark.parametrize("reply", MEMORY_FAULTS, ids=lambda r: r.fault or str(r.status or r.delay))
def test_a_failing_extractor_never_loses_the_memory(openai_server, make_settings, embedder,
                                                    reply):
    settings = make_settings(extractor="llm", request_timeout=0.5)
    openai_server.script(reply, reply)  # the extractor asks twice when the first reply is bad
    with Memory(settings, embedder=embedder) as mem:
        item = mem.add("ann", "Ann bought a ROG laptop in Berlin")
        assert item.needs_extraction and item.extractor == "rules"
        assert mem.get("ann", item.id).needs_extraction
        assert [h.item.id for h in mem.search("ann", "ROG laptop")] == [item.id]
        assert mem.entities("ann")  # the rules found something meanwhile

        openai_server.reset()
        openai_server.script(json.dumps({"entities": [{"name": "ROG laptop", "type": "product"}],
                                         "relations": [{"subject": "Ann", "predicate": "bought",
                                                        "object": "ROG laptop"}]}))
        assert mem.reextract("ann") == 1
        again = mem.get("ann", item.id)
        assert not again.needs_extraction and again.extractor == "llm:gpt-4o-mini"
        assert [str(r) for r in mem.relations("ann")] == ["Ann -bought-> ROG laptop"]
        assert mem.reextract("ann") == 0
        assert mem.history("ann", item.id)[-1].cause == "re-extracted with llm:gpt-4o-mini"


@pytest.mark.parametrize("reply", MEMORY_FAULTS, ids=lambda r: r.fault or str(r.status or r.delay))
def test_add_many_keeps_every_memory_when_the_extractor_fails(openai_server, make_settings,
                                                              embedder, reply):
    """A batch's one extraction call failing, whatever the way: every memory is stored, marked
    for re-extraction, searchable; nothing is lost and nothing raises."""
    texts = ["Ann bought a ROG laptop in Berlin", "Ann moved to Lisbon last spring",
             "Ann is allergic to peanuts"]
    with Memory(make_settings(extractor="llm", request_timeout=0.5), embedder=embedder) as mem:
        openai_server.script(*[reply] * 6)
        items = mem.add_many("ann", texts)
        assert [i.text for i in items] == texts
        assert [(i.needs_extraction, i.extractor) for i in items] == [(True, "rules")] * 3
        assert sorted(i.text for i in mem.list("ann")) == sorted(texts)
        assert [h.item.id for h in mem.search("ann", "peanut allergy", limit=1)] == [items[2].id]


EMBEDDER_FAULTS = [r for r in MEMORY_FAULTS if r.content is None]  # the text is for chat


@pytest.mark.parametrize("reply", EMBEDDER_FAULTS,
                         ids=lambda r: r.fault or str(r.status or r.delay))
def test_add_many_stores_nothing_when_the_embedder_fails(openai_server, make_settings, reply):
    """The remote embedder failing mid-batch is a BackendError and no memory of the batch is
    stored (vectors are the source of truth: no half-written batch)."""
    settings = make_settings(embedder="openai", extractor="rules", request_timeout=0.5)
    with Memory(settings) as mem:
        kept = mem.add("ann", "Ann owns a red kayak")
        graph = [str(r) for r in mem.relations("ann")]
        openai_server.script(reply, endpoint="embeddings")
        with pytest.raises(BackendError):
            mem.add_many("ann", ["Ann bought a ROG laptop", "Ann lives in Berlin"])
        assert [i.id for i in mem.list("ann")] == [kept.id]
        assert [e.memory_id for e in mem.history("ann")] == [kept.id]
        assert [str(r) for r in mem.relations("ann")] == graph
        assert mem.search("ann", "ROG laptop Berlin")[0].item.id == kept.id
        again = mem.add_many("ann", ["Ann bought a ROG laptop", "Ann lives in Berlin"])
        assert mem.count("ann") == 3 and {i.id for i in again} < {i.id for i in mem.list("ann")}


def test_reextraction_links_no_memories_of_different_conversations(
        openai_server, make_settings, embedder):
    """Re-extraction redoes memories of many conversations in one call: it must not chain them
    as one episode (each add below is its own conversation, so no episodic link may appear)."""
    with Memory(make_settings(extractor="llm", request_timeout=0.5), embedder=embedder) as mem:
        openai_server.script(*[Reply.error(503)] * 4)  # both adds fall back to the rules
        first = mem.add("dee", "Dee bought a ROG laptop in Berlin")
        second = mem.add("dee", "Dee moved to Lisbon last spring")
        assert first.needs_extraction and second.needs_extraction
        openai_server.reset()
        dee = {"entities": [{"name": "Dee", "type": "person"}], "relations": []}
        openai_server.script(json.dumps({"results": [{"index": 0, **dee}, {"index": 1, **dee}]}))
        assert mem.reextract("dee") == 2
        assert not mem.get("dee", first.id).needs_extraction
        assert mem.export("dee")["graph"]["graph"]["graph"].get("next", {}) == {}


def test_reextract_keeps_the_mark_while_the_model_still_fails(openai_server, make_settings,
                                                              embedder):
    with Memory(make_settings(extractor="llm"), embedder=embedder) as mem:
        openai_server.script(Reply.broken("html"), Reply.broken("html"))
        item = mem.add("bo", "Bo lives in Oslo")
        openai_server.script(Reply.error(503), Reply.error(503))
        assert mem.reextract("bo") == 0
        assert mem.get("bo", item.id).needs_extraction
        assert mem.count("bo") == 1


def test_a_failed_summary_never_raises_and_is_retried(openai_server, make_settings, embedder):
    settings = make_settings(extractor="rules", episode_turns=2)
    turns = [{"role": "user", "content": "I like green tea"},
             {"role": "assistant", "content": "Noted, green tea."}]
    with Memory(settings, embedder=embedder) as mem:
        openai_server.script(Reply.broken("non_json"))
        stored = mem.add_messages("cy", turns)
        assert len(stored) == 2 and mem.count("cy") == 2  # stored, no error, no summary
        assert mem.list("cy", where={"kind": "summary"}) == []

        openai_server.script("Cy likes green tea.")
        mem.add_messages("cy", [{"role": "user", "content": "And oolong too"}])
        (summary,) = mem.list("cy", where={"kind": "summary"})
        assert summary.text == "Cy likes green tea." and summary.metadata["turns"] == 3
        assert mem.count("cy") == 4
