"""An overwriting import killed with SIGKILL at each of its writes leaves the user wholly before or
wholly after it — memories, lexical index and graph alike — never half overwritten."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hybridmem import Memory, Settings, StorageError
from hybridmem.ops.bundle import IMPORT_FILE
from hybridmem.graph import NetworkXGraphStore

#: Two bundles over the same memory ids: "alpha" texts about Lyon, "beta" texts about Paris.
#: The importer opens the data dir (which finishes a journaled import), loads one bundle over the
#: other and pauses at one point of the import's writes, printing "paused <point>", so the test
#: kills it exactly there; "-" imports nothing (the pause then lands in the recovery at open).
IMPORTER = r"""
import json, sys, threading
from hybridmem import Memory, Settings
from hybridmem.chroma.vector import ChromaVectorStore
from hybridmem.graph.store import NetworkXGraphStore
from hybridmem.ops import bundle
from hybridmem.sqlite.history import HistoryStore
from hybridmem.sqlite.lexical import SqliteLexicalIndex

data_dir, bundles, name, point = sys.argv[1], json.loads(open(sys.argv[2]).read()), *sys.argv[3:]
calls = {}

def pause(here):
    calls[here] = calls.get(here, 0) + 1
    if f"{here}@{calls[here]}" == point:
        print("paused", point, flush=True)
        threading.Event().wait()  # until the test's SIGKILL

def after(cls, method):
    real = getattr(cls, method)
    def wrapped(self, *args, **kwargs):
        result = real(self, *args, **kwargs)
        pause(f"{cls.__name__}.{method}")
        return result
    setattr(cls, method, wrapped)

for cls, method in ((ChromaVectorStore, "upsert"), (SqliteLexicalIndex, "add"),
                    (NetworkXGraphStore, "import_graph"), (HistoryStore, "record")):
    after(cls, method)
write = bundle.atomic_write_bytes
def journaled(path, data):
    if path.name == bundle.IMPORT_FILE:
        pause("before-journal")
        write(path, data)
        pause("after-journal")
    else:
        write(path, data)
bundle.atomic_write_bytes = journaled
with Memory(Settings(data_dir=data_dir, embedder="hash", extractor="rules")) as mem:
    if name != "-":
        mem.import_("u", bundles[name], overwrite=True)
