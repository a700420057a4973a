"""Server mode: graph and lexical index shared through a real `chroma run`, across instances and
across processes (two real Python processes writing to the same user at the same time)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hybridmem import Memory, NotFoundError, Settings
from hybridmem.chroma import client as _chroma
from hybridmem.errors import ClosedError, ConfigError, InvalidInputError, StorageError
from hybridmem.graph import NetworkXGraphStore
from hybridmem.models import Entity, Extraction, MemoryItem, Relation, utcnow
from hybridmem.offline import HashEmbedder, LocalEmbedder
from hybridmem.replica.graph import ChromaGraphStore
from hybridmem.replica.lexical import ChromaLexicalIndex
from hybridmem.chroma.vector import ChromaVectorStore

EMB = HashEmbedder(32)


def ex(*relations: tuple[str, str, str], entities: tuple[str, ...] = ()) -> Extraction:
    return Extraction(
        entities=[Entity(name=n, type="product") for n in entities],
        relations=[Relation(subject=s, predicate=p, object=o) for s, p, o in relations],
        extractor="test",
    )


def edges(store: Any, user: str) -> list[tuple[str, str, str, list[str]]]:
    return [(r.subject_key, r.predicate, r.object_key, r.memory_ids) for r in store.relations(user)]


def side(url: str, user: str) -> Any:
    """The user's graph side collection, through a client of the test's own."""
    return _chroma.make_client(url=url).get_collection(_chroma.collection_name(user, "graph"))


def nodes(store: Any, user: str) -> dict[str, Any]:
    return {n["id"]: n for n in store.export(user)["graph"]["nodes"]}


# -- ChromaGraphStore --------------------------------------------------------------------------

def test_graph_writes_are_seen_by_another_instance(chroma_server: str, unique_user: str) -> None:
    a = ChromaGraphStore(url=chroma_server, refresh_interval=0)
    b = ChromaGraphStore(url=chroma_server, refresh_interval=0)
    a.add_extractions(unique_user, [("m1", ex(("alice", "bought", "ROG laptop"))),
                                    ("m2", ex(("Dell monitor", "complements", "ROG laptop")))])
    b.add_extraction(unique_user, "m3", ex(("alice", "likes", "Dell monitor")))
    want = [("alice", "bought", "rog laptop", ["m1"]), ("alice", "likes", "dell monitor", ["m3"]),
            ("dell monitor", "complements", "rog laptop", ["m2"])]
    assert edges(a, unique_user) == edges(b, unique_user) == want
    assert b.query_path(unique_user, "alice", "Dell monitor") == ["alice -likes-> Dell monitor"]
    assert set(b.neighbourhood(unique_user, ["ROG laptop"], hops=1)) == {"m1", "m2", "m3"}
    assert a.entities_in(unique_user, "is the rog laptop ok?") == ["rog laptop"]
    assert b.entities_of(unique_user, ["m2"]) == ["dell monitor", "rog laptop"]
    rog = a.entity(unique_user, "ROG Laptop.")
    assert rog is not None and rog.memory_ids == ["m1", "m2"]
    assert [e.key for e in b.entities(unique_user)] == ["alice", "dell monitor", "rog laptop"]
    # the same nodes everywhere, first/last seen included: replay uses the writer's time stamp
    assert nodes(a, unique_user) == nodes(b, unique_user)

    b.remove_memory(unique_user, ["m1", "m3"])
    assert edges(a, unique_user) == [("dell monitor", "complements", "rog laptop", ["m2"])]
    assert a.entity(unique_user, "alice") is None
    a.drop_user(unique_user)
    assert b.relations(unique_user) == [] and b.export(unique_user)["graph"]["nodes"] == []
    names = [c.name for c in _chroma.make_client(url=chroma_server).list_collections()]
    assert _chroma.collection_name(unique_user, "graph") not in names
    a.close(), b.close()


def test_records_are_per_write_and_never_rewritten(chroma_server: str, unique_user: str) -> None:
    store = ChromaGraphStore(url=chroma_server)
    store.add_extraction(unique_user, "m1", ex(("alice", "bought", "ROG laptop")))
    store.add_extraction(unique_user, "m1", ex(("alice", "returned", "ROG laptop")))  # additive
    got = side(chroma_server, unique_user).get(include=["documents", "metadatas"])
    assert len(got["ids"]) == 2 and all(i.startswith("m1~") for i in got["ids"])
    assert {m["memory_id"] for m in got["metadatas"]} == {"m1"}
    # two metadata keys (the server indexes each) and no document (Chroma full-text-indexes
    # documents, nobody searches these)
    assert all(set(m) == {"memory_id", "record"} for m in got["metadatas"])
    assert got["documents"] == [None, None]
    records = [json.loads(m["record"]) for m in got["metadatas"]]
    assert all(set(r) == {"ts", "prev", "extraction"} for r in records)
    assert {Extraction.model_validate(r["extraction"]).extractor for r in records} == {"test"}
    assert [r.predicate for r in store.relations(unique_user)] == ["bought", "returned"]
    store.close()


def test_checks_are_rate_limited_and_refresh_forces_one(
    chroma_server: str, unique_user: str
) -> None:
    writer = ChromaGraphStore(url=chroma_server)
    reader = ChromaGraphStore(url=chroma_server, refresh_interval=3600)
    assert reader.relations(unique_user) == []  # first read: a check
    writer.add_extraction(unique_user, "m1", ex(("alice", "bought", "ROG laptop")))
    assert reader.relations(unique_user) == []  # within the interval: the cache answers
    reader.add_extraction(unique_user, "m2", ex(("bob", "bought", "mouse")))
    assert [r.memory_ids for r in reader.relations(unique_user)] == [["m2"]]  # own: at once
    reader.refresh(unique_user)
    assert [r.memory_ids for r in reader.relations(unique_user)] == [["m1"], ["m2"]]
    writer.close(), reader.close()


def test_a_memory_that_loses_a_record_is_replayed(chroma_server: str, unique_user: str) -> None:
    a = ChromaGraphStore(url=chroma_server, refresh_interval=0)
    a.add_extraction(unique_user, "m1", ex(("alice", "bought", "ROG laptop")))
    a.add_extraction(unique_user, "m1", ex(("alice", "returned", "ROG laptop")))
    records = side(chroma_server, unique_user)
    first = records.get(include=["metadatas"])
    bought = next(i for i, m in zip(first["ids"], first["metadatas"])
                  if "bought" in m["record"])
    records.delete(ids=[bought])  # as if another process removed one write
    assert [r.predicate for r in a.relations(unique_user)] == ["returned"]
    records.upsert(ids=["m2~feed"], documents=["not json"], embeddings=[[1.0]],
                   metadatas=[{"memory_id": "m2", "token": "feed", "ts": 0.0}])
    assert [r.predicate for r in a.relations(unique_user)] == ["returned"]  # skipped, logged
    a.close()


def test_records_that_do_not_parse_are_skipped_and_bad_times_read_as_unknown(
    chroma_server: str, unique_user: str
) -> None:
    """A record whose JSON or extraction does not parse is skipped (logged); one whose time is
    not a usable number is replayed without a time, never failing the check."""
    good = ex(("alice", "bought", "ROG laptop")).model_dump_json()
    side_records = {
        "m1~bad1": "not json", "m2~bad2": "[1, 2]",
        "m3~bad3": '{"ts": 1.0, "prev": "", "extraction": {"entities": "x"}}',
        "m4~ok": '{"ts": Infinity, "prev": 7, "extraction": ' + good + "}",
        "m5~ok": '{"ts": true, "extraction": ' + good + "}",
    }
    writer = ChromaGraphStore(url=chroma_server)
    writer.add_extraction(unique_user, "m0", ex(("bob", "bought", "mouse")))
    side(chroma_server, unique_user).add(
        ids=list(side_records), embeddings=[[1.0]] * len(side_records),
        metadatas=[{"memory_id": i.partition("~")[0], "record": r}
                   for i, r in side_records.items()])
    reader = ChromaGraphStore(url=chroma_server, refresh_interval=0)
    assert edges(reader, unique_user) == [("alice", "bought", "rog laptop", ["m4", "m5"]),
                                          ("bob", "bought", "mouse", ["m0"])]
    writer.close(), reader.close()


def test_records_with_the_extraction_in_the_document_are_replayed(
    chroma_server: str, unique_user: str
) -> None:
    """Graph records of the earlier layouts (the extraction JSON as the document; or the
    extraction, time and previous memory as metadata keys of their own) replay like the
    current ones, beside them, episodic link included."""
    writer = ChromaGraphStore(url=chroma_server)
    writer.add_extraction(unique_user, "m2", ex(("bob", "bought", "mouse")))
    old, older = ex(("carol", "sold", "old monitor")), ex(("alice", "bought", "ROG laptop"))
    side(chroma_server, unique_user).add(
        ids=["m1~0ld", "m3~0ld"], documents=[older.model_dump_json(), None],
        embeddings=[[1.0], [1.0]],
        metadatas=[{"memory_id": "m1", "token": "0ld", "ts": 1.0e9, "prev": ""},
                   {"memory_id": "m3", "token": "0ld", "ts": 1.1e9, "prev": "m1",
                    "extraction": old.model_dump_json()}])
    reader = ChromaGraphStore(url=chroma_server, refresh_interval=0)
    assert edges(reader, unique_user) == [("alice", "bought", "rog laptop", ["m1"]),
                                          ("bob", "bought", "mouse", ["m2"]),
                                          ("carol", "sold", "old monitor", ["m3"])]
    assert reader.graph(unique_user).graph["next"]["m1"] == "m3"
    reader.remove_memory(unique_user, ["m1", "m3"])
    assert edges(reader, unique_user) == [("bob", "bought", "mouse", ["m2"])]
    assert side(chroma_server, unique_user).get(ids=["m1~0ld", "m3~0ld"])["ids"] == []
    writer.close(), reader.close()


def test_stale_handles_survive_another_process_dropping_the_user(
    chroma_server: str, unique_user: str
) -> None:
    a = ChromaGraphStore(url=chroma_server, refresh_interval=0)
    b = ChromaGraphStore(url=chroma_server, refresh_interval=0)
    a.add_extraction(unique_user, "m1", ex(("alice", "bought", "ROG laptop")))
    b.drop_user(unique_user)
    assert a.relations(unique_user) == []  # collection gone: cache emptied
    b.add_extraction(unique_user, "m2", ex(("bob", "bought", "mouse")))  # re-created
    a.add_extraction(unique_user, "m3", ex(("carol", "bought", "desk")))  # stale handle reopened
    assert [r.memory_ids for r in a.relations(unique_user)] == [["m2"], ["m3"]]
    assert [r.memory_ids for r in b.relations(unique_user)] == [["m2"], ["m3"]]
    a.close(), b.close()


def test_import_graph_splits_an_export_into_records(chroma_server: str, unique_user: str) -> None:
    local = NetworkXGraphStore(None)
    local.add_extraction("u", "m1", ex(("alice", "bought", "ROG laptop"), entities=("Lyon",)))
    local.add_extraction("u", "m2", ex(("Dell monitor", "complements", "ROG laptop")))
    shared = ChromaGraphStore(url=chroma_server, refresh_interval=0)
    shared.add_extraction(unique_user, "old", ex(("x", "is", "y")))
    shared.import_graph(unique_user, local.export("u"))
    other = ChromaGraphStore(url=chroma_server, refresh_interval=0)
    assert edges(other, unique_user) == edges(local, "u")
    assert other.entities_of(unique_user, ["m1"]) == ["alice", "lyon", "rog laptop"]
    with pytest.raises(InvalidInputError):
        shared.import_graph(unique_user, {"nodes": "nope"})
    shared.close(), other.close()


def test_construction_and_lifecycle(chroma_server: str, unique_user: str) -> None:
    with pytest.raises(ConfigError):
        ChromaGraphStore()
    with pytest.raises(ConfigError):
        ChromaLexicalIndex(url=chroma_server, refresh_interval=5, sweep_interval=1)
    client = _chroma.make_client(url=chroma_server)
    store = ChromaGraphStore(client=client)
    assert "ChromaGraphStore(" in repr(store)
    store.add_extraction(unique_user, "m1", ex(("alice", "bought", "ROG laptop")))
    store.close()
    store.close()
    for call in (lambda: store.relations(unique_user), lambda: store.drop_user(unique_user),
                 lambda: store.add_extraction(unique_user, "m2", ex(("a", "b", "c")))):
        with pytest.raises(ClosedError, match="closed"):
            call()
    index = ChromaLexicalIndex(client=client)
    index.close()
    with pytest.raises(ClosedError):
        index.search(unique_user, "laptop", limit=3)
    # a client passed in is the caller's: closing the stores left it open
    assert client.get_collection(_chroma.collection_name(unique_user, "graph")).count() == 1
    with pytest.raises(StorageError, match="could not open the Chroma server"):
        ChromaGraphStore(url="http://127.0.0.1:9")  # nothing listens there


def test_in_memory_networkx_store_writes_no_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                 ) -> None:
    monkeypatch.chdir(tmp_path)
    store = NetworkXGraphStore(None, autosave=False)
    store.add_extraction("u", "m1", ex(("alice", "bought", "ROG laptop")))
    store.save("u")
    store.remove_memory("u", ["m1"])
    store.drop_user("u")
    store.close()
    assert list(tmp_path.iterdir()) == [] and "data_dir=None" in repr(store)


def test_an_in_memory_store_keeps_every_user_past_max_open() -> None:
    # with no file to load a user back from, evicting one would empty its graph for good (a
    # server-mode worker that served more users than max_open answered without their graphs)
    store = NetworkXGraphStore(None, max_open=2)
    for user in ("u1", "u2", "u3", "u4"):
        store.add_extraction(user, "m1", ex((f"{user} person", "bought", "ROG laptop")))
    assert [len(store.relations(u)) for u in ("u1", "u2", "u3", "u4")] == [1, 1, 1, 1]
    store.close()


# -- ChromaLexicalIndex ------------------------------------------------------------------------

@pytest.fixture
def vectors(chroma_server: str) -> Iterator[ChromaVectorStore]:
    store = ChromaVectorStore(embedder_name=EMB.name, dimension=32, url=chroma_server)
    yield store
    store.close()


def put(vectors: ChromaVectorStore, index: ChromaLexicalIndex, user: str,
        docs: dict[str, str]) -> None:
    """What Memory does: the documents go to the main collection, then to the index."""
    now = utcnow()
    items = [MemoryItem(id=i, user_id=user, text=t, created_at=now, updated_at=now,
                        metadata={"n": 1}) for i, t in docs.items()]
    vectors.upsert(user, items, EMB.embed_batch(list(docs.values())))
    index.add(user, list(docs), list(docs.values()))


def test_lexical_cache_follows_the_main_collection(
    chroma_server: str, vectors: ChromaVectorStore, unique_user: str
) -> None:
    a = ChromaLexicalIndex(url=chroma_server)
    b = ChromaLexicalIndex(url=chroma_server, refresh_interval=0, sweep_interval=3600)
    put(vectors, a, unique_user, {"m1": "I bought the monitor yesterday", "m2": "Shipping was"})
    assert [i for i, _ in b.search(unique_user, "monitors", limit=5)] == ["m1"]  # first: a sweep
    put(vectors, a, unique_user, {"m3": "The monitor stand wobbles"})
    assert {i for i, _ in b.search(unique_user, "monitor", limit=5)} == {"m1", "m3"}  # id check
    vectors.delete(unique_user, ["m1"])
    a.delete(unique_user, ["m1"])
    assert [i for i, _ in b.search(unique_user, "monitor", limit=5)] == ["m3"]
    put(vectors, a, unique_user, {"m2": "Shipping was fast, the keyboard arrived"})  # an edit
    assert b.search(unique_user, "keyboard", limit=5) == []  # same ids: only a sweep sees it
    b.refresh(unique_user)
    assert [i for i, _ in b.search(unique_user, "keyboard", limit=5)] == ["m2"]
    assert [i for i, _ in a.search(unique_user, "keyboard", limit=5)] == ["m2"]  # own write
    vectors.drop_user(unique_user)
    assert b.search(unique_user, "keyboard", limit=5) == []
    assert b.search(unique_user, "the and", limit=5) == []  # only stopwords: no check at all
    cache = Path(b._dir.name)
    b.drop_user(unique_user)
    b.close(), b.close(), a.close()
    assert not cache.exists()


def test_lexical_users_are_isolated(
    chroma_server: str, vectors: ChromaVectorStore, unique_user: str
) -> None:
    index = ChromaLexicalIndex(url=chroma_server, refresh_interval=0)
    put(vectors, index, unique_user + "a", {"x": "alice secret keyboard"})
    put(vectors, index, unique_user + "b", {"y": "bob keyboard"})
    fresh = ChromaLexicalIndex(url=chroma_server)
    assert [i for i, _ in fresh.search(unique_user + "b", "keyboard secret", limit=5)] == ["y"]
    index.close(), fresh.close()


# -- Memory in server mode: key behaviours of test_memory.py -------------------------------------

@pytest.fixture
def make_mem(chroma_server: str, tmp_path: Path, embedder: LocalEmbedder) -> Iterator[Any]:
    """Memories in server mode, each with its own (unused) data_dir, as on separate hosts."""
    opened: list[Memory] = []

    def make(name: str = "hm") -> Memory:
        settings = Settings(data_dir=tmp_path / name, chroma_url=chroma_server, extractor="rules")
        opened.append(Memory(settings, embedder=embedder))
        return opened[-1]

    yield make
    for m in opened:
        m.close()


def test_server_mode_selects_the_shared_stores(make_mem: Any) -> None:
    mem = make_mem()
    stores = mem._stores  # white-box: which backends the settings chose
    from hybridmem.graph.name_vectors import NamedGraph

    assert isinstance(stores.graph, NamedGraph)  # keeps the topic signal's name vectors
    assert isinstance(stores.graph.inner, ChromaGraphStore)
    assert isinstance(stores.lexical, ChromaLexicalIndex)


def test_memory_add_search_update_forget(make_mem: Any, unique_user: str) -> None:
    mem = make_mem()
    item = mem.add(unique_user, "Bought a ROG Strix laptop for $1,899", category="purchase")
    mem.add_many(unique_user, ["I live in Lyon", "I hate loud keyboards"])
    hits = mem.search(unique_user, "which laptop did I purchase?", limit=2)
    assert hits[0].item.id == item.id and hits[0].breakdown.lexical_rank == 1  # "laptop"
    mem.update(unique_user, item.id, text="Bought a Zephyrus laptop for $1,999")
    (edited,) = mem.search(unique_user, "Zephyrus", limit=1)
    assert edited.item.id == item.id and edited.breakdown.lexical_rank == 1
    assert mem.forget(unique_user, item.id) == 1
    assert all(h.item.id != item.id for h in mem.search(unique_user, "Zephyrus laptop"))
    assert mem.forget(unique_user) == 2 and mem.count(unique_user) == 0
    assert mem.search(unique_user, "Lyon") == [] and mem.relations(unique_user) == []


def test_memory_graph_reach_and_isolation(make_mem: Any, unique_user: str) -> None:
    mem = make_mem()
    texts = [
        "Agent: The CalDigit TS4 dock pairs well with your ThinkPad X1 Carbon over Thunderbolt 4.",
        "bob: Since the last BIOS update my ThinkPad X1 Carbon keeps dropping Wi-Fi.",
        "bob: I ordered a standing desk for the home office.",
    ]
    mem.add_many(unique_user, texts)
    mem.add(unique_user + "-other", "The safe code is 4412")
    hits = mem.search(unique_user, "has the computer I connect to my CalDigit TS4 given trouble?")
    assert hits[0].item.text == texts[0]
    wifi = next(h for h in hits if "Wi-Fi" in h.item.text)
    assert wifi.breakdown.graph_hops == 0 and "graph: said just after hit 1" in wifi.why
    assert sorted(h.item.text for h in mem.search(unique_user, "safe code")) == sorted(texts)
    assert mem.query_path(unique_user, "CalDigit TS4 dock", "ThinkPad X1 Carbon") == [
        "CalDigit TS4 dock -complements-> ThinkPad X1 Carbon"]


def test_memory_export_import_keeps_the_graph(make_mem: Any, unique_user: str) -> None:
    mem = make_mem()
    mem.add_many(unique_user, ["I bought the ROG laptop",
                               "The Dell monitor pairs well with the ROG laptop"])
    bundle = json.loads(json.dumps(mem.export(unique_user)))
    other = make_mem("other")
    assert other.import_(unique_user + "-copy", bundle) == 2
    assert edges(other, unique_user + "-copy") == edges(mem, unique_user)


def test_two_memories_on_one_server_share_a_user(make_mem: Any, unique_user: str) -> None:
    a, b = make_mem("a"), make_mem("b")
    item = a.add(unique_user, "I bought the Dell U2723QE monitor")
    assert [h.item.id for h in b.search(unique_user, "U2723QE", limit=1)] == [item.id]
    a.update(unique_user, item.id, text="I bought the Dell U3223QE monitor")
    b.add(unique_user, "My ThinkPad pairs well with the Dell U3223QE monitor")
    for mem in (a, b):  # a check and a sweep (text edits) now, whatever the intervals
        mem.refresh(unique_user)
    assert item.id in {h.item.id for h in b.search(unique_user, "U3223QE")}
    assert len(a.relations(unique_user)) == len(b.relations(unique_user)) == 2
    b.forget(unique_user, item.id)
    with pytest.raises(NotFoundError):
        a.get(unique_user, item.id)
    a.refresh(unique_user)
    assert a.relations(unique_user) == b.relations(unique_user)
    assert len(a.relations(unique_user)) == 1
    assert all(h.item.id != item.id for h in a.search(unique_user, "U3223QE"))


def test_threads_writing_while_others_search(make_mem: Any, unique_user: str) -> None:
    mem, errors = make_mem(), []

    def worker(n: int) -> None:
        try:
            for i in range(4):
                mem.add(unique_user, f"I bought the Dell monitor number {100 * n + i}")
                mem.search(unique_user, "which monitor?", limit=3)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and mem.count(unique_user) == 12
    fresh = make_mem("fresh")
    assert edges(fresh, unique_user) == edges(mem, unique_user)
    assert len(edges(mem, unique_user)) == 12


# -- two processes ------------------------------------------------------------------------------

WORKER = r'''
import json, sys, time
from pathlib import Path
from hybridmem import Memory, Settings
from hybridmem.offline import LocalEmbedder

url, user, data_dir, tag, sync_dir, count = sys.argv[1:]
sync, n = Path(sync_dir), int(count)
base, marker = {"a": (1000, "walrus"), "b": (2000, "pelican")}[tag]
other_base, other_marker = {"a": (2000, "pelican"), "b": (1000, "walrus")}[tag]

def barrier(name):
    (sync / f"{name}-{tag}").touch()
    deadline = time.monotonic() + 120
    while len(list(sync.glob(f"{name}-*"))) < 2:
        if time.monotonic() > deadline:
            sys.exit(f"barrier {name} timed out")
        time.sleep(0.01)

with Memory(Settings(data_dir=data_dir, chroma_url=url, extractor="rules"),
            embedder=LocalEmbedder(threads=1)) as mem:
    barrier("ready")
    mine = []
    for i in range(n):
        k = base + i
        text = (f"I bought the Dell monitor number {k} for the {marker} office." if i % 2 == 0
                else f"Alice Smith {k} pairs well with product {k}, says the {marker} catalogue.")
        mine.append(mem.add(user, text).id)
        if i % 10 == 9:  # checks run while the other process writes
            mem.search(user, "which monitor did I buy?", limit=5)
    barrier("done")
    time.sleep(1.1)  # others' writes show within refresh_interval (1 s)
    print(json.dumps({
        "mine": mine,
        "count": mem.count(user),
        "ids": sorted(i.id for i in mem.list(user, limit=1000)),
        "relations": sorted([r.subject_key, r.predicate, r.object_key, r.memory_ids]
                            for r in mem.relations(user)),
        "lexical": sorted(h.item.id for h in mem.search(user, other_marker, limit=100)
                          if h.breakdown.lexical is not None),
        "path": mem.query_path(user, f"Alice Smith {other_base + 1}", f"product {other_base + 1}"),
        "graph_hit": [h.item.text for h in mem.search(user, f"Alice Smith {other_base + 1}?")
                      if h.breakdown.graph_hops is not None],
    }))
'''


@pytest.mark.slow
def test_two_processes_add_to_one_user_concurrently(chroma_server: str, tmp_path: Path,
                                                   unique_user: str) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    sync = tmp_path / "sync"
    sync.mkdir()
    procs = {
        tag: subprocess.Popen(
            [sys.executable, str(script), chroma_server, unique_user, str(tmp_path / tag), tag,
             str(sync), "30"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        )
        for tag in ("a", "b")
    }
    out = {}
    for tag, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=180)
        assert proc.returncode == 0, stderr[-3000:]
        out[tag] = json.loads(stdout.strip().splitlines()[-1])
    a, b = out["a"], out["b"]
    everything = sorted(a["mine"] + b["mine"])
    assert len(set(everything)) == 60
    assert a["count"] == b["count"] == 60
    assert a["ids"] == b["ids"] == everything
    assert a["relations"] == b["relations"] and len(a["relations"]) == 60
    assert sorted(m for r in a["relations"] for m in r[3]) == everything
    assert a["lexical"] == sorted(b["mine"]) and b["lexical"] == sorted(a["mine"])
    assert a["path"] == ["Alice Smith 2001 -complements-> product 2001"]
    assert b["path"] == ["Alice Smith 1001 -complements-> product 1001"]
    assert any("Alice Smith 2001" in t for t in a["graph_hit"])
    assert any("Alice Smith 1001" in t for t in b["graph_hit"])


CONFLICTS = r'''
import json, sys, time
from pathlib import Path
from hybridmem import Memory, Settings
from hybridmem.offline import LocalEmbedder

url, user, data_dir, tag, sync_dir, count = sys.argv[1:]
sync, n = Path(sync_dir), int(count)
base = {"a": 1000, "b": 2000}[tag]

def barrier(name):
    (sync / f"{name}-{tag}").touch()
    deadline = time.monotonic() + 120
    while len(list(sync.glob(f"{name}-*"))) < 2:
        if time.monotonic() > deadline:
            sys.exit(f"barrier {name} timed out")
        time.sleep(0.01)

with Memory(Settings(data_dir=data_dir, chroma_url=url, extractor="rules"),
            embedder=LocalEmbedder(threads=1)) as mem:
    barrier("ready")
    for i in range(n):
        mem.add(user, f"I live in Town{base + i}")  # a conflict: one current town in the end
        mem.add(user, f"I bought the Dell monitor number {i} for the office")  # said by both
        mem.remember(user, "favourite colour", f"colour {base + i}")  # one current value
    barrier("done")
    mem.refresh(user)  # the other process's last writes, now rather than within a second
    everything = []
    while page := mem.list(user, limit=1000, offset=len(everything), include_superseded=True):
        everything.extend(page)
    print(json.dumps({
        "current": sorted(i.text for i in mem.list(user, limit=1000)),
        "all": [[i.id, i.text, i.mention_count, i.is_current] for i in everything],
        "facts": [[f.key, f.text] for f in mem.facts(user)],
        "history": [[e.memory_id, e.action] for e in mem.history(user)],
    }))
'''


@pytest.mark.slow
def test_two_processes_writing_conflicting_facts_keep_one_current_value(
    chroma_server: str, tmp_path: Path, unique_user: str
) -> None:
    """Both processes state a new town, the same purchases and a new key fact, interleaved: the
    lease (hybridmem.replica.lease) makes each plan see the other's writes, so in the end there is one
    current town, one memory per purchase said twice, one current colour — and both processes
    read the same shared history."""
    script = tmp_path / "conflicts.py"
    script.write_text(CONFLICTS)
    sync = tmp_path / "sync"
    sync.mkdir()
    n = 8
    procs = {
        tag: subprocess.Popen(
            [sys.executable, str(script), chroma_server, unique_user, str(tmp_path / tag), tag,
             str(sync), str(n)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        )
        for tag in ("a", "b")
    }
    out = {}
    for tag, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-3000:]
        out[tag] = json.loads(stdout.strip().splitlines()[-1])
    a, b = out["a"], out["b"]
    assert a["current"] == b["current"] and a["facts"] == b["facts"]
    towns = [t for t in a["current"] if t.startswith("I live in")]
    assert len(towns) == 1, towns  # exactly one current value of the conflict
    assert len(a["facts"]) == 1 and a["facts"][0][0] == "favourite colour"
    monitors = [(t, c) for _, t, c, _ in a["all"] if "monitor" in t]
    assert sorted(t for t, _ in monitors) == sorted(
        f"I bought the Dell monitor number {i} for the office" for i in range(n))  # no duplicate
    assert all(c == 2 for _, c in monitors)  # each said twice, no bump lost
    stated = [t for _, t, _, _ in a["all"] if t.startswith("I live in")]
    assert len(stated) == 2 * n  # every statement kept, all but one superseded
    ids = {i for i, _, _, _ in a["all"]}
    assert a["history"] == b["history"]  # one history, shared through the server
    assert ids <= {m for m, action in a["history"] if action == "add"}
    assert sum(1 for _, action in a["history"] if action == "supersede") == 2 * (2 * n - 1)


# -- checks cost O(changes): a check whose lease marker did not move lists nothing ----------------

def test_a_check_lists_records_only_after_someone_took_the_lease(
    chroma_server: str, vectors: ChromaVectorStore, unique_user: str
) -> None:
    from hybridmem.replica.lease import ChromaLeases

    client = _chroma.make_client(url=chroma_server)
    leases = ChromaLeases(client)
    writer = ChromaGraphStore(url=chroma_server)
    lexical = ChromaLexicalIndex(url=chroma_server)
    reader = ChromaGraphStore(url=chroma_server, refresh_interval=0)
    words = ChromaLexicalIndex(url=chroma_server, refresh_interval=0, sweep_interval=0)

    def written(action: Any) -> None:  # a write as Memory makes it: under the user's lease
        lease = leases.acquire(unique_user)
        try:
            action()
        finally:
            leases.release(lease)

    written(lambda: writer.add_extraction(unique_user, "m1", ex(("alice", "bought", "laptop"))))
    written(lambda: put(vectors, lexical, unique_user, {"m1": "alice bought a laptop"}))
    assert [r.memory_ids for r in reader.relations(unique_user)] == [["m1"]]
    assert [i for i, _ in words.search(unique_user, "laptop", limit=5)] == ["m1"]
    # records written around the lease (nothing in hybridmem does) stay unseen: checks and
    # sweeps (every time here) end at the unchanged lease
    writer.add_extraction(unique_user, "m2", ex(("bob", "bought", "mouse")))
    put(vectors, lexical, unique_user, {"m1": "alice bought a keyboard"})
    assert [r.memory_ids for r in reader.relations(unique_user)] == [["m1"]]
    assert words.search(unique_user, "keyboard", limit=5) == []
    written(lambda: None)  # anyone taking the lease: the next check lists, the next sweep reads
    assert [r.memory_ids for r in reader.relations(unique_user)] == [["m1"], ["m2"]]
    assert [i for i, _ in words.search(unique_user, "keyboard", limit=5)] == ["m1"]
    for store in (writer, lexical, reader, words):
        store.close()
    leases.drop_user(unique_user)
