"""The Memory facade end to end, with real Chroma, real files and the real local embedder."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from hybridmem import (
    EmbedderMismatchError,
    HybridMemError,
    InvalidInputError,
    InvalidUserIdError,
    Memory,
    NotFoundError,
    Settings,
)
from hybridmem.offline import HashEmbedder, LocalEmbedder


def test_add_get_list_search_roundtrip(mem: Memory) -> None:
    when = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
    item = mem.add("client_123", "Bought a ROG Strix laptop for $1,899", category="purchase",
                   importance=0.8, metadata={"order_id": "A-1"}, created_at=when)
    assert item.text.startswith("Bought") and item.category == "purchase"
    assert item.created_at == when and item.metadata == {"order_id": "A-1"}
    assert mem.get("client_123", item.id) == item
    mem.add_many("client_123", ["I live in Lyon", {"text": "I hate loud keyboards",
                                                   "category": "preference"}])
    assert [i.text for i in mem.list("client_123", category="preference")] == [
        "I hate loud keyboards"
    ]
    hits = mem.search("client_123", "which computer did I purchase?", limit=2)
    assert hits[0].item.id == item.id
    assert hits[0].score > 0 and "vector" in hits[0].why
    assert (hits[0].breakdown.vector_rank, hits[0].breakdown.vector) == (1, pytest.approx(0.4945, abs=1e-3))
    only = mem.search("client_123", "laptop", where={"order_id": "A-1"})
    assert [h.item.id for h in only] == [item.id]
    assert "MemoryItem(" in repr(item) and "Hit(" in repr(hits[0])


def test_persistence_across_reopen(settings: Settings, embedder: LocalEmbedder) -> None:
    with Memory(settings, embedder=embedder) as first:
        item = first.add("u1", "My favourite colour is teal")
    with Memory(settings, embedder=embedder) as second:
        assert second.get("u1", item.id).text == "My favourite colour is teal"
        assert second.search("u1", "what colour do I like?")[0].item.id == item.id


def test_users_are_isolated(mem: Memory) -> None:
    mem.add("alice", "Alice's secret: the safe code is 4412")
    mem.add("bob", "Bob likes hiking")
    for hit in mem.search("bob", "what is the safe code?", limit=10):
        assert hit.item.user_id == "bob"
    assert "4412" not in mem.context("bob", "safe code", max_tokens=500).text
    alice_item = mem.list("alice")[0]
    with pytest.raises(NotFoundError):
        mem.get("bob", alice_item.id)


def test_exact_duplicates_are_stored_once(mem: Memory) -> None:
    a = mem.add("u", "I prefer matte screens.")
    b = mem.add("u", "i prefer  MATTE screens")
    assert a.id == b.id and b.mention_count == 2
    assert mem.count("u") == 1
    items = mem.add_many("u", ["Same thing twice", "same thing twice!"])
    assert items[0].id == items[1].id and mem.count("u") == 2


@pytest.mark.parametrize(
    "user_id", ["", "   ", "a/b", "..", "x" * 300, "bad\x00id", "tab\tid", "c:\\x"]
)
def test_bad_user_ids_are_refused(mem: Memory, user_id: str) -> None:
    with pytest.raises(InvalidUserIdError):
        mem.add(user_id, "hello")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"text": ""},
        {"text": "   "},
        {"text": "x" * 20_001},
        {"text": "ok", "importance": 1.5},
        {"text": "ok", "confidence": -0.1},
        {"text": "ok", "metadata": {"nested": {"a": 1}}},
        {"text": "ok", "metadata": {"bad key!": 1}},
        {"text": "ok", "metadata": {"f": float("nan")}},
        {"text": "ok", "kind": "poem"},
    ],
)
def test_bad_input_is_refused_and_nothing_is_written(mem: Memory, kwargs: dict) -> None:
    kwargs = dict(kwargs)  # the parameter is shared by both Chroma modes
    text = kwargs.pop("text")
    with pytest.raises(InvalidInputError):
        mem.add("u", text, **kwargs)
    assert mem.count("u") == 0


def test_bad_limits_and_filters(mem: Memory) -> None:
    mem.add("u", "hello world")
    for limit in (0, -1, 10_000, True):
        with pytest.raises(InvalidInputError):
            mem.search("u", "hello", limit=limit)
    with pytest.raises(InvalidInputError):
        mem.search("u", "hello", where={"$bogus": 1})
    with pytest.raises(InvalidInputError):
        mem.context("u", "hello", max_tokens=0)


def test_update_and_forget_one(mem: Memory) -> None:
    item = mem.add("u", "I live in Paris")
    updated = mem.update("u", item.id, text="I live in Berlin", importance=0.9)
    assert updated.text == "I live in Berlin" and updated.importance == 0.9
    assert mem.search("u", "Berlin")[0].item.id == item.id
    assert mem.forget("u", item.id) == 1
    with pytest.raises(NotFoundError):
        mem.get("u", item.id)
    with pytest.raises(NotFoundError):
        mem.forget("u", item.id)


def test_forget_user_removes_everything(mem: Memory, settings: Settings) -> None:
    mem.add_many("gone", ["I bought a Dell monitor", "I live in Lyon"])
    mem.add("stays", "I bought a Dell monitor")
    assert mem.forget("gone") == 2
    assert mem.count("gone") == 0 and mem.search("gone", "monitor") == []
    assert mem.count("stays") == 1
    users = settings.data_dir / "users"
    user_dirs = list(users.iterdir()) if users.exists() else []
    assert len(user_dirs) == (0 if settings.chroma_url else 1)  # only "stays" keeps files
    # (with a Chroma server nothing of a user is on the local disk, history included)


def test_graph_reaches_a_memory_without_shared_words(mem: Memory) -> None:
    mem.add_many("bob", [
        "Agent: The CalDigit TS4 dock pairs well with your ThinkPad X1 Carbon over Thunderbolt 4.",
        "bob: Since the last BIOS update my ThinkPad X1 Carbon keeps dropping Wi-Fi.",
        "bob: I ordered a standing desk for the home office.",
        "bob: My daughter Mei starts school in September.",
    ])
    hits = mem.search("bob", "has the computer I connect to my CalDigit TS4 given me trouble?", limit=4)
    wifi = next(h for h in hits if "Wi-Fi" in h.item.text)
    assert wifi.breakdown.graph_hops == 0 and "graph: said just after hit 1" in wifi.why


def test_context_respects_budget_and_explains(mem: Memory) -> None:
    mem.add_many("c", [f"Order {i}: bought item number {i} for ${i}0" for i in range(40)])
    ctx = mem.context("c", "what did I buy?", max_tokens=120)
    assert ctx.tokens <= 120 and ctx.tokens == mem.tokens.count(ctx.text)
    assert ctx.lines and all(line.why for line in ctx.lines if line.memory_id)
    assert ctx.text.startswith("<memory>\nMemories (most relevant first):\n- [")
    assert ctx.text.endswith("\n</memory>") and (len(ctx.lines), ctx.tokens) == (4, 101)


def test_embedder_mismatch_is_refused_with_advice(settings: Settings, embedder: LocalEmbedder) -> None:
    with Memory(settings, embedder=embedder) as first:
        first.add("u", "hello")
    with Memory(settings, embedder=HashEmbedder(384)) as second:
        with pytest.raises(EmbedderMismatchError, match=r"Memory\.reembed .*hybridmem reembed"):
            second.search("u", "hello")


def test_export_import_roundtrip(mem: Memory, tmp_path: Path, embedder: LocalEmbedder) -> None:
    mem.add_many("src", [
        {"text": "I bought the ROG laptop", "category": "purchase", "metadata": {"sku": "R1"}},
        {"text": "I live in Lyon", "category": "identity", "importance": 0.9},
    ])
    bundle = json.loads(json.dumps(mem.export("src")))
    with Memory(Settings(data_dir=tmp_path / "other"), embedder=embedder) as other:
        assert other.import_("src", bundle) == 2
        again = other.export("src")
    strip = lambda b: [{k: v for k, v in m.items()} for m in b["memories"]]  # noqa: E731
    assert strip(again) == strip(bundle)
    assert again["graph"] == bundle["graph"]
    with pytest.raises(InvalidInputError):
        mem.import_("x", {"memories": []})


def test_closed_memory_refuses_use(settings: Settings, embedder: LocalEmbedder) -> None:
    m = Memory(settings, embedder=embedder)
    m.close()
    m.close()  # idempotent
    with pytest.raises(HybridMemError, match="closed"):
        m.add("u", "x")


def test_concurrent_adds_from_threads(mem: Memory) -> None:
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(5):
                mem.add("shared", f"thread {n} memory {i} about product {n * 10 + i}")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and mem.count("shared") == 30


def test_expired_memories_are_not_returned(mem: Memory) -> None:
    past = datetime.now(timezone.utc) - timedelta(days=1)
    mem.add("u", "flash sale code SUMMER10", expires_at=past)
    mem.add("u", "regular discount code WELCOME5")
    texts = [h.item.text for h in mem.search("u", "discount code", limit=5)]
    assert texts == ["regular discount code WELCOME5"]


# Embedded only: with a shared Chroma server there is no record cache to load.
@pytest.mark.parametrize("chroma_url", ["embedded"], indirect=True)
def test_reads_by_id_do_not_start_loading_the_record_cache(
    settings: Settings, embedder: LocalEmbedder
) -> None:
    with Memory(settings, embedder=embedder) as mem:
        ids = [i.id for i in mem.add_many("u", ["Alice bought a ROG laptop", "Bob lives in Lyon"])]
    with Memory(settings, embedder=embedder) as mem:  # a one-shot process: one search, then close
        assert mem.search("u", "laptop")[0].item.id == ids[0]
        for _ in range(3):
            assert [i.id for i in mem._stores.vectors.get("u", ids)] == ids
        vectors = mem._stores.vectors  # white-box: the cache the read path may load
        assert vectors._records is not None  # type: ignore[attr-defined]
        assert not vectors._loading.loaders and vectors._records.get("u") is None  # type: ignore[attr-defined]
        mem.search("u", "Lyon")  # a second search is a second miss: now it loads
        for loader in list(vectors._loading.loaders.values()):  # type: ignore[attr-defined]
            loader.join()
        assert vectors._records.get("u") is not None  # type: ignore[attr-defined]
    with Memory(settings, embedder=embedder) as mem:  # `hybridmem stats`: a list and a count
        assert mem.stats("u").memories == 2
        vectors = mem._stores.vectors
        assert not vectors._loading.loaders and vectors._records.get("u") is None  # type: ignore[attr-defined]


# Embedded only, as above.
@pytest.mark.parametrize("chroma_url", ["embedded"], indirect=True)
def test_a_first_context_does_not_start_loading_the_record_cache(
    settings: Settings, embedder: LocalEmbedder
) -> None:
    """context() asks whether the user has key facts, summaries and procedures with bounded
    listings: they are not misses that load every record, so a user's first context() does not
    share the machine with that load; the second one starts it."""
    with Memory(settings, embedder=embedder) as mem:
        mem.add_many("u", ["Alice bought a ROG laptop", "Bob lives in Lyon"])
    with Memory(settings, embedder=embedder) as mem:
        assert "ROG laptop" in mem.context("u", "which laptop?").text
        vectors = mem._stores.vectors  # white-box: the cache the read path may load
        assert not vectors._loading.loaders and vectors._records.get("u") is None  # type: ignore[attr-defined]
        mem.context("u", "who lives in Lyon?")
        for loader in list(vectors._loading.loaders.values()):  # type: ignore[attr-defined]
            loader.join()
        assert vectors._records.get("u") is not None  # type: ignore[attr-defined]


def _search_thrice_then_due(mem: Memory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three searches that each return both memories, the write due only with the third.

    Why: were it due from the first, a loaded machine's gap of more than ACCESS_IDLE between two
    searches is a pause, and the write lands with a count of 1 (CI saw [0, 1] for [0, 3])."""
    from hybridmem.read import access

    monkeypatch.setattr(access, "ACCESS_FLUSH", 10**9)
    for _ in range(2):
        assert len(mem.search("u", "Alice")) == 2
    monkeypatch.setattr(access, "ACCESS_FLUSH", 2)
    assert len(mem.search("u", "Alice")) == 2


