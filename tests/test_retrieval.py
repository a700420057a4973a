"""The read path's helpers on their own: the query batcher (name vectors: test_names)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from hybridmem import retrieval
from hybridmem.offline import HashEmbedder
from hybridmem.retrieval import QueryBatcher


def test_concurrent_queries_share_model_calls_and_each_gets_its_own_vector() -> None:
    model = HashEmbedder(dimension=32)
    calls: list[int] = []

    def embed(texts: list[str]) -> list[list[float]]:  # a slow model: others queue meanwhile
        calls.append(len(texts))
        time.sleep(0.05)
        return model.embed_batch(texts)

    batcher = QueryBatcher(embed)
    queries = [f"question {n}" for n in range(12)]
    got: dict[str, list[float]] = {}
    threads = [threading.Thread(target=lambda q=q: got.__setitem__(q, batcher(q)))
               for q in queries]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == {q: model.embed_batch([q])[0] for q in queries}
    assert sum(calls) == 12 and len(calls) < 12  # batched, and every query embedded once
    assert batcher("alone") == model.embed_batch(["alone"])[0]  # no one to wait for


def test_a_failing_model_call_fails_every_query_it_carried() -> None:
    def embed(texts: list[str]) -> list[list[float]]:
        raise RuntimeError("model crashed")

    with pytest.raises(RuntimeError, match="crashed"):
        QueryBatcher(embed)("q")


