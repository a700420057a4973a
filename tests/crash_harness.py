"""The kill -9 harness, shared by tests/test_crash.py (a few trials) and bench/storage.py (200):
a writer subprocess adds batches (some superseding, some forgotten) and prints what it was told
is stored; it is killed with SIGKILL at a random moment; then a fresh Memory must hold every
acknowledged memory, and every store must agree with the vector store."""

from __future__ import annotations

import random
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hybridmem import Memory, Settings
from hybridmem.chroma import client as _chroma
from hybridmem.chroma.client import collection_name
from hybridmem.replica.lease import INTENT, NOTE

USER = "crash-user"
#: Lease lifetime of the server-mode writers: a dead writer's lease is taken over this soon.
SHORT_TTL = 1.0

WRITER = r"""
import sys
from hybridmem import Memory, Settings

data_dir, start, url = sys.argv[1], int(sys.argv[2]), sys.argv[3] or None
with Memory(Settings(data_dir=data_dir, embedder="hash", extractor="rules", chroma_url=url)) as mem:
    if mem._stores.leases is not None:  # the harness's only white-box: a short lease
        mem._stores.leases.ttl = float(sys.argv[4])
    for n in range(start, start + 10_000):
        texts = [f"I bought gadget {n}-{k} for the office of Alice {n}" for k in range(5)]
        if n % 3 == 0:
            texts.append(f"I live in Town{n}")  # supersedes the previous town
        items = mem.add_many("crash-user", texts)
        print(" ".join(i.id for i in items), flush=True)
        if n % 7 == 6:  # said before it is done: a kill in between may or may not have erased it
            print("forgetting", items[0].id, flush=True)
            mem.forget("crash-user", items[0].id)
"""


@dataclass
class Ledger:
    """What the writers were told: stored ids, and ids they set out to forget."""

    acknowledged: set[str] = field(default_factory=set)
    forgotten: set[str] = field(default_factory=set)

    @property
    def must_exist(self) -> set[str]:
        return self.acknowledged - self.forgotten


def settings(data_dir: Path, chroma_url: str | None) -> Settings:
    return Settings(data_dir=data_dir, embedder="hash", extractor="rules", chroma_url=chroma_url)


def kill_writer(data_dir: Path, start: int, rng: random.Random, ledger: Ledger, *,
                chroma_url: str | None = None, stderr: Any = subprocess.DEVNULL,
                max_wait: float = 1.5) -> None:
    """Run one writer, SIGKILL it after a random time, and note what it acknowledged."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(data_dir), str(start), chroma_url or "",
         str(SHORT_TTL)], stdout=subprocess.PIPE, stderr=stderr, text=True)
    assert proc.stdout is not None
    first = proc.stdout.readline()  # the writer is up and has written once
    time.sleep(rng.uniform(0.0, max_wait))
    proc.send_signal(signal.SIGKILL)
    # read through the same buffered reader as readline (communicate() would bypass it and drop
    # lines it already holds)
    rest = proc.stdout.read()
    proc.wait(timeout=120)
    if not first:
        raise RuntimeError("the writer died before its first write")
    for line in [first, *rest.splitlines()]:
        if line.startswith("forgetting "):
            ledger.forgotten.add(line.split()[1])
        elif line.strip():
            ledger.acknowledged.update(line.split())


def all_items(mem: Memory, user: str = USER) -> list[Any]:
    """Every memory of the user, superseded ones included, page by page."""
    items: list[Any] = []
    while page := mem.list(user, limit=1000, offset=len(items), include_superseded=True):
        items.extend(page)
    return items


def _ids_in_sqlite(path: Path, sql: str) -> set[str]:
    if not path.exists():
        return set()
    with sqlite3.connect(path) as conn:
        return {row[0] for row in conn.execute(sql)}


def recover(mem: Memory, user: str = USER) -> None:
    """Embedded recovery ran when the Memory opened; in server mode the next write lock does it
    (once the dead writer's lease expired): a dry-run prune takes the lock and changes nothing."""
    if mem.settings.chroma_url:
        time.sleep(SHORT_TTL)
        mem.prune(user, dry_run=True)


def check_agree(mem: Memory, data_dir: Path, user: str = USER) -> None:
    """Every store holds exactly the memories the vector store holds, and no journal is left."""
    items = all_items(mem, user)
    ids = {i.id for i in items}
    assert mem.count(user) == len(ids)
    events = mem.history(user)
    assert ids <= {e.memory_id for e in events if e.action == "add"}
    assert not ids & {e.memory_id for e in events if e.action == "delete"}
    mem.refresh(user)
    in_graph = {m for e in mem.entities(user) for m in e.memory_ids}
    current = {i.id for i in items if i.is_current}
    assert in_graph <= current  # no provenance of a memory that is gone or superseded
    assert {i.id for i in items if "gadget" in i.text and i.is_current} <= in_graph
    if mem.settings.chroma_url:  # the lexical index is a cache of the vectors' documents there
        client = _chroma.make_client(url=mem.settings.chroma_url)
        slots = client.get_collection(collection_name(user, "lease")).get(
            include=["documents", "metadatas"])
        # a released slot lists what its holder wrote; an intent is on a held slot only
        assert all((m or {}).get("state") == "free" for m in slots["metadatas"] or []), (
            "a lease was left held")
        assert all((d or "").startswith(NOTE) or not d for d in slots["documents"] or []), (
            "a journal was left in the lease")
        assert not any((m or {}).get(INTENT) for m in slots["metadatas"] or []), (
            "a journal was left in the lease")
        return
    folder = next((data_dir / "users").iterdir())
    assert _ids_in_sqlite(folder / "lexical.sqlite3", "SELECT id FROM ids") == ids
    journal = folder / "pending.json"  # kept between batches, empty when nothing is pending
    assert not journal.exists() or journal.stat().st_size == 0


def trial(data_dir: Path, n: int, rng: random.Random, ledger: Ledger, *,
          chroma_url: str | None = None, stderr: Any = subprocess.DEVNULL) -> tuple[int, bool]:
    """One kill and check: (acknowledged memories missing, whether the stores agree)."""
    kill_writer(data_dir, n * 1000, rng, ledger, chroma_url=chroma_url, stderr=stderr)
    with Memory(settings(data_dir, chroma_url)) as mem:
        recover(mem)
        lost = len(ledger.must_exist - {i.id for i in all_items(mem)})
        try:
            check_agree(mem, data_dir)
        except AssertionError:
            return lost, False
        return lost, True
