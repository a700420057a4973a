"""HistoryStore: the per-user audit log (order, idempotent imports, scrubbing, lifecycle)."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import pytest

from hybridmem.runtime.files import user_dir
from hybridmem.errors import ClosedError, StoreBusyError
from hybridmem.sqlite.history import FILE_NAME, HistoryStore
from hybridmem.models import HistoryEvent
from hybridmem.protocols import HistoryLog

AT = datetime(2024, 3, 3, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def history(tmp_path: Path) -> Iterator[HistoryStore]:
    with HistoryStore(tmp_path, timeout=0.05) as store:
        yield store


def event(
    memory_id: str,
    action: Literal["add", "update"] = "add",
    text: str = "bought a ROG laptop",
    *,
    cause: str = "",
    detail: dict[str, Any] | None = None,
) -> HistoryEvent:
    return HistoryEvent(
        memory_id=memory_id, action=action, at=AT, text=text, cause=cause, detail=detail or {}
    )


def test_is_a_history_log(history: HistoryStore) -> None:
    seam: HistoryLog = history  # mypy checks the signatures
    assert all(callable(getattr(seam, n)) for n in vars(HistoryLog) if not n.startswith("_"))


def test_events_come_back_oldest_first_and_survive_a_reopen(tmp_path: Path) -> None:
    first = HistoryStore(tmp_path)
    e1, e2 = event("m1", detail={"why": "new"}), event("m2", cause="import")
    e3 = event("m1", action="update", text="bought a ROG laptop and a mouse")
    first.record("u", [e1, e2])
    first.record("u", [e3])
    first.close()
    with HistoryStore(tmp_path) as again:
        assert again.list("u") == [e1, e2, e3]
        assert again.list("u", "m1") == [e1, e3]
        assert again.list("u", "unknown") == [] and again.list("nobody") == []


def test_recording_an_event_twice_keeps_one(history: HistoryStore) -> None:
    e1 = event("m1")
    history.record("u", [e1])
    history.record("u", [e1, event("m2")])
    assert [e.memory_id for e in history.list("u")] == ["m1", "m2"]
    history.record("u", [])  # nothing to do


def test_scrub_removes_the_texts_of_deleted_memories(history: HistoryStore) -> None:
    history.record("u", [event("m1", detail={"old": "secret"}), event("m2")])
    history.scrub("u", ["m1"])
    m1, m2 = history.list("u")
    assert (m1.text, m1.detail, m1.action) == (None, {}, "add")  # the event stays, the words go
    assert m2.text == "bought a ROG laptop"
    history.scrub("nobody", ["m1"])  # no file: nothing to do, and no file is made
    assert not (user_dir(history._data_dir, "nobody", create=False) / FILE_NAME).exists()


def test_users_are_isolated_and_dropped_alone(history: HistoryStore) -> None:
    history.record("alice", [event("a1")])
    history.record("bob", [event("b1")])
    history.drop_user("alice")
    assert history.list("alice") == []
    assert [e.memory_id for e in history.list("bob")] == ["b1"]


def test_closed_history_refuses_use(history: HistoryStore) -> None:
    history.record("u", [event("m1")])
    history.close()
    history.close()
    with pytest.raises(ClosedError):
        history.list("u")
    with pytest.raises(ClosedError):
        history.record("u", [event("m2")])
    with pytest.raises(ClosedError):
        history.scrub("u", ["m1"])


def test_a_locked_history_is_busy_and_a_failed_write_leaves_nothing(history: HistoryStore) -> None:
    history.record("u", [event("m1")])
    path = user_dir(history._data_dir, "u", create=False) / FILE_NAME
    other = sqlite3.connect(str(path), isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreBusyError):
            history.scrub("u", ["m1"])
        with pytest.raises(StoreBusyError):
            history.record("u", [event("m2")])
    finally:
        other.rollback()
        other.close()
    assert [(e.memory_id, e.text) for e in history.list("u")] == [("m1", "bought a ROG laptop")]


# -- server mode: the history in the Chroma server (hybridmem.replica.history) ---------------------

def test_the_shared_history_is_one_log_for_every_client(chroma_server: str,
                                                        unique_user: str) -> None:
    from hybridmem.chroma import client as _chroma
    from hybridmem.replica.history import ChromaHistoryLog

    a = ChromaHistoryLog(_chroma.make_client(url=chroma_server))
    b = ChromaHistoryLog(_chroma.make_client(url=chroma_server))
    seam: HistoryLog = a
    assert seam.list(unique_user) == []  # no collection yet
    e1, e2 = event("m1", detail={"why": "new"}), event("m2", cause="import")
    e3 = event("m1", action="update", text="bought a ROG laptop and a mouse")
    a.record(unique_user, [e1, e2])
    b.record(unique_user, [e3, e1])  # e1 again: kept once
    assert a.list(unique_user) == b.list(unique_user) == [e1, e2, e3]  # in recording order
    assert b.list(unique_user, "m1") == [e1, e3]
    b.scrub(unique_user, ["m1"])
    scrubbed = a.list(unique_user, "m1")
    assert [e.id for e in scrubbed] == [e1.id, e3.id]
    assert all(e.text is None and e.detail == {} for e in scrubbed)
    assert a.list(unique_user, "m2") == [e2]  # other memories keep their texts
    a.drop_user(unique_user)
    assert b.list(unique_user) == []
    a.close(), b.close()


def test_the_shared_history_keeps_events_in_metadata_and_reads_the_earlier_layout(
    chroma_server: str, unique_user: str
) -> None:
    """Events are metadata values (Chroma full-text-indexes documents; nobody searches events).
    Records of the earlier layout, the event JSON as the document, list alike, and a scrub
    leaves no text in either place."""
    from hybridmem.chroma import client as _chroma
    from hybridmem.replica.history import ChromaHistoryLog

    client = _chroma.make_client(url=chroma_server)
    log = ChromaHistoryLog(client)
    new, kept = event("m1", text="bought a ROG laptop"), event("m2", text="likes tea")
    log.record(unique_user, [new, kept])
    side = client.get_collection(_chroma.collection_name(unique_user, "history"))
    got = side.get(ids=[new.id], include=["documents", "metadatas"])
    assert got["documents"] == [None]
    assert HistoryEvent.model_validate_json(got["metadatas"][0]["event"]) == new
    old = event("m1", action="update", text="bought a ROG laptop and a mouse")
    side.add(ids=[old.id], documents=[old.model_dump_json()], embeddings=[[1.0]],
             metadatas=[{"memory_id": "m1", "seq": time.time_ns()}])
    assert log.list(unique_user) == [new, kept, old]
    assert log.list(unique_user, "m1") == [new, old]

    log.scrub(unique_user, ["m1"])
    assert [(e.id, e.text, e.detail) for e in log.list(unique_user, "m1")] == [
        (new.id, None, {}), (old.id, None, {})]
    assert log.list(unique_user, "m2") == [kept]
    raw = side.get(where={"memory_id": "m1"}, include=["documents", "metadatas"])
    stored = json.dumps([raw["documents"], raw["metadatas"]])
    assert len(raw["ids"]) == 2 and "ROG" not in stored and "mouse" not in stored
    log.drop_user(unique_user)
    log.close()
