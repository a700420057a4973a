"""Physical erasure, store by store, on real files: the lexical index, lock files, the history
of a memory whose text was replaced, and the purge of embedded Chroma's shared file (within the
purge delay, coalesced, on close, and at the next open after a kill). (The end-to-end property
test is in test_lifecycle.)"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hybridmem import Memory, Settings
from hybridmem.chroma.purge import MARKER, Compactor
from hybridmem.errors import StorageError
from hybridmem.runtime.files import LOCK_STRIPES, user_key, user_lock
from hybridmem.sqlite.lexical import SqliteLexicalIndex
from hybridmem.offline import HashEmbedder


def _holding(root: Path, needle: str) -> list[str]:
    return [str(p.relative_to(root)) for p in root.rglob("*")
            if p.is_file() and needle.lower().encode() in p.read_bytes().lower()]


def test_deleted_and_replaced_texts_leave_no_token_in_the_lexical_file(tmp_path: Path) -> None:
    with SqliteLexicalIndex(tmp_path) as index:
        index.add("u", [f"m{i}" for i in range(60)],
                  [f"note {i} about Qv{i:03d}x7 shipping" for i in range(60)])
        index.delete("u", ["m5"])
        index.add("u", ["m6"], ["note six rewritten"])
        assert index.search("u", "Qv005x7", limit=5) == []
        assert [i for i, _ in index.search("u", "Qv007x7", limit=5)] == ["m7"]
    assert _holding(tmp_path, "qv005x7") == []
    assert _holding(tmp_path, "qv006x7") == []
    assert len(_holding(tmp_path, "qv007x7")) == 1  # the scan sees what is live


def test_lock_files_are_fixed_stripes_named_after_no_user(tmp_path: Path) -> None:
    users = [f"user-{n}" for n in range(200)]
    paths = {u: Path(user_lock(tmp_path, u).lock_file) for u in users}
    assert paths["user-7"] == Path(user_lock(tmp_path, "user-7").lock_file)  # stable
    names = sorted(p.name for p in (tmp_path / "locks").iterdir())
    assert names == [f"stripe-{n:02d}.lock" for n in range(LOCK_STRIPES)]
    assert not [n for n in names for u in users if user_key(u)[2:12] in n or u in n]
    assert len(set(paths.values())) > 1  # users are spread over the stripes


def test_lock_files_named_after_users_by_an_older_version_are_removed(tmp_path: Path) -> None:
    legacy = tmp_path / "locks" / f"{user_key('gone-user')}.lock"
    legacy.parent.mkdir(parents=True)
    legacy.touch()
    user_lock(tmp_path, "someone")
    assert not legacy.exists()
    assert len(list((tmp_path / "locks").iterdir())) == LOCK_STRIPES


def test_update_of_a_text_scrubs_the_old_text_from_history_and_disk(tmp_path: Path) -> None:
    with Memory(Settings(data_dir=tmp_path / "hm"), embedder=HashEmbedder(64)) as mem:
        item = mem.add("u", "My door code is Qd4471x9.")
        mem.add("u", "I like green tea.")
        mem.update("u", item.id, text="My door code changed.")
        events = mem.history("u", item.id)
        assert [e.action for e in events] == ["add", "update"]
        assert all(e.text is None for e in events)
        assert mem.search("u", "door code")[0].item.text == "My door code changed."
    assert _holding(tmp_path, "qd4471x9") == []


def test_forgetting_erases_name_vectors_byte_for_byte(tmp_path: Path) -> None:
    """The topic signal's name vectors (hybridmem.graph.name_vectors) of a node only the forgotten memory
    named leave no byte behind: not its name, not its vector; forgetting the user removes the
    file. (A vector is not text: the test looks for its bytes.)"""
    import sqlite3

    from hybridmem.runtime.files import user_dir
    from hybridmem.graph.name_vectors import FILE_NAME

    data = tmp_path / "hm"
    with Memory(Settings(data_dir=data), embedder=HashEmbedder(64)) as mem:
        secret = mem.add("u", "I booked the Qorvathel Lodge for our trip.")
        mem.add("u", "I like green tea with Quentin.")
        path = user_dir(data, "u", create=False) / FILE_NAME
        with sqlite3.connect(path) as conn:
            rows = dict(conn.execute("SELECT key, vec FROM names").fetchall())
        assert "qorvathel lodge" in rows
        vector = rows["qorvathel lodge"]
        mem.forget("u", secret.id)
        with sqlite3.connect(path) as conn:
            left = {k for (k,) in conn.execute("SELECT key FROM names")}
        assert "qorvathel lodge" not in left and left
        mem.purge_now()  # Chroma's shared file: else within purge_delay (tested below)
        assert _holding(tmp_path, "qorvathel") == []
        assert [p for p in tmp_path.rglob("*") if p.is_file() and vector in p.read_bytes()] == []
        mem.forget("u")
        assert not path.exists()


# -- the purge of embedded Chroma's shared file: deferred, coalesced, durable ----------------------
def _wait_purged(mem: Memory, user_id: str, within: float = 60.0) -> float:
    """Seconds until no erasure awaits its purge (fails after ``within``)."""
    start = time.monotonic()
    while mem.stats(user_id).purge_pending:
        assert time.monotonic() - start < within, "the purge never ran"
        time.sleep(0.02)
    return time.monotonic() - start


def test_a_forgotten_text_leaves_every_file_within_the_purge_delay(tmp_path: Path) -> None:
    data = tmp_path / "hm"
    with Memory(Settings(data_dir=data, purge_delay=0.3), embedder=HashEmbedder(64)) as mem:
        compactor = mem._stores.vectors._compactor  # type: ignore[attr-defined]  # white-box
        purge, looked = compactor._purge, threading.Event()

        def after_a_look() -> None:  # the purge, held until the test has looked at the files
            looked.wait(60)
            purge()

        compactor._purge = after_a_look
        secret = mem.add("u", "My safe code is Qx5512k3.")
        mem.add("u", "I like green tea.")
        mem.forget("u", secret.id)
        assert mem.stats("u").purge_pending and (data / "chroma" / MARKER).exists()
        assert _holding(tmp_path, "qx5512k3") == ["hm/chroma/chroma.sqlite3"]  # not yet
        looked.set()
        _wait_purged(mem, "u")
        assert _holding(tmp_path, "qx5512k3") == []  # while the Memory stays open
        assert not (data / "chroma" / MARKER).exists()
        assert [h.item.text for h in mem.search("u", "tea")] == ["I like green tea."]


def test_close_purges_what_is_pending(tmp_path: Path) -> None:
    data = tmp_path / "hm"
    with Memory(Settings(data_dir=data, purge_delay=3600), embedder=HashEmbedder(64)) as mem:
        secret = mem.add("u", "My safe code is Qx7781k3.")
        mem.update("u", mem.add("u", "My bike lock is Qb4410k3.").id, text="My bike lock changed.")
        mem.add("v", "Order Qz9001k3 arrived.")
        mem.forget("u", secret.id)
        mem.forget("v")
        assert mem.stats("u").purge_pending
        assert _holding(tmp_path, "qx7781k3") and _holding(tmp_path, "qb4410k3")
    for needle in ("qx7781k3", "qb4410k3", "qz9001k3"):
        assert _holding(tmp_path, needle) == [], needle
    assert not (data / "chroma" / MARKER).exists()


def test_purge_now_is_physical_before_it_returns(tmp_path: Path) -> None:
    with Memory(Settings(data_dir=tmp_path / "hm", purge_delay=3600),
                embedder=HashEmbedder(64)) as mem:
        mem.forget("u", mem.add("u", "My safe code is Qx3310k3.").id)
        assert _holding(tmp_path, "qx3310k3")
        mem.purge_now()
        assert _holding(tmp_path, "qx3310k3") == [] and not mem.stats("u").purge_pending


def test_pruned_texts_leave_every_file(tmp_path: Path) -> None:
    """prune() erases like forget(): the expired and the idle memory's texts and the entity only
    they named leave every file of the data dir (vectors, lexical index, graph, history)."""
    from datetime import datetime, timedelta, timezone

    now = datetime.now(timezone.utc)
    with Memory(Settings(data_dir=tmp_path / "hm", purge_delay=3600, extractor="rules"),
                embedder=HashEmbedder(64)) as mem:
        expired = mem.add("u", "My voucher Qe6620k3 for the Zorblax hotel.",
                          expires_at=now - timedelta(days=1))
        idle = mem.add("u", "I once asked about the Qi4471k3 Quuxbar blender.", importance=0.05,
                       created_at=now - timedelta(days=400))
        kept = mem.add("u", "I like green tea.")
        assert _holding(tmp_path, "qe6620k3") and _holding(tmp_path, "quuxbar")
        gone = mem.prune("u", dry_run=False)
        assert sorted(i.id for i in gone) == sorted([expired.id, idle.id])
        mem.purge_now()
        for needle in ("qe6620k3", "zorblax", "qi4471k3", "quuxbar"):
            assert _holding(tmp_path, needle) == [], needle
        assert [e.action for e in mem.history("u", expired.id)] == ["add", "expire"]
        assert [e.action for e in mem.history("u", idle.id)] == ["add", "delete"]
        assert [i.id for i in mem.list("u")] == [kept.id]


KILLED_AFTER_FORGET = r"""
import sys, threading
from hybridmem import Memory, Settings
with Memory(Settings(data_dir=sys.argv[1], embedder="hash", purge_delay=3600)) as mem:
    secret = mem.add("u", "My safe code is Qk8086k3.")
    mem.add("u", "I like green tea.")
    mem.forget("u", secret.id)
    print("forgotten", flush=True)
    threading.Event().wait()  # until the test kills it
