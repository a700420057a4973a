"""Text snapshots of the lexical cache in the Chroma server (hybridmem.replica.lexical and
hybridmem.replica.snapshot): a first look loads the snapshot and fetches only what it lacks or
what changed since, a forgotten or edited text leaves no copy in it, the graph's snapshot writes
leave it alone, and a writer killed mid-write leaves a loadable one. Real `chroma run`, real
subprocesses."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from hybridmem import Memory, Settings
from hybridmem.chroma import client as _chroma
from hybridmem.chroma.vector import ChromaVectorStore
from hybridmem.models import Entity, Extraction, MemoryItem, utcnow
from hybridmem.offline import HashEmbedder
from hybridmem.replica import snapshot
from hybridmem.replica.graph import SNAPSHOT_TAIL, ChromaGraphStore
from hybridmem.replica.lexical import TEXTS_TAIL, ChromaLexicalIndex
from hybridmem.runtime.files import user_key

ROOT = Path(__file__).resolve().parents[1]
EMB = HashEmbedder(32)
WORDS = ["monitor", "keyboard", "laptop", "shipping", "refund", "warranty", "cable", "stand",
         "mouse", "headset", "charger", "battery", "screen", "speaker", "webcam", "printer"]
QUERIES = ["monitor stand", "refund warranty", "battery charger", "zanzibar", "keyboard cable",
           "quokka printer", "webcam speaker headset"]


def text(i: int) -> str:
    rng = random.Random(i)
    return f"note {i}: the " + " and the ".join(rng.sample(WORDS, 3))


@pytest.fixture
def vectors(chroma_server: str) -> Iterator[ChromaVectorStore]:
    store = ChromaVectorStore(embedder_name=EMB.name, dimension=32, url=chroma_server)
    yield store
    store.close()


def put(vectors: ChromaVectorStore, index: ChromaLexicalIndex | None, user: str,
        docs: dict[str, str]) -> None:
    """What Memory does: the documents go to the main collection, then to the index (None: a
    writer that leaves the text snapshot alone, as a process of an older release does)."""
    now = utcnow()
    items = [MemoryItem(id=i, user_id=user, text=t, created_at=now, updated_at=now)
             for i, t in docs.items()]
    vectors.upsert(user, items, EMB.embed_batch(list(docs.values())))
    if index is not None:
        index.add(user, list(docs), list(docs.values()))


def texts(url: str, user: str) -> snapshot.Texts | None:
    col = _chroma.make_client(url=url).get_collection(_chroma.collection_name(user, "snapshot"))
    return snapshot.read_texts(col)


def results(index: ChromaLexicalIndex, user: str,
            queries: Sequence[str] = QUERIES) -> list[list[tuple[str, float]]]:
    """Every match of each query with its score (equal scores in id order: the cache's order
    among ties is its insertion order)."""
    return [sorted(index.search(user, q, limit=1000), key=lambda h: (-h[1], h[0]))
            for q in queries]


class Fetches:
    """Records the ids a lexical index fetches the documents of (the real fetch still runs)."""

    def __init__(self, index: ChromaLexicalIndex) -> None:
        self.ids: list[str] = []
        self.everything = 0
        real = index._documents

        def documents(user_id: str, ids: Sequence[str] | None) -> dict[str, str]:
            if ids is None:
                self.everything += 1
            else:
                self.ids.extend(ids)
            return real(user_id, ids)

        index._documents = documents  # type: ignore[method-assign]


def swept(url: str) -> ChromaLexicalIndex:
    """An index whose first look fetches every document, as without text snapshots."""
    index = ChromaLexicalIndex(url=url)
    index._start_from_snapshot = lambda *a: False  # type: ignore[method-assign]
    return index


def test_a_first_look_loads_the_text_snapshot_and_fetches_only_the_rest(
    chroma_server: str, vectors: ChromaVectorStore, unique_user: str
) -> None:
    writer = ChromaLexicalIndex(url=chroma_server)
    put(vectors, writer, unique_user, {f"m{i}": text(i) for i in range(TEXTS_TAIL)})
    stored = texts(chroma_server, unique_user)
    assert stored is not None and len(stored.hashes) == TEXTS_TAIL  # due at the bound
    put(vectors, writer, unique_user, {f"t{i}": f"tail note {i} about a quokka printer"
                                       for i in range(5)})
    vectors.delete(unique_user, ["m3"])
    writer.delete(unique_user, ["m3"])
    put(vectors, None, unique_user, {"m7": "m7 now speaks of zanzibar"})  # snapshot not told
    fresh = ChromaLexicalIndex(url=chroma_server)
    fetched = Fetches(fresh)
    assert results(fresh, unique_user) == results(swept(chroma_server), unique_user)
    assert fetched.everything == 0
    # the delete of m3 rewrote the snapshot from the writer's index: the t's are in it, and
    # m7's text hash differs from the snapshot's (this index has no lease to read notes from)
    assert sorted(fetched.ids) == ["m7"]
    assert [i for i, _ in fresh.search(unique_user, "zanzibar", limit=5)] == ["m7"]
    assert fresh.search(unique_user, f"note 3 {' '.join(WORDS)}", limit=300)  # still answers
    assert "m3" not in {i for i, _ in fresh.search(unique_user, text(3), limit=300)}
    writer.close(), fresh.close()


def test_graph_snapshots_leave_the_text_snapshot_alone(
    chroma_server: str, vectors: ChromaVectorStore, unique_user: str
) -> None:
    index = ChromaLexicalIndex(url=chroma_server)
    put(vectors, index, unique_user, {f"m{i}": text(i) for i in range(TEXTS_TAIL)})
    before = texts(chroma_server, unique_user)
    graph = ChromaGraphStore(url=chroma_server)
    for lo in range(0, 2 * SNAPSHOT_TAIL, SNAPSHOT_TAIL):  # two graph snapshots: one replaces
        graph.add_extractions(unique_user, [(f"m{i}", Extraction(
            entities=[Entity(name=f"thing {i}", type="product")], extractor="test"))
            for i in range(lo, lo + SNAPSHOT_TAIL)])
    assert texts(chroma_server, unique_user) == before
    col = _chroma.make_client(url=chroma_server).get_collection(
        _chroma.collection_name(unique_user, "snapshot"))
    read = snapshot.read(col)
    assert read is not None and len(read.covers) == 2 * SNAPSHOT_TAIL
    graph.close(), index.close()


def test_forgetting_or_editing_a_text_or_the_user_leaves_no_copy_in_the_text_snapshot(
    chroma_server: str, vectors: ChromaVectorStore, unique_user: str
) -> None:
    writer = ChromaLexicalIndex(url=chroma_server)
    docs = {f"m{i}": text(i) for i in range(TEXTS_TAIL)}
    docs["secret"], docs["edited"] = "the vault code is zanzibar", "my old password is quokka"
    put(vectors, writer, unique_user, docs)
    stored = texts(chroma_server, unique_user)
    assert stored is not None and "secret" in stored.hashes and b"zanzibar" in stored.index
    other = ChromaLexicalIndex(url=chroma_server)  # a process that never read this snapshot
    vectors.delete(unique_user, ["secret"])
    other.delete(unique_user, ["secret"])
    put(vectors, other, unique_user, {"edited": "no password here"})
    col = _chroma.make_client(url=chroma_server).get_collection(
        _chroma.collection_name(unique_user, "snapshot"))
    everything = str(col.get(include=["metadatas", "documents"]))
    left = texts(chroma_server, unique_user)
    assert left is not None and "secret" not in left.hashes
    assert b"zanzibar" not in left.index and b"quokka" not in left.index  # gone from the file
    assert b"no password here" in left.index and len(left.hashes) == TEXTS_TAIL + 1
    parts = [m for m in col.get(include=["metadatas"])["metadatas"] if "lpart" in m]
    assert {m["lexical"] for m in parts} == {left.snap}  # no older snapshot's part is left
    assert "zanzibar" not in everything and "quokka" not in everything  # compressed anyway
    fresh = ChromaLexicalIndex(url=chroma_server)
    assert fresh.search(unique_user, "zanzibar", limit=5) == []
    assert fresh.search(unique_user, "quokka", limit=5) == []
    assert [i for i, _ in fresh.search(unique_user, "password", limit=5)] == ["edited"]
    vectors.drop_user(unique_user)
    fresh.drop_user(unique_user)  # forgetting the user: no text of theirs stays in a snapshot
    assert texts(chroma_server, unique_user) is None
    assert not [m for m in col.get(include=["metadatas"])["metadatas"] if "lexical" in m]
    writer.close(), other.close(), fresh.close()


KILLED = r"""
import sys
import threading
from hybridmem.chroma.vector import ChromaVectorStore
from hybridmem.models import MemoryItem, utcnow
from hybridmem.offline import HashEmbedder
from hybridmem.replica import lexical, snapshot
from hybridmem.runtime.files import user_key
snapshot.PART_CHARS, snapshot.PARTS_PER_CALL = 512, 1  # many small requests: a wide target
url, user, start = sys.argv[1], sys.argv[2], int(sys.argv[3])
emb = HashEmbedder(32)
vectors = ChromaVectorStore(embedder_name=emb.name, dimension=32, url=url)
index = lexical.ChromaLexicalIndex(url=url)
for n in range(start, start + 100_000, 8):
    now = utcnow()
    docs = {f"k{i}": f"killed writer note {i} about cable {i % 13}" for i in range(n, n + 8)}
    vectors.upsert(user, [MemoryItem(id=i, user_id=user, text=t, created_at=now, updated_at=now)
                          for i, t in docs.items()], emb.embed_batch(list(docs.values())))
    index.add(user, list(docs), list(docs.values()))
    st = index._users[user_key(user)]
    index._write_texts(user, st, final=True)
    print(n, flush=True)
