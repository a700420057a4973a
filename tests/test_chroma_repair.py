"""A Chroma HNSW index torn by a crash (each file cut, emptied, overwritten or missing) is found
before Chroma reads it and rebuilt from Chroma's SQLite file: every memory is found again by id
and by search, and the lexical index, graph and history are untouched. A kill during the rebuild
leaves something the next open finishes. Real Chroma, real files, real subprocesses (some tears
crash Chroma itself with SIGSEGV, so each reopen runs in its own process)."""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hybridmem import Memory, Settings
from hybridmem.chroma.repair import FILES, torn
from hybridmem.chroma.client import collection_name

#: More than one HNSW persist (every 1,000 records), so the index files exist.
N = 1100
USER = "alice"

#: Opens the data dir, then checks every memory by id and a sample by search; prints a verdict.
CHECKER = r"""
import json, sys
from hybridmem import Memory, Settings

want = json.loads(open(sys.argv[1]).read())
for data_dir in sys.argv[2:]:
  with Memory(Settings(data_dir=data_dir, embedder="hash", extractor="rules")) as mem:
    got = {i.id for off in range(0, 2000, 1000) for i in mem.list("alice", limit=1000, offset=off)}
    by_id = sum(1 for i in want["ids"] if mem.get("alice", i).text == want["text"][i])
    missed = [i for i in want["sample"]
              if not any(h.item.id == i for h in mem.search("alice", want["text"][i], limit=5))]
    history = sum(1 for i in want["sample"] if mem.history("alice", i))
    why = [[(h.item.id == i, h.breakdown.vector_rank, h.breakdown.lexical_rank,
             h.breakdown.graph, round(h.score, 4))
            for n, h in enumerate(mem.search("alice", want["text"][i], limit=100))
            if n < 5 or h.item.id == i] for i in missed]
    print(json.dumps({"listed": len(got & set(want["ids"])), "by_id": by_id,
                      "found": len(want["sample"]) - len(missed), "history": history,
                      "why": why}), flush=True)
"""
#: One case of each way Chroma reacts (see hybridmem.chroma.repair): every call fails, the
#: process dies (SIGSEGV), calls succeed on a damaged or empty index. (The whole matrix, 5 files
#: x cut/empty/garbage/missing, passed too: 20 of 20, each in its own process.)
TEARS = [("index_metadata.pickle", "cut"), ("index_metadata.pickle", "missing"),
         ("header.bin", "cut"), ("header.bin", "garbage"), ("data_level0.bin", "garbage"),
         ("data_level0.bin", "empty"), ("link_lists.bin", "garbage"), ("length.bin", "garbage")]


def _text(n: int) -> str:
    return f"note {n}: the {n % 37}th parcel went to depot {n * 7 % 101} on route {n * 13 % 97}"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A data dir whose user has N memories and a persisted index, and what it must hold."""
    root = tmp_path_factory.mktemp("torn")
    data = root / "data"
    with Memory(Settings(data_dir=data, embedder="hash", extractor="rules")) as mem:
        items = mem.add_many(USER, [_text(n) for n in range(N)])
    want = {"ids": [i.id for i in items], "text": {i.id: i.text for i in items},
            "sample": [i.id for i in items[::37]]}
    (root / "want.json").write_text(json.dumps(want))
    return data, root / "want.json"


def _segment(data: Path) -> Path:
    folders = [p for p in (data / "chroma").iterdir() if p.is_dir()]
    assert len(folders) == 1, folders  # the hot collection only: nothing was superseded
    return folders[0]


def _check(want: Path, *data: Path) -> list[dict[str, int]]:
    """What the checker found in each data dir (all in one child process); a sampled memory its
    own text did not find is shown with the top 5 hits and its own, if among the first 100 (is it,
    vector rank, lexical rank, graph, score), so a failure says which signal lost it."""
    run = subprocess.run([sys.executable, "-c", CHECKER, str(want), *map(str, data)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    got = [dict(json.loads(line)) for line in run.stdout.splitlines()[-len(data):]]
    whys = [g.pop("why") for g in got]
    assert not any(whys), (got, whys)
    return got


def _tear(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "cut":
        path.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "garbage":
        path.write_bytes(random.Random(7).randbytes(len(data)))
    else:
        path.unlink()


def test_an_intact_index_is_not_torn(built: tuple[Path, Path]) -> None:
    data, _ = built
    assert torn(data / "chroma", collection_name(USER)) is None


@pytest.mark.slow
def test_each_kind_of_torn_file_is_rebuilt_and_every_memory_found(
        built: tuple[Path, Path], tmp_path: Path) -> None:
    data, want = built
    copies = []
    for name, how in TEARS:
        copy = tmp_path / f"{name}-{how}"
        shutil.copytree(data, copy)
        _tear(_segment(copy) / name, how)
        assert torn(copy / "chroma", collection_name(USER)) is not None, (name, how)
        copies.append(copy)
    sample = len(json.loads(want.read_text())["sample"])
    expected = {"listed": N, "by_id": N, "found": sample, "history": sample}
    assert _check(want, *copies) == [expected] * len(copies)
    for copy in copies:
        assert torn(copy / "chroma", collection_name(USER)) is None
        assert not list((copy / "chroma").glob("repair-*"))


#: Opens a torn data dir and pauses the rebuild at one point (argv[2]), printing "paused <point>",
#: so the test kills it exactly there: each point is a step boundary or between two batches of a
#: step (N records are two batches of repair.BATCH).
PAUSER = r"""
import sys, threading
from chromadb.api.models.Collection import Collection
from hybridmem import Memory, Settings
from hybridmem.chroma import repair

