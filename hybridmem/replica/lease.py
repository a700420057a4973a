"""The user's write lock: within a process a re-entrant lock, and with a Chroma server also a
*lease* shared by every process, which carries the server-mode journal.

Why: with ``chroma_url`` several processes (on several hosts) write the same users. Dedup and
supersession read the stores, decide, then write; two processes doing that at once for one user
would both store the same fact, or both keep their own "current" value of a conflict. So a write
holds the user's lease while it plans (from the stores as they are then) and applies; the model
calls run before (see :mod:`hybridmem.write.writer`), so a lease is held for store round trips only.

**The primitive.** Chroma has no compare-and-set, but its ``add`` inserts a record only when its
id is absent (an existing id is left as it is, silently), and a read after a write sees it. When
processes ``add`` the same id with different owner tokens and read it back, all of them see the
same owner: one winner, decided by the server.

**The lease.** The user's side collection ``l-<user key>`` holds numbered *slots* (ids
``000000000001``, ...). To take the lease, a process reads the slots; if the last is held and
not expired it waits (polling) ; otherwise it ``add``\\ s the next number with its token and
reads back: it holds the lease when its token is there and no higher slot exists (a process that
read a stale listing can only insert a number below the last, and so loses). Slots below the
holder's are tidied once :data:`STALE_SLOTS` accrue beyond the last :data:`KEEP_SLOTS`, which
stay, or all at once when one carries an intent. Releasing marks the slot free.

**The journal** (server mode): before the first store write of a batch, its intent (see
:mod:`hybridmem.write.journal`) is written into the holder's slot, as its metadata value
``intent`` (zlib-compressed, base64) — also renewing the lease, after checking it is still the
holder's — and cleared after the last (by the release, when it follows at once: a holder
killed in between leaves a finished batch, which is finished again). A holder killed mid-batch
leaves its slot held with the intent; once the lease expires (:data:`LEASE_TTL`), the next
process to win a slot copies that intent into its own slot (so a second crash loses nothing)
and finishes it — forward when the batch's vectors landed, back when not — before doing
anything else. Any process can do it: nothing of the journal is on a local disk. Why metadata:
Chroma indexes every document for full-text search, at about three times the cost of the same
bytes as metadata (see :mod:`hybridmem.replica.snapshot`), and an intent quotes every text of
its batch, written and replaced once per batch. Why compressed: every check of a user's
caches reads the slots' metadata, the holder's intent included (a 500-memory batch's ~0.6 MB of
JSON is ~0.1 MB compressed). A held slot without ``intent`` is read as the layout of earlier
versions, the intent in its document.

**What a holder wrote.** Releasing writes into the slot's document the ids of the memories its
holder wrote (:meth:`ChromaLeases.note`), or ``*`` past :data:`MAX_NOTED` of them; a memory
whose fields only it changed is listed once more, marked (:data:`~hybridmem.protocols.FIELDS_NOTE`),
so a reader that follows texts skips it. A process
that keeps a copy of the user's records (:mod:`hybridmem.chroma.follow`) reads the slots taken
since its last look and fetches just those memories: O(changes) per check, whatever the user's
size. Slots are tidied away only :data:`STALE_SLOTS` at a time and the last :data:`KEEP_SLOTS`
always stay, so a reader that looks once a second misses none unless that many leases were taken
in between (it then reloads the user), and a snapshot names a slot that is still there: writers
store one again after :data:`~hybridmem.protocols.SNAPSHOT_AGE` leases (half the slots kept).

**Assumptions**, as for any lease without fencing tokens: a holder finishes (or renews, at every
batch) within :data:`LEASE_TTL` seconds, and hosts' clocks agree to well within it (NTP). A
holder that finds at its next renewal that it lost the lease raises
:class:`~hybridmem.errors.StorageError` and writes nothing more.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
import time
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hybridmem.chroma import client as _chroma
from hybridmem.runtime.files import user_key
from hybridmem.runtime.locks import UserLocks
from hybridmem.errors import CorruptStateError, StorageError, StoreBusyError
from hybridmem.protocols import FIELDS_NOTE, SNAPSHOT_AGE, WriteSlot

if TYPE_CHECKING:
    from chromadb.api import ClientAPI
    from chromadb.api.models.Collection import Collection
    from chromadb.api.types import PyEmbedding

__all__ = ["LEASE_TTL", "ChromaLeases", "Lease"]

log = logging.getLogger(__name__)
#: Seconds a lease lasts without renewal; a dead holder's lease is taken over after this.
LEASE_TTL = 30.0
#: Seconds between two looks at a lease another process holds.
POLL = 0.02
#: Slots below the holder's that a taker leaves before deleting the oldest of them (all but the
#: last :data:`KEEP_SLOTS`): each delete is a write, and a reader of the slots (see the module
#: docstring) misses what a deleted slot's holder wrote unless it looked in between. Reading them
#: costs little: a check reads their metadata, and the documents only of slots it has not seen.
STALE_SLOTS = 32
#: Slots below the holder's that a tidy leaves: a snapshot names the slot of the lease it was
#: written under, and a first look from it reads the notes of the slots after it (see
#: hybridmem.chroma.follow.written_since). Twice SNAPSHOT_AGE, after which writers store a
#: snapshot again, so a snapshot's slot is always there.
KEEP_SLOTS = 2 * SNAPSHOT_AGE
#: The most memory ids a released slot lists (a batch that wrote more says ``*``: reload).
MAX_NOTED = 4096
#: How a released slot's document starts (an intent of the earlier layout, on a held slot, is a
#: JSON object).
NOTE = "wrote:"
#: The metadata key of a held slot's intent, compressed (see :func:`_pack`; "" for none).
INTENT = "intent"
#: Seconds a read of a user's slots serves other checks (see ChromaLeases.slots): the checks of
#: one context() fall within it; a check may see the slots that much late.
SHARE = 0.05
#: Users whose last lease owner a process remembers.
MAX_REMEMBERED = 4096
_UNIT = [1.0]  # Chroma wants a vector per record; slots are never searched
_SCHEMA = 1


def _slot(n: int) -> str:
    return f"{n:012d}"


@dataclass
class Lease:
    """A held lease: the slot won, the owner token, and (when a dead holder left one) the
    intent JSON of its unfinished batch, to finish before anything else. ``foreign``: the
    previous holder was not this process (its writes may not be in this process's caches)."""

    user_id: str
    slot: int
    owner: str
    orphan: str | None = None
    foreign: bool = True
    renewed: float = field(default_factory=time.monotonic)  # when its expiry was last pushed
    #: the memory ids written under it (see ChromaLeases.note), told to readers at the release
    wrote: set[str] = field(default_factory=set)
    #: those of them written otherwise than by a fields-only update (the rest are marked)
    texts: set[str] = field(default_factory=set)


class ChromaLeases:
    """Per-user leases in a Chroma server (see the module docstring). Thread-safe; the client
    (or the handles, see :func:`~hybridmem.chroma.client.handles_of`) is borrowed (the vector
    store owns and closes it)."""

    def __init__(self, client: ClientAPI | _chroma.CollectionHandles, *, ttl: float = LEASE_TTL,
                 poll: float = POLL) -> None:
        self._handles = _chroma.handles_of(
            client, hint="check that the Chroma server at chroma_url is reachable")
        self.ttl = ttl
        self._poll = poll
        #: user key -> this process's last owner token (bounded: a forgotten one means "refresh")
        self._last_owner: OrderedDict[str, str] = OrderedDict()
        #: owner tokens of this store's recent leases (a reader skips what it wrote itself)
        self._mine: OrderedDict[str, None] = OrderedDict()
        #: user key -> the lease this store holds now
        self._holding: dict[str, Lease] = {}
        #: user key -> (when, the slots) of the last read by slots(), and one read at a time
        self._recent: OrderedDict[str, tuple[float, dict[int, WriteSlot] | None]] = OrderedDict()
        self._reading = UserLocks()
        self._guard = threading.Lock()

    def __repr__(self) -> str:
        return f"ChromaLeases(ttl={self.ttl})"

    def _run(self, user_id: str, what: str, call: Callable[[Collection], Any], *,
             create: bool = True) -> Any:
        """``call`` on the user's lease collection (created if missing unless not ``create``:
        then None when it is gone, as after :meth:`drop_user`)."""
        created: _chroma.CollectionMeta = {"kind": "hybridmem-lease", "schema": _SCHEMA}
        return self._handles.run(_chroma.collection_name(user_id, "lease"), call, user_id=user_id,
                                 what=what, create=created if create else None)

    def drop_user(self, user_id: str) -> None:
        """Delete the user's lease collection (forgetting a user leaves nothing of it); the
        holder's release then finds nothing to free."""
        self._handles.drop(_chroma.collection_name(user_id, "lease"), user_id=user_id,
                           what="delete the write lease")

    def _slots(self, user_id: str) -> dict[int, tuple[dict[str, Any], str]]:
        """The slots' metadata, and the intent (a dead holder's) of the last one when it is
        held: from its metadata, else from its document (the earlier layout; the others'
        documents, what their holders wrote, a taker does not need)."""
        got = self._run(user_id, "read the write lease", lambda c: c.get(include=["metadatas"]))
        slots = {int(i): (dict(m or {}), "") for i, m in zip(got["ids"], got["metadatas"] or [])}
        last = max(slots, default=0)
        meta = slots[last][0] if last else {}
        if meta.get("state") == "held" and INTENT in meta:
            slots[last] = (meta, _unpack(meta[INTENT]))
        elif meta.get("state") == "held":  # the earlier layout: the intent in the document
            doc = self._run(user_id, "read the write lease", lambda c: c.get(
                ids=[_slot(last)], include=["documents"]))
            slots[last] = (meta, ((doc["documents"] or [""])[0] or ""))
        return slots

    def acquire(self, user_id: str, *, timeout: float | None = None) -> Lease:
        """Wait for the user's lease and take it; :class:`StoreBusyError` after ``timeout``
        seconds (default: twice the lease's lifetime, by when a dead holder's has expired)."""
        deadline = time.monotonic() + (2 * self.ttl if timeout is None else timeout)
        while True:
            slots = self._slots(user_id)
            last = max(slots, default=0)
            meta, doc = slots.get(last, ({}, ""))
            held = meta.get("state") == "held"
            if held and float(meta.get("expires", 0)) > time.time():
                if time.monotonic() > deadline:
                    raise StoreBusyError(
                        f"another process is writing the memories of {user_id!r} (its lease "
                        f"lasts up to {self.ttl:.0f} s); retry later")
                time.sleep(self._poll)
                continue
            orphan = doc if held and doc else None
            owner, mine = uuid.uuid4().hex, last + 1
            unit: list[PyEmbedding] = [_UNIT]
            self._run(user_id, "take the write lease", lambda c: c.add(
                ids=[_slot(mine)], documents=[""], embeddings=unit,
                metadatas=[{"owner": owner, "state": "held", "expires": time.time() + self.ttl,
                            INTENT: _pack(orphan or "")}],
            ))
            if self._holds(user_id, mine, owner):
                below = sorted(n for n in slots if n < mine)
                # the oldest tidied now and then (a write less per lease), every one at once
                # when one is held: it carries an intent, which may quote memory texts
                if any(slots[n][0].get("state") == "held" for n in below):
                    stale = [_slot(n) for n in below]
                else:
                    stale = [_slot(n) for n in below[:len(below) - KEEP_SLOTS]] \
                        if len(below) >= KEEP_SLOTS + STALE_SLOTS else []
                if stale:
                    self._run(user_id, "tidy the write lease", lambda c: c.delete(ids=stale))
                if orphan:
                    log.warning("taking over the write lease of a process that died mid-write")
                with self._guard:
                    foreign = self._last_owner.get(user_key(user_id)) != meta.get("owner")
                    self._last_owner[user_key(user_id)] = owner
                    self._last_owner.move_to_end(user_key(user_id))
                    while len(self._last_owner) > MAX_REMEMBERED:
                        self._last_owner.popitem(last=False)
                    self._mine[owner] = None
                    while len(self._mine) > MAX_REMEMBERED:
                        self._mine.popitem(last=False)
                    lease = Lease(user_id, mine, owner, orphan, foreign=foreign or not meta)
                    self._holding[user_key(user_id)] = lease
                return lease

    def _holds(self, user_id: str, slot: int, owner: str) -> bool:
        """Whether ``owner`` holds ``slot`` and it is the last slot (the server decides)."""
        got = self._run(user_id, "check the write lease", lambda c: c.get(include=["metadatas"]))
        slots = {int(i): dict(m or {}) for i, m in zip(got["ids"], got["metadatas"] or [])}
        return slots.get(slot, {}).get("owner") == owner and max(slots, default=0) == slot

    def journal(self, lease: Lease, intent: str) -> None:
        """Write a batch's intent into the lease (``""`` clears it) and renew the lease; raises
        :class:`StorageError` if another process took it meanwhile (nothing is written then)."""
        renewed = time.monotonic()
        if not intent and renewed - lease.renewed <= self.ttl / 4:
            # the release, which follows, empties the slot anyway: one write less per batch. A
            # holder killed in between leaves the intent, and its next holder finishes the batch
            # again, which is safe: every step of it is idempotent (hybridmem.write.journal).
            return
        # within half its lifetime of the last renewal nobody can have taken it: skip the check
        if renewed - lease.renewed > self.ttl / 2 and not self._holds(
                lease.user_id, lease.slot, lease.owner):
            raise StorageError(
                f"lost the write lease of {lease.user_id!r} (held past {self.ttl:.0f} s?); the "
                "write was not applied, retry it")
        unit: list[PyEmbedding] = [_UNIT]
        self._run(lease.user_id, "write the journal", lambda c: c.update(
            ids=[_slot(lease.slot)], embeddings=unit,
            metadatas=[{"owner": lease.owner, "state": "held",
                        "expires": time.time() + self.ttl, INTENT: _pack(intent)}]))
        lease.renewed = renewed

    def note(self, user_id: str, ids: Sequence[str], *, fields_only: bool = False) -> None:
        """Remember that ``ids`` were written under the user's lease this store holds (the
        vector store calls this before each write); the release tells readers, marking those
        only ever written ``fields_only`` (see :data:`~hybridmem.protocols.FIELDS_NOTE`)."""
        with self._guard:
            lease = self._holding.get(user_key(user_id))
            if lease is not None:
                lease.wrote.update(ids)
                if not fields_only:
                    lease.texts.update(ids)

    def holding(self, user_id: str) -> tuple[int, str] | None:
        """(slot, owner token) of the user's lease this store holds now, else None."""
        with self._guard:
            lease = self._holding.get(user_key(user_id))
        return None if lease is None else (lease.slot, lease.owner)

    def slots(self, user_id: str, *, fresh: bool = False) -> dict[int, WriteSlot] | None:
        """The user's slots by number, or None when the user has no lease collection (see
        :class:`~hybridmem.protocols.WriteLog`).

        Unless ``fresh``, a read started at most :data:`SHARE` seconds ago answers: the checks
        of a user's graph, lexical index and record copy fall due together (each once per
        refresh interval), and one read of the slots serves them all; one that arrives while a
        read is in flight waits for it."""
        key = user_key(user_id)
        with self._reading.hold(key):
            kept = self._recent.get(key)
            if not fresh and kept is not None and time.monotonic() - kept[0] <= SHARE:
                return kept[1]
            started = time.monotonic()
            got = self._run(user_id, "read the write lease",
                            lambda c: c.get(include=["metadatas"]), create=False)
            with self._guard:
                view = None if got is None else {
                    int(i): WriteSlot(owner=str((m or {}).get("owner")),
                                      held=(m or {}).get("state") == "held",
                                      mine=(m or {}).get("owner") in self._mine)
                    for i, m in zip(got["ids"], got["metadatas"] or [])}
                self._recent[key] = (started, view)
                self._recent.move_to_end(key)
                while len(self._recent) > MAX_REMEMBERED:
                    self._recent.popitem(last=False)
            return view

    def changed(self, user_id: str, slots: Sequence[int]) -> dict[int, frozenset[str] | None]:
        """What the holders of released ``slots`` wrote (None: a slot that does not say)."""
        out: dict[int, frozenset[str] | None] = dict.fromkeys(slots)
        if not slots:
            return out
        got = self._run(user_id, "read the write lease", lambda c: c.get(
            ids=[_slot(n) for n in slots], include=["documents"]), create=False)
        for i, doc in zip(got["ids"] if got else [], (got["documents"] or []) if got else []):
            out[int(i)] = _noted(doc or "")
        return out

    def release(self, lease: Lease) -> None:
        """Mark the lease free, its journal replaced by the ids written under it (see
        :meth:`note`); a lease already taken over is left alone."""
        with self._guard:
            if self._holding.get(user_key(lease.user_id)) is lease:
                del self._holding[user_key(lease.user_id)]
        unit: list[PyEmbedding] = [_UNIT]
        fresh = time.monotonic() - lease.renewed <= self.ttl / 2  # surely still its holder
        listed = sorted(lease.wrote) + sorted(FIELDS_NOTE + i for i in lease.wrote - lease.texts)
        wrote = (NOTE + "*" if len(lease.wrote) > MAX_NOTED
                 else NOTE + json.dumps(listed, separators=(",", ":")))

        def free(c: Collection) -> None:
            if not fresh:
                got = c.get(ids=[_slot(lease.slot)], include=["metadatas"])
                metas = got["metadatas"] or []
                if not metas or (metas[0] or {}).get("owner") != lease.owner:
                    return
            c.update(ids=[_slot(lease.slot)], documents=[wrote], embeddings=unit,
                     metadatas=[{"owner": lease.owner, "state": "free", "expires": 0.0,
                                 INTENT: ""}])

        self._run(lease.user_id, "release the write lease", free, create=False)

    def close(self) -> None:
        """Forget cached handles (the client is the vector store's)."""
        self._handles.clear()


def _pack(intent: str) -> str:
    """An intent's JSON as its slot stores it: zlib (fast level), then base64 ("" stays "")."""
    if not intent:
        return ""
    return base64.b64encode(zlib.compress(intent.encode("utf-8"), 1)).decode("ascii")


def _unpack(value: object) -> str:
    """The intent JSON a slot's ``intent`` value holds ("" for none)."""
    if not isinstance(value, str) or not value:
        return ""
    try:
        return zlib.decompress(base64.b64decode(value, validate=True)).decode("utf-8")
    except (binascii.Error, zlib.error, UnicodeDecodeError) as exc:
        raise CorruptStateError(
            "the write lease holds an unfinished write that cannot be read; delete the user's "
            f"lease collection to drop that batch ({exc})") from exc


def _noted(doc: str) -> frozenset[str] | None:
    """The memory ids a released slot's document lists, or None when it does not list them."""
    if not doc.startswith(NOTE) or doc == NOTE + "*":
        return None
    try:
        ids = json.loads(doc[len(NOTE):])
    except ValueError:
        return None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        return None
    return frozenset(ids)
