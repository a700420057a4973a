"""The vector store's two collections per user (hot: current memories; archive: the rest), the
move between them, the migration of an older layout, and the in-memory record cache."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from hybridmem import Memory, Settings
from hybridmem.chroma import client as _chroma
from hybridmem.chroma.layout import to_record
from hybridmem.filters import eq
from hybridmem.models import MemoryItem
from hybridmem.offline import HashEmbedder
from hybridmem.chroma.vector import ChromaVectorStore

EMB = HashEmbedder(32)
T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)


def item(user: str, id_: str, text: str, **fields: Any) -> MemoryItem:
    return MemoryItem(id=id_, user_id=user, text=text, created_at=T0, updated_at=T0, **fields)


@pytest.fixture(params=["embedded", "cached", "server"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ChromaVectorStore]:
    if request.param == "server":
        made = ChromaVectorStore(embedder_name=EMB.name, dimension=32,
                                 url=request.getfixturevalue("chroma_server"))
    else:
        made = ChromaVectorStore(embedder_name=EMB.name, dimension=32, path=tmp_path / "c",
                                 cache_records=request.param == "cached", background_load=False)
    yield made
    made.close()


def ids_in(store: ChromaVectorStore, name: str) -> set[str]:
    got = _chroma.open_collection(store.client, name)
    return set() if got is None else set(got.get(include=[])["ids"])


def test_a_superseded_memory_moves_to_the_archive_and_stays_findable(
    store: ChromaVectorStore, unique_user: str
) -> None:
    old, new = item(unique_user, "old", "lives in Lyon"), item(unique_user, "new", "lives in Oslo")
    store.upsert(unique_user, [old, new], EMB.embed_batch([old.text, new.text]))
    gone = old.model_copy(update={"invalid_at": T0, "superseded_by": "new"})
    store.update(unique_user, [gone])
    hot, archive = (_chroma.collection_name(unique_user),
                    _chroma.collection_name(unique_user, "archive"))
    assert ids_in(store, hot) == {"new"} and ids_in(store, archive) == {"old"}
    assert store.count(unique_user) == 2
    assert store.get(unique_user, ["old", "new"]) == [gone, new]
    vec = EMB.embed_batch(["lives in Lyon"])
    current = store.query(unique_user, vec, limit=5, where=eq("current", True))[0]
    assert [h.item.id for h in current] == ["new"]
    both = store.query(unique_user, vec, limit=5)[0]
    assert [h.item.id for h in both] == ["old", "new"]  # best first, across the collections
    assert {i.id for i in store.list(unique_user)} == {"old", "new"}
    assert [i.id for i in store.list(unique_user, where=eq("current", False))] == ["old"]
    # and back: a memory that becomes current again returns to the hot collection
    store.update(unique_user, [old])
    assert ids_in(store, hot) == {"old", "new"} and ids_in(store, archive) == set()
    store.delete(unique_user, ["old"])
    assert store.count(unique_user) == 1


def test_an_old_layout_is_migrated_when_opened(tmp_path: Path, unique_user: str) -> None:
    """A hot collection of schema 1 (superseded memories beside current ones) is split when a
    store first opens it."""
    client = _chroma.make_client(path=tmp_path / "c")
    hot = _chroma.create_collection(client, _chroma.collection_name(unique_user), {
        "user_id": unique_user, "embedder": EMB.name, "dimension": 32, "schema": 1})
    rows = [item(unique_user, "a", "current one"),
            item(unique_user, "b", "old one", invalid_at=T0, superseded_by="a")]
    hot.add(ids=["a", "b"], documents=[r.text for r in rows],
            embeddings=EMB.embed_batch([r.text for r in rows]),
            metadatas=[{k: v for k, v in to_record(r).items() if v is not None} for r in rows])
    _chroma.close_client(client)
    with ChromaVectorStore(embedder_name=EMB.name, dimension=32, path=tmp_path / "c") as store:
        assert store.count(unique_user) == 2
        assert ids_in(store, _chroma.collection_name(unique_user)) == {"a"}
        assert ids_in(store, _chroma.collection_name(unique_user, "archive")) == {"b"}
        assert [i.id for i in store.get(unique_user, ["b"])] == ["b"]


def test_a_copy_left_twice_by_a_crash_is_resolved_on_load(tmp_path: Path, unique_user: str) -> None:
    """An upsert that moved a memory and died before deleting the old copy leaves two; loading
    the records keeps the copy whose collection fits it and deletes the other."""
    with ChromaVectorStore(embedder_name=EMB.name, dimension=32, path=tmp_path / "c") as store:
        live = item(unique_user, "m", "a memory")
        store.upsert(unique_user, [live], EMB.embed_batch([live.text]))
        dead = live.model_copy(update={"invalid_at": T0})
        archive = _chroma.create_collection(
            store.client, _chroma.collection_name(unique_user, "archive"),
            {"user_id": unique_user, "embedder": EMB.name, "dimension": 32, "schema": 2})
        archive.add(ids=["m"], documents=[dead.text], embeddings=EMB.embed_batch([dead.text]),
                    metadatas=[{k: v for k, v in to_record(dead).items() if v is not None}])
        assert store.get(unique_user, ["m"]) == [live]  # readers prefer the hot copy
    with ChromaVectorStore(embedder_name=EMB.name, dimension=32, path=tmp_path / "c",
                           cache_records=True, background_load=False) as cached:
        assert cached.count(unique_user) == 1
        assert ids_in(cached, _chroma.collection_name(unique_user, "archive")) == set()


def test_the_cache_loads_in_the_background_and_stays_coherent(
    tmp_path: Path, unique_user: str
) -> None:
    with ChromaVectorStore(embedder_name=EMB.name, dimension=32, path=tmp_path / "c",
                           cache_records=True) as store:
        first = item(unique_user, "1", "one")
        store.upsert(unique_user, [first], EMB.embed_batch(["one"]))
        for _ in range(5):  # misses read Chroma until the background load lands
            assert store.get(unique_user, ["1"]) == [first]
        second = item(unique_user, "2", "two", category="x")
        store.upsert(unique_user, [second], EMB.embed_batch(["two"]))
        assert store.list(unique_user, where=eq("category", "x")) == [second]
        store.update(unique_user, [second.model_copy(update={"category": "y"})])
        assert store.list(unique_user, where=eq("category", "x")) == []
        store.drop_user(unique_user)
        assert store.count(unique_user) == 0 and store.get(unique_user, ["1"]) == []


def test_memory_keeps_old_values_searchable_in_both_modes(
    make_settings: Callable[..., Settings], unique_user: str
) -> None:
    with Memory(make_settings(embedder="hash", extractor="rules")) as mem:
        mem.remember(unique_user, "city", "Lyon")
        mem.remember(unique_user, "city", "Oslo")
        assert [i.text for i in mem.facts(unique_user)] == ["city: Oslo"]
        everything = mem.list(unique_user, include_superseded=True)
        assert sorted(i.text for i in everything) == ["city: Lyon", "city: Oslo"]
        current = [h.item.text for h in mem.search(unique_user, "city Lyon")]
        assert current == ["city: Oslo"]
        found = [h.item.text for h in mem.search(unique_user, "city Lyon",
                                                  include_superseded=True)]
        assert "city: Lyon" in found
        assert mem.count(unique_user) == 2
