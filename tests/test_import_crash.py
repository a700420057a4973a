"""An import killed with SIGKILL at each of its writes leaves the user wholly before or wholly
after it — memories, lexical index, graph and history alike — never half written: overwriting or
into an empty user, on embedded Chroma and on a real `chroma run`."""

from __future__ import annotations

import json
import os
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
from hybridmem.runtime.files import user_dir

#: Two bundles over the same memory ids: "alpha" texts about Lyon, "beta" texts about Paris.
#: The importer opens the data dir (which finishes a journaled import), loads one bundle into the
#: user ("overwrite" or "first", an import without overwrite) and pauses at one point of the
#: import's writes, printing "paused <point>", so the test kills it exactly there; "-" imports
#: nothing (the pause then lands in the recovery at open). The points are named by the store's
#: role, so they are the same writes on embedded Chroma and with a Chroma server.
IMPORTER = r"""
import json, sys, threading, types
from hybridmem import Memory, Settings
from hybridmem.ops import bundle

data_dir, bundles, user, name, point, url, mode = sys.argv[1:]
bundles = json.loads(open(bundles).read())
calls = {}

def pause(here):
    calls[here] = calls.get(here, 0) + 1
    if f"{here}@{calls[here]}" == point:
        print("paused", point, flush=True)
        threading.Event().wait()  # until the test's SIGKILL

class Paused:
    # a store whose calls pause once they have returned (the write has landed)
    def __init__(self, role, store):
        self.role, self.store = role, store
    def __getattr__(self, attr):
        real = getattr(self.store, attr)
        def call(*args, **kwargs):
            result = real(*args, **kwargs)
            pause(f"{self.role}.{attr}")
            return result
        return call

write = bundle._write  # every store write of an import and of its recovery
def paused_write(stores, intent, vectors):
    roles = {r: Paused(r, getattr(stores, r)) for r in ("vectors", "lexical", "graph", "history")}
    write(types.SimpleNamespace(**roles), intent, vectors)
bundle._write = paused_write
write_file = bundle.atomic_write_bytes
def journaled(path, data):
    if path.name == bundle.IMPORT_FILE:
        pause("before-journal")
        write_file(path, data)
        pause("after-journal")
    else:
        write_file(path, data)
bundle.atomic_write_bytes = journaled
settings = Settings(data_dir=data_dir, embedder="hash", extractor="rules",
                    chroma_url=None if url == "-" else url)
with Memory(settings) as mem:
    if name != "-":
        mem.import_(user, bundles[name], overwrite=mode == "overwrite")
print("finished", flush=True)
"""
#: Where a kill lands in an overwriting import (the N memories are three chunks, each written to
#: the vectors then the lexical index; then the graph, then the history): before its journal is
#: committed, then after each write; ``@n`` is the n-th call of that point in the process.
KILL_POINTS = ["before-journal@1", "after-journal@1", "vectors.upsert@1", "lexical.add@2",
               "vectors.upsert@3", "graph.import_graph@1", "history.record@1"]
#: With a Chroma server (each kill costs a round of server writes) and for a first import: the
#: commit point from both sides, one chunk of memories, the graph.
FEWER_POINTS = ["before-journal@1", "after-journal@1", "vectors.upsert@2",
                "graph.import_graph@1"]
N = 600  # three import chunks
CITY = {"alpha": "Lyon", "beta": "Paris"}
Bundles = dict[str, dict[str, Any]]


def _settings(data_dir: Path, chroma_url: str | None = None) -> Settings:
    return Settings(data_dir=data_dir, embedder="hash", extractor="rules", chroma_url=chroma_url)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> tuple[Bundles, Path]:
    """Both bundles, beta's ids renamed to alpha's (in the memories, facts, graph and history),
    and the JSON file the importer reads them from."""
    src = tmp_path_factory.mktemp("bundles")
    with Memory(_settings(src / "hm")) as mem:
        for name, city in CITY.items():
            mem.add_many(f"src-{name}", [f"{name} note {k}: Visited {city} with Omar{k}"
                                         for k in range(N)], infer=False)
        alpha, beta = mem.export("src-alpha"), mem.export("src-beta")
    text = json.dumps(beta)
    for a, b in zip(alpha["memories"], beta["memories"]):
        assert a["text"].split(":")[0].replace("alpha", "beta") == b["text"].split(":")[0]
        text = text.replace(b["id"], a["id"])
    both = {"alpha": alpha, "beta": json.loads(text)}
    path = src / "bundles.json"
    path.write_text(json.dumps(both))
    return both, path


