"""The read path's helpers on their own: the query batcher (name vectors: test_names)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridmem.read import retrieval
from hybridmem.offline import HashEmbedder
from hybridmem.read.retrieval import QueryBatcher


def test_concurrent_queries_share_model_calls_and_each_gets_its_own_vector() -> None:
    model = HashEmbedder(dimension=32)
    calls: list[int] = []

    queries = [f"question {n}" for n in range(12)]

    def embed(texts: list[str]) -> list[list[float]]:
        calls.append(len(texts))
        deadline = time.monotonic() + 60  # only a hang reaches it
        while len(calls) == 1 and len(batcher._queue) < len(queries) - 1:  # white-box
            assert time.monotonic() < deadline, "the other queries never queued"
            time.sleep(0.001)  # the first call runs until every other query waits behind it
        return model.embed_batch(texts)

    batcher = QueryBatcher(embed)
    got: dict[str, list[float]] = {}
    threads = [threading.Thread(target=lambda q=q: got.__setitem__(q, batcher(q)))
               for q in queries]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == {q: model.embed_batch([q])[0] for q in queries}
    assert calls == [1, 11]  # the first alone, the eleven that queued meanwhile in one call
    assert batcher("alone") == model.embed_batch(["alone"])[0]  # no one to wait for


def test_a_failing_model_call_fails_every_query_it_carried() -> None:
    def embed(texts: list[str]) -> list[list[float]]:
        raise RuntimeError("model crashed")

    with pytest.raises(RuntimeError, match="crashed"):
        QueryBatcher(embed)("q")




@settings(max_examples=200, deadline=None)
@given(candidates=st.integers(1, 1000), limit=st.integers(1, 5000))
def test_a_search_fetches_a_pool_deeper_than_its_limit(candidates: int, limit: int) -> None:
    """Fusion can only lift what a retriever fetched: the pool is at least the setting, at least
    twice the limit up to 500 beyond it, and never more than those ask for."""
    pool = retrieval.pool_size(candidates, limit)
    assert pool >= candidates
    assert pool >= limit + min(limit, retrieval.POOL_EXTRA)
    assert pool <= max(candidates, 2 * limit)
    assert retrieval.pool_size(50, 10) == 50 and retrieval.pool_size(50, 30) == 60
    assert retrieval.pool_size(50, 100) == 200 and retrieval.pool_size(50, 1000) == 1500


def test_context_embeds_the_query_once_while_it_asks_which_sections_the_user_has(
    tmp_path: Path
) -> None:
    """context() asks the vector store which sections the user has (three metadata scans,
    round trips on a Chroma server) while a reader thread embeds the query: the scans find it
    being embedded, and the gathering reuses that one embedding."""
    from hybridmem import Memory, Settings

    question = "which lamp did Ida buy?"
    embedded = threading.Event()
    calls: list[list[str]] = []

    class Watched(HashEmbedder):
        def embed_batch(self, texts: Sequence[str]) -> list[list[float]]:
            calls.append(list(texts))
            if question in texts:
                embedded.set()
            return super().embed_batch(texts)

    with Memory(Settings(data_dir=tmp_path, extractor="rules"), embedder=Watched()) as mem:
        mem.add("u", "Ida bought the Lumo lamp.")
        vectors = mem._stores.vectors
        real = vectors.list
        met: list[bool] = []

        def scan(*args: object, **kwargs: object) -> object:
            met.append(embedded.wait(10.0))  # a bound for the failure, not a timing
            return real(*args, **kwargs)  # type: ignore[arg-type]

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(vectors, "list", scan)
            assert "Lumo lamp" in mem.context("u", question).text
    assert met and all(met)
    assert sum(question in batch for batch in calls) == 1
