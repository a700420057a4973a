"""ChromaVectorStore against a real Chroma: embedded and a real `chroma run` server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hybridmem.errors import EmbedderMismatchError, InvalidUserIdError
from hybridmem.offline import HashEmbedder
from hybridmem.vector import ChromaVectorStore

EMB = HashEmbedder(32)


@pytest.fixture(params=["embedded", "server"])
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[object]:
    def make(name: str = EMB.name, dim: int = 32) -> ChromaVectorStore:
        if request.param == "server":
            url = request.getfixturevalue("chroma_server")
            return ChromaVectorStore(embedder_name=name, dimension=dim, url=url)
        return ChromaVectorStore(embedder_name=name, dimension=dim, path=tmp_path / "chroma")

    yield make


def _put(store: ChromaVectorStore, user: str, texts: list[str]) -> list[str]:
    ids = [f"{user}-{i}" for i in range(len(texts))]
    store.upsert(user, ids, texts, EMB.embed_batch(texts),
                 [{"category": "c", "n": i, "none": None} for i in range(len(texts))])
    return ids


def test_upsert_query_get_delete(store_factory, unique_user: str) -> None:
    store = store_factory()
    ids = _put(store, unique_user, ["red laptop bag", "blue monitor stand", "green mouse pad"])
    hits = store.query(unique_user, EMB.embed_batch(["blue monitor stand"])[0], limit=2)
    assert hits[0].record.id == ids[1] and hits[0].similarity > 0.99
    assert len(hits) == 2
    got = store.get(unique_user, [ids[2], "missing", ids[0]])
    assert [r.id for r in got] == [ids[2], ids[0]]
    assert got[0].metadata["n"] == 2 and "none" not in got[0].metadata
    assert [r.id for r in store.get(unique_user, ids, where={"n": {"$gte": 1}})] == ids[1:]
    store.delete(unique_user, [ids[0]])
    assert store.count(unique_user) == 2
    store.drop_user(unique_user)
    assert store.count(unique_user) == 0 and store.query(unique_user, [0.1] * 32, limit=3) == []
    store.close()


def test_users_are_isolated(store_factory, unique_user: str) -> None:
    store = store_factory()
    _put(store, unique_user + "a", ["alice secret"])
    _put(store, unique_user + "b", ["bob things"])
    hits = store.query(unique_user + "b", EMB.embed_batch(["alice secret"])[0], limit=10)
    assert [h.record.text for h in hits] == ["bob things"]


def test_embedder_mismatch_is_refused(store_factory, unique_user: str) -> None:
    store = store_factory()
    _put(store, unique_user, ["x"])
    store.close()
    other = store_factory(name="other-model", dim=32)
    with pytest.raises(EmbedderMismatchError, match="re-embed"):
        other.count(unique_user)


def test_collection_name_is_derived_not_raw(tmp_path: Path) -> None:
    store = ChromaVectorStore(embedder_name=EMB.name, dimension=32, path=tmp_path / "c")
    _put(store, "weird id with spaces & ünicode", ["hello"])
    names = [c.name for c in store._client.list_collections()]
    assert len(names) == 1 and names[0].startswith("u-") and " " not in names[0]
    meta = store._client.get_collection(names[0]).metadata
    assert meta["user_id"] == "weird id with spaces & ünicode" and meta["dimension"] == 32
    with pytest.raises(InvalidUserIdError):
        store.count("../etc")


def test_stale_handle_after_another_process_dropped_the_user(
    chroma_server: str, unique_user: str
) -> None:
    first = ChromaVectorStore(embedder_name=EMB.name, dimension=32, url=chroma_server)
    second = ChromaVectorStore(embedder_name=EMB.name, dimension=32, url=chroma_server)
    _put(first, unique_user, ["one", "two"])
    assert second.count(unique_user) == 2  # second now caches a handle
    first.drop_user(unique_user)
    assert second.count(unique_user) == 0 and second.list(unique_user) == []
    _put(first, unique_user, ["three"])
    assert [r.text for r in second.list(unique_user)] == ["three"]
