"""Graph snapshots in the Chroma server (hybridmem.replica.snapshot): a first read loads the
snapshot and replays only the records after it, a writer killed mid-snapshot leaves a loadable
state, and a forgotten memory survives in no snapshot. Real `chroma run`, real subprocesses."""

from __future__ import annotations

import base64
import json
import random
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import zstandard

from hybridmem.chroma import client as _chroma
from hybridmem.models import Entity, Extraction, Relation
from hybridmem.replica import snapshot
from hybridmem.graph.store import NetworkXGraphStore
from hybridmem.replica.graph import SNAPSHOT_TAIL, ChromaGraphStore
from hybridmem.replica.lease import ChromaLeases
from hybridmem.runtime.files import user_key
from hybridmem.runtime.locks import WriteLocks

ROOT = Path(__file__).resolve().parents[1]


def ex(i: int) -> Extraction:
    """A memory's extraction: customer i%37 bought product i%53 (so entities are shared)."""
    who, what = f"customer {i % 37}", f"gadget {i % 53}"
    return Extraction(entities=[Entity(name=who, type="person"), Entity(name=what, type="product")],
                      relations=[Relation(subject=who, predicate="bought", object=what)],
                      extractor="test")


def view(store: ChromaGraphStore, user: str) -> tuple[Any, ...]:
    """What readers see: every relation with its memories, and every entity's memories."""
    rels = [(r.subject_key, r.predicate, r.object_key, r.memory_ids) for r in store.relations(user)]
    ents = [(e.key, e.memory_ids) for e in store.entities(user)]
    return rels, ents


def snapshots(url: str, user: str) -> Any:
    return _chroma.make_client(url=url).get_collection(_chroma.collection_name(user, "snapshot"))


def stored(url: str, user: str) -> bytes:
    """What the user's snapshot collection holds, decoded: the current snapshot's graph and
    record ids (and no record of another snapshot is left)."""
    col = snapshots(url, user)
    current = snapshot.read(col)
    assert current is not None
    assert {m["snap"] for m in col.get()["metadatas"]} == {current.snap}
    return current.graph + str(sorted(current.covers)).encode()


def state(store: ChromaGraphStore, user: str) -> Any:
    return store._users[user_key(user)]  # white-box: which snapshot the cache started from


def test_a_first_read_loads_the_snapshot_and_replays_only_the_tail(
    chroma_server: str, unique_user: str
) -> None:
    writer = ChromaGraphStore(url=chroma_server, refresh_interval=0)
    for lo in range(0, SNAPSHOT_TAIL + 40, 20):
        writer.add_extractions(unique_user, [(f"m{i}", ex(i)) for i in range(lo, lo + 20)])
    head = snapshots(chroma_server, unique_user).get(ids=[snapshot.HEAD])["metadatas"][0]
    covered = int(head["covers"])
    assert SNAPSHOT_TAIL <= covered < SNAPSHOT_TAIL + 40  # stored once the tail reached the bound
    writer.remove_memory(unique_user, ["m3", "m4"])  # covered by the snapshot: gone since
    reader = ChromaGraphStore(url=chroma_server, refresh_interval=0)
    assert view(reader, unique_user) == view(writer, unique_user)
    st = state(reader, unique_user)
    assert st.snap == head["snap"] and len(st.snap_covers) == covered
    assert not {"m3", "m4"} & {m for rel in view(reader, unique_user)[0] for m in rel[3]}
    # the snapshot is the replay of what it covers: a reader that replays every record agrees
    full = ChromaGraphStore(url=chroma_server, refresh_interval=0)
    full._handles.drop(_chroma.collection_name(unique_user, "snapshot"), user_id=unique_user,
                       what="drop")
    assert view(full, unique_user) == view(writer, unique_user)
    assert state(full, unique_user).snap is None
    for s in (writer, reader, full):
        s.close()


def test_a_snapshot_is_stored_compressed_in_metadata_not_in_documents(
    chroma_server: str, unique_user: str
) -> None:
    """Chroma full-text indexes every document, so a snapshot kept there costs the writer several
    times more: the parts carry no document, and their ``data`` is the compressed payload."""
    store = ChromaGraphStore(url=chroma_server)
    store.add_extractions(unique_user, [(f"m{i}", ex(i)) for i in range(SNAPSHOT_TAIL)])
    got = snapshots(chroma_server, unique_user).get(include=["documents", "metadatas"])
    parts = sorted((m["part"], d, m["data"]) for i, d, m in
                   zip(got["ids"], got["documents"], got["metadatas"]) if i != snapshot.HEAD)
    assert parts and all(doc is None for _, doc, _ in parts)
    payload = "".join(data for _, _, data in parts)
    raw = zstandard.ZstdDecompressor().decompress(base64.b64decode(payload))
    assert len(payload) < len(raw) / 2
    covers, _, graph = raw.partition(b"\n")
    assert graph == store._cache.snapshot(unique_user)
    assert sorted(json.loads(covers)["covers"]) == sorted(state(store, unique_user).record_ids)
    store.close()


