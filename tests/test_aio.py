"""AsyncMemory: the Memory API, awaitable, under many concurrent tasks — real stores, the real
hash embedder (wrapped to count the threads it runs on), a real OpenAI-wire server for chat."""

from __future__ import annotations

import inspect
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest
from openai_wire import OpenAIWireServer, Reply

from hybridmem import (
    AsyncMemory,
    ClosedError,
    InvalidInputError,
    InvalidUserIdError,
    Memory,
    NotFoundError,
    Settings,
)
from hybridmem.offline import HashEmbedder

pytestmark = pytest.mark.anyio

WORDS = ["amber", "basil", "cedar", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper", "kestrel", "lagoon", "meadow", "nectar", "orchid", "pepper", "quartz", "raven", "saffron", "tundra", "umber", "violet", "willow", "yarrow", "zephyr", "anchor", "bramble", "copper", "dune", "elm", "falcon", "glacier", "hazel", "iris", "jasper", "kelp", "lilac", "maple"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class CountingEmbedder(HashEmbedder):
    """The real hash embedder, counting how many threads are inside ``embed_batch`` at once."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__(256)
        self.delay = delay
        self.active = 0
        self.peak = 0
        self.in_flight = 0  # texts inside embed_batch at once (concurrent queries share a call)
        self.peak_texts = 0
        self.threads: set[int] = set()
        self.gate: Callable[[Sequence[str]], None] | None = None  # runs inside each call
        self._guard = threading.Lock()

    def embed_batch(self, texts: Sequence[str]) -> list[list[float]]:
        with self._guard:
            self.active += 1
            self.peak = max(self.peak, self.active)
            self.in_flight += len(texts)
            self.peak_texts = max(self.peak_texts, self.in_flight)
            self.threads.add(threading.get_ident())
        try:
            if self.gate is not None:
                self.gate(texts)
            if self.delay:
                time.sleep(self.delay)
            return super().embed_batch(texts)
        finally:
            with self._guard:
                self.active -= 1
                self.in_flight -= len(texts)


def distinct_text(rng: random.Random, n: int) -> str:
    """A memory no other one is a near-duplicate of (so none is merged)."""
    return f"note {n}: " + " ".join(rng.sample(WORDS, 6)) + f" token{n}x{rng.randrange(10**9)}"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "hm", embedder="hash")


@pytest.fixture
async def amem(settings: Settings) -> AsyncIterator[AsyncMemory]:
    async with AsyncMemory(settings) as memory:
        yield memory


# -- the API mirrors Memory --------------------------------------------------------------------------
def _public(cls: type) -> dict[str, object]:
    """Public attributes, inherited ones included."""
    return {n: v for klass in reversed(cls.__mro__[:-1]) for n, v in vars(klass).items()
            if not n.startswith("_")}


def test_same_public_methods_and_signatures_as_memory() -> None:
    sync, aio = _public(Memory), _public(AsyncMemory)
    sync_methods = {n for n, v in sync.items() if inspect.isfunction(v)}
    aio_methods = {n for n, v in aio.items() if inspect.isfunction(v)}
    # aclose is the async twin of close; from_memory is the async-only constructor.
    assert aio_methods - {"aclose"} == sync_methods
    assert {n for n, v in sync.items() if isinstance(v, property)} <= {
        n for n, v in aio.items() if isinstance(v, property)}
    for name in sorted(sync_methods - {"close"}):
        ours = getattr(AsyncMemory, name)
        if name == "chat_stream":
            assert inspect.isasyncgenfunction(ours), name
        else:
            assert inspect.iscoroutinefunction(ours), name
        theirs = inspect.signature(getattr(Memory, name)).parameters
        mine = inspect.signature(ours).parameters
        assert [(p.name, p.kind, p.default, p.annotation) for p in mine.values()] == [
            (p.name, p.kind, p.default, p.annotation) for p in theirs.values()], name
    init = inspect.signature(AsyncMemory.__init__).parameters
    assert list(init)[:-1] == list(inspect.signature(Memory.__init__).parameters)


# -- every method, awaited -----------------------------------------------------------------------------
async def test_round_trip_through_every_method(amem: AsyncMemory) -> None:
    item = await amem.add("client_1", "I bought a ROG laptop", category="purchase", importance=0.8)
    assert (await amem.get("client_1", item.id)).text == "I bought a ROG laptop"
    turns = await amem.add_messages("client_1", [{"role": "user", "content": "I want a 4K monitor"}])
    assert turns[0].kind == "turn"
    many = await amem.add_many("client_1", ["Lives in Lyon", {"text": "Likes espresso"}])
    assert len(many) == 2
    hits = await amem.search("client_1", "laptop", limit=5)
    assert hits and hits[0].item.id == item.id
    ctx = await amem.context("client_1", "which laptop?", max_tokens=60)
    # The hash embedder scores "Lives in Lyon" and "Likes espresso" 0 alike, and a tie is broken
    # by memory id (random): the context takes the one its search ranks first. The 4K monitor
    # line (second) does not fit in 60 tokens.
    ranked = [h.item.text for h in await amem.search("client_1", "which laptop?", limit=30)]
    assert ranked[:2] == ["I bought a ROG laptop", "I want a 4K monitor"]
    assert set(ranked[2:]) == {"Lives in Lyon", "Likes espresso"}
    day = item.created_at.date().isoformat()
    assert ctx.text == ("<memory>\nRelations:\n- client_1 -bought-> ROG laptop\n"
                        f"Memories (most relevant first):\n- [{day}] I bought a ROG laptop\n"
                        f"- [{day}] {ranked[2]}\n</memory>")
    # o200k tokens, counted once with tiktoken
    assert ctx.tokens == {"Lives in Lyon": 56, "Likes espresso": 55}[ranked[2]]
    fact = await amem.remember("client_1", "city", "Lyon")
    assert [f.id for f in await amem.facts("client_1")] == [fact.id]
    updated = await amem.update("client_1", item.id, importance=0.9)
    assert updated.importance == 0.9
    assert [e.action for e in await amem.history("client_1", item.id)][:2] == ["add", "update"]
    assert await amem.count("client_1") == len(await amem.list("client_1")) == 5
    stats = await amem.stats("client_1")
    assert stats.memories == 5 and stats.entities == len(await amem.entities("client_1"))
    assert [str(r) for r in await amem.relations("client_1")] == [
        "client_1 -bought-> ROG laptop", "client_1 -wants-> 4K monitor"]
    assert await amem.query_path("client_1", "client_1", "ROG laptop") == [
        "client_1 -bought-> ROG laptop"]
    graph = await amem.graph("client_1")
    assert set(graph.nodes) == {e.key for e in await amem.entities("client_1")}
    await amem.refresh("client_1")
    await amem.flush_access()
    assert await amem.prune("client_1") == []
    bundle = await amem.export("client_1")
    assert await amem.import_("client_2", bundle) == 5
    assert await amem.forget("client_1", item.id) == 1
    with pytest.raises(NotFoundError):
        await amem.get("client_1", item.id)
    assert await amem.forget("client_2") == 5
    assert await amem.count("client_2") == 0
    assert amem.settings.embedder == "hash" and amem.embedder.name == "hash-256"
    assert amem.tokens is amem.memory.tokens and amem.usage.total_tokens == 0
    assert "AsyncMemory(Memory(" in repr(amem)


async def test_errors_are_the_typed_errors_of_memory(amem: AsyncMemory) -> None:
    with pytest.raises(InvalidUserIdError):
        await amem.add("../etc", "x")
    with pytest.raises(InvalidUserIdError):
        await amem.search("", "x")
    with pytest.raises(InvalidInputError):
        await amem.search("u", "x", limit=0)
    with pytest.raises(NotFoundError):
        await amem.get("u", "nope")


# -- concurrency -----------------------------------------------------------------------------------
async def test_many_concurrent_tasks_on_one_user_and_others(tmp_path: Path) -> None:
    embedder = CountingEmbedder()
    rng = random.Random(14)
    plan = [("busy", distinct_text(rng, n)) for n in range(50)]
    plan += [(f"other-{k}", distinct_text(rng, 100 + 20 * k + n)) for k in range(3) for n in range(20)]
    rng.shuffle(plan)
    stored: dict[str, list[str]] = {}
    found: list[int] = []
    async with AsyncMemory(Settings(data_dir=tmp_path / "hm"), embedder=embedder,
                           max_threads=4) as amem:

        async def add(user: str, text: str) -> None:
            item = await amem.add(user, text, infer=False)
            stored.setdefault(user, []).append(item.id)

        async def search(user: str) -> None:
            for _ in range(5):
                found.append(len(await amem.search(user, "note meadow", limit=5)))
                await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as tg:
            for user, text in plan:
                tg.start_soon(add, user, text)
            for user in ("busy", "other-0", "other-1", "other-2"):
                tg.start_soon(search, user)

        assert {u: len(ids) for u, ids in stored.items()} == {
            "busy": 50, "other-0": 20, "other-1": 20, "other-2": 20}
        for user, ids in stored.items():
            assert len(set(ids)) == len(ids)
            assert await amem.count(user) == len(ids)
            assert {i.id for i in await amem.list(user, limit=100)} == set(ids)
        assert len(found) == 20
        # Every stored memory is searchable afterwards.
        assert (await amem.search("busy", "note", limit=50))
    assert embedder.peak <= 4


async def test_threads_are_bounded_by_max_threads(tmp_path: Path) -> None:
    embedder = CountingEmbedder()
    async with AsyncMemory(Settings(data_dir=tmp_path / "hm"), embedder=embedder,
                           max_threads=3) as amem:
        await amem.add("seed", "warm up the stores", infer=False)
        batcher = amem.memory._retriever._batch  # type: ignore[attr-defined]  # white-box
        first = threading.Event()

        def hold_the_first_query(texts: Sequence[str]) -> None:
            if first.is_set():
                return
            first.set()  # the first query's call waits until both other threads queue theirs
            deadline = time.monotonic() + 60  # only a hang reaches it
            while len(batcher._queue) < 2:
                assert time.monotonic() < deadline, "the other threads never queued"
                time.sleep(0.001)

        embedder.gate = hold_the_first_query
        async with anyio.create_task_group() as tg:
            for n in range(24):
                tg.start_soon(amem.search, f"user-{n % 8}", f"anything at all {n}")
    # searches in flight at once: their queries are embedded together (one call per batch), and
    # never more than the three threads carry
    assert 2 <= embedder.peak_texts <= 3


async def test_writes_of_one_user_hold_at_most_two_threads(tmp_path: Path) -> None:
    """The per-user gate: 12 concurrent adds to one user never occupy more than two threads at
    once, so the pool stays free for other users."""
    embedder = CountingEmbedder(delay=0.01)
    rng = random.Random(3)
    async with AsyncMemory(Settings(data_dir=tmp_path / "hm"), embedder=embedder,
                           max_threads=4) as amem:
        async with anyio.create_task_group() as tg:
            for n in range(12):
                tg.start_soon(amem.add, "solo", distinct_text(rng, n))
        assert await amem.count("solo") == 12
    assert 1 <= embedder.peak <= 2


# -- lifecycle -------------------------------------------------------------------------------------
async def test_aclose_waits_for_calls_in_flight_then_refuses(tmp_path: Path) -> None:
    embedder = CountingEmbedder(delay=0.2)
    amem = AsyncMemory(Settings(data_dir=tmp_path / "hm"), embedder=embedder)
    results: list[str] = []

    async def slow_add() -> None:
        results.append((await amem.add("u", "a slow memory", infer=False)).id)

    async with anyio.create_task_group() as tg:
        tg.start_soon(slow_add)
        while not embedder.active:  # the add is inside its thread (pytest-timeout ends a hang)
            await anyio.sleep(0.001)
        await amem.aclose()  # returns only once the add has landed
        assert results
    with pytest.raises(ClosedError):
        await amem.count("u")
    with pytest.raises(ClosedError):
        amem.memory.count("u")  # it owned the Memory, so it closed it
    await amem.aclose()
    amem.close()  # idempotent, both ways


async def test_a_cancelled_write_still_lands_whole(tmp_path: Path) -> None:
    """A timeout does not abandon the thread: the write finishes whole before the awaiting task
    moves on (the cancellation is delivered at its next checkpoint)."""
    embedder = CountingEmbedder(delay=0.3)
    async with AsyncMemory(Settings(data_dir=tmp_path / "hm"), embedder=embedder) as amem:
        with anyio.move_on_after(0.05) as scope:
            await amem.add("u", "written despite the timeout", infer=False)
        assert scope.cancel_called
        embedder.delay = 0
        assert [i.text for i in await amem.list("u")] == ["written despite the timeout"]


async def test_from_memory_leaves_the_memory_open(settings: Settings) -> None:
    with Memory(settings) as mem:
        async with AsyncMemory.from_memory(mem, max_threads=2) as amem:
            await amem.add("u", "shared between faces", infer=False)
        assert mem.count("u") == 1
        with pytest.raises(ClosedError):
            await amem.count("u")
    with pytest.raises(InvalidInputError):
        AsyncMemory.from_memory(mem, max_threads=0)
    with pytest.raises(InvalidInputError):
        AsyncMemory.from_memory("not a memory")  # type: ignore[arg-type]


def test_sync_close_outside_the_loop(settings: Settings) -> None:
    amem = AsyncMemory(settings)
    assert anyio.run(amem.count, "u") == 0
    amem.close()
    with pytest.raises(ClosedError):
        anyio.run(amem.count, "u")


# -- chat --------------------------------------------------------------------------------------------
@pytest.fixture
def llm_settings(tmp_path: Path, openai_server: OpenAIWireServer) -> Iterator[Settings]:
    yield Settings(data_dir=tmp_path / "llm", embedder="hash", base_url=openai_server.base_url,
                   api_key="sk-test", chat_model="test-model", max_retries=0, request_timeout=5,
                   episode_turns=0, extractor="rules")


async def test_chat_and_chat_stream(llm_settings: Settings, openai_server: OpenAIWireServer) -> None:
    async with AsyncMemory(llm_settings) as amem:
        await amem.add("c", "I bought the ROG laptop last spring.", infer=False)
        openai_server.script(Reply.text("Try the Dell 4K monitor."))
        reply = await amem.chat("c", "Which monitor fits my laptop?")
        assert reply.text == "Try the Dell 4K monitor." and "ROG laptop" in reply.context.text

        openai_server.script(Reply.text("Streaming works fine"))
        parts = [part async for part in amem.chat_stream("c", "Say something")]
        assert len(parts) > 1 and "".join(parts) == "Streaming works fine"
        assert "Streaming works fine" in [
            t.text for t in await amem.list("c", where={"source": "assistant"})]

        openai_server.script(Reply.text("The user bought a laptop and asked about monitors."))
        summary = await amem.summarize("c")
        assert summary is not None and summary.kind == "summary"

        openai_server.script(Reply.text("one two three four five six seven eight"))
        stream = amem.chat_stream("c", "Count")
        first = await stream.__anext__()
        await stream.aclose()  # leaving early closes the HTTP stream; nothing is stored
        assert first == "one "
        assert "Count" not in [t.text for t in await amem.list("c", where={"kind": "turn"})]

        with pytest.raises(InvalidUserIdError):
            async for _ in amem.chat_stream("a/b", "hi"):
                pass
