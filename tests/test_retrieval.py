"""The read path's helpers on their own: the query batcher (name vectors: test_names)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

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
