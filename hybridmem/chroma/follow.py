"""Keeping a process's copy of a user's records exact on a shared Chroma server.

Why: embedded, the record copy (:mod:`hybridmem.chroma.record_cache`) serves a search's
hydration and filtered listings from memory, and the vector query asks Chroma for ids and
distances only. On a Chroma server without a copy each of those reads is an HTTP round trip
(a 5,000-memory user's context() paid two: the query with documents and metadata, ~15 ms, and
the hydration of lexical and graph candidates, ~17 ms). The copy is kept there too, and this
module keeps it in step with what other processes write.

How: every write of a user's memories runs under the user's lease, and a lease's release says
which memory ids its holder wrote (:mod:`hybridmem.replica.lease`). A check reads the lease's
slots (one small read); when no slot was taken since the last check nothing changed. Otherwise
it reads what the new, released slots' holders wrote and fetches just those memories: the
ones found replace their copies, the others are gone. What this process wrote itself is in the
copy already (the vector store updates it after each write), so its own slots are skipped.

Consistency (the rules of the graph and lexical replicas, see docs/server-mode.md):

- A process sees its own writes at once, and another process's writes at its first check after
  the lease was released: checks run before a read at most every ``interval`` seconds, and at
  once when this process takes a lease another process held last (a write then plans from what
  the other wrote).
- A write still under way (its slot held) is applied when it is released.
- When the slots cannot say what changed — slots tidied away before this process looked, a
  holder that died mid-write, a batch that wrote more than the slot lists, the user erased and
  written again — the copy is dropped and reloaded whole (at the user's next misses, as at the
  first touch); reads meanwhile go to the server.
- A memory the vector query returns that the copy lacks (written since the last check) is read
  from the server for that query, and the next read checks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from hybridmem.chroma.record_cache import UserRecords
from hybridmem.protocols import FIELDS_NOTE, GRAPH_NOTE, SNAPSHOT_AGE, WriteLog, WriteSlot

__all__ = ["Follower", "missed", "noted_memories", "noted_texts", "written", "written_since"]

#: ``UserRecords.checked`` of a copy that a read found lacking (see Follower.distrust).
STALE = float("-inf")
#: Reads records by id from the server: id -> (document, metadata) of those found.
Fetch = Callable[[list[str]], Mapping[str, tuple[str, Mapping[str, Any]]]]


class Follower:
    """Checks and updates users' record copies from ``log`` (see the module docstring), at
    most every ``interval`` seconds per user unless forced. The caller holds the user's lock
    (the vector store's, which its own writes hold) around :meth:`start` + load and around
    :meth:`check`."""

    def __init__(self, log: WriteLog, *, interval: float) -> None:
        self.log = log
        self.interval = interval

    def start(self, user_id: str, records: UserRecords) -> None:
        """Record the slots as they are before ``records`` are loaded: a write that lands
        during the load is then applied again at the first check (applying is idempotent)."""
        records.base = self.log.slots(user_id, fresh=True)
        records.checked = time.monotonic()

    def due(self, records: UserRecords) -> bool:
        return time.monotonic() - records.checked >= self.interval

    @staticmethod
    def distrust(records: UserRecords) -> None:
        """A read found a memory the copy lacks: check at the next read, with a fresh read of
        the slots (not one that other checks share)."""
        records.checked = STALE

    def check(self, user_id: str, records: UserRecords, fetch: Fetch, *,
              fresh: bool = False) -> bool:
        """Bring ``records`` up to date; False when they cannot be (drop and reload them).
        ``fresh``: read the slots now (a write is about to plan from the copy), not share a
        read other checks just made."""
        started = time.monotonic()
        now = self.log.slots(user_id, fresh=fresh or records.checked == STALE)
        seen: dict[int, WriteSlot] | None = records.base
        if now == seen:
            records.checked = started
            return True
        if now is None:  # no lease: erased since the copy was loaded, or never taken (a user
            records.checked = started  # written before leases, unchanged since)
            return seen is None
        noted = written(self.log, user_id, seen, now)
        if noted is None:
            return False
        wrote = noted_memories(noted)
        if wrote:
            apply(records, sorted(wrote), fetch)
        records.base, records.checked = now, started
        return True


def noted_memories(noted: Iterable[str]) -> set[str]:
    """The memory ids that lease notes list (graph records and marks left out)."""
    return {i for i in noted if not i.startswith((GRAPH_NOTE, FIELDS_NOTE))}


def noted_texts(noted: Iterable[str]) -> set[str]:
    """The memory ids whose text the noting leases may have changed: those listed, less those
    marked as changed in their fields only (see :data:`~hybridmem.protocols.FIELDS_NOTE`)."""
    marked = {i[len(FIELDS_NOTE):] for i in noted if i.startswith(FIELDS_NOTE)}
    return noted_memories(noted) - marked


def apply(records: UserRecords, ids: list[str], fetch: Fetch) -> None:
    """Replace the copies of ``ids`` with what the server holds (removed where it has none)."""
    found = fetch(ids)
    records.put((i, doc, meta) for i, (doc, meta) in found.items())
    records.remove(i for i in ids if i not in found)


def written(log: WriteLog, user_id: str, seen: Mapping[int, WriteSlot] | None,
            now: Mapping[int, WriteSlot]) -> set[str] | None:
    """The ids other processes noted in the slots released since ``seen`` (see
    :class:`~hybridmem.protocols.WriteLog`); None when the slots cannot say (see
    :func:`missed`, and a holder that noted too many to list). The caches of the graph and the
    lexical index follow the server this way too (:mod:`hybridmem.replica.sync`)."""
    if seen is None or missed(seen, now):
        return None
    return _noted(log, user_id, [n for n, slot in now.items() if seen.get(n) != slot
                                 and not slot.held and not slot.mine])


def written_since(log: WriteLog, user_id: str, at: tuple[int, str, bool],
                  now: Mapping[int, WriteSlot]) -> set[str] | None:
    """The ids noted in the slots released after the lease ``at`` (its slot number and owner
    token, and whether what is asked for came after the lease's last write: else that slot's
    own notes count too), this process's own included; None when the slots cannot say: that
    slot is gone or was taken by another owner (tidied away, or the user erased since), a slot
    after it is missing, or a holder listed too many to say. Slots still held are left out:
    their notes come at their release, which a later check (:func:`written`) reads."""
    first, owner, final = at
    slot = now.get(first)
    if slot is None or slot.owner != owner:
        return None
    if any(n not in now for n in range(first, max(now) + 1)):
        return None
    return _noted(log, user_id, [n for n, s in now.items() if n >= first + final and not s.held])


def aged(log: WriteLog, user_id: str, at: tuple[int, str, bool] | None) -> bool:
    """Whether a snapshot written under lease ``at`` is to be stored again as the lease this
    process holds now ends: :data:`~hybridmem.protocols.SNAPSHOT_AGE` leases or more later, or
    the slots were numbered anew since (the user erased and written again). False when this
    process holds no lease or the snapshot names none."""
    held = log.holding(user_id)
    if at is None or held is None:
        return False
    return held[0] - at[0] >= SNAPSHOT_AGE or held[0] < at[0]


def _noted(log: WriteLog, user_id: str, released: list[int]) -> set[str] | None:
    """Every id the ``released`` slots list; None when one of them does not say."""
    out: set[str] = set()
    for ids in log.changed(user_id, released).values():
        if ids is None:
            return None
        out.update(ids)
    return out


def missed(seen: Mapping[int, WriteSlot], now: Mapping[int, WriteSlot]) -> bool:
    """Whether slots taken since ``seen`` may have been tidied away unseen, or the lease was
    made again (the user erased and written since), or a holder seen at work died."""
    top = max(seen, default=0)
    last = max(now, default=0)
    if last < top:
        return True
    if any(n in seen and seen[n].owner != slot.owner for n, slot in now.items()):
        return True
    if any(n not in now for n in range(top + 1, last + 1)):
        return True
    # a holder seen at work whose slot is gone was taken over: what it half wrote was finished
    # or undone by its successor, whose slot lists only what the successor wrote itself
    return any(slot.held and not slot.mine and n not in now for n, slot in seen.items())

