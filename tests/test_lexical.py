"""The FTS5 lexical index: BM25 ranking, stemming, isolation, deletion, persistence, and the
SQLite base it shares with the history: transactions, locks, closed stores, corrupt files."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybridmem.runtime.files import user_dir
from hybridmem.sqlite.base import PerUserSqlite
from hybridmem.errors import (
    ClosedError,
    CorruptStateError,
    InvalidInputError,
    StorageError,
    StoreBusyError,
)
from hybridmem.sqlite.lexical import FILE_NAME, SqliteLexicalIndex
from hybridmem.protocols import LexicalIndex
from hybridmem.text import content_words


@pytest.fixture
def idx(tmp_path: Path) -> Iterator[SqliteLexicalIndex]:
    with SqliteLexicalIndex(tmp_path, timeout=0.05) as index:
        yield index


def test_bm25_ranks_rare_words_and_stems(idx: SqliteLexicalIndex) -> None:
    idx.add("u1", ["a", "b", "c"], [
        "I bought the monitor yesterday",
        "The monitor and the laptop and the mouse",
        "Shipping was delayed by the carrier",
    ])
    ids = [i for i, _ in idx.search("u1", "buying monitors?", limit=10)]
    assert ids[0] == "a" and set(ids) == {"a", "b"}
    assert idx.search("u1", "the and of", limit=10) == []  # only stopwords


def test_users_isolated_and_delete_and_reopen(tmp_path: Path) -> None:
    idx = SqliteLexicalIndex(tmp_path)
    idx.add("u1", ["a"], ["secret keyboard"])
    idx.add("u2", ["b"], ["keyboard for bob"])
    assert [i for i, _ in idx.search("u2", "keyboard", limit=5)] == ["b"]
    idx.delete("u2", ["b"])
    assert idx.search("u2", "keyboard", limit=5) == []
    idx.close()
    again = SqliteLexicalIndex(tmp_path)
    assert [i for i, _ in again.search("u1", "keyboard", limit=5)] == ["a"]
    again.drop_user("u1")
    assert again.search("u1", "keyboard", limit=5) == []
    again.close()


def test_quotes_and_operators_in_queries_are_safe(idx: SqliteLexicalIndex) -> None:
    idx.add("u", ["a"], ['He said "NEAR" AND OR NOT'])
    assert [i for i, _ in idx.search("u", 'said "near AND* (', limit=5)] == ["a"]
    assert content_words("The NEAR near, Near!") == ["near"]


def test_documents_and_queries_share_one_normaliser(idx: SqliteLexicalIndex) -> None:
    idx.add("u", ["a", "b", "c"], ["Moved to the Hauptstraße", "ＲＯＧ laptop", "Alice's phone"])
    assert [i for i, _ in idx.search("u", "hauptstrasse", limit=5)] == ["a"]
    assert [i for i, _ in idx.search("u", "Hauptstraße", limit=5)] == ["a"]
    assert [i for i, _ in idx.search("u", "rog", limit=5)] == ["b"]
    assert [i for i, _ in idx.search("u", "alice", limit=5)] == ["c"]


def test_replacing_a_text_and_refusing_bad_batches(idx: SqliteLexicalIndex) -> None:
    idx.add("u", ["a"], ["old keyboard"])
    idx.add("u", ["a"], ["new mouse"])
    assert idx.search("u", "keyboard", limit=5) == []
    assert [i for i, _ in idx.search("u", "mouse", limit=5)] == ["a"]
    with pytest.raises(InvalidInputError):
        idx.add("u", ["b", "c"], ["only one text"])
    with pytest.raises(InvalidInputError):
        idx.add("u", ["b", "b"], ["one", "two"])
    idx.delete("nobody", ["a"])  # no file: nothing to do, and no file is made
    assert not (user_dir(idx._data_dir, "nobody", create=False) / FILE_NAME).exists()


def test_is_a_lexical_index(idx: SqliteLexicalIndex) -> None:
    seam: LexicalIndex = idx  # mypy checks the signatures
    assert all(callable(getattr(seam, n)) for n in vars(LexicalIndex) if not n.startswith("_"))


def test_closed_index_refuses_use(tmp_path: Path) -> None:
    idx = SqliteLexicalIndex(tmp_path)
    idx.add("u", ["a"], ["keyboard"])
    idx.close()
    idx.close()  # idempotent
    for use in (
        lambda: idx.search("u", "keyboard", limit=5),
        lambda: idx.add("u", ["b"], ["mouse"]),
        lambda: idx.delete("u", ["a"]),
        lambda: idx.drop_user("u"),
    ):
        with pytest.raises(ClosedError, match="closed"):
            use()
    assert "closed" in repr(idx)


def test_commits_leave_an_empty_journal_and_no_deleted_text(idx: SqliteLexicalIndex) -> None:
    """The rollback journal is truncated at each commit (not created and unlinked each time):
    what it held of a transaction is gone once the transaction is, deleted text included."""
    idx.add("u", ["a", "b"], ["the QUOKKAPHONE order", "a keyboard"])
    idx.delete("u", ["a"])
    folder = user_dir(idx._data_dir, "u", create=False)
    journal = folder / (FILE_NAME + "-journal")
    assert journal.exists() and journal.stat().st_size == 0
    assert not any(b"quokkaphone" in p.read_bytes().lower() for p in folder.iterdir())
    assert [i for i, _ in idx.search("u", "keyboard", limit=5)] == ["b"]
    idx.drop_user("u")
    assert not journal.exists()


def _hold_exclusive_lock(idx: SqliteLexicalIndex, user_id: str) -> sqlite3.Connection:
    path = user_dir(idx._data_dir, user_id, create=False) / FILE_NAME
    other = sqlite3.connect(str(path), isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    return other


def test_a_locked_database_is_a_retryable_busy_error(idx: SqliteLexicalIndex) -> None:
    idx.add("u", ["a"], ["keyboard"])
    other = _hold_exclusive_lock(idx, "u")
    try:
        with pytest.raises(StoreBusyError, match="locked") as caught:
            idx.add("u", ["b"], ["mouse"])
        assert caught.value.retryable and caught.value.status_code == 503
        with pytest.raises(StoreBusyError):
            idx.search("u", "keyboard", limit=5)
        fresh = SqliteLexicalIndex(idx._data_dir, timeout=0.05)  # opening it is busy too
        with pytest.raises(StoreBusyError):
            fresh.search("u", "keyboard", limit=5)
        fresh.close()
    finally:
        other.rollback()
        other.close()
    idx.add("u", ["b"], ["mouse"])  # the same call succeeds once the lock is gone
    assert {i for i, _ in idx.search("u", "mouse keyboard", limit=5)} == {"a", "b"}


def test_a_file_that_is_not_a_database_is_corrupt_state(tmp_path: Path) -> None:
    path = user_dir(tmp_path, "u") / FILE_NAME
    path.write_bytes(b"this is not a database" * 100)
    with SqliteLexicalIndex(tmp_path) as idx, pytest.raises(CorruptStateError, match=str(path)):
        idx.search("u", "keyboard", limit=5)


class _Counter(PerUserSqlite):
    file_name = "counter.sqlite3"
    what = "counter"
    schema = ("CREATE TABLE IF NOT EXISTS n (k TEXT PRIMARY KEY, v INTEGER)",)


def test_a_failing_transaction_leaves_nothing_behind(tmp_path: Path) -> None:
    store = _Counter(tmp_path)
    store._write("u", "seed", lambda c: c.execute("INSERT INTO n VALUES ('a', 1)"))

    def half_then_sqlite_error(conn: sqlite3.Connection) -> None:
        conn.execute("UPDATE n SET v = 2 WHERE k = 'a'")
        conn.execute("INSERT INTO n VALUES ('b', 1)")
        conn.execute("INSERT INTO n VALUES ('a', 3)")  # primary key taken

    def half_then_bug(conn: sqlite3.Connection) -> None:
        conn.execute("UPDATE n SET v = 2 WHERE k = 'a'")
        raise KeyError("a bug in the caller")

    with pytest.raises(StorageError, match="could not add of 'u'") as caught:
        store._write("u", "add", half_then_sqlite_error)
    assert type(caught.value) is StorageError  # neither busy nor corrupt
    with pytest.raises(KeyError):  # not ours: it leaves as it is, after the rollback
        store._write("u", "add", half_then_bug)
    assert store._read("u", "read", "SELECT k, v FROM n") == [("a", 1)]
    store._write("u", "add", lambda c: c.execute("INSERT INTO n VALUES ('b', 5)"))  # usable
    assert store._read("u", "read", "SELECT k, v FROM n ORDER BY k") == [("a", 1), ("b", 5)]
    store.close()


def test_one_users_open_transaction_holds_up_no_other_user(idx: SqliteLexicalIndex) -> None:
    import threading

    idx.add("quick", ["q1"], ["a matte 4K monitor"])
    inside, release = threading.Event(), threading.Event()
    released: list[bool] = []  # whether the slow write was let go by us (not by its time-out)

    def slow(conn: sqlite3.Connection) -> None:  # stands for a long, fsync'd commit
        conn.execute("DELETE FROM ids WHERE 0")
        inside.set()
        released.append(release.wait(15))

    writer = threading.Thread(target=idx._write, args=("slow", "hold a transaction", slow))
    writer.start()
    try:
        assert inside.wait(30)
        # while "slow" is inside its transaction, another user reads and writes
        assert [m for m, _ in idx.search("quick", "monitor", limit=5)] == ["q1"]
        idx.add("quick", ["q2"], ["a ROG laptop"])
        assert [m for m, _ in idx.search("quick", "laptop", limit=5)] == ["q2"]
    finally:
        release.set()
        writer.join(30)
    assert released == [True]  # the slow write was still open all along


def test_many_users_keep_at_most_max_open_connections(tmp_path: Path) -> None:
    with SqliteLexicalIndex(tmp_path, max_open=3) as small:
        for n in range(10):
            small.add(f"user-{n}", [f"m{n}"], [f"memory number {n} about monitors"])
        assert len(small._conns) == 3
        assert [m for m, _ in small.search("user-0", "monitors", limit=5)] == ["m0"]  # reopened
        assert len(small._conns) == 3


def test_an_index_file_travels_whole_and_a_foreign_one_is_refused(tmp_path: Path) -> None:
    """dump() gives the user's file, load() takes it in another store (server mode ships it in
    a text snapshot): same answers, no deleted text in it. A file with anything the index does
    not make (here a trigger that would run on the next write) or no database at all is refused,
    and leaves the user with no index rather than a half-loaded one."""
    source = SqliteLexicalIndex(tmp_path / "a")
    source.add("u", ["m1", "m2", "m3"], ["the Dell monitor arm", "a zanzibar secret", "ROG laptop"])
    source.delete("u", ["m2"])
    image = source.dump("u")
    assert image is not None and b"zanzibar" not in image
    assert source.dump("nobody") is None
    target = SqliteLexicalIndex(tmp_path / "b")
    target.add("u", ["old"], ["text the loaded file replaces"])
    assert target.load("u", image)
    for query in ("monitor arm", "laptop", "zanzibar", "replaces"):
        assert target.search("u", query, limit=5) == source.search("u", query, limit=5)
    target.add("u", ["m4"], ["a second monitor"])  # the loaded file takes writes
    assert {i for i, _ in target.search("u", "monitor", limit=5)} == {"m1", "m4"}

    crafted = tmp_path / "crafted.sqlite3"
    conn = sqlite3.connect(crafted)
    for statement in SqliteLexicalIndex.schema:
        conn.execute(statement)
    conn.execute("CREATE TRIGGER t AFTER INSERT ON ids BEGIN DELETE FROM ids; END")
    conn.commit()
    conn.close()
    for foreign in (crafted.read_bytes(), b"not a database" * 100):
        assert not target.load("u", foreign)
        assert target.search("u", "monitor", limit=5) == []
        assert target.dump("u") is None
    source.close()
    target.close()
