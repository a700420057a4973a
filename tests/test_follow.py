"""The record copy on a shared Chroma server: each process keeps one, and catches up with what
other processes wrote by reading the write leases' slots and fetching only the memories their
holders list (hybridmem.chroma.follow). Each "process" here is a store with its own client."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pytest
from chromadb.api.models.Collection import Collection

from hybridmem import Memory, Settings
from hybridmem.chroma.client import COLLECTION_PREFIXES, collection_name, is_memories_name
from hybridmem.chroma import follow as follow_module
from hybridmem.chroma import vector as vector_module
from hybridmem.chroma.vector import ChromaVectorStore
from hybridmem.filters import eq
from hybridmem.protocols import FIELDS_NOTE
from hybridmem.models import MemoryItem
from hybridmem.offline import HashEmbedder, LocalEmbedder
from hybridmem.replica import lease as lease_module
from hybridmem.replica.graph import SNAPSHOT_TAIL, ChromaGraphStore
from hybridmem.replica.lease import NOTE, ChromaLeases
from hybridmem.replica.lexical import TEXTS_TAIL, ChromaLexicalIndex
from hybridmem.replica.copies import ChromaRecordSnapshots
from hybridmem.runtime.locks import WriteLocks

EMB = HashEmbedder(32)
T0 = datetime(2025, 3, 1, 9, 0, tzinfo=timezone.utc)


@dataclass
class Process:
    store: ChromaVectorStore
    leases: ChromaLeases
    locks: WriteLocks

    def put(self, user: str, items: list[MemoryItem]) -> None:
        with self.locks(user):
            self.store.upsert(user, items, EMB.embed_batch([i.text for i in items]))

    def update(self, user: str, items: list[MemoryItem]) -> None:
        with self.locks(user):
            self.store.update(user, items)

    def delete(self, user: str, ids: list[str]) -> None:
        with self.locks(user):
            self.store.delete(user, ids)

    def everything(self, user: str) -> list[MemoryItem]:
        return sorted(self.store.list(user), key=lambda i: i.id)


@pytest.fixture()
def process(chroma_server: str) -> Iterator[Any]:
    made: list[Process] = []

    def make(interval: float = 3600.0, snapshots: bool = False) -> Process:
        store = ChromaVectorStore(embedder_name=EMB.name, dimension=32, url=chroma_server,
                                  cache_records=True, background_load=False)
        leases = ChromaLeases(store.client)
        store.follow(leases, interval=interval,
                     snapshots=ChromaRecordSnapshots(store.client) if snapshots else None)
        made.append(Process(store, leases, WriteLocks(leases, refresh=store.refresh,
                                                      settle=store.settle)))
        return made[-1]

    yield make
    for p in made:
        p.store.close()


@pytest.fixture()
def gets(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[str]]]:
    """The ids of every read by id that reaches Chroma (the real reads, noted on the way)."""
    seen: list[list[str]] = []
    real = Collection.get

    def noted(self: Collection, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("ids") is not None and _memories(self.name):
            seen.append(list(kwargs["ids"]))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Collection, "get", noted)
    yield seen


def _memories(name: str) -> bool:
    """Whether a collection holds memories (hot or archive), not a lease or graph records."""
    return is_memories_name(name) or name.startswith(COLLECTION_PREFIXES["archive"])


def item(user: str, id_: str, text: str, **fields: Any) -> MemoryItem:
    return MemoryItem(id=id_, user_id=user, text=text, created_at=T0, updated_at=T0, **fields)


def test_a_copy_catches_up_with_only_what_another_process_wrote(
    process: Any, gets: list[list[str]], unique_user: str
) -> None:
    a, b = process(), process()
    u = unique_user
    a.put(u, [item(u, f"m{n}", f"Alice bought the kettle number {n}") for n in range(6)])
    assert [i.id for i in b.everything(u)] == [f"m{n}" for n in range(6)]  # b's copy loads
    old = b.everything(u)
    m1 = a.everything(u)[1]
    a.update(u, [m1.model_copy(update={"importance": 0.9, "access_count": 4})])
    a.update(u, [a.everything(u)[2].model_copy(update={"superseded_by": "m6"})])  # to archive
    a.delete(u, ["m3"])
    a.put(u, [item(u, "m6", "Alice returned the kettle number 2")])
    assert b.everything(u) == old  # served from b's copy until its next check
    # a memory the vector query finds that the copy lacks is read from the server, and the
    # next read checks: it fetches what the slots list, from the hot and the archive collection
    m6 = a.store.get(u, ["m6"])[0]
    gets.clear()
    assert b.store.query(u, EMB.embed_batch([m6.text]), limit=1)[0][0].item == m6
    assert b.store.get_sections(u, ["m6"], [None]) == [[m6]]
    assert sorted(i for ids in gets for i in ids) == sorted(["m1", "m2", "m3", "m6"] * 2)
    b.store.refresh(u)
    assert b.everything(u) == a.everything(u)
    assert b.store.get(u, ["m1"])[0].importance == 0.9
    assert [i.id for i in b.store.list(u, where=eq("current", False))] == ["m2"]
    # what a process wrote itself is in its copy already: nothing is fetched for it
    b.put(u, [item(u, "m7", "Bob bought the lamp")])
    gets.clear()
    b.store.refresh(u)
    assert gets == [] and [i.id for i in b.everything(u)][-1] == "m7"
    a.store.refresh(u)
    assert a.everything(u) == b.everything(u)


def test_a_release_lists_what_its_holder_wrote(process: Any, unique_user: str) -> None:
    a = process()
    a.put(unique_user, [item(unique_user, "x1", "one"), item(unique_user, "x2", "two")])
    a.delete(unique_user, ["x1"])
    slots = a.leases.slots(unique_user, fresh=True)
    assert slots is not None and len(slots) == 2
    assert all(not s.held and s.mine for s in slots.values())
    assert a.leases.changed(unique_user, sorted(slots)) == {
        min(slots): frozenset({"x1", "x2"}), max(slots): frozenset({"x1"})}
    got = a.store.client.get_collection(
        collection_name(unique_user, "lease")).get(include=["documents"])
    assert sorted(got["documents"] or []) == [NOTE + '["x1","x2"]', NOTE + '["x1"]']


def test_a_copy_that_missed_tidied_slots_reloads_from_the_server(
    process: Any, unique_user: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = process(), process()
    u = unique_user
    a.put(u, [item(u, "k1", "Carol bought the tent")])
    assert len(b.everything(u)) == 1
    monkeypatch.setattr(lease_module, "STALE_SLOTS", 1)  # each taker deletes the slots below
    monkeypatch.setattr(lease_module, "KEEP_SLOTS", 0)
    for n in range(2, 5):
        a.put(u, [item(u, f"k{n}", f"Carol bought tent number {n}")])
    b.store.refresh(u)  # the slots of k2 and k3 are gone: the copy cannot know what they wrote
    assert b.store._records.get(u) is None  # type: ignore[union-attr]  # dropped
    assert b.everything(u) == a.everything(u)  # reloaded whole
    assert len(b.everything(u)) == 4


def test_a_write_plans_from_what_the_last_holder_wrote(process: Any, unique_user: str) -> None:
    """Taking a lease another process held last catches the copy up first: the placement and
    dedup a write reads from it are exact under the lease."""
    a, b = process(), process()
    u = unique_user
    a.put(u, [item(u, "p1", "Dan bought the camera")])
    assert len(b.everything(u)) == 1
    a.update(u, [a.everything(u)[0].model_copy(update={"superseded_by": "p2"})])
    # b's copy still says p1 is hot; b's update of p1 must find it in the archive
    b.update(u, [b.store.get(u, ["p1"])[0].model_copy(update={"category": "camera"})])
    assert a.store.get(u, ["p1"])[0].category == "camera"
    assert a.store.get(u, ["p1"])[0].superseded_by == "p2"
    a.store.refresh(u)
    assert a.everything(u) == b.everything(u)


def test_a_served_context_reads_chroma_once(
    chroma_server: str, tmp_path: Any, embedder: LocalEmbedder, unique_user: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With its copy loaded, a server-mode context() makes one nearest-neighbour query (ids and
    distances) and no read by id: summaries, procedures and candidates are hydrated here."""
    settings = Settings(data_dir=tmp_path / "hm", chroma_url=chroma_server, extractor="rules")
    with Memory(settings, embedder=embedder) as mem:
        u = unique_user
        mem.add_many(u, [f"Erin bought the lamp number {n} at Shop{n % 4}" for n in range(40)]
                     + [{"text": "Summary: Erin talks about lamps", "kind": "summary"},
                        {"text": "To return a lamp: print the label", "kind": "procedure"}])
        for _ in range(2):  # the second miss loads the copy (in the background)
            mem.context(u, "which lamp did Erin buy?")
        vectors = mem._stores.vectors  # type: ignore[attr-defined]
        for loader in list(vectors._loading.loaders.values()):
            loader.join()
        mem.refresh(u)
        calls: list[tuple[str, str, list[str]]] = []
        for name in ("query", "get"):
            real = getattr(Collection, name)

            def counted(self: Collection, *args: Any, _real: Any = real, _name: str = name,
                        **kwargs: Any) -> Any:
                calls.append((_name, self.name, list(kwargs.get("include") or [])))
                return _real(self, *args, **kwargs)

            monkeypatch.setattr(Collection, name, counted)
        ctx = mem.context(u, "where did Erin buy lamp number 7?")
        assert {line.section for line in ctx.lines} >= {"memories", "episodes", "procedures"}
        reads = [c for c in calls if _memories(c[1])]
        assert reads == [("query", reads[0][1], ["distances"])]