def _state(mem: Memory, data_dir: Path, user: str) -> str:
    """Which bundle the user holds ("empty" for nothing), after checking that every store says
    the same. With a Chroma server the lexical index is a cache of the memories' own collection
    (nothing to tear), so the lexical file is read on embedded Chroma only."""
    items: list[Any] = []
    while page := mem.list(user, limit=1000, offset=len(items), include_superseded=True):
        items.extend(page)
    folder = user_dir(data_dir, user, create=False)
    assert not (folder / IMPORT_FILE).exists(), "the open left the import unfinished"
    cited = {e.name.lower() for e in mem.entities(user) if e.memory_ids}
    imported = {e.memory_id for e in mem.history(user) if e.action == "import"}
    indexed: dict[str, str] = {}
    if mem.settings.chroma_url is None and (folder / "lexical.sqlite3").exists():
        with sqlite3.connect(folder / "lexical.sqlite3") as conn:
            indexed = dict(conn.execute(
                "SELECT ids.id, docs.text FROM ids JOIN docs ON docs.rowid = ids.docid"))
    if not items:
        assert (cited, imported, indexed) == (set(), set(), {}), "an empty user half written"
        assert mem.history(user) == []
        return "empty"
    names = {i.text.split()[0] for i in items}
    assert len(names) == 1, f"half overwritten: {sorted(names)}"
    assert len(items) == N, f"half imported: {len(items)} of {N} memories"
    (name,) = names
    if mem.settings.chroma_url is None:
        assert set(indexed) == {i.id for i in items}
        assert all(doc.split()[0] == name for doc in indexed.values()), "index half overwritten"
    assert CITY[name].lower() in cited
    other = next(n for n in CITY if n != name)
    assert CITY[other].lower() not in cited, "graph half overwritten"
    assert imported == {i.id for i in items}, "history half written"
    return name


def _kill_at(data_dir: Path, bundles: Path, user: str, name: str, point: str,
             chroma_url: str | None, errors: Path, *, mode: str = "overwrite") -> None:
    """Run the importer until it pauses at ``point``, then SIGKILL it. Its temporary files
    (the server-mode lexical cache) go under ``errors``' folder, since a killed process cannot
    remove them."""
    env = {**os.environ, "TMPDIR": str(errors.parent)}
    with errors.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", IMPORTER, str(data_dir), str(bundles),
                                 user, name, point, chroma_url or "-", mode],
                                stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
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
def test_an_overwriting_import_killed_at_each_write_is_all_or_nothing(
    tmp_path: Path, chroma_url: str | None, unique_user: str, bundles: tuple[Bundles, Path]
) -> None:
    """SIGKILL at each point of an overwriting import, paused there so the kill lands at that
    point on any machine: before its journal the user keeps the old bundle, after it the next
    open finishes the new one; never half of each. Embedded, one user is overwritten back and
    forth; with a Chroma server each kill takes a fresh user, since a killed importer holds
    its user's lease until the lease expires."""
    data, path = bundles
    data_dir = tmp_path / "hm"
    points = KILL_POINTS if chroma_url is None else FEWER_POINTS
    held: dict[str, str] = {}  # user -> the bundle it holds
    # embedded, a last import is killed too, and then its recovery at the next open
    for trial, point in enumerate([*points, "lexical.add@1"] if chroma_url is None else points):
        user = unique_user if chroma_url is None else f"{unique_user}-{trial}"
        if user not in held:
            with Memory(_settings(data_dir, chroma_url)) as mem:
                mem.import_(user, data["alpha"])
                held[user] = _state(mem, data_dir, user)
        old = held[user]
        new = "beta" if old == "alpha" else "alpha"
        _kill_at(data_dir, path, user, new, point, chroma_url, tmp_path / f"importer-{trial}.err")
        if trial == len(points):
            # A kill during the recovery at the next open: that open's recovery is finished in turn.
            _kill_at(data_dir, path, user, "-", "vectors.upsert@2", chroma_url,
                     tmp_path / "recovery.err")
        with Memory(_settings(data_dir, chroma_url)) as mem:
            held[user] = _state(mem, data_dir, user)
        assert held[user] == (old if point == "before-journal@1" else new), (point, held[user])


@pytest.mark.slow
def test_a_first_import_killed_at_each_write_is_all_or_nothing(
    tmp_path: Path, chroma_url: str | None, unique_user: str, bundles: tuple[Bundles, Path]
) -> None:
    """An import without overwrite into an empty user, killed at each point: before its journal
    the user is still empty in every store (no memories, no graph evidence, no history); after
    it the next open finishes the whole bundle, each history event once."""
    data, path = bundles
    data_dir = tmp_path / "hm"
    for trial, point in enumerate(FEWER_POINTS):
        user = f"{unique_user}-{trial}"
        _kill_at(data_dir, path, user, "alpha", point, chroma_url, tmp_path / f"first-{trial}.err",
                 mode="first")
        with Memory(_settings(data_dir, chroma_url)) as mem:
            state = _state(mem, data_dir, user)
            events = len(mem.history(user))
        assert state == ("empty" if point == "before-journal@1" else "alpha"), (point, state)
        if state == "alpha":
            assert events == len(data["alpha"]["history"]) + N, point


class _FullDisk(NetworkXGraphStore):
    """A real graph store whose next graph import fails as a full disk would (once)."""

    fail = True

    def import_graph(self, user_id: str, data: Any) -> None:
        if self.fail:
            self.fail = False
            raise OSError(28, "No space left on device")
        super().import_graph(user_id, data)


def test_a_store_error_midway_is_finished_forward_not_left_half(
    tmp_path: Path, bundles: tuple[Bundles, Path]
) -> None:
    data, _ = bundles
    data_dir = tmp_path / "hm"
    with Memory(_settings(data_dir)) as mem:
        mem.import_("u", data["alpha"])
    graph = _FullDisk(data_dir)
    with Memory(_settings(data_dir), graph_store=graph) as mem:
        with pytest.raises(StorageError, match="finished when the data dir is next opened"):
            mem.import_("u", data["beta"], overwrite=True)
    assert (user_dir(data_dir, "u", create=False) / IMPORT_FILE).exists()
    graph.close()
    with Memory(_settings(data_dir)) as mem:  # opening finishes it: wholly beta
        assert _state(mem, data_dir, "u") == "beta"