data_dir, point = sys.argv[1], sys.argv[2]

def pause(here):
    if here == point:
        print("paused", here, flush=True)
        threading.Event().wait()  # until the test's SIGKILL

mark, create, drop = repair.Repair._mark, repair.create_collection, repair.drop_collection
add = Collection.add

def marked(marker, step, meta):
    pause("before-" + step)
    mark(marker, step, meta)

def created(client, name, meta):
    pause("before-create-staging" if name.startswith(repair.STAGING) else "before-create")
    return create(client, name, meta)

def dropped(client, name):
    if name.startswith(repair.STAGING):
        pause("before-drop-staging")
    return drop(client, name)

def added(self, *args, **kwargs):
    result = add(self, *args, **kwargs)
    pause("after-add-staging" if self.name.startswith(repair.STAGING) else "after-add")
    return result

repair.Repair._mark = staticmethod(marked)
repair.create_collection, repair.drop_collection, Collection.add = created, dropped, added
with Memory(Settings(data_dir=data_dir, embedder="hash", extractor="rules")) as mem:
    mem.count("alice")
print("finished", flush=True)
"""
#: Where a kill interrupts the rebuild (see hybridmem.chroma.repair): records read, half staged,
#: wholly staged, torn collection dropped and created empty, half copied back, copied back with
#: the staging collection still there.
KILL_POINTS = ["before-create-staging", "after-add-staging", "before-staged", "before-create",
               "after-add", "before-drop-staging"]


@pytest.mark.slow
def test_a_kill_during_the_rebuild_is_finished_at_the_next_open(
        built: tuple[Path, Path], tmp_path: Path) -> None:
    """SIGKILL at each step of the rebuild (reading, staging, copying back), paused there so the
    kill lands at that step on any machine; the next open finishes it, every memory there."""
    data, want = built
    sample = len(json.loads(want.read_text())["sample"])
    copies = []
    for point in KILL_POINTS:
        copy = tmp_path / point
        shutil.copytree(data, copy)
        _tear(_segment(copy) / "index_metadata.pickle", "cut")
        errors = tmp_path / f"{point}.err"
        with errors.open("w") as stderr:
            child = subprocess.Popen([sys.executable, "-c", PAUSER, str(copy), point],
                                     stdout=subprocess.PIPE, stderr=stderr, text=True)
        assert child.stdout is not None
        said: list[str] = []
        for line in child.stdout:  # until it pauses (or, if the point was never reached, ends)
            said.append(line.strip())
            if said[-1] in (f"paused {point}", "finished"):
                break
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=60)
        assert said and said[-1] == f"paused {point}", (point, said[-3:],
                                                        errors.read_text()[-2000:])
        assert list((copy / "chroma").glob("repair-*")), point  # the kill left the rebuild undone
        copies.append(copy)
    expected = {"listed": N, "by_id": N, "found": sample, "history": sample}
    assert _check(want, *copies) == [expected] * len(copies)
    for copy in copies:
        assert not list((copy / "chroma").glob("repair-*"))
        assert torn(copy / "chroma", collection_name(USER)) is None
