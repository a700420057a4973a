"""The offline defaults: local embedder semantics, exact token counting, no downloads."""

from __future__ import annotations

import math

import pytest

from hybridmem.offline import HashEmbedder, LocalEmbedder, TiktokenCounter, load_encoding


def _cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b))


def test_local_embedder_is_semantic(embedder: LocalEmbedder) -> None:
    base, para, other = embedder.embed_batch(
        ["I bought a gaming laptop last week", "Last week I purchased a notebook computer for games",
         "The weather in Lyon is rainy in November"]
    )
    assert _cos(base, para) > _cos(base, other) + 0.3


def test_local_embedder_vectors_are_unit_and_ordered(embedder: LocalEmbedder) -> None:
    texts = ["short", "a much longer text " * 20, "medium length text here"]
    batch = embedder.embed_batch(texts)
    assert len(batch) == 3 and all(len(v) == embedder.dimension == 384 for v in batch)
    for v in batch:
        assert math.isclose(math.sqrt(sum(x * x for x in v)), 1.0, rel_tol=1e-4)
    # padding to the longest text of a batch must not change a text's vector
    alone = [embedder.embed_batch([t])[0] for t in texts]
    for a, b in zip(alone, batch):
        assert _cos(a, b) > 0.999
    assert embedder.embed_batch([]) == []


def test_local_embedder_threads_sleep_when_idle(embedder: LocalEmbedder) -> None:
    """Its onnxruntime workers do not spin between runs (they would hold a core the caller's
    threads need next); the vectors are the same either way (see the tests above)."""
    options = embedder._session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_hash_embedder_is_deterministic() -> None:
    e = HashEmbedder(64)
    assert e.embed_batch(["a b c"]) == e.embed_batch(["a b c"])
    assert len(e.embed_batch(["x"])[0]) == 64


@pytest.mark.parametrize("name", ["cl100k_base", "o200k_base"])
def test_tiktoken_counts_exactly_offline(name: str) -> None:
    counter = TiktokenCounter(name)
    enc = load_encoding(name)
    text = "hybridmem packs memories into a budget — exactly, émigré 1234567 <|endoftext|>"
    assert counter.count(text) == len(enc.encode(text, disallowed_special=()))
    assert counter.count("hello world") == 2


def test_truncate_respects_budget() -> None:
    counter = TiktokenCounter("cl100k_base")
    text = "one two three four five six seven eight nine ten " * 3
    for budget in range(0, 12):
        cut = counter.truncate(text, budget)
        assert counter.count(cut) <= budget
        assert text.startswith(cut)
    assert counter.truncate("short", 10) == "short"


def test_unknown_encoding_is_a_config_error() -> None:
    from hybridmem.errors import ConfigError

    with pytest.raises(ConfigError):
        load_encoding("p50k_base")