print("finished", flush=True)
"""
#: Where a kill lands in an overwriting import (the N memories are three chunks, each written to
#: the vectors then the lexical index; then the graph, then the history): before its journal is
#: committed, then after each write; ``@n`` is the n-th call of that point in the process.
KILL_POINTS = ["before-journal@1", "after-journal@1", "ChromaVectorStore.upsert@1",
               "SqliteLexicalIndex.add@2", "ChromaVectorStore.upsert@3",
               "NetworkXGraphStore.import_graph@1", "HistoryStore.record@1"]
N = 600  # three import chunks
CITY = {"alpha": "Lyon", "beta": "Paris"}


def _settings(data_dir: Path) -> Settings:
    return Settings(data_dir=data_dir, embedder="hash", extractor="rules")


def _bundles(data_dir: Path) -> dict[str, dict[str, Any]]:
    """Both bundles, beta's ids renamed to alpha's (in the memories, facts, graph and history)."""
    with Memory(_settings(data_dir)) as mem:
        for name, city in CITY.items():
            mem.add_many(f"src-{name}", [f"{name} note {k}: Visited {city} with Omar{k}"
                                         for k in range(N)], infer=False)
        alpha, beta = mem.export("src-alpha"), mem.export("src-beta")
    text = json.dumps(beta)
    for a, b in zip(alpha["memories"], beta["memories"]):
        assert a["text"].split(":")[0].replace("alpha", "beta") == b["text"].split(":")[0]
        text = text.replace(b["id"], a["id"])
    return {"alpha": alpha, "beta": json.loads(text)}


def _state(mem: Memory, data_dir: Path) -> str:
    """Which bundle the user holds, after checking that every store says the same one."""
    items: list[Any] = []
    while page := mem.list("u", limit=1000, offset=len(items), include_superseded=True):
        items.extend(page)
    names = {i.text.split()[0] for i in items}
    assert len(items) == N and len(names) == 1, f"half overwritten: {sorted(names)}"
    (name,) = names
    (folder,) = [p for p in (data_dir / "users").iterdir() if p.is_dir()]  # u's only
    with sqlite3.connect(folder / "lexical.sqlite3") as conn:
        indexed = dict(conn.execute(
            "SELECT ids.id, docs.text FROM ids JOIN docs ON docs.rowid = ids.docid"))
    assert set(indexed) == {i.id for i in items}
    assert all(doc.split()[0] == name for doc in indexed.values()), "index half overwritten"
    cited = {e.name.lower() for e in mem.entities("u") if e.memory_ids}
    assert CITY[name].lower() in cited
    other = next(n for n in CITY if n != name)
    assert CITY[other].lower() not in cited, "graph half overwritten"
    assert not (folder / IMPORT_FILE).exists()
    return name


def _kill_at(data_dir: Path, bundles: Path, name: str, point: str, errors: Path) -> None:
    """Run the importer until it pauses at ``point``, then SIGKILL it."""
    with errors.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", IMPORTER, str(data_dir), str(bundles),
                                 name, point], stdout=subprocess.PIPE, stderr=stderr, text=True)
    assert proc.stdout is not None
    said: list[str] = []
    for line in proc.stdout:  # until it pauses (or, if the point was never reached, ends)
        said.append(line.strip())
        if said[-1] in (f"paused {point}", "finished"):
            break
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert said and said[-1] == f"paused {point}", (point, said[-3:], errors.read_text()[-2000:])


@pytest.mark.slow
def test_an_overwriting_import_killed_at_each_write_is_all_or_nothing(tmp_path: Path) -> None:
    """SIGKILL at each point of an overwriting import, paused there so the kill lands at that
    point on any machine: before its journal the user keeps the old bundle, after it the next
    open finishes the new one; never half of each."""
    data_dir = tmp_path / "hm"
    bundles = _bundles(tmp_path / "src")
    path = tmp_path / "bundles.json"
    path.write_text(json.dumps(bundles))
    with Memory(_settings(data_dir)) as mem:
        mem.import_("u", bundles["alpha"])
        assert _state(mem, data_dir) == "alpha"
    state = "alpha"
    for trial, point in enumerate(KILL_POINTS):
        other = "beta" if state == "alpha" else "alpha"
        _kill_at(data_dir, path, other, point, tmp_path / f"importer-{trial}.err")
        with Memory(_settings(data_dir)) as mem:
            got = _state(mem, data_dir)
        assert got == (state if point == "before-journal@1" else other), (point, got)
        state = got
    # A kill during the recovery at the next open: that open's recovery is finished in turn.
    other = "beta" if state == "alpha" else "alpha"
    _kill_at(data_dir, path, other, "SqliteLexicalIndex.add@1", tmp_path / "import.err")
    _kill_at(data_dir, path, "-", "ChromaVectorStore.upsert@2", tmp_path / "recovery.err")
    with Memory(_settings(data_dir)) as mem:
        assert _state(mem, data_dir) == other


class _FullDisk(NetworkXGraphStore):
    """A real graph store whose next graph import fails as a full disk would (once)."""

    fail = True

    def import_graph(self, user_id: str, data: Any) -> None:
        if self.fail:
            self.fail = False
            raise OSError(28, "No space left on device")
        super().import_graph(user_id, data)


def test_a_store_error_midway_is_finished_forward_not_left_half(tmp_path: Path) -> None:
    data_dir = tmp_path / "hm"
    bundles = _bundles(tmp_path / "src")
    with Memory(_settings(data_dir)) as mem:
        mem.import_("u", bundles["alpha"])
    graph = _FullDisk(data_dir)
    with Memory(_settings(data_dir), graph_store=graph) as mem:
        with pytest.raises(StorageError, match="finished when the data dir is next opened"):
            mem.import_("u", bundles["beta"], overwrite=True)
    (folder,) = [p for p in (data_dir / "users").iterdir() if p.is_dir()]
    assert (folder / IMPORT_FILE).exists()
    graph.close()
    with Memory(_settings(data_dir)) as mem:  # opening finishes it: wholly beta
        assert _state(mem, data_dir) == "beta"
