"""The in-memory copy of a user's lexical index (hybridmem.sqlite.bm25) answers exactly as FTS5 does:
same ids, same order (ties in rowid order), same scores, through adds, replacements and deletes;
and it is dropped when it could be wrong (another connection wrote the file, the user's
connection was closed, the user was dropped)."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridmem.sqlite.bm25 import Tokenizer
from hybridmem.runtime.files import user_dir, user_key
from hybridmem.sqlite.lexical import FILE_NAME, SqliteLexicalIndex

# stems that meet ("run"/"running"/"runs"), folded letters ("Café"/"cafe"), numbers, and a word
# FTS5 splits in two ("wi_fi"), so that phrases go to FTS5
WORDS = ["run", "running", "runs", "Café", "cafe", "monitor", "monitors", "laptop", "blue",
         "42", "order", "wi_fi", "desk", "lamp"]

texts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=7).map(" ".join)
batches = st.lists(st.tuples(st.integers(0, 11), texts), min_size=1, max_size=6)
queries = st.lists(st.lists(st.sampled_from(WORDS), min_size=1, max_size=4).map(" ".join),
                   min_size=1, max_size=4)


def _apply(idx: SqliteLexicalIndex, batch: Sequence[tuple[int, str]], drop: Sequence[int]) -> None:
    unique = dict(batch)  # one text per id within a batch
    idx.add("u", [f"m{i}" for i in unique], list(unique.values()))
    idx.delete("u", [f"m{i}" for i in drop])


def _copy_built(idx: SqliteLexicalIndex) -> bool:
    return user_key("u") in idx._copies


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=batches, later=st.lists(st.tuples(batches, st.lists(st.integers(0, 11))),
                                     max_size=4), asked=queries, limit=st.integers(1, 8))
def test_copy_answers_as_fts5(
    first: list[tuple[int, str]], later: list[tuple[list[tuple[int, str]], list[int]]],
    asked: list[str], limit: int,
) -> None:
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b, \
            SqliteLexicalIndex(a, build_seconds_per_row=0) as mine, \
            SqliteLexicalIndex(b, in_memory=False) as fts5:
        for idx in (mine, fts5):
            _apply(idx, first, [])
        mine.search("u", "run", limit=1)
        mine.search("u", "run", limit=1)  # the second search builds the copy
        assert _copy_built(mine)
        for batch, drop in later:  # kept current by the writes
            for idx in (mine, fts5):
                _apply(idx, batch, drop)
            for q in asked:
                assert mine.search("u", q, limit=limit) == fts5.search("u", q, limit=limit)
        for q in asked:
            assert mine.search("u", q, limit=limit) == fts5.search("u", q, limit=limit)
        assert not fts5._copies


def test_ties_come_in_rowid_order_and_scores_are_fts5s(tmp_path: Path) -> None:
    with SqliteLexicalIndex(tmp_path / "a", build_seconds_per_row=0) as mine, \
            SqliteLexicalIndex(tmp_path / "b", in_memory=False) as fts5:
        for idx in (mine, fts5):  # twenty equal rows: the cut at the limit is decided by rowid
            idx.add("u", [f"t{n:02d}" for n in range(20)], ["blue desk lamp"] * 20)
            idx.add("u", ["x"], ["a blue laptop"])
            idx.delete("u", ["t03"])
        for _ in range(2):
            mine.search("u", "lamp", limit=1)
        assert _copy_built(mine)
        got = mine.search("u", "blue lamps", limit=7)
        assert got == fts5.search("u", "blue lamps", limit=7)
        assert [i for i, _ in got] == ["t00", "t01", "t02", "t04", "t05", "t06", "t07"]


def test_another_writer_or_a_closed_connection_drops_the_copy(tmp_path: Path) -> None:
    with SqliteLexicalIndex(tmp_path, max_open=1, build_seconds_per_row=0) as idx:
        idx.add("u", ["a", "b"], ["blue monitor", "red laptop"])
        for _ in range(2):
            idx.search("u", "monitor", limit=5)
        assert _copy_built(idx)
        # another connection (another process, a restore) changes the file behind the copy
        other = SqliteLexicalIndex(tmp_path, in_memory=False)
        other.add("u", ["c"], ["green monitor"])
        other.close()
        assert sorted(i for i, _ in idx.search("u", "monitor", limit=5)) == ["a", "c"]
        assert not _copy_built(idx)  # dropped, FTS5 answered
        for _ in range(2):
            idx.search("u", "monitor", limit=5)
        assert _copy_built(idx)
        idx.add("v", ["z"], ["monitor"])  # max_open=1: u's connection closes, its copy goes
        assert not _copy_built(idx)
        assert [i for i, _ in idx.search("u", "green", limit=5)] == ["c"]
        idx.drop_user("v")
        assert not (user_dir(tmp_path, "v", create=False) / FILE_NAME).exists()


def test_tokenizer_is_fts5s() -> None:
    tok = Tokenizer()
    try:
        assert tok.tokens(["Running CAFÉS", "wi_fi", ""]) == [["run", "cafe"], ["wi", "fi"], []]
    finally:
        tok.close()


def test_the_copy_is_built_only_once_fts5_has_spent_what_it_costs(tmp_path: Path) -> None:
    """Ski rental: a user searched rarely never pays for a copy (here its assumed cost is
    absurdly high); the first search is always FTS5's, so a one-shot process never builds."""
    with SqliteLexicalIndex(tmp_path / "dear", build_seconds_per_row=1e6) as dear, \
            SqliteLexicalIndex(tmp_path / "free", build_seconds_per_row=0) as free:
        for idx in (dear, free):
            idx.add("u", ["a", "b"], ["blue monitor", "red laptop"])
            assert idx.search("u", "monitor", limit=5) == idx.search("u", "monitor", limit=5)
        assert _copy_built(free)
        for _ in range(20):
            assert [i for i, _ in dear.search("u", "laptop", limit=5)] == ["b"]
        assert not _copy_built(dear)
    with SqliteLexicalIndex(tmp_path / "once", build_seconds_per_row=0) as once:
        once.add("u", ["a"], ["blue monitor"])
        once.search("u", "monitor", limit=5)
        assert not _copy_built(once)
