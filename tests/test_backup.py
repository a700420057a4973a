"""Backups: a snapshot restored into a fresh store gives back every user's export; snapshots
taken during writes are never torn; rotation keeps the newest N; damage is refused."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hybridmem import InvalidInputError, Memory, NotFoundError, Settings
from hybridmem.offline import HashEmbedder

USERS = ("client_123", "alice", "bob")


def _fill(mem: Memory) -> None:
    mem.add_many("client_123", ["I bought an ASUS ROG laptop.", "I prefer wireless mice."])
    mem.add("client_123", "I prefer wired mice now.", category="preference")
    mem.remember("client_123", "plan", "silver")
    mem.remember("client_123", "plan", "gold")
    mem.add("alice", "I live in Lyon.")
    mem.add("alice", "I moved to Berlin, I live in Berlin now.")
    mem.add("bob", "To reset the router: hold reset for 10 s.", kind="procedure")
    mem.add_messages("bob", [{"role": "user", "content": "My dock arrived."}])


def _comparable(bundle: dict[str, Any]) -> dict[str, Any]:
    """An export without what a restore changes by design: the export time, the history's own
    'import' events, the order of graph nodes and edges, and — the server's graph store rebuilds
    an imported graph from its records — when each entity was first and last seen."""
    graph = bundle["graph"]["graph"]
    nodes = sorted(({k: v for k, v in n.items() if k not in ("first_seen", "last_seen")}
                    for n in graph["nodes"]), key=lambda n: str(n["id"]))
    edges = sorted(graph["edges"], key=lambda e: json.dumps(e, sort_keys=True))
    return {**{k: v for k, v in bundle.items() if k not in ("exported_at", "graph")},
            "nodes": nodes, "edges": edges,
            "history": [e for e in bundle["history"] if e["action"] != "import"]}


def test_restore_gives_back_every_users_export(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    embedder = HashEmbedder()
    with Memory(make_settings(), embedder=embedder) as mem:
        _fill(mem)
        before = {u: _comparable(mem.export(u)) for u in USERS}
        snapshot = mem.backup(tmp_path / "backups")
        manifest = json.loads((snapshot / "manifest.json").read_text())
        assert sorted(u["user_id"] for u in manifest["users"]) == sorted(USERS)
        if mem.settings.chroma_url:  # one server: the "fresh store" is the same server, emptied
            for user in USERS:
                mem.forget(user)
    with Memory(make_settings("fresh"), embedder=embedder) as fresh:
        assert fresh.restore(tmp_path / "backups") == sum(
            len(b["memories"]) for b in before.values())
        assert {u: _comparable(fresh.export(u)) for u in USERS} == before
        assert fresh.facts("client_123")[0].text == "plan: gold"
        with pytest.raises(InvalidInputError, match="replace=True"):
            fresh.restore(snapshot)
        fresh.add("alice", "A memory made after the snapshot.")
        assert fresh.restore(snapshot, user_id="alice", replace=True) == 2
        assert _comparable(fresh.export("alice")) == before["alice"]
        with pytest.raises(NotFoundError):
            fresh.restore(snapshot, user_id="nobody")


def test_a_backup_during_writes_is_never_torn(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    """A writer adds numbered memories while backups run; each snapshot of the user holds exactly
    the first k of them (writes are sequential), and restores whole."""
    embedder = HashEmbedder()
    stop = threading.Event()
    written: list[int] = []

    with Memory(make_settings(backup_keep=3), embedder=embedder) as mem:
        mem.add("writer", "memory number 0")
        written.append(0)

        def write() -> None:
            n = 1
            while not stop.is_set():
                mem.add("writer", f"memory number {n}", infer=n % 2 == 0)
                written.append(n)
                n += 1

        thread = threading.Thread(target=write)
        thread.start()
        try:
            snaps = [mem.backup(tmp_path / "b") for _ in range(4)]
        finally:
            stop.set()
            thread.join()
    assert len({s.name for s in snaps}) == 4
    kept = sorted(p.name for p in (tmp_path / "b").iterdir())
    assert kept == sorted(s.name for s in snaps[1:])  # rotation: the newest 3
    for snap in snaps[1:]:
        manifest = json.loads((snap / "manifest.json").read_text())
        (entry,) = manifest["users"]
        bundle = json.loads((snap / entry["file"]).read_text())
        numbers = sorted(int(m["text"].rsplit(" ", 1)[1]) for m in bundle["memories"])
        assert numbers == list(range(len(numbers))) and entry["memories"] == len(numbers)
    with Memory(Settings(data_dir=tmp_path / "restored"), embedder=embedder) as fresh:
        assert fresh.restore(snaps[-1]) == len(numbers)


def test_a_damaged_snapshot_is_refused_before_anything_is_restored(tmp_path: Path) -> None:
    embedder = HashEmbedder()
    with Memory(Settings(data_dir=tmp_path / "a"), embedder=embedder) as mem:
        _fill(mem)
        snap = mem.backup(tmp_path / "b")
    victim = sorted((snap / "users").iterdir())[-1]
    victim.write_bytes(victim.read_bytes() + b" ")  # still JSON, but not what was written
    with Memory(Settings(data_dir=tmp_path / "c"), embedder=embedder) as fresh:
        with pytest.raises(InvalidInputError, match="checksum"):
            fresh.restore(snap)
        assert all(fresh.count(u) == 0 for u in USERS)
        with pytest.raises(NotFoundError, match="no hybridmem snapshot"):
            fresh.restore(tmp_path / "c")
