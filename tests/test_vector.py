"""ChromaVectorStore against a real Chroma: embedded and a real `chroma run` server."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from hybridmem.chroma import client as _chroma
from hybridmem.chroma.placement import changes, over
from hybridmem.errors import (
    ClosedError,
    EmbedderMismatchError,
    InvalidInputError,
    InvalidUserIdError,
)
from hybridmem.filters import Filter, all_of, eq, parse_where
from hybridmem.models import MemoryItem
from hybridmem.offline import HashEmbedder
from hybridmem.text import text_hash
from hybridmem.chroma.vector import OVERFETCH, ChromaVectorStore
from hybridmem.replica.lease import ChromaLeases

EMB = HashEmbedder(32)
T0 = datetime(2024, 5, 1, 12, 30, 15, 123456, tzinfo=timezone.utc)
Factory = Callable[..., ChromaVectorStore]


@pytest.fixture(params=["embedded", "cached", "server", "server-cached"])
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    """Stores in each mode; "cached" is embedded with the record cache (as Memory opens it),
    "server-cached" a server store with its record copy following the write leases (as Memory
    opens it; no other process writes here, see tests/test_follow.py for those that do)."""
    made: list[ChromaVectorStore] = []

    def make(name: str = EMB.name, dim: int = 32) -> ChromaVectorStore:
        if request.param.startswith("server"):
            url = request.getfixturevalue("chroma_server")
            cached = request.param == "server-cached"
            made.append(ChromaVectorStore(embedder_name=name, dimension=dim, url=url,
                                          cache_records=cached, background_load=False))
            if cached:
                made[-1].follow(ChromaLeases(made[-1].client), interval=3600.0)
        else:
            made.append(ChromaVectorStore(embedder_name=name, dimension=dim,
                                          path=tmp_path / "chroma",
                                          cache_records=request.param == "cached",
                                          background_load=False))
        return made[-1]

    yield make
    for store in made:
        store.close()


def item(user: str, id_: str, text: str, **fields: Any) -> MemoryItem:
    fields.setdefault("created_at", T0)
    fields.setdefault("updated_at", fields["created_at"])
    return MemoryItem(id=id_, user_id=user, text=text, **fields)


def put(store: ChromaVectorStore, items: list[MemoryItem]) -> None:
    store.upsert(items[0].user_id, items, EMB.embed_batch([i.text for i in items]))


def ids(items: list[MemoryItem]) -> list[str]:
    return [i.id for i in items]


# -- writes and reads ------------------------------------------------------------------------------

def test_every_field_survives_a_round_trip(store_factory: Factory, unique_user: str) -> None:
    store = store_factory()
    full = item(
        unique_user, "full", "Alice bought a ROG laptop", kind="summary", category="purchase",
        importance=0.8, confidence=0.7, source="import", created_at=T0,
        updated_at=T0 + timedelta(hours=1), valid_from=T0 - timedelta(days=1),
        invalid_at=T0 + timedelta(days=2), superseded_by="newer",
        expires_at=T0 + timedelta(days=30),
        mention_count=3, access_count=5, last_accessed_at=T0 + timedelta(minutes=5),
        needs_extraction=True, extractor="rules", key="laptop",
        metadata={"s": "text", "i": 7, "f": 0.25, "b": False, "kind": "not the system kind"},
    )
    bare = item(unique_user, "bare", "Shipping was fast")  # every optional time None
    assert bare.valid_from is None and bare.last_accessed_at is None and bare.metadata == {}
    put(store, [full, bare])
    assert store.get(unique_user, ["bare", "missing", "full"]) == [bare, full]
    assert sorted(store.list(unique_user), key=lambda i: i.id) == [bare, full]
    hits = store.query(unique_user, EMB.embed_batch([full.text, bare.text]), limit=1)
    assert [[h.item for h in hits_] for hits_ in hits] == [[full], [bare]]
    assert hits[0][0].similarity > 0.99
    # absent means None: a None metadata value is not stored
    put(store, [item(unique_user, "nulls", "x", metadata={"gone": None, "kept": 1})])
    assert store.get(unique_user, ["nulls"])[0].metadata == {"kept": 1}
    assert store.count(unique_user) == 3


def test_writes_replace_the_record_chroma_would_merge(
    store_factory: Factory, unique_user: str
) -> None:
    store = store_factory()
    old = item(unique_user, "m", "Alice bought a ROG laptop", superseded_by="x", key="laptop",
               invalid_at=T0, metadata={"a": 1, "b": "two"})
    put(store, [old])
    cleared = old.model_copy(update={"superseded_by": None, "key": None, "invalid_at": None,
                                     "metadata": {"b": "three"}, "access_count": 2})
    store.update(unique_user, [cleared])
    assert store.get(unique_user, ["m"]) == [cleared]
    assert store.list(unique_user, where=parse_where({"a": 1})) == []
    assert ids(store.list(unique_user, where=parse_where({"current": True, "has_key": False}))) == [
        "m"]
    # update keeps text and vector; upsert replaces them and the fields
    hit = store.query(unique_user, EMB.embed_batch([old.text]), limit=1)[0][0]
    assert hit.similarity > 0.99 and hit.item == cleared
    new = item(unique_user, "m", "Bob returned the mouse", metadata={"c": True})
    put(store, [new])
    assert store.get(unique_user, ["m"]) == [new] and store.count(unique_user) == 1
    store.update(unique_user, [item(unique_user, "unknown", "nothing")])  # ignored
    assert store.count(unique_user) == 1


def test_changes_sends_only_what_differs() -> None:
    """Chroma merges metadata: an update sends the changed keys and None for the dropped."""
    old = {"a": 1, "b": 2, "c": 1, "d": 0, "e": "same"}
    assert changes({"a": 1, "b": None, "c": True, "e": "same", "f": 0.5}, old) == {
        "b": None, "c": True, "d": None, "f": 0.5}
    assert changes({"a": 1, "b": 2, "c": 1, "d": 0, "e": "same"}, old) == {}
    assert changes({"a": 1, "b": None}, None) == over({"a": 1, "b": None}, None)


def test_an_update_of_a_few_fields_lands_exact(store_factory: Factory, unique_user: str) -> None:
    """Only the changed keys are sent (an access-count flush changes 2 of ~17): the record
    read back, from this store and from a fresh one reading Chroma, is the new item."""
    store = store_factory()
    old = item(unique_user, "m", "Alice bought a ROG laptop", key="laptop", access_count=1,
               metadata={"n": 1, "s": "x"})
    put(store, [old, item(unique_user, "o", "Bob returned the mouse")])
    new = old.model_copy(update={"access_count": 2, "last_accessed_at": T0 + timedelta(hours=1),
                                 "key": None, "metadata": {"n": True, "s": "x"}})
    store.update(unique_user, [new])
    store.update(unique_user, [new])  # nothing changed: nothing sent
    for reader in (store, store_factory()):
        assert reader.get(unique_user, ["m", "o"])[0] == new
        assert ids(reader.list(unique_user, where=parse_where({"n": True}))) == ["m"]
        assert reader.list(unique_user, where=parse_where({"n": 1})) == []
        assert reader.list(unique_user, where=eq("has_key", True)) == []


def test_a_write_replaces_what_another_store_wrote_before(
    store_factory: Factory, unique_user: str
) -> None:
    """Fresh ids are added, and Chroma's add keeps an existing record silently: so the
    existence check must be exact even for a store that has never seen the id (a reopened
    store, its record cache not loaded yet), in either collection."""
    put(store_factory(), [item(unique_user, "m", "Alice bought a laptop", metadata={"gone": 1}),
                          item(unique_user, "s", "old archived", superseded_by="x",
                               invalid_at=T0)])
    store = store_factory()
    new = item(unique_user, "m", "Bob returned the mouse")
    back = item(unique_user, "s", "back in the hot collection")
    put(store, [new, back])
    assert store.get(unique_user, ["m", "s"]) == [new, back]
    assert store.list(unique_user, where=parse_where({"gone": 1})) == []
    assert store.count(unique_user) == 2
    hits = {h.item.id: h for h in store.query(unique_user, EMB.embed_batch(["Bob returned the mouse"]),
                                               limit=2)[0]}
    assert hits["m"].item == new and hits["m"].similarity > 0.99  # the vector was replaced too
    third = store_factory()
    assert third.get(unique_user, ["m", "s"]) == [new, back]


def test_writes_larger_than_chromas_batch_limit_land_whole(
    store_factory: Factory, unique_user: str
) -> None:
    """Chroma refuses a batch over its max_batch_size (5,461 here): a bigger add, upsert or
    metadata update is written in parts, and all of it lands."""
    store = store_factory()
    many = [item(unique_user, f"m{n:05d}", f"note {n} about gadget {n}") for n in range(6000)]
    put(store, many)
    assert store.count(unique_user) == 6000
    store.update(unique_user, [m.model_copy(update={"access_count": 3}) for m in many])
    got = store.get(unique_user, [many[0].id, many[-1].id])
    assert [g.access_count for g in got] == [3, 3]
    put(store, many[:5500] + [item(unique_user, "extra", "one more note")])  # known and fresh ids
    assert store.count(unique_user) == 6001


def test_delete_drop_and_users_are_isolated(store_factory: Factory, unique_user: str) -> None:
    store = store_factory()
    a, b = unique_user + "a", unique_user + "b"
    put(store, [item(a, "1", "alice secret"), item(a, "2", "alice other")])
    put(store, [item(b, "1", "bob things")])
    hits = store.query(b, EMB.embed_batch(["alice secret"]), limit=10)[0]
    assert [h.item.text for h in hits] == ["bob things"]
    store.delete(a, ["1", "unknown"])
    assert ids(store.list(a)) == ["2"] and store.count(b) == 1
    store.drop_user(a)
    store.drop_user(a)  # a missing collection is fine
    assert store.count(a) == 0 and store.list(a) == [] and store.get(a, ["2"]) == []
    assert store.query(a, EMB.embed_batch(["alice"]), limit=3) == [[]]
    assert store.count(b) == 1


def test_bad_input_is_refused(store_factory: Factory, unique_user: str) -> None:
    store = store_factory()
    one = item(unique_user, "m", "text")
    with pytest.raises(InvalidInputError, match="embeddings"):
        store.upsert(unique_user, [one], [])
    with pytest.raises(InvalidInputError, match="dimensions"):
        store.upsert(unique_user, [one], [[0.1] * 8])
    with pytest.raises(InvalidInputError, match="belongs to"):
        store.upsert(unique_user + "x", [one], EMB.embed_batch(["text"]))
    with pytest.raises(InvalidUserIdError):
        store.count("../etc")
    with pytest.raises(InvalidInputError):
        store.list(unique_user, offset=-1)
    assert store.query(unique_user, [], limit=3) == []
    assert store.query(unique_user, EMB.embed_batch(["x"]), limit=0) == [[]]


# -- filters: the same answers from get (Python), list (Chroma) and query (Python) ---------------

@pytest.fixture
def filtered(store_factory: Factory, unique_user: str) -> ChromaVectorStore:
    store = store_factory()
    put(store, [
        item(unique_user, "a", "red laptop bag", category="purchase",
             metadata={"color": "red", "n": 1}),
        item(unique_user, "b", "blue monitor stand", category="purchase",
             created_at=T0 + timedelta(days=2), metadata={"color": "blue", "n": 2.0}),
        item(unique_user, "c", "green mouse pad", kind="summary", superseded_by="a",
             metadata={"n": 3, "flag": True}),
        item(unique_user, "d", "yellow desk lamp", key="lamp", created_at=T0 + timedelta(days=5),
             metadata={"flag": 1, "color": "red"}),
    ])
    return store


CASES: list[tuple[str, Filter | None, set[str]]] = [
    ("eq", eq("category", "purchase"), {"a", "b"}),
    ("eq metadata", eq("color", "red"), {"a", "d"}),
    ("$ne includes a missing key", parse_where({"color": {"$ne": "red"}}), {"b", "c"}),
    ("$nin includes a missing key", parse_where({"n": {"$nin": [1, 2]}}), {"c", "d"}),
    ("$in across int and float", parse_where({"n": {"$in": [2, 3]}}), {"b", "c"}),
    ("$gt on a time", parse_where({"created_at_ts": {"$gt": (T0 + timedelta(days=1)).timestamp()}}),
     {"b", "d"}),
    ("$lte on metadata", parse_where({"n": {"$lte": 2}}), {"a", "b"}),
    ("bool is not a number", parse_where({"flag": True}), {"c"}),
    ("number is not a bool", parse_where({"flag": 1}), {"d"}),
    ("$or", parse_where({"$or": [{"kind": "summary"}, {"color": "blue"}]}), {"b", "c"}),
    ("AllOf", all_of(eq("category", "purchase"), parse_where({"n": {"$gte": 2}})), {"b"}),
    ("several keys are $and", parse_where({"color": "red", "has_key": True}), {"d"}),
    ("derived current", parse_where({"current": False}), {"c"}),
    ("derived text_hash", eq("text_hash", text_hash("Green  MOUSE pad!")), {"c"}),
    ("nothing", parse_where({"color": "purple"}), set()),
    ("no filter", None, {"a", "b", "c", "d"}),
]


@pytest.mark.parametrize(("name", "flt", "want"), CASES, ids=[c[0] for c in CASES])
def test_filters_agree_across_paths(
    filtered: ChromaVectorStore, unique_user: str, name: str, flt: Filter | None, want: set[str]
) -> None:
    everything = ["a", "b", "c", "d"]
    got = ids(filtered.get(unique_user, everything, where=flt))
    assert got == [i for i in everything if i in want]  # Python path, order of ids
    assert set(ids(filtered.list(unique_user, where=flt))) == want  # Chroma's where
    hits = filtered.query(unique_user, EMB.embed_batch(["red laptop bag"]), limit=4, where=flt)
    assert {h.item.id for h in hits[0]} == want  # over-fetched and filtered in Python


def test_a_thinned_query_asks_chroma_with_the_filter(
    store_factory: Factory, unique_user: str
) -> None:
    store = store_factory()
    texts = [f"laptop bag model {n}" for n in range(3 * OVERFETCH)] + ["completely unrelated zebra"]
    put(store, [item(unique_user, f"m{n}", t, metadata={"far": n == len(texts) - 1})
                for n, t in enumerate(texts)])
    hits = store.query(unique_user, EMB.embed_batch(["laptop bag model 0"]), limit=1,
                       where=eq("far", True))
    assert [h.item.text for h in hits[0]] == ["completely unrelated zebra"]


def test_list_pages_in_storage_order(store_factory: Factory, unique_user: str) -> None:
    store = store_factory()
    put(store, [item(unique_user, f"m{n}", f"memory number {n}") for n in range(5)])
    first, rest = store.list(unique_user, limit=2), store.list(unique_user, offset=2)
    assert len(first) == 2 and len(rest) == 3
    assert sorted(ids(first + rest)) == [f"m{n}" for n in range(5)]
    assert store.list(unique_user, limit=0) == []


# -- identity and lifecycle ------------------------------------------------------------------------

def test_embedder_mismatch_is_refused(store_factory: Factory, unique_user: str) -> None:
    store = store_factory()
    put(store, [item(unique_user, "m", "x")])
    other = store_factory(name="other-model", dim=32)
    with pytest.raises(EmbedderMismatchError, match="hybridmem reembed"):
        other.count(unique_user)
    with pytest.raises(EmbedderMismatchError):
        store_factory(dim=16).list(unique_user)
    assert store.count(unique_user) == 1


def test_a_closed_store_refuses_use(store_factory: Factory, unique_user: str) -> None:
    store = store_factory()
    put(store, [item(unique_user, "m", "x")])
    with store:
        pass
    store.close()  # idempotent
    one = item(unique_user, "m", "x")
    calls: list[Callable[[], object]] = [
        lambda: store.upsert(unique_user, [one], EMB.embed_batch(["x"])),
        lambda: store.update(unique_user, [one]),
        lambda: store.get(unique_user, ["m"]),
        lambda: store.list(unique_user),
        lambda: store.query(unique_user, EMB.embed_batch(["x"]), limit=1),
        lambda: store.delete(unique_user, ["m"]),
        lambda: store.drop_user(unique_user),
        lambda: store.count(unique_user),
        store.purge,
    ]
    for call in calls:
        with pytest.raises(ClosedError):
            call()
    assert store_factory().count(unique_user) == 1  # closing one store closed nothing shared


def test_collection_name_is_derived_not_raw(tmp_path: Path) -> None:
    with ChromaVectorStore(embedder_name=EMB.name, dimension=32, path=tmp_path / "c") as store:
        put(store, [item("weird id with spaces & ünicode", "m", "hello")])
        assert "path=" in repr(store) and "hash-32" in repr(store)
    client = _chroma.make_client(path=tmp_path / "c")
    names = [c.name for c in client.list_collections()]
    assert names == [_chroma.collection_name("weird id with spaces & ünicode")]
    assert names[0].startswith("u-") and " " not in names[0]
    meta = client.get_collection(names[0]).metadata
    assert meta["user_id"] == "weird id with spaces & ünicode" and meta["dimension"] == 32
    _chroma.close_client(client)


# Not "cached": a record cache assumes its store is the only writer (the data-dir lock).
@pytest.mark.parametrize("store_factory", ["embedded", "server"], indirect=True)
def test_stale_handle_after_another_client_dropped_the_user(
    store_factory: Factory, unique_user: str
) -> None:
    first, second = store_factory(), store_factory()
    put(first, [item(unique_user, "1", "one"), item(unique_user, "2", "two")])
    assert second.count(unique_user) == 2  # second now caches a handle
    first.drop_user(unique_user)  # NotFoundError behind second's cached handle
    assert second.count(unique_user) == 0 and second.list(unique_user) == []
    put(first, [item(unique_user, "3", "three")])  # re-created: a new collection, same name
    assert [r.text for r in second.list(unique_user)] == ["three"]
    first.drop_user(unique_user)
    put(second, [item(unique_user, "4", "four")])  # a write re-creates it
    assert ids(first.list(unique_user)) == ["4"]


def test_purge_leaves_no_bytes_of_a_dropped_user(tmp_path: Path) -> None:
    path = tmp_path / "chroma"
    with ChromaVectorStore(embedder_name=EMB.name, dimension=32, path=path) as store:
        put(store, [item("victim", f"m{n}", f"code word QUOKKA{n}ZANZIBAR") for n in range(30)])
        put(store, [item("bystander", "b", "I live in Oslo")])
        store.drop_user("victim")
        store.purge()
    leftovers = [p for p in path.rglob("*") if p.is_file() and b"QUOKKA" in p.read_bytes()]
    assert leftovers == []
    with ChromaVectorStore(embedder_name=EMB.name, dimension=32, path=path) as store:
        assert store.count("bystander") == 1 and store.count("victim") == 0


def test_a_store_closed_while_it_loads_records_in_the_background_warns_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """close() lands between the two collections' reads of a background load: the load ends
    quietly (``hybridmem stats`` after a kill -9 printed "loading the records ... failed (the
    vector store is closed)" after its answer), and close() waits for it."""
    import threading
    import time

    entered, release = threading.Event(), threading.Event()
    real = _chroma.get_paged

    def held(col: Any, **kw: Any) -> Any:
        entered.set()
        release.wait(30)
        return real(col, **kw)

    store = ChromaVectorStore(embedder_name=EMB.name, dimension=32, path=tmp_path / "chroma",
                              cache_records=True)
    put(store, [item("u", "1", "one"), item("u", "2", "two")])
    monkeypatch.setattr(_chroma, "get_paged", held)
    vector = EMB.embed_batch(["one"])
    for _ in range(2):  # the second miss starts the load
        assert ids([h.item for h in store.query("u", vector, limit=1)[0]]) == ["1"]
    assert entered.wait(30)
    closer = threading.Thread(target=store.close)
    closer.start()
    while not store._closed:  # type: ignore[attr-defined]  # white-box: close() is under way
        time.sleep(0.001)
    release.set()
    closer.join(30)
    assert not closer.is_alive() and not store._loading.loaders  # type: ignore[attr-defined]
    assert [r.message for r in caplog.records if r.levelno >= 30] == []