def test_the_graph_and_lexical_checks_fetch_only_what_the_slots_list(
    chroma_server: str, tmp_path: Any, embedder: LocalEmbedder, unique_user: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After another process's write, a check of the graph and of the lexical index reads the
    records the released slot lists, by id: no listing of every id (O(changes))."""
    monkeypatch.setattr(lease_module, "SHARE", 0.0)  # each check reads the slots itself
    u = unique_user
    settings = Settings(data_dir=tmp_path / "a", chroma_url=chroma_server, extractor="rules")
    lexical = ChromaLexicalIndex(url=chroma_server, refresh_interval=0.0)
    graph = ChromaGraphStore(url=chroma_server, refresh_interval=0.0)
    try:
        # b without the topic signal: its name filler reads the graph in the background, and a
        # check made there would fetch the new records outside the calls noted below
        with Memory(settings, embedder=embedder) as a, Memory(
                Settings(data_dir=tmp_path / "b", chroma_url=chroma_server, extractor="rules",
                         graph_topic=0.0),
                embedder=embedder, lexical_index=lexical, graph_store=graph) as b:
            a.add_many(u, [f"Gina bought the Shop{n} tent number {n}" for n in range(30)])
            assert b.search(u, "tent number 3")  # b's first look lists everything
            new = a.add(u, "Gina bought the Vexo kettle from Shop11")
            calls: list[tuple[str, list[str] | None, Any]] = []
            real = Collection.get

            def noted(self: Collection, *args: Any, **kwargs: Any) -> Any:
                calls.append((self.name, kwargs.get("ids"), kwargs.get("include")))
                return real(self, *args, **kwargs)

            monkeypatch.setattr(Collection, "get", noted)
            hits = b.search(u, "Vexo kettle", limit=3)
            monkeypatch.undo()
            assert hits[0].item.id == new.id and hits[0].breakdown.lexical_rank == 1
            assert [e.name for e in b.entities(u) if "Vexo" in e.name]  # in b's graph
            graph_key = collection_name(u, "graph")
            # (b's record copy may load meanwhile: it reads documents, not a listing of ids)
            listings = [name for name, ids, include in calls if ids is None and include == []
                        and (_memories(name) or name == graph_key)]
            assert listings == []
            fetched = {i for name, ids, _ in calls if ids and name != collection_name(u, "lease")
                       for i in ids}
            assert new.id in fetched and any(i.startswith(new.id + "~") for i in fetched)
    finally:
        lexical.close()
        graph.close()


def test_a_lease_marks_memories_whose_fields_only_it_changed(
    process: Any, unique_user: str
) -> None:
    """A release lists every memory written, and marks those only updated (fields, never the
    text); a memory also written otherwise in the same lease is not marked."""
    u = unique_user
    a, b = process(), process()
    a.put(u, [item(u, "t1", "one"), item(u, "t2", "two"), item(u, "t3", "three")])
    with a.locks(u):
        a.store.update(u, [item(u, "t1", "one", importance=0.9),
                           item(u, "t2", "two", importance=0.9)])
        a.store.upsert(u, [item(u, "t2", "two, rewritten")], EMB.embed_batch(["two, rewritten"]))
    slots = b.leases.slots(u, fresh=True)
    assert slots is not None
    noted = b.leases.changed(u, [max(slots)])[max(slots)]
    assert noted == {"t1", "t2", FIELDS_NOTE + "t1"}
    assert follow_module.noted_memories(noted) == {"t1", "t2"}
    assert follow_module.noted_texts(noted) == {"t2"}


def test_fields_only_updates_cost_the_lexical_check_no_read_of_texts(
    chroma_server: str, tmp_path: Any, embedder: LocalEmbedder, unique_user: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another process's updates of fields (importance here; access counts alike) make the
    lexical check read the slots and nothing of the memories, while the record copy still
    follows the new values."""
    monkeypatch.setattr(lease_module, "SHARE", 0.0)  # each check reads the slots itself
    u = unique_user
    lexical = ChromaLexicalIndex(url=chroma_server, refresh_interval=0.0)
    with Memory(Settings(data_dir=tmp_path / "a", chroma_url=chroma_server, extractor="rules"),
                embedder=embedder) as a, Memory(
            Settings(data_dir=tmp_path / "b", chroma_url=chroma_server, extractor="rules"),
            embedder=embedder, lexical_index=lexical) as b:
        stored = a.add_many(u, [f"Hana bought the Lumo lamp number {n}" for n in range(12)])
        assert b.search(u, "Lumo lamp number 3")  # b's first look
        for memory in stored[:5]:
            a.update(u, memory.id, importance=0.95)
        calls: list[str] = []
        real = Collection.get

        def noted(self: Collection, *args: Any, **kwargs: Any) -> Any:
            calls.append(self.name)
            return real(self, *args, **kwargs)

        with pytest.MonkeyPatch.context() as watch:
            watch.setattr(Collection, "get", noted)
            assert lexical.search(u, "Lumo lamp number 4", limit=3)  # a check falls due
        assert calls and not [name for name in calls if _memories(name)]
        b.refresh(u)
        assert all(b.get(u, m.id).importance == 0.95 for m in stored[:5])


def test_checks_falling_due_together_share_one_read_of_the_slots(
    process: Any, unique_user: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = process()
    a.put(unique_user, [item(unique_user, "s1", "one")])
    reads = [0]
    real = Collection.get

    def counted(self: Collection, *args: Any, **kwargs: Any) -> Any:
        reads[0] += self.name == collection_name(unique_user, "lease")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Collection, "get", counted)
    monkeypatch.setattr(lease_module, "SHARE", 3600.0)
    first = a.leases.slots(unique_user, fresh=True)
    assert a.leases.slots(unique_user) == first and reads[0] == 1  # shared
    assert a.leases.slots(unique_user, fresh=True) == first and reads[0] == 2  # a read of its own


def test_a_user_erased_by_another_process_leaves_no_copy(process: Any, unique_user: str) -> None:
    a, b = process(), process()
    u = unique_user
    a.put(u, [item(u, "e1", "Hal bought the drone")])
    assert [i.id for i in b.everything(u)] == ["e1"]
    with a.locks(u):  # as Stores.drop_user erases a user: memories, then the lease
        a.store.drop_user(u)
    a.leases.drop_user(u)
    b.store.refresh(u)
    assert b.store._records.get(u) is None  # type: ignore[union-attr]  # dropped
    assert b.everything(u) == [] and b.store.get(u, ["e1"]) == []


def test_a_lexical_first_look_fetches_only_what_leases_after_its_text_snapshot_noted(
    chroma_server: str, tmp_path: Any, embedder: LocalEmbedder, unique_user: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A text snapshot names the lease it was stored under: stored as a lease ends, a process's
    first look loads it and fetches the documents later leases noted; stored mid-lease (a
    forgotten text rewritten out at once), that lease's notes too. No listing of ids, no
    comparison of text hashes, and the answers of a cache that fetched every document."""
    u = unique_user
    settings = Settings(data_dir=tmp_path / "a", chroma_url=chroma_server, extractor="rules")
    queries = ["Qorv kettle", "lamp number 7", "Hana ordered", "Zell blender"]

    def first_look() -> tuple[list[list[str]], set[str]]:
        """A fresh process's answers to ``queries``, and the ids its lexical cache fetched."""
        calls: list[tuple[str, Any, Any, Any]] = []
        real = Collection.get

        def noted(self: Collection, *args: Any, **kwargs: Any) -> Any:
            calls.append((self.name, kwargs.get("ids"), kwargs.get("include"),
                          kwargs.get("where")))
            return real(self, *args, **kwargs)

        index = ChromaLexicalIndex(url=chroma_server)
        index.watch(ChromaLeases(index._handles.client))
        monkeypatch.setattr(Collection, "get", noted)
        try:
            found = [[i for i, _ in index.search(u, q, limit=50)] for q in queries]
        finally:
            monkeypatch.undo()
            index.close()
        mine = [c for c in calls if _memories(c[0])]
        assert [c for c in mine if c[1] is None or c[3] is not None] == []  # no listing, no hash
        return found, {i for _, ids, include, _ in mine if include == ["documents"] for i in ids}

    def every_document() -> list[list[str]]:
        index = ChromaLexicalIndex(url=chroma_server)
        index._start_from_snapshot = lambda *a: False  # type: ignore[method-assign]
        try:
            return [[i for i, _ in index.search(u, q, limit=50)] for q in queries]
        finally:
            index.close()

    with Memory(settings, embedder=embedder) as a:
        batch = a.add_many(u, [f"Hana ordered the Shop{n} lamp number {n}"
                               for n in range(TEXTS_TAIL)])  # owes a snapshot: stored at its end
        late = [a.add(u, f"Hana returned the Qorv kettle number {n}").id for n in range(3)]
        found, fetched = first_look()
        assert fetched == set(late)
        assert found == every_document() and set(found[0]) == set(late)
        gone = batch[7].id
        assert a.forget(u, gone) == 1  # the snapshot held it: rewritten at once, mid-lease
        last = a.add(u, "Hana ordered a Zell blender").id
        found, fetched = first_look()
        assert fetched == {gone, last}
        assert found == every_document() and gone not in found[1] and found[3] == [last]


def test_a_graph_first_look_reads_the_records_noted_after_its_snapshot_without_a_listing(
    chroma_server: str, tmp_path: Any, embedder: LocalEmbedder, unique_user: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A graph snapshot names the lease it was stored under (mid-write, marked at the lease's
    end as its last graph write): a process's first look loads it and reads the graph records
    noted after that lease, by id, instead of listing every record id; its graph is the one a
    replay of every record builds."""
    u = unique_user
    settings = Settings(data_dir=tmp_path / "a", chroma_url=chroma_server, extractor="rules")
    with Memory(settings, embedder=embedder) as a:
        a.add_many(u, [f"Ivo bought the Shop{n} drill number {n}" for n in range(SNAPSHOT_TAIL)])
        for n in range(3):
            a.add(u, f"Ivo returned the Brak saw number {n} to Shop{n}")
    calls: list[tuple[str, Any, Any]] = []
    real = Collection.get

    def noted(self: Collection, *args: Any, **kwargs: Any) -> Any:
        calls.append((self.name, kwargs.get("ids"), kwargs.get("include")))
        return real(self, *args, **kwargs)

    fresh = ChromaGraphStore(url=chroma_server)
    fresh.watch(ChromaLeases(fresh._handles.client))
    replayed = ChromaGraphStore(url=chroma_server)
    replayed._read_snapshot = lambda *a: None  # type: ignore[method-assign]
    try:
        monkeypatch.setattr(Collection, "get", noted)
        loaded = fresh.entities(u)
        monkeypatch.undo()
        assert loaded == replayed.entities(u)
        assert any("Brak" in e.name for e in loaded)
        graph = collection_name(u, "graph")
        assert [ids for name, ids, _ in calls if name == graph and ids is None] == []
        # the snapshot was stored mid-write, and marked as its lease's last graph write as the
        # lease ended: only the later leases' records are asked for, and read
        read = {i for name, ids, include in calls if name == graph and ids and include for i in ids}
        asked = {i for name, ids, _ in calls if name == graph and ids for i in ids}
        assert len(read) == 3 and asked == read
    finally:
        fresh.close()
        replayed.close()


def test_a_copy_loads_from_the_record_snapshot_and_what_leases_noted_since(
    process: Any, unique_user: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A writer whose copy is loaded stores a record snapshot as its lease ends; another
    process's copy then loads from it and reads by id only what later leases noted — no
    listing — and equals the copy a full read makes. Deleting or rewriting a text deletes the
    snapshot first: none holds a forgotten text, and the next load reads every record."""
    monkeypatch.setattr(vector_module, "RECORDS_MIN", 1)  # a snapshot of a few records too
    u = unique_user
    a = process(snapshots=True)
    a.everything(u)  # a's copy is loaded (empty): it knows of no snapshot, so owes one
    a.put(u, [item(u, f"m{n}", f"Alice bought the kettle number {n}") for n in range(6)])
    a.put(u, [item(u, "m6", "Alice returned the kettle number 2")])  # after: the tail
    a.update(u, [a.everything(u)[1].model_copy(update={"importance": 0.9})])
    a.update(u, [a.everything(u)[2].model_copy(update={"superseded_by": "m6"})])  # to archive

    def load() -> tuple[list[MemoryItem], list[tuple[str, Any]]]:
        calls: list[tuple[str, Any]] = []
        real = Collection.get

        def noted(self: Collection, *args: Any, **kwargs: Any) -> Any:
            if _memories(self.name):
                calls.append((self.name, kwargs.get("ids")))
            return real(self, *args, **kwargs)

        fresh = process(snapshots=True)
        with pytest.MonkeyPatch.context() as patched:
            patched.setattr(Collection, "get", noted)
            return fresh.everything(u), calls

    full = process().everything(u)  # without snapshots: every record read
    assert full == a.everything(u) and full[1].importance == 0.9 and not full[2].is_current
    loaded, calls = load()
    assert loaded == full
    assert [ids for _, ids in calls if ids is None] == []  # no listing
    assert sorted({i for _, ids in calls for i in ids}) == ["m1", "m2", "m6"]
    snaps = ChromaRecordSnapshots(a.store.client)
    dropped: list[str] = []
    real_drop = ChromaRecordSnapshots.drop

    def drop(self: ChromaRecordSnapshots, user: str) -> None:
        assert "m3" in {i.id for i in a.store.get(u, ["m3"])}  # before the memory goes
        dropped.append(user)
        real_drop(self, user)

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(ChromaRecordSnapshots, "drop", drop)
        a.delete(u, ["m3"])  # a forgotten text: the snapshot goes first, a new one at the release
    held = snaps.read(u)
    assert dropped == [u] and held is not None and held.rows.keys() == {
        i.id for i in a.everything(u)} and "m3" not in held.rows
    loaded, calls = load()
    assert loaded == a.everything(u) and [ids for _, ids in calls if ids is None] == []
    assert {i for _, ids in calls for i in ids} == set()  # nothing written since
    a.put(u, [item(u, "m4", "Alice returned the Qorv kettle")])  # a text replaced
    held = snaps.read(u)
    assert held is not None and held.rows["m4"][0] == "Alice returned the Qorv kettle"
    assert all("kettle number 4" not in doc for doc, _ in held.rows.values())
    # a new memory leaves the snapshot as it was (the load reads it by id); another process's
    # deletion drops it and, its copy loaded from it, stores the next without the memory
    b = process(snapshots=True)
    b.put(u, [item(u, "m8", "Alice returned the kettle number 5 twice")])
    a.store.refresh(u)
    loaded, calls = load()
    assert loaded == a.everything(u) and {i for _, ids in calls for i in ids} == {"m8"}
    b.delete(u, ["m0"])
    a.store.refresh(u)
    held = snaps.read(u)
    assert held is not None and "m0" not in held.rows
    loaded, calls = load()
    assert loaded == a.everything(u) == b.everything(u)
    assert [ids for _, ids in calls if ids is None] == []


@pytest.fixture()
def short_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    """A write log that keeps 4 slots, tidies one at a time, and snapshots stored again after
    2 leases: what happens to a busy user after hundreds of leases, in a dozen."""
    monkeypatch.setattr(follow_module, "SNAPSHOT_AGE", 2)
    monkeypatch.setattr(lease_module, "KEEP_SLOTS", 4)
    monkeypatch.setattr(lease_module, "STALE_SLOTS", 1)


def _lease_slots(client: Any, user: str) -> list[int]:
    got = client.get_collection(collection_name(user, "lease")).get(include=[])
    return sorted(int(i) for i in got["ids"])


@pytest.mark.usefixtures("short_slots")
def test_leases_that_write_no_text_leave_first_looks_a_text_and_graph_snapshot_to_start_from(
    chroma_server: str, tmp_path: Any, embedder: LocalEmbedder, unique_user: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Leases that write no text and no graph record (field updates here; access counts in a
    service) make no snapshot due, yet each takes a lease slot and the oldest are tidied away.
    Writers store a snapshot again once it is SNAPSHOT_AGE leases old, so the slot it names is
    still there: a fresh process's first look lists no ids and compares no text hashes."""
    u = unique_user
    settings = Settings(data_dir=tmp_path / "a", chroma_url=chroma_server, extractor="rules")
    with Memory(settings, embedder=embedder) as a:
        made = a.add_many(u, [f"Ivo bought the Shop{n} drill number {n}"
                              for n in range(max(TEXTS_TAIL, SNAPSHOT_TAIL))])
        first = _lease_slots(a._stores.vectors.client, u)[-1]  # type: ignore[attr-defined]
        for n in range(12):
            a.update(u, made[n].id, importance=0.5 + n / 100)
        slots = _lease_slots(a._stores.vectors.client, u)  # type: ignore[attr-defined]
    assert slots[0] > first and len(slots) <= 6  # the slots of the batch's leases are gone
    calls: list[tuple[str, Any, Any]] = []
    real = Collection.get

    def noted(self: Collection, *args: Any, **kwargs: Any) -> Any:
        calls.append((self.name, kwargs.get("ids"), kwargs.get("where")))
        return real(self, *args, **kwargs)

    index = ChromaLexicalIndex(url=chroma_server)
    index.watch(ChromaLeases(index._handles.client))
    graph = ChromaGraphStore(url=chroma_server)
    graph.watch(ChromaLeases(graph._handles.client))
    try:
        with pytest.MonkeyPatch.context() as patched:
            patched.setattr(Collection, "get", noted)
            found = index.search(u, "Shop7 drill", limit=5)
            entities = graph.entities(u)
    finally:
        index.close()
        graph.close()
    assert found and found[0][0] == made[7].id
    assert any("Shop7" in e.name for e in entities)
    listed = [(name, where) for name, ids, where in calls if ids is None
              and (_memories(name) or name == collection_name(u, "graph"))]
    assert listed == []
    assert [where for name, ids, where in calls if _memories(name) and where] == []


@pytest.mark.usefixtures("short_slots")
def test_leases_that_write_no_text_leave_a_copy_a_record_snapshot_to_load_from(
    process: Any, unique_user: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As for the text and graph snapshots: a copy's record snapshot is stored again once it is
    SNAPSHOT_AGE leases old, however little the leases wrote, so a fresh copy loads from it and
    what was noted since, without a listing, after many field updates."""
    monkeypatch.setattr(vector_module, "RECORDS_MIN", 1)
    u = unique_user
    a = process(snapshots=True)
    a.everything(u)
    a.put(u, [item(u, f"m{n}", f"Alice bought the kettle number {n}") for n in range(6)])
    first = _lease_slots(a.store.client, u)[-1]
    for n in range(12):
        a.update(u, [a.everything(u)[n % 6].model_copy(update={"importance": 0.5 + n / 100})])
    assert _lease_slots(a.store.client, u)[0] > first
    calls: list[Any] = []
    real = Collection.get

    def noted(self: Collection, *args: Any, **kwargs: Any) -> Any:
        if _memories(self.name):
            calls.append(kwargs.get("ids"))
        return real(self, *args, **kwargs)

    fresh = process(snapshots=True)
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(Collection, "get", noted)
        loaded = fresh.everything(u)
    assert loaded == a.everything(u) and loaded[5].importance == 0.61
    assert None not in calls  # no listing: the snapshot, and by id what was noted since


def test_a_lexical_check_fetches_the_texts_of_noted_memories_only_when_they_changed(
    chroma_server: str, tmp_path: Any, embedder: LocalEmbedder, unique_user: str,
) -> None:
    """Leases note every memory they write, and most writes change fields, not texts (access
    counts above all). A lexical check asks which noted memories it holds still exist and which
    carry another text hash, and fetches the documents of those only: a field update costs no
    document, an edit is re-indexed, a forgotten memory dropped."""
    u = unique_user
    settings = Settings(data_dir=tmp_path / "a", chroma_url=chroma_server, extractor="rules")
    index = ChromaLexicalIndex(url=chroma_server, refresh_interval=0.0)
    index.watch(ChromaLeases(index._handles.client))
    calls: list[tuple[str, Any, Any]] = []
    real = Collection.get

    def noted(self: Collection, *args: Any, **kwargs: Any) -> Any:
        calls.append((self.name, kwargs.get("ids"), kwargs.get("include")))
        return real(self, *args, **kwargs)

    try:
        with Memory(settings, embedder=embedder) as a:
            made = a.add_many(u, [f"Hana ordered the Shop{n} lamp number {n}" for n in range(30)])
            assert [i for i, _ in index.search(u, "Shop7 lamp", limit=1)] == [made[7].id]
            for n in range(10):  # fields only
                a.update(u, made[n].id, importance=0.5 + n / 100)
            with pytest.MonkeyPatch.context() as patched:
                patched.setattr(Collection, "get", noted)
                assert [i for i, _ in index.search(u, "Shop7 lamp", limit=1)] == [made[7].id]
            fetched = [ids for name, ids, include in calls if _memories(name)
                       and include == ["documents"]]
            assert fetched == []
            a.update(u, made[3].id, text="Hana returned the Qorv kettle")
            assert a.forget(u, made[4].id) == 1
            calls.clear()
            with pytest.MonkeyPatch.context() as patched:
                patched.setattr(Collection, "get", noted)
                found = [i for i, _ in index.search(u, "Qorv kettle", limit=5)]
                assert made[4].id not in [i for i, _ in index.search(u, "Shop4 lamp", limit=30)]
        assert found == [made[3].id]
        fetched = [i for name, ids, include in calls if _memories(name)
                   and include == ["documents"] for i in ids]
        assert fetched == [made[3].id]
    finally:
        index.close()
