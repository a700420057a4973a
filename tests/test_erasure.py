"""Physical erasure, store by store, on real files: the lexical index, lock files, and the history
of a memory whose text was replaced. (The end-to-end property test is in test_lifecycle.)"""

from __future__ import annotations

from pathlib import Path

from hybridmem import Memory, Settings
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
        assert _holding(tmp_path, "qorvathel") == []
        assert [p for p in tmp_path.rglob("*") if p.is_file() and vector in p.read_bytes()] == []
        mem.forget("u")
        assert not path.exists()