"""


def test_a_process_killed_after_forget_is_purged_at_the_next_open(tmp_path: Path) -> None:
    data = tmp_path / "hm"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_AFTER_FORGET, str(data)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "forgotten"
    finally:
        proc.send_signal(signal.SIGKILL)  # before the purge: the delay is an hour
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert _holding(tmp_path, "qk8086k3") == ["hm/chroma/chroma.sqlite3"]  # the kill left it
    assert (data / "chroma" / MARKER).exists()
    with Memory(Settings(data_dir=data, embedder="hash")) as mem:
        assert _holding(tmp_path, "qk8086k3") == []  # purged by the open itself
        assert not (data / "chroma" / MARKER).exists() and not mem.stats("u").purge_pending
        assert [i.text for i in mem.list("u")] == ["I like green tea."]


class FrozenClock:
    """``time.monotonic`` of hybridmem.chroma.purge, moved only by the test: a purge comes due
    when the test says so, however fast or slow the machine runs the rest."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from hybridmem.chroma import purge

        self.now = 1000.0
        monkeypatch.setattr(purge, "time", self)

    def monotonic(self) -> float:
        return self.now


def _wait_done(compactor: Compactor) -> None:
    deadline = time.monotonic() + 60  # only a hang reaches it
    while compactor.pending:
        assert time.monotonic() < deadline, "the purge never ran"
        time.sleep(0.01)


