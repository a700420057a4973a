"""Re-embedding: from the hash embedder to the local one and back, resumed after a real process
was killed midway; the collection's recorded embedder follows."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hybridmem import EmbedderMismatchError, Memory, Settings
from hybridmem.offline import HashEmbedder, LocalEmbedder

ROOT = Path(__file__).resolve().parent.parent
MEMORIES = 700  # more than five pages of hybridmem.chroma.reembed.PAGE

# Re-embeds every user with the local embedder, printing each page as it is done; the test
# kills it after the first page.
WORKER = r"""
import sys
from hybridmem import Memory, Settings
data_dir = sys.argv[1]
with Memory(Settings(data_dir=data_dir, embedder="local", extractor="rules")) as mem:
    def report(user, done, total):
        print(f"page {user} {done}/{total}", flush=True)
    mem.reembed(progress=report)
print("finished", flush=True)
"""


def _texts(n: int) -> list[str]:
    return [f"Order {i}: a {colour} {thing} shipped to {city}."
            for i, (colour, thing, city) in enumerate(
                (c, t, p) for c in ("red", "blue", "green", "black", "white")
                for t in ("kettle", "laptop", "bike", "lamp", "chair", "phone", "desk")
                for p in ("Lyon", "Berlin", "Oslo", "Porto"))][:n] + [
        f"Note {i}: nothing special happened on day {i}." for i in range(max(0, n - 140))]


def test_hash_to_local_resumes_after_a_kill_and_back(tmp_path: Path, embedder: LocalEmbedder) -> None:
    data_dir = tmp_path / "hm"
    with Memory(Settings(data_dir=data_dir, extractor="rules"), embedder=HashEmbedder()) as mem:
        mem.add_many("alice", _texts(MEMORIES), infer=False)
        mem.add("bob", "I live in Lyon.")
        mem.remember("bob", "plan", "gold")
    with Memory(Settings(data_dir=data_dir, extractor="rules"), embedder=embedder) as mem:
        with pytest.raises(EmbedderMismatchError):
            mem.search("alice", "blue kettle")

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", WORKER, str(data_dir)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("page alice ") or first.startswith("page bob "), (
            first, proc.stderr.read() if proc.stderr else "")
        os.kill(proc.pid, signal.SIGKILL)  # mid-way: at most a page or two is done
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL

    pages: list[tuple[str, int, int]] = []
    with Memory(Settings(data_dir=data_dir, extractor="rules"), embedder=embedder) as mem:
        done = mem.reembed(progress=lambda u, d, t: pages.append((u, d, t)))
        assert 0 < done < MEMORIES + 2  # resumed: what the killed run wrote is not redone
        assert {u for u, _, _ in pages} <= {"alice", "bob"}
        assert mem.count("alice") == MEMORIES and mem.count("bob") == 2
        hits = mem.search("alice", "a blue kettle went to Oslo", limit=3)
        assert "blue kettle shipped to Oslo" in hits[0].item.text
        assert mem.facts("bob")[0].text == "plan: gold"
        assert mem.reembed() == 0  # nothing left to move
        mem.add("alice", "A memory added under the new embedder.")

    with Memory(Settings(data_dir=data_dir, extractor="rules"), embedder=HashEmbedder()) as mem:
        with pytest.raises(EmbedderMismatchError):
            mem.count("alice")
        assert mem.reembed("alice") == MEMORIES + 1
        assert "kettle" in mem.search("alice", "blue kettle Oslo", limit=1)[0].item.text
        with pytest.raises(EmbedderMismatchError):  # bob was not asked for
            mem.search("bob", "plan")


def test_reembed_on_a_chroma_server(make_settings: Callable[..., Settings],
                                    embedder: LocalEmbedder, unique_user: str) -> None:
    with Memory(make_settings(), embedder=HashEmbedder()) as mem:
        mem.add_many(unique_user, ["I bought a ROG laptop.", "My cat is called Miso."])
        mem.add(unique_user, "I live in Lyon.")
        mem.add(unique_user, "I live in Berlin.")  # Lyon is superseded: the archive collection
        assert [i.text for i in mem.list(unique_user, include_superseded=True)
                if not i.is_current] == ["I live in Lyon."]
    with Memory(make_settings(), embedder=embedder) as mem:
        assert mem.reembed(unique_user) == 4  # the archived memory moves too
        assert mem.search(unique_user, "which computer do I own?", limit=1)[0].item.text == (
            "I bought a ROG laptop.")
        old = mem.search(unique_user, "where did I live before?", include_superseded=True)
        assert "I live in Lyon." in [h.item.text for h in old]
        assert mem.reembed(unique_user) == 0