def test_forgetting_rewrites_a_snapshot_that_holds_the_memory(
    chroma_server: str, unique_user: str
) -> None:
    writer = ChromaGraphStore(url=chroma_server, refresh_interval=0)
    items = [(f"m{i}", ex(i)) for i in range(SNAPSHOT_TAIL)]
    items.append(("secret", Extraction(entities=[Entity(name="Zanzibar vault", type="place")],
                                       extractor="test")))
    writer.add_extractions(unique_user, items)
    assert b"zanzibar" in stored(chroma_server, unique_user).lower()
    other = ChromaGraphStore(url=chroma_server)  # a process that never saw this snapshot
    other.remove_memory(unique_user, ["secret"], erase=True)
    assert b"zanzibar" not in stored(chroma_server, unique_user).lower()
    assert "zanzibar" not in str(snapshots(chroma_server, unique_user).get()).lower()
    fresh = ChromaGraphStore(url=chroma_server)
    assert fresh.entity(unique_user, "Zanzibar vault") is None
    assert len(fresh.entities(unique_user)) == 37 + 53
    for s in (writer, other, fresh):
        s.close()


def test_a_drop_deletes_the_snapshot(chroma_server: str, unique_user: str) -> None:
    store = ChromaGraphStore(url=chroma_server)
    store.add_extractions(unique_user, [(f"m{i}", ex(i)) for i in range(SNAPSHOT_TAIL)])
    store.drop_user(unique_user)
    names = [c.name for c in _chroma.make_client(url=chroma_server).list_collections()]
    assert _chroma.collection_name(unique_user, "snapshot") not in names
    store.close()


def test_an_unusable_snapshot_falls_back_to_replaying_every_record(
    chroma_server: str, unique_user: str
) -> None:
    writer = ChromaGraphStore(url=chroma_server)
    writer.add_extractions(unique_user, [(f"m{i}", ex(i)) for i in range(SNAPSHOT_TAIL)])
    col = snapshots(chroma_server, unique_user)
    snap = col.get(ids=[snapshot.HEAD])["metadatas"][0]["snap"]
    col.delete(ids=[f"{snap}.0"])  # a racing writer deleted a part
    reader = ChromaGraphStore(url=chroma_server)
    assert view(reader, unique_user) == view(writer, unique_user)
    assert state(reader, unique_user).snap is None
    col.upsert(ids=[f"{snap}.0"], embeddings=[[1.0]], metadatas=[{
        "snap": snap, "part": 0,
        "data": base64.b64encode(zstandard.ZstdCompressor().compress(b"not json\n{")).decode()}])
    again = ChromaGraphStore(url=chroma_server)
    assert view(again, unique_user) == view(writer, unique_user)
    for s in (writer, reader, again):
        s.close()



def test_a_snapshot_of_the_earlier_codec_is_read_and_a_frame_claiming_too_much_is_not(
    chroma_server: str, unique_user: str
) -> None:
    """Snapshots written by a release that compressed with zlib still load; a Zstandard frame
    whose header claims more than MAX_PAYLOAD is refused before anything is allocated, and the
    reader replays the records instead."""
    writer = ChromaGraphStore(url=chroma_server)
    writer.add_extractions(unique_user, [(f"m{i}", ex(i)) for i in range(SNAPSHOT_TAIL)])
    col = snapshots(chroma_server, unique_user)
    current = snapshot.read(col)
    assert current is not None
    head = col.get(ids=[snapshot.HEAD], include=["metadatas"])["metadatas"][0]
    assert head["codec"] == snapshot.CODEC
    payload = snapshot._get(col, snapshot._GRAPH)
    assert payload is not None

    def rewrite(data: str, codec: str) -> None:
        col.upsert(ids=[f"{current.snap}.0", snapshot.HEAD], embeddings=[[1.0], [1.0]],
                   metadatas=[{"snap": current.snap, "part": 0, "data": data},
                              {**head, "parts": 1, "codec": codec}])

    rewrite(base64.b64encode(zlib.compress(payload[1], 1)).decode(), snapshot.ZLIB_CODEC)
    older = snapshot.read(col)
    assert older is not None and older.graph == current.graph
    assert older.covers == current.covers
    reader = ChromaGraphStore(url=chroma_server)
    assert view(reader, unique_user) == view(writer, unique_user)
    assert state(reader, unique_user).snap == current.snap  # loaded from it, not replayed

    frame = zstandard.ZstdCompressor().compress(b"x" * 64)  # magic, header (1-byte size), blocks
    assert zstandard.frame_content_size(frame) == 64 and frame[4] & 0xE0 == 0x20
    # the same blocks behind a header claiming 1 TiB (an 8-byte size field, one segment)
    lying = frame[:4] + bytes([0xE0]) + (1 << 40).to_bytes(8, "little") + frame[6:]
    assert zstandard.frame_content_size(lying) == 1 << 40
    rewrite(base64.b64encode(lying).decode(), snapshot.CODEC)
    assert snapshot.read(col) is None
    again = ChromaGraphStore(url=chroma_server)
    assert view(again, unique_user) == view(writer, unique_user)
    assert state(again, unique_user).snap is None
    for s in (writer, reader, again):
        s.close()

