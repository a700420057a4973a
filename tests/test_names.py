"""Name vectors of the graph's topic signal (hybridmem.graph.name_vectors), on real parts: a real Memory on
real files (and a real `chroma run`), a real hashing embedder that records what it is asked to
embed. A search must never embed a node name; writes make and keep them; forgetting erases them."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

import pytest

from hybridmem import Memory, Settings
from hybridmem.errors import StorageError
from hybridmem.runtime.files import user_dir
from hybridmem.graph import name_vectors
from hybridmem.graph.name_vectors import FILE_NAME, NameVectors
from hybridmem.offline import HashEmbedder
from hybridmem.replica.copies import ChromaNameSnapshots

TURNS = [
    "Melanie: I signed up for a pottery class at Acme Corp.",
    "Melanie: My tax return for Acme Corp is due in April.",
    "Caroline: I went to the Pride parade with my friends from the LGBTQ support group.",
]
QUERY = "Which class does Melanie take?"


class Recording:
    """A real embedder (HashEmbedder) that records every batch it embeds."""

    def __init__(self, dimension: int = 64) -> None:
        self._inner = HashEmbedder(dimension)
        self.name, self.dimension = self._inner.name, dimension
        self.calls: list[list[str]] = []

    def embed_batch(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls.append(list(texts))
        return self._inner.embed_batch(texts)


def _names_of(mem: Memory, user: str) -> NameVectors:
    names = mem._names  # the Memory's own, to wait for its background filler
    assert names is not None
    return names


def _topic(mem: Memory, user: str, model: Recording) -> float:
    """The query's cosine to the "pottery class" node, as the search sees it (a node without a
    vector is queued for the filler, which may embed it meanwhile: the caller checks calls)."""
    qvec = HashEmbedder(model.dimension).embed_batch([QUERY])[0]
    (cos,) = _names_of(mem, user).similar(user, qvec, ["pottery class"], ["pottery class"])
    return cos


def _rows(data_dir: Path, user: str) -> dict[str, tuple[str, str]]:
    path = user_dir(data_dir, user, create=False) / FILE_NAME
    if not path.exists():
        return {}
    with sqlite3.connect(path) as conn:
        return {k: (n, m) for k, n, m in conn.execute("SELECT key, name, model FROM names")}


def test_writes_embed_node_names_and_no_search_does_even_after_a_restart(
    tmp_path: Path, chroma_url: str | None,
) -> None:
    settings = Settings(data_dir=tmp_path / "hm", chroma_url=chroma_url)
    model = Recording()
    with Memory(settings, embedder=model) as mem:
        mem.add_many("u", [{"text": t, "kind": "turn"} for t in TURNS])
        (call,) = model.calls  # one embedding call for the turns and the new node names
        assert call[:len(TURNS)] == TURNS and "pottery class" in call[len(TURNS):]
        model.calls.clear()
        hits = mem.search("u", QUERY)
        assert model.calls == [[QUERY]]  # the search embeds its query, no node name
        assert hits and _topic(mem, "u", model) > 0.3
    if chroma_url is None:  # persisted: a new process embeds nothing but the query
        rows = _rows(settings.data_dir, "u")
        assert rows["pottery class"] == ("pottery class", model.name)
        model = Recording()
        with Memory(settings, embedder=model) as mem:
            hits = mem.search("u", QUERY)
            assert model.calls == [[QUERY]]
            assert hits and _topic(mem, "u", model) > 0.3


def test_a_node_without_a_vector_scores_zero_and_is_filled_in_the_background(
    tmp_path: Path,
) -> None:
    """Legacy data (written with the topic signal off, so no vectors), or rows a crash lost: a
    node without a vector scores 0 and no search embeds it; the background filler stores it."""
    data = tmp_path / "hm"
    with Memory(Settings(data_dir=data, graph_topic=0.0), embedder=Recording()) as mem:
        mem.add_many("u", [{"text": t, "kind": "turn"} for t in TURNS])
    assert _rows(data, "u") == {}
    model = Recording()
    with Memory(Settings(data_dir=data), embedder=model) as mem:
        assert _topic(mem, "u", model) == 0.0  # no vector: 0, and queued
        assert _names_of(mem, "u").wait()
        assert "pottery class" in _rows(data, "u")
        assert _topic(mem, "u", model) > 0.3
    with sqlite3.connect(user_dir(data, "u", create=False) / FILE_NAME) as conn:
        conn.execute("DELETE FROM names")  # as a crash between the graph write and this one
    model = Recording()
    with Memory(Settings(data_dir=data), embedder=model) as mem:
        mem.search("u", QUERY)  # a search that meets nodes without a vector embeds no name
        assert model.calls[0] == [QUERY]
        assert _names_of(mem, "u").wait()
        assert {"pottery class", "acme corp"} <= set(_rows(data, "u"))  # the pool's nodes


def test_the_in_memory_budget_counts_allocated_rows_so_many_small_users_stay_bounded(
    tmp_path: Path,
) -> None:
    """A matrix holds more rows than vectors (it doubles); the LRU's budget counts the rows. It
    counted vectors, so 10,000 one-node users kept 64 rows each in RAM (1 GB RSS in
    bench/storage.py's users part). Evicted users' vectors come back from their file."""
    model = Recording()
    with Memory(Settings(data_dir=tmp_path / "hm"), embedder=model) as mem:
        names = _names_of(mem, "u0")
        names._budget = 40  # rows over all users: a few users' worth
        for n in range(30):
            mem.add(f"u{n}", f"I signed up for a pottery class at Acme Corp {n}.")
        held = list(names._users.values())
        assert names._size == sum(u.capacity for u in held)  # the count is the rows held
        assert names._size <= 40 + max(u.capacity for u in held)  # the newest user may pass it
        assert len(held) < 30 and all(len(u) <= u.capacity for u in held)
        model.calls.clear()
        assert _topic(mem, "u0", model) > 0.3  # evicted first, reloaded from its file
        assert model.calls == []  # nothing embedded to get it back


def test_vectors_of_another_model_are_never_used_and_are_replaced(tmp_path: Path) -> None:
    data = tmp_path / "hm"
    with Memory(Settings(data_dir=data), embedder=Recording(64)) as mem:
        mem.add_many("u", [{"text": t, "kind": "turn"} for t in TURNS])
    assert {m for _, m in _rows(data, "u").values()} == {"hash-64"}
    path = user_dir(data, "u", create=False) / FILE_NAME
    with sqlite3.connect(path) as conn:  # as if a model with the same dimension wrote them
        conn.execute("UPDATE names SET model = 'another-model'")
    model = Recording(64)
    with Memory(Settings(data_dir=data), embedder=model) as mem:
        assert _topic(mem, "u", model) == 0.0  # another model's vector is not used
        assert _names_of(mem, "u").wait()
        assert _topic(mem, "u", model) > 0.3
    assert {m for _, m in _rows(data, "u").values()} == {"hash-64"}


def test_forgetting_erases_the_vectors_of_the_nodes_that_disappear(tmp_path: Path) -> None:
    data = tmp_path / "hm"
    with Memory(Settings(data_dir=data), embedder=Recording()) as mem:
        items = mem.add_many("u", [{"text": t, "kind": "turn"} for t in TURNS])
        before = _rows(data, "u")
        assert "pottery class" in before and "acme corp" in before
        mem.forget("u", items[0].id)
        after = _rows(data, "u")
        assert "pottery class" not in after  # only the forgotten turn named it
        assert "acme corp" in after  # the second turn still does
        mem.forget("u")
        assert not (user_dir(data, "u", create=False) / FILE_NAME).exists()
        assert _rows(data, "u") == {}


def test_an_import_gives_every_node_a_vector_at_write_time(tmp_path: Path) -> None:
    with Memory(Settings(data_dir=tmp_path / "a"), embedder=Recording()) as mem:
        mem.add_many("u", [{"text": t, "kind": "turn"} for t in TURNS])
        bundle = mem.export("u")
        keys = set(_rows(tmp_path / "a", "u"))
    model = Recording()
    with Memory(Settings(data_dir=tmp_path / "b"), embedder=model) as mem:
        mem.import_("v", bundle)
        assert set(_rows(tmp_path / "b", "v")) == keys
        model.calls.clear()
        mem.search("v", QUERY)
        assert model.calls == [[QUERY]]


@pytest.mark.parametrize("topic", [0.0])
def test_no_name_vectors_are_made_with_the_topic_signal_off(tmp_path: Path, topic: float) -> None:
    model = Recording()
    with Memory(Settings(data_dir=tmp_path / "hm", graph_topic=topic), embedder=model) as mem:
        mem.add_many("u", [{"text": t, "kind": "turn"} for t in TURNS])
        assert [len(c) for c in model.calls] == [len(TURNS)]  # the turns only
    assert _rows(tmp_path / "hm", "u") == {}


def test_nodes_whose_names_are_close_to_the_query_are_linked_without_embedding(
    tmp_path: Path,
) -> None:
    """Query linking (graph_link): the stored vectors of node names are searched for the query's
    nearest nodes (a query whose words name no node: "class pottery"), which seed their
    memories; the search embeds its query only."""
    model = Recording()
    settings = Settings(data_dir=tmp_path / "hm", graph_link=1.0)
    with Memory(settings, embedder=model) as mem:
        mem.add_many("u", [{"text": t, "kind": "turn"} for t in TURNS])
        names = _names_of(mem, "u")
        qvec = HashEmbedder(model.dimension).embed_batch(["pottery class"])[0]
        assert names.nearest("u", qvec, 2, 0.3)[0] == ("pottery class", pytest.approx(1.0, abs=1e-3))  # float16
        assert names.nearest("u", qvec, 5, 1.01) == []
        model.calls.clear()
        hits = mem.search("u", "class pottery", limit=3)
        assert model.calls == [["class pottery"]]
        assert any("pottery class (close to the query)" in h.why for h in hits)


def test_server_mode_another_process_nodes_get_vectors_in_the_background(
    tmp_path: Path, chroma_server: str,
) -> None:
    """With a Chroma server, a node another process wrote reaches this one through the graph
    sync: a search here embeds no name for it, the background filler does, and the next
    search has its cosine."""
    writer_model, reader_model = Recording(), Recording()
    with Memory(Settings(data_dir=tmp_path / "a", chroma_url=chroma_server),
                embedder=writer_model) as writer, \
            Memory(Settings(data_dir=tmp_path / "b", chroma_url=chroma_server),
                   embedder=reader_model) as reader:
        user = "server-names"
        reader.search(user, "nothing yet")  # the reader has loaded the (empty) user
        writer.add_many(user, [{"text": t, "kind": "turn"} for t in TURNS])
        ChromaNameSnapshots(writer._stores.vectors.client).drop(user)  # no shared vectors
        reader._stores.graph.refresh(user)
        reader_model.calls.clear()
        reader.search(user, QUERY)
        assert reader_model.calls[0] == [QUERY]
        assert _names_of(reader, user).wait()
        assert "pottery class" in {n for call in reader_model.calls[1:] for n in call}
        assert _topic(reader, user, reader_model) > 0.3
        writer.forget(user)


def test_a_re_embed_with_a_new_model_recomputes_every_name_vector(tmp_path: Path) -> None:
    data = tmp_path / "hm"
    with Memory(Settings(data_dir=data), embedder=Recording(64)) as mem:
        mem.add_many("u", [{"text": t, "kind": "turn"} for t in TURNS])
    before = _rows(data, "u")
    assert {m for _, m in before.values()} == {"hash-64"}
    model = Recording(32)  # another model (another dimension, so another name)
    with Memory(Settings(data_dir=data), embedder=model) as mem:
        mem.reembed("u")
        after = _rows(data, "u")
        assert set(after) == set(before) and {m for _, m in after.values()} == {"hash-32"}
        model.calls.clear()
        mem.search("u", QUERY)
        assert model.calls == [[QUERY]]
        assert _topic(mem, "u", model) > 0.3


def test_server_mode_processes_share_name_vectors_and_forgetting_drops_them(
    tmp_path: Path, chroma_server: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a Chroma server a writer stores its name vectors as the user's name snapshot when its
    lease ends; a fresh process reads them in the background and embeds no name at all. A
    forgotten memory's nodes leave the snapshot with their vectors."""
    monkeypatch.setattr(name_vectors, "SHARED_MIN", 1)  # a snapshot of a few names too
    writer_model, reader_model = Recording(), Recording()
    user = "shared-names"
    with Memory(Settings(data_dir=tmp_path / "a", chroma_url=chroma_server),
                embedder=writer_model) as writer:
        shared = ChromaNameSnapshots(writer._stores.vectors.client)
        writer.search(user, "nothing yet")  # its first use of the user reads (no) snapshot
        assert _names_of(writer, user).wait()
        added = writer.add_many(user, [{"text": t, "kind": "turn"} for t in TURNS])
        held = shared.read(user)
        assert held is not None and "pottery class" in held.keys
        with Memory(Settings(data_dir=tmp_path / "b", chroma_url=chroma_server),
                    embedder=reader_model) as reader:
            reader.search(user, QUERY)
            assert _names_of(reader, user).wait()
            assert _topic(reader, user, reader_model) > 0.3
            assert reader_model.calls == [[QUERY]]  # no name embedded here
        def unstored(*_: object) -> None:
            raise StorageError("the server is away")

        with pytest.MonkeyPatch.context() as patched:
            patched.setattr(ChromaNameSnapshots, "write", unstored)
            writer.forget(user, added[0].id)  # the pottery class goes with its only memory
        assert shared.read(user) is None  # dropped first, whatever the lease's end stores
        writer.add(user, "Caroline: the parade was loud.")
        held = shared.read(user)
        assert held is not None and "acme corp" in held.keys  # stored again, without it
        assert "pottery class" not in {*held.keys, *held.names}
        writer.forget(user)