def test_erasures_within_the_delay_coalesce_into_one_purge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FrozenClock(monkeypatch)
    runs: list[float] = []
    compactor = Compactor(lambda: runs.append(clock.now), delay=0.3, marker=tmp_path / MARKER)
    try:
        for _ in range(20):
            compactor.request()
        assert compactor.pending and (tmp_path / MARKER).exists() and runs == []
        clock.now += 0.3  # the delay after the first erasure is over: the thread's next look
        _wait_done(compactor)
        assert runs == [1000.3]  # one purge for the twenty, at the end of the delay
        assert not (tmp_path / MARKER).exists()
    finally:
        compactor.close()


def test_an_erasure_during_a_purge_gets_a_purge_of_its_own(tmp_path: Path) -> None:
    started, release = threading.Event(), threading.Event()
    runs: list[int] = []

    def slow() -> None:
        runs.append(len(runs))
        if len(runs) == 1:
            started.set()
            release.wait(60)

    compactor = Compactor(slow, delay=0.05, marker=tmp_path / MARKER)
    try:
        compactor.request()
        assert started.wait(60)
        compactor.request()  # ends while the first purge runs: that one may not cover it
        release.set()
        _wait_done(compactor)
        assert len(runs) == 2
    finally:
        compactor.close()


def test_the_compactor_never_runs_after_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FrozenClock(monkeypatch)
    runs: list[int] = []
    compactor = Compactor(lambda: runs.append(1), delay=0.2, marker=tmp_path / MARKER)
    compactor.request()
    compactor.close()
    clock.now += 3600  # long due; close() stopped the thread
    compactor.request()  # and an erasure after close() starts none
    assert runs == [] and compactor.pending  # the owner runs what is owed itself
    compactor.run()
    assert runs == [1] and not compactor.pending and not (tmp_path / MARKER).exists()


def test_a_failed_purge_stays_owed_and_is_retried(tmp_path: Path) -> None:
    calls: list[int] = []

    def flaky() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise StorageError("disk full")

    compactor = Compactor(flaky, delay=0.05, marker=tmp_path / MARKER)
    try:
        compactor.request()
        _wait_done(compactor)
        assert len(calls) == 2
    finally:
        compactor.close()


def test_two_memories_on_one_dir_purge_inside_the_call(tmp_path: Path) -> None:
    """A second Memory of this process on the same dir makes Chroma calls a background purge of
    the first would not wait for: then each erasure purges before it returns."""
    settings = Settings(data_dir=tmp_path / "hm", purge_delay=3600)
    with Memory(settings, embedder=HashEmbedder(64)) as first, \
            Memory(settings, embedder=HashEmbedder(64)) as second:
        first.forget("u", first.add("u", "My safe code is Qt5150k3.").id)
        assert _holding(tmp_path, "qt5150k3") == [] and not second.stats("u").purge_pending