KILLED = r"""
import sys
from hybridmem.models import Entity, Extraction, Relation
from hybridmem.replica import snapshot
from hybridmem.replica.graph import ChromaGraphStore
snapshot.PART_CHARS, snapshot.PARTS_PER_CALL = 2048, 1  # many small requests: a wide target
url, user, start = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = ChromaGraphStore(url=url)
for n in range(start, start + 100_000, 8):
    store.add_extractions(user, [(f"k{i}", Extraction(
        entities=[Entity(name=f"customer {i % 37}", type="person")],
        relations=[Relation(subject=f"customer {i % 37}", predicate="bought",
                            object=f"gadget {i}")], extractor="test")) for i in range(n, n + 8)])
    store._compact(user, store._users[next(iter(store._users))], force=True)
    print(n, flush=True)
"""


def test_a_writer_killed_mid_snapshot_leaves_a_loadable_state(
    chroma_server: str, unique_user: str, tmp_path: Path
) -> None:
    rng = random.Random(7)
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    for trial in range(3):
        start = 100_000 * trial  # each trial writes memories of its own
        proc = subprocess.Popen([sys.executable, str(script), chroma_server, unique_user,
                                 str(start)], stdout=subprocess.PIPE, text=True, env=env)
        assert proc.stdout is not None
        assert proc.stdout.readline()  # at least one snapshot stored
        time.sleep(rng.uniform(0.05, 0.6))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        loaded = ChromaGraphStore(url=chroma_server)
        replayed = ChromaGraphStore(url=chroma_server)
        replayed._read_snapshot = lambda *a: None  # type: ignore[method-assign]
        assert view(loaded, unique_user) == view(replayed, unique_user)
        assert state(loaded, unique_user).snap is not None  # the head's snapshot is whole
        assert len(state(loaded, unique_user).record_ids) == len(
            state(replayed, unique_user).record_ids)
        loaded.close(), replayed.close()


def test_record_and_name_snapshots_read_back_and_a_malformed_one_is_refused(
    chroma_server: str, unique_user: str
) -> None:
    """A record snapshot and a name snapshot read back as written; one whose payload is not what
    its writer makes (a nested metadata value, vectors of another size) is refused, and a drop
    leaves neither, nor the other kinds' records touched."""
    client = _chroma.make_client(url=chroma_server)
    col = _chroma.create_collection(client, _chroma.collection_name(unique_user, "snapshot"),
                                    snapshot.collection_meta(unique_user))
    rows = {"m1": ("Alice bought a kettle", {"kind": "fact", "importance": 0.5, "current": True}),
            "m2": ("Bob paid", {"kind": "turn", "access_count": 3})}
    snapshot.write_records(col, "r1", rows, (4, "owner", True))
    snapshot.write_names(col, "n1", "hash-4", 4, ["alice"], ["Alice"], b"\x00\x3c" * 4)
    assert snapshot.read_records(col) == ("r1", rows, (4, "owner", True))
    assert snapshot.read_names(col) == ("hash-4", 4, ["alice"], ["Alice"], b"\x00\x3c" * 4)
    snapshot.write_records(col, "r2", {"m1": ("x", {"nested": {"a": 1}})}, None)
    snapshot.write_names(col, "n2", "hash-4", 4, ["alice"], ["Alice"], b"\x00" * 6)
    assert snapshot.read_records(col) is None and snapshot.read_names(col) is None
    snapshot.drop_records(col)
    assert snapshot.read_names(col) is None and col.count() == 2  # the name snapshot's own
    snapshot.drop_names(col)
    assert col.count() == 0


