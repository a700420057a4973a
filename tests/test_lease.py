"""The per-user write lease through a real `chroma run` (hybridmem.replica.lease): one holder at a
time across clients, a dead holder's lease taken over after it expires with its journal, a holder
that lost its lease refused, and mutual exclusion under a real race."""

from __future__ import annotations

import base64
import threading
import zlib

import pytest

from hybridmem.chroma import client as _chroma
from hybridmem.replica.lease import ChromaLeases
from hybridmem.runtime.locks import WriteLocks
from hybridmem.errors import CorruptStateError, StorageError, StoreBusyError


def leases(url: str, ttl: float = 30.0) -> ChromaLeases:
    return ChromaLeases(_chroma.make_client(url=url), ttl=ttl, poll=0.01)


def test_one_holder_at_a_time(chroma_server: str, unique_user: str) -> None:
    a, b = leases(chroma_server), leases(chroma_server)
    held = a.acquire(unique_user)
    assert held.orphan is None
    with pytest.raises(StoreBusyError, match="another process is writing"):
        b.acquire(unique_user, timeout=0.3)
    a.release(held)
    mine = b.acquire(unique_user, timeout=5)
    assert mine.slot == held.slot + 1 and mine.foreign  # a held it last: b must catch up
    b.release(mine)
    again = b.acquire(unique_user, timeout=5)
    assert not again.foreign  # b itself held it last
    b.release(again)


def test_a_dead_holders_journal_is_handed_over_and_it_is_refused(
    chroma_server: str, unique_user: str
) -> None:
    dead, next_ = leases(chroma_server, ttl=0.5), leases(chroma_server, ttl=0.5)
    lost = dead.acquire(unique_user)
    dead.journal(lost, '{"user_id": "x"}')  # then the process "dies": no release
    expired_at = float(dead._slots(unique_user)[lost.slot][0]["expires"])  # white-box
    taken = next_.acquire(unique_user, timeout=60)
    taken_at = float(next_._slots(unique_user)[taken.slot][0]["expires"]) - next_.ttl
    assert taken_at >= expired_at  # taken only once the dead holder's lease had expired
    assert taken.orphan == '{"user_id": "x"}'
    with pytest.raises(StorageError, match="lost the write lease"):
        dead.journal(lost, "{}")
    dead.release(lost)  # a lease taken over is left alone
    next_.journal(taken, "")
    next_.release(taken)
    after = next_.acquire(unique_user, timeout=5)
    assert after.orphan is None  # the journal was cleared: nothing to finish twice
    next_.release(after)


def test_the_journal_is_a_metadata_value_and_the_earlier_layout_is_handed_over(
    chroma_server: str, unique_user: str
) -> None:
    """An intent is the held slot's metadata value ``intent``, compressed (Chroma
    full-text-indexes documents); a dead holder's intent in its slot's document (the earlier
    layout) is handed over alike, and one that does not decode is a typed error."""
    from hybridmem.replica.lease import INTENT

    dead, next_ = leases(chroma_server, ttl=0.5), leases(chroma_server, ttl=0.5)
    lost = dead.acquire(unique_user)
    slots = _chroma.make_client(url=chroma_server).get_collection(
        _chroma.collection_name(unique_user, "lease"))
    dead.journal(lost, '{"user_id": "new"}')
    got = slots.get(ids=[f"{lost.slot:012d}"], include=["documents", "metadatas"])
    stored = got["metadatas"][0][INTENT]  # compressed: every check reads the slots' metadata
    assert got["documents"] == [""] and "user_id" not in stored
    assert zlib.decompress(base64.b64decode(stored)) == b'{"user_id": "new"}'
    taken = next_.acquire(unique_user, timeout=60)
    assert taken.orphan == '{"user_id": "new"}'
    # a holder of the earlier layout dies: its intent is the document, no intent metadata
    slots.add(ids=[f"{taken.slot + 1:012d}"], documents=['{"user_id": "old"}'], embeddings=[[1.0]],
              metadatas=[{"owner": "earlier", "state": "held", "expires": 0.0}])
    again = dead.acquire(unique_user, timeout=60)
    assert again.orphan == '{"user_id": "old"}'
    dead.journal(again, "")
    dead.release(again)
    after = next_.acquire(unique_user, timeout=5)
    assert after.orphan is None
    next_.release(after)
    assert not any(m.get(INTENT) for m in slots.get(include=["metadatas"])["metadatas"])
    slots.add(ids=[f"{after.slot + 1:012d}"], documents=[""], embeddings=[[1.0]],
              metadatas=[{"owner": "torn", "state": "held", "expires": 0.0, INTENT: "{not"}])
    with pytest.raises(CorruptStateError, match="cannot be read"):
        next_.acquire(unique_user, timeout=5)


def test_leases_exclude_each_other_under_a_race(chroma_server: str, unique_user: str) -> None:
    """Four clients increment one counter record read-modify-write under the lease: no
    increment is lost."""
    client = _chroma.make_client(url=chroma_server)
    counter = client.get_or_create_collection("counter-" + unique_user, embedding_function=None)
    counter.add(ids=["n"], documents=["0"], embeddings=[[1.0]])
    errors: list[BaseException] = []

    def worker() -> None:
        locks = WriteLocks(leases(chroma_server))
        try:
            for _ in range(5):
                with locks(unique_user):
                    with locks(unique_user):  # re-entrant: the lease is taken once
                        value = int(counter.get(ids=["n"])["documents"][0])
                        counter.update(ids=["n"], documents=[str(value + 1)], embeddings=[[1.0]])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert counter.get(ids=["n"])["documents"][0] == "20"
    client.delete_collection("counter-" + unique_user)


def test_forgetting_a_user_drops_its_lease(chroma_server: str, unique_user: str) -> None:
    from hybridmem.chroma.client import collection_name

    a = leases(chroma_server)
    held = a.acquire(unique_user)
    a.drop_user(unique_user)  # as Memory.forget(user) does, holding the lease
    a.release(held)  # finds nothing to free, re-creates nothing
    names = [c.name for c in _chroma.make_client(url=chroma_server).list_collections()]
    assert collection_name(unique_user, "lease") not in names
    a.release(a.acquire(unique_user))  # the next write starts a new lease