"""


def test_a_writer_killed_mid_text_snapshot_leaves_a_loadable_one(
    chroma_server: str, unique_user: str, tmp_path: Path
) -> None:
    rng = random.Random(11)
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    for trial in range(3):
        proc = subprocess.Popen([sys.executable, str(script), chroma_server, unique_user,
                                 str(100_000 * trial)], stdout=subprocess.PIPE, text=True, env=env)
        assert proc.stdout is not None
        assert proc.stdout.readline()  # at least one text snapshot stored
        time.sleep(rng.uniform(0.05, 0.6))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert texts(chroma_server, unique_user) is not None  # the head's snapshot is whole
        loaded, full = ChromaLexicalIndex(url=chroma_server), swept(chroma_server)
        queries = ["killed writer cable 3", "note cable 12", "about"]
        assert results(loaded, unique_user, queries) == results(full, unique_user, queries)
        st: Any = loaded._users[user_key(unique_user)]
        assert st.texts is not None  # the first look started from the snapshot
        loaded.close(), full.close()


def test_a_first_context_starts_the_lexical_first_look_ahead_of_its_search(
        chroma_server: str, tmp_path: Path, unique_user: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """context() preloads the lexical cache while it asks which sections the user has: the
    first look is made once, on a reader thread, before the search that needs it."""
    u = unique_user
    settings = Settings(data_dir=tmp_path / "a", chroma_url=chroma_server, extractor="rules")
    with Memory(settings, embedder=HashEmbedder(32)) as writer:
        writer.add_many(u, [text(i) for i in range(20)])
    looks: list[str] = []
    preloads: list[str] = []
    real_look = ChromaLexicalIndex._start_from_snapshot
    real_preload = ChromaLexicalIndex.preload

    def look(self: ChromaLexicalIndex, *args: Any) -> bool:
        looks.append(threading.current_thread().name)
        return real_look(self, *args)

    def preload(self: ChromaLexicalIndex, user_id: str) -> None:
        preloads.append(user_id)
        real_preload(self, user_id)

    monkeypatch.setattr(ChromaLexicalIndex, "_start_from_snapshot", look)
    monkeypatch.setattr(ChromaLexicalIndex, "preload", preload)
    with Memory(settings, embedder=HashEmbedder(32)) as reader:
        word = text(3).split()[-1]
        got = reader.context(u, f"which {word}?")
        reader.context(u, "and the rest?")
    assert preloads == [u, u] and len(looks) == 1 and looks[0].startswith("hybridmem-read")
    assert any(word in line.text for line in got.lines)
