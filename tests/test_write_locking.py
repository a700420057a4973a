"""Model calls run outside the user's lock (hybridmem.write.writer): a hanging endpoint delays only its
own add, never another add or a search of the same user — and the plan made before the lock is
checked again under it, so what changed meanwhile is not duplicated. Real parts: the OpenAI-wire
test server on 127.0.0.1 (its slow reply hangs until the server is reset), real Chroma in both
modes, the local embedder."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from openai_wire import OpenAIWireServer, Reply

from hybridmem import AsyncMemory, Memory, MemoryItem, Settings
from hybridmem.models import to_request
from hybridmem.offline import LocalEmbedder

HANG = 600.0  # the client never gives up first: a held-back reply ends when the server is reset


def _llm_settings(make_settings: Callable[..., Settings], server: OpenAIWireServer) -> Settings:
    return make_settings(base_url=server.base_url, api_key="sk-test", extractor="llm",
                         max_retries=0, request_timeout=HANG, request_deadline=HANG)


def _hanging_add(mem: Memory, user: str, text: str, server: OpenAIWireServer
                 ) -> tuple[threading.Thread, list[MemoryItem]]:
    """Start an add whose extraction call hangs; return once the server holds that call."""
    server.script(Reply.held_back())
    out: list[MemoryItem] = []
    thread = threading.Thread(target=lambda: out.append(mem.add(user, text)), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.requests:
        assert time.monotonic() < deadline, "the extraction call never reached the server"
        assert thread.is_alive(), "the add finished without calling the endpoint"
        time.sleep(0.02)
    return thread, out


def test_a_hanging_endpoint_blocks_neither_adds_nor_searches_of_the_user(
    openai_server: OpenAIWireServer, make_settings: Callable[..., Settings],
    embedder: LocalEmbedder, unique_user: str,
) -> None:
    with Memory(_llm_settings(make_settings, openai_server), embedder=embedder) as mem:
        mem.add(unique_user, "Ann bought a ROG laptop", infer=False)
        slow, out = _hanging_add(mem, unique_user, "Ann lives in Berlin", openai_server)

        other = mem.add(unique_user, "Ann prefers matte screens")  # its own call: answered
        hits = mem.search(unique_user, "which laptop did Ann buy?", limit=3)
        assert other.text == "Ann prefers matte screens" and not other.needs_extraction
        assert hits[0].item.text == "Ann bought a ROG laptop"
        assert slow.is_alive()  # all of the above happened while the slow call still hung

        openai_server.reset()  # the hanging reply is cut: the add falls back to the rules
        slow.join(timeout=60)
        assert not slow.is_alive() and out[0].needs_extraction
        assert mem.count(unique_user) == 3


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_async_writes_of_a_user_do_not_wait_for_its_hanging_model_call(
    openai_server: OpenAIWireServer, make_settings: Callable[..., Settings],
    embedder: LocalEmbedder, unique_user: str, anyio_backend: str,
) -> None:
    """AsyncMemory (the REST service's engine) gates a user's writes, but not one at a time: the
    next add of the user lands while the first one's extraction still hangs."""
    with Memory(_llm_settings(make_settings, openai_server), embedder=embedder) as mem:
        async with AsyncMemory.from_memory(mem) as amem, anyio.create_task_group() as tg:
            openai_server.script(Reply.held_back())
            tg.start_soon(amem.add, unique_user, "Ann lives in Berlin")
            with anyio.fail_after(60):
                while not openai_server.requests:
                    await anyio.sleep(0.02)
                other = await amem.add(unique_user, "Ann prefers matte screens", infer=False)
            assert other.text == "Ann prefers matte screens"
            assert await amem.count(unique_user) == 1  # the slow add still waits for its model
            openai_server.reset()  # the hanging reply is cut: the add falls back to the rules
        assert mem.count(unique_user) == 2


def test_a_plan_made_before_the_lock_is_checked_again_under_it(
    openai_server: OpenAIWireServer, make_settings: Callable[..., Settings],
    embedder: LocalEmbedder, unique_user: str,
) -> None:
    with Memory(_llm_settings(make_settings, openai_server), embedder=embedder) as mem:
        slow, out = _hanging_add(mem, unique_user, "Ann lives in Berlin", openai_server)
        # while the first add waits for its model, the same fact arrives and is stored
        first = mem.add(unique_user, "Ann lives in Berlin.")
        openai_server.reset()
        slow.join(timeout=60)
        assert not slow.is_alive()
        # the slow add planned "new memory" but found the fact stored when it took the lock
        assert out[0].id == first.id and out[0].mention_count == 2
        assert [i.id for i in mem.list(unique_user)] == [first.id]
        actions = [e.action for e in mem.history(unique_user, first.id)]
        assert actions == ["add", "merge"]


def test_prepared_answers_are_reused_and_missing_ones_fetched(
    make_settings: Callable[..., Settings], embedder: LocalEmbedder, unique_user: str,
) -> None:
    """White-box on the writer's two steps: a text that became fresh after prepare gets its
    vector and extraction from a second prepare (try_commit says so), none is lost."""
    with Memory(make_settings(extractor="rules"), embedder=embedder) as mem:
        writer: Any = mem._writer
        stored = mem.add(unique_user, "Ben works at Acme")
        prepared = writer.prepare(unique_user, [to_request("Ben works at Acme")], infer=True)
        assert prepared.vectors == {}  # an exact duplicate needs no vector
        mem.forget(unique_user, stored.id)  # ... until it is gone
        assert writer.try_commit(prepared) is None  # nothing written: a vector is missing
        assert mem.count(unique_user) == 0
        (item,) = writer.write(unique_user, [to_request("Ben works at Acme")], infer=True)
        assert item.id != stored.id and mem.count(unique_user) == 1
        assert [str(r) for r in mem.relations(unique_user)] == ["Ben -works_at-> Acme"]


def test_the_last_attempt_calls_no_chat_model_and_marks_what_it_lacks(
    openai_server: OpenAIWireServer, make_settings: Callable[..., Settings],
    embedder: LocalEmbedder, unique_user: str,
) -> None:
    """White-box: commit (the last attempt, under the lock) makes do with what prepare gathered.
    A text that became fresh meanwhile is embedded and extracted by the rules, and marked for
    re-extraction; the LLM endpoint hears nothing."""
    with Memory(_llm_settings(make_settings, openai_server), embedder=embedder) as mem:
        writer: Any = mem._writer
        stored = mem.add(unique_user, "Ben works at Acme", infer=False)
        prepared = writer.prepare(unique_user, [to_request("Ben works at Acme")], infer=True)
        assert prepared.vectors == {} and prepared.found == {}  # a duplicate needs no answer
        mem.forget(unique_user, stored.id)
        with writer.locks(unique_user):
            (item,) = writer.commit(prepared)
        assert openai_server.requests == []
        assert item.id != stored.id and item.extractor == "rules" and item.needs_extraction
        assert [str(r) for r in mem.relations(unique_user)] == ["Ben -works_at-> Acme"]
