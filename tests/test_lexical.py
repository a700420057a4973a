"""The FTS5 lexical index: BM25 ranking, stemming, isolation, deletion, persistence."""

from __future__ import annotations

from pathlib import Path

from hybridmem.lexical import SqliteLexicalIndex, content_words


def test_bm25_ranks_rare_words_and_stems(tmp_path: Path) -> None:
    idx = SqliteLexicalIndex(tmp_path)
    idx.add("u1", ["a", "b", "c"], [
        "I bought the monitor yesterday",
        "The monitor and the laptop and the mouse",
        "Shipping was delayed by the carrier",
    ])
    ids = [i for i, _ in idx.search("u1", "buying monitors?", limit=10)]
    assert ids[0] == "a" and set(ids) == {"a", "b"}
    assert idx.search("u1", "the and of", limit=10) == []  # only stopwords
    idx.close()


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


def test_quotes_and_operators_in_queries_are_safe(tmp_path: Path) -> None:
    idx = SqliteLexicalIndex(tmp_path)
    idx.add("u", ["a"], ['He said "NEAR" AND OR NOT'])
    assert [i for i, _ in idx.search("u", 'said "near AND* (', limit=5)] == ["a"]
    assert content_words("The NEAR near, Near!") == ["near"]