def test_access_counts_are_written_in_a_pause_of_the_searches(
    mem: Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from hybridmem.read import access

    monkeypatch.setattr(access, "ACCESS_IDLE", 0.2)
    items = mem.add_many("u", ["Alice bought a ROG laptop", "Alice lives in Lyon"])
    _search_thrice_then_due(mem, monkeypatch)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and mem.get("u", items[0].id).access_count == 0:
        time.sleep(0.1)  # the write is due and waits for 0.2 s without a search
    assert [mem.get("u", i.id).access_count for i in items] == [3, 3]


def test_a_background_count_write_goes_in_parts_with_rests(
    mem: Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One memory a part and a rest of 10^9 times the part: the first part lands alone; close()
    ends the rest and writes the remainder at once, every count exact."""
    import time

    from hybridmem.read import access

    monkeypatch.setattr(access, "ACCESS_IDLE", 0.05)
    monkeypatch.setattr(access, "ACCESS_PART", 1)
    monkeypatch.setattr(access, "ACCESS_SHARE", 1e-9)  # a rest of years: only close() ends it
    items = mem.add_many("u", ["Alice bought a ROG laptop", "Alice lives in Lyon"])
    _search_thrice_then_due(mem, monkeypatch)
    deadline = time.monotonic() + 30

    def counts() -> list[int]:
        return sorted(mem.get("u", i.id).access_count for i in items)

    while time.monotonic() < deadline and counts() == [0, 0]:
        time.sleep(0.01)
    assert counts() == [0, 3]  # one part written, the other waits out the rest
    mem._access.close()  # type: ignore[attr-defined]  # white-box: what Memory.close() calls
    assert counts() == [3, 3]


def test_a_slow_count_write_puts_off_the_next_one_under_load(
    mem: Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Searches that never pause force a write after ACCESS_WAIT, unless the last write took
    long: then it waits (1 / ACCESS_SHARE - 1) times that, so counts cost a bounded share."""
    import time

    from hybridmem.read import access

    monkeypatch.setattr(access, "ACCESS_IDLE", 600.0)  # no pause is ever long enough
    monkeypatch.setattr(access, "ACCESS_WAIT", 0.2)
    monkeypatch.setattr(access, "ACCESS_SHARE", 0.25)
    log = mem._access  # type: ignore[attr-defined]  # white-box: the search's access log
    items = mem.add_many("u", ["Alice bought a ROG laptop", "Alice lives in Lyon"])
    assert log.forced_after() == 0.2  # the last write took no time: ACCESS_WAIT
    log._spent = 1.0  # the last write took 1 s
    assert log.forced_after() == 3.0  # 1 s x (1 / 0.25 - 1), not 0.2 s
    _search_thrice_then_due(mem, monkeypatch)
    deadline = time.monotonic() + 60  # forced within 3 s; only a hang reaches 60
    while time.monotonic() < deadline and mem.get("u", items[0].id).access_count == 0:
        time.sleep(0.1)
    assert [mem.get("u", i.id).access_count for i in items] == [3, 3]


def test_an_extractor_without_its_declared_attributes_is_refused(settings: Settings) -> None:
    """The writer decides from ``Extractor.offline`` whether extraction calls a model, so an
    extractor that does not declare it is refused when the Memory is built, not mid-write."""
    from hybridmem import ConfigError, Extraction
    from hybridmem.offline import HashEmbedder

    class Undeclared:
        name = "mine"

        def extract(self, text: str, *, speaker: str | None = None) -> Extraction:
            return Extraction()

    with pytest.raises(ConfigError, match="offline"):
        Memory(settings, embedder=HashEmbedder(), extractor=Undeclared())  # type: ignore[arg-type]
