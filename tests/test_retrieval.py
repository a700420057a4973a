"""The read path's helpers on their own: the query batcher, the node-name vectors."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from hybridmem import retrieval
from hybridmem.offline import HashEmbedder
from hybridmem.retrieval import NameVectors, QueryBatcher


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


def test_name_vectors_embed_each_name_once_and_give_cosines_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = HashEmbedder(dimension=64)
    calls: list[list[str]] = []

    def embed(texts: Sequence[str]) -> list[list[float]]:
        calls.append(list(texts))
        return [[2.0 * x for x in v] for v in model.embed_batch(texts)]  # not unit length

    names = NameVectors(embed)
    query = model.embed_batch(["pottery class"])[0]
    sims = names.similar(query, ["pottery class", "tax return", "pottery class"])
    assert calls == [["pottery class", "tax return"]]  # one call, each name once
    assert sims[0] == sims[2] == pytest.approx(1.0) and sims[1] < 0.5
    assert names.similar(query, ["tax return", "pottery class"]) == [sims[1], sims[0]]
    assert len(calls) == 1  # cached: no second embedding
    monkeypatch.setattr(retrieval, "NAME_VECTORS", 2)
    names.similar(query, ["support group"])  # a third name: the least recently used goes
    names.similar(query, ["tax return"])
    assert calls[1:] == [["support group"], ["tax return"]]
