"""A user past SQLite's 32,766 variables: whole-collection reads are paged (_chroma.get_paged).

Chroma's ``get`` of documents or metadatas without ``where`` or ``limit`` fails above that many
records ("too many SQL variables"); the latency bench met it at 100k memories, where the record
cache could not load and every search fell back to reading Chroma (search p50 106 ms).
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest

from hybridmem.chroma import client as _chroma
from hybridmem.models import MemoryItem
from hybridmem.chroma.vector import ChromaVectorStore

#: Past SQLite's default limit of 32,766 variables in one statement.
N = 40_000
T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)


@pytest.mark.slow
@pytest.mark.parametrize("cached", [False, True], ids=["embedded", "cached"])
def test_a_user_of_40k_memories_lists_and_loads_whole(tmp_path: Path, cached: bool) -> None:
    def open_store() -> ChromaVectorStore:
        return ChromaVectorStore(embedder_name="test-4d", dimension=4, path=tmp_path / "chroma",
                                 cache_records=cached, background_load=False)

    items = [MemoryItem(id=f"m{i:05d}", user_id="big", text=f"fact number {i}",
                        created_at=T0, updated_at=T0) for i in range(N)]
    vectors = np.random.default_rng(7).random((N, 4)).tolist()
    with open_store() as store:
        store.upsert("big", items, vectors)
    store = open_store()  # reopened: the record cache loads all 40k from Chroma at the first read
    try:

        listed = store.list("big")
        assert len(listed) == N and {i.id for i in listed} == {i.id for i in items}
        assert [i.id for i in store.list("big", limit=5, offset=N - 3)] == [
            i.id for i in listed[N - 3:]]
        got = store.get("big", ["m00000", "m39999"])
        assert sorted(i.text for i in got) == ["fact number 0", "fact number 39999"]
        hits = store.query("big", [vectors[123]], limit=3)[0]
        assert hits[0].item.id == "m00123"
    finally:
        store.close()


def test_get_paged_reads_every_page_and_stops_at_the_limit(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Page boundaries: a small page size gives the same records as one read."""
    monkeypatch.setattr(_chroma, "READ_PAGE", 7)
    import chromadb

    client = chromadb.PersistentClient(path=str(tmp_path / "c"))
    col = client.create_collection("pages")
    col.add(ids=[f"r{i:02d}" for i in range(30)], embeddings=[[float(i), 1.0] for i in range(30)],
            documents=[f"d{i}" for i in range(30)])
    every = col.get(include=["documents"])
    got = _chroma.get_paged(col, include=["documents"])
    assert got["ids"] == every["ids"] and got["documents"] == every["documents"]
    some = _chroma.get_paged(col, include=["documents"], limit=10, offset=12)
    assert some["ids"] == every["ids"][12:22]
    assert _chroma.get_paged(col, include=[], limit=0)["ids"] == []
