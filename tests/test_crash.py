"""Crash consistency and bounded resources, with real processes: a writer killed with SIGKILL at
random moments, two processes on one embedded data dir, and many users under a low file limit."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hybridmem import DataDirLockedError, Memory, Settings

WRITER = r"""
import sys
from hybridmem import Memory, Settings

data_dir, start = sys.argv[1], int(sys.argv[2])
with Memory(Settings(data_dir=data_dir, embedder="hash", extractor="rules")) as mem:
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


def _ids_in_sqlite(path: Path, sql: str) -> set[str]:
    if not path.exists():
        return set()
    with sqlite3.connect(path) as conn:
        return {row[0] for row in conn.execute(sql)}


def _all(mem: Memory, user: str) -> list[Any]:
    """Every memory of the user, superseded ones included, page by page."""
    items: list[Any] = []
    while page := mem.list(user, limit=1000, offset=len(items), include_superseded=True):
        items.extend(page)
    return items


def _agree(mem: Memory, data_dir: Path, user: str) -> None:
    """Every store holds exactly the memories the vector store holds."""
    items = _all(mem, user)
    ids = {i.id for i in items}
    assert mem.count(user) == len(ids)
    folder = next((data_dir / "users").iterdir())
    lexical = _ids_in_sqlite(folder / "lexical.sqlite3", "SELECT id FROM ids")
    assert lexical == ids
    added = _ids_in_sqlite(folder / "history.sqlite3",
                           "SELECT memory_id FROM events WHERE action = 'add'")
    deleted = _ids_in_sqlite(folder / "history.sqlite3",
                             "SELECT memory_id FROM events WHERE action = 'delete'")
    assert ids <= added and not ids & deleted
    in_graph = {m for e in mem.entities(user) for m in e.memory_ids}
    current = {i.id for i in items if i.is_current}
    assert in_graph <= current  # no provenance of a memory that is gone or superseded
    assert {i.id for i in items if "gadget" in i.text and i.is_current} <= in_graph
    assert not (folder / "pending.json").exists()


def test_a_writer_killed_at_random_loses_nothing_acknowledged(tmp_path: Path) -> None:
    rng = random.Random(20261130)
    data_dir = tmp_path / "hm"
    acknowledged: set[str] = set()
    forgotten: set[str] = set()
    for trial in range(10):
        errors = tmp_path / f"writer-{trial}.err"
        with errors.open("w") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-c", WRITER, str(data_dir), str(trial * 1000)],
                stdout=subprocess.PIPE, stderr=stderr, text=True,
            )
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the writer is up and has written once
        assert first, errors.read_text()
        time.sleep(rng.uniform(0.0, 1.5))
        proc.send_signal(signal.SIGKILL)
        # read through the same buffered reader as readline (communicate() would bypass it and
        # drop lines it already holds)
        rest = proc.stdout.read()
        proc.wait(timeout=60)
        for line in [first, *rest.splitlines()]:
            if line.startswith("forgetting "):
                forgotten.add(line.split()[1])
            elif line.strip():
                acknowledged.update(line.split())
        with Memory(Settings(data_dir=data_dir, embedder="hash", extractor="rules")) as mem:
            stored = {i.id for i in _all(mem, "crash-user")}
            assert acknowledged - forgotten <= stored, f"trial {trial} lost acknowledged writes"
            _agree(mem, data_dir, "crash-user")


HOLDER = r"""
import sys, time
from hybridmem import Memory, Settings
with Memory(Settings(data_dir=sys.argv[1], embedder="hash")) as mem:
    mem.add("u", "held")
    print("ready", flush=True)
    time.sleep(60)
"""


def test_a_second_process_on_an_embedded_dir_is_refused_by_name(tmp_path: Path) -> None:
    data_dir = tmp_path / "hm"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(data_dir)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        with pytest.raises(DataDirLockedError) as refused:
            Memory(Settings(data_dir=data_dir, embedder="hash"))
        message = str(refused.value)
        assert f"process {holder.pid}" in message
        assert "hybridmem serve" in message and "HYBRIDMEM_CHROMA_URL" in message
        cli = subprocess.run(
            [sys.executable, "-m", "hybridmem.cli", "search", "u", "held", "--data-dir",
             str(data_dir)],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "HYBRIDMEM_EMBEDDER": "hash"},
        )
        said = " ".join(cli.stderr.split())  # the terminal may wrap the line
        assert cli.returncode == 1 and f"in use by process {holder.pid}" in said
        assert "Traceback" not in cli.stderr
    finally:
        holder.kill()  # SIGKILL: the lock must die with it
        holder.wait(timeout=30)
    with Memory(Settings(data_dir=data_dir, embedder="hash")) as mem:
        assert [h.item.text for h in mem.search("u", "held")] == ["held"]


def test_the_same_process_may_open_a_dir_twice(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "hm", embedder="hash")
    with Memory(settings) as first, Memory(settings) as second:
        first.add("u", "one")
        assert second.count("u") == 1


MANY_USERS = r"""
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
from hybridmem import Memory, Settings
with Memory(Settings(data_dir=sys.argv[1], embedder="hash", max_open_users=32)) as mem:
    for n in range(int(sys.argv[2])):
        mem.add(f"user-{n}", f"I bought gadget {n}")
        if n % 100 == 0:
            assert mem.search(f"user-{n // 2}", "gadget")
    print(len(__import__("os").listdir("/proc/self/fd")), flush=True)
"""


def test_many_users_under_a_low_file_limit(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", MANY_USERS, str(tmp_path / "hm"), "1500"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) < 200  # open descriptors at the end, of 256 allowed