def test_a_finished_mark_names_its_snapshot_and_makes_its_lease_final(
        chroma_server: str, unique_user: str) -> None:
    """A graph snapshot stored mid-lease names its lease as not final; marked as its lease's
    last graph write, it reads back final. A later snapshot's head keeps the mark's key, which
    names the earlier one: the later snapshot reads back as it was stored."""
    client = _chroma.make_client(url=chroma_server)
    try:
        made = snapshot.collection_meta(unique_user)
        col = _chroma.create_collection(client, _chroma.collection_name(unique_user, "snapshot"),
                                        made)
        snapshot.write(col, "a1", ["m1~t"], b"{}", (3, "owner-a", False))
        got = snapshot.read(col)
        assert got is not None and got.at == (3, "owner-a", False)
        snapshot.finish(col, "a1")
        got = snapshot.read(col)
        assert got is not None and got.at == (3, "owner-a", True)
        snapshot.write(col, "b2", ["m1~t", "m2~t"], b"{}", (4, "owner-b", False))
        got = snapshot.read(col)
        assert got is not None and got.snap == "b2" and got.at == (4, "owner-b", False)
    finally:
        _chroma.close_client(client)


def _writer_and_reader(url: str) -> tuple[ChromaGraphStore, WriteLocks, ChromaGraphStore]:
    """A graph store that writes under leases (settling as they end), its write locks, and a
    second process's store that follows the same leases."""
    store = ChromaGraphStore(url=url)
    leases = ChromaLeases(store._handles.client)
    store.watch(leases)
    fresh = ChromaGraphStore(url=url)
    fresh.watch(ChromaLeases(fresh._handles.client))
    return store, WriteLocks(leases, settle=store.settle), fresh


def test_a_snapshot_followed_by_graph_writes_in_its_lease_is_not_marked_finished(
        chroma_server: str, unique_user: str) -> None:
    """A graph write after the snapshot, in the same lease, leaves it unmarked: a fresh first
    look then asks for that lease's records too, and finds the late one."""
    u = unique_user
    store, locks, fresh = _writer_and_reader(chroma_server)
    try:
        with locks(u):
            store.add_extractions(u, [(f"m{i}", ex(i)) for i in range(SNAPSHOT_TAIL)])
            store.add_extractions(u, [("late", ex(SNAPSHOT_TAIL + 1))])
        got = snapshot.read(snapshots(chroma_server, u))
        assert got is not None and got.at is not None and got.at[2] is False
        assert "late" not in {r.split("~")[0] for r in got.covers}
        assert view(fresh, u) == view(store, u)
        with locks(u):
            store.add_extractions(u, [(f"n{i}", ex(i)) for i in range(SNAPSHOT_TAIL)])
        got = snapshot.read(snapshots(chroma_server, u))
        assert got is not None and got.at is not None and got.at[2] is True  # marked
    finally:
        store.close()
        fresh.close()


def test_an_imported_graph_replaces_the_snapshot_it_no_longer_matches(
        chroma_server: str, unique_user: str) -> None:
    """Importing a graph deletes every record under the lease, and the graph snapshot with
    them: the importing process's own first look (its cache was dropped) and a fresh one
    build the imported graph only, not the snapshot's."""
    u = unique_user
    store, locks, fresh = _writer_and_reader(chroma_server)
    scratch = NetworkXGraphStore(None)
    try:
        with locks(u):  # a snapshot, marked as its lease's last graph write
            store.add_extractions(u, [(f"m{i}", ex(i)) for i in range(SNAPSHOT_TAIL)])
        with locks(u):
            store.add_extractions(u, [("late", ex(SNAPSHOT_TAIL + 1))])
        scratch.add_extractions(u, [("new", Extraction(
            entities=[Entity(name="Nadia", type="person"), Entity(name="Qorv lamp",
                                                                  type="product")],
            relations=[Relation(subject="Nadia", predicate="bought", object="Qorv lamp")],
            extractor="test"))])
        with locks(u):
            store.import_graph(u, scratch.export(u)["graph"])
        names = {e.name for e in store.entities(u)}
        assert names == {"Nadia", "Qorv lamp"}
        assert {e.name for e in fresh.entities(u)} == names
    finally:
        store.close()
        fresh.close()
        scratch.close()
