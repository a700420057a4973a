"""Bookkeeping around the searches: access counts written in the background, and the cached
answer to a question every context() asks ("has this user key facts, episodes, procedures?").

A memory's ``access_count`` and ``last_accessed_at`` say how often and how lately searches
returned it: the retention policy keeps an unimportant memory while it is still read
(:func:`hybridmem.write.policy.doomed` judges idleness by ``last_accessed_at``), and both fields
are filterable (:mod:`hybridmem.filters`). Writing them is a vector-store update, which stalls
the searches that run beside it, so no search writes its own: :class:`AccessLog` counts in
memory and a background thread writes the counts in batches, at a pause of the searches and in
paced parts (its docstring says when and why).

context() adds key facts, summary episodes and procedures when the user has any; finding out
costs three metadata scans, so :class:`Extras` keeps each user's answer for a few seconds.

- :class:`AccessLog` — buffers access counts and writes them in the background (and on close).
- :class:`Extras` — the cached "has key facts / episodes / procedures" answer of each user.
- :data:`ACCESS_FLUSH`, :data:`ACCESS_IDLE`, :data:`ACCESS_WAIT`, :data:`ACCESS_SHARE`,
  :data:`ACCESS_PART` — when a background write starts, waits, and how it is paced.
- :data:`EXTRAS_TTL`, :data:`MAX_EXTRAS` — how long and for how many users an answer is kept.

Separate from :mod:`hybridmem.read.retrieval` because none of this ranks anything: it is the
bookkeeping around a search, with its own thread, pacing and cache.
"""

from __future__ import annotations

import contextvars
import itertools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from datetime import datetime
from typing import Any

from hybridmem.filters import Filter, all_of, eq
from hybridmem.models import MemoryItem
from hybridmem.stores import Stores

__all__ = ["ACCESS_FLUSH", "ACCESS_IDLE", "ACCESS_PART", "ACCESS_SHARE", "ACCESS_WAIT",
           "EXTRAS_TTL", "MAX_EXTRAS", "AccessLog", "Extras"]

log = logging.getLogger(__name__)
#: Buffered memory accesses that start a background write of the counts.
ACCESS_FLUSH = 512
#: Seconds without a search that the write waits for, and the longest it waits (see AccessLog).
ACCESS_IDLE = 0.25
ACCESS_WAIT = 10.0
#: Under load that never pauses, the share of the time the count writes may take at most: a forced
#: write also waits ``1 / ACCESS_SHARE - 1`` times as long as the last write took (see AccessLog).
ACCESS_SHARE = 0.1
#: Memories per part of a background count write: after each part the writer rests
#: ``1 / ACCESS_SHARE - 1`` times as long as the part took (see AccessLog). One Chroma write
#: call's worth: a write of fewer is one stall; smaller parts stall more calls
#: (with parts of 250, bench/latency.py's search p95 at 10k was 256 ms, its p50 18.8 ms).
ACCESS_PART = 1000
#: Seconds a "does this user have key facts / episodes" answer is reused by context().
EXTRAS_TTL = 5.0
#: Users whose answer is kept (the least recently asked beyond this are dropped).
MAX_EXTRAS = 4096


class AccessLog:
    """Access counts of returned memories, buffered in memory and written in batches by a
    background thread (and on close), so no search pays for a write.

    A write is due once :data:`ACCESS_FLUSH` memories have counts buffered, and then waits for a
    pause in the searches (:data:`ACCESS_IDLE` s without one), for at most :data:`ACCESS_WAIT`
    s. Why: a Chroma metadata update holds the collection while it runs (at 10k memories ~45 ms
    plus ~0.8 ms per memory), and searches that came meanwhile waited for it: the slowest 5 % of
    ``context()`` calls were exactly those. Smaller, more frequent updates spread the stall over
    more calls and cost twice as much in all, so the write stays one batch and moves to a quiet
    moment; under load that never pauses it still happens every :data:`ACCESS_WAIT` s, or later
    when the last write took long: at most :data:`ACCESS_SHARE` of the time goes to writing
    counts. Chroma holds the GIL while it updates, so with 8 REST clients on one 10k user the
    10 s writes (thousands of memories each) took a fifth of the server's GIL time; waiting
    longer merges repeated accesses into one row each. :meth:`close` writes what is left at once.

    The background write goes in parts of :data:`ACCESS_PART` memories, each followed by a rest
    ``1 / ACCESS_SHARE - 1`` times as long as it took, so the share holds from the first write on
    and no request waits for more than one part. Why: Chroma's update holds the GIL, and one
    write of all 6,291 memories 20 s of 8 REST clients had touched at 10k held it ~3.7 s: a third
    of the server's GIL samples in that window. Each part is read and written under the user's
    lock, so a count is never lost and writes of that user wait one part at most."""

    def __init__(self, stores: Stores, lock_for: Callable[[str], Any]) -> None:
        self._stores = stores
        self._lock_for = lock_for
        self._pending: dict[str, dict[str, tuple[int, datetime]]] = {}
        self._guard = threading.Lock()
        self._worker: threading.Thread | None = None
        self._last = time.monotonic()  # when the last search noted its hits
        self._hurry = threading.Event()  # set by close(): the rest is written now
        self._spent = 0.0  # seconds the last write took

    def note(self, user_id: str, ids: Sequence[str], now: datetime) -> None:
        """Count one access of each id; a write is due when :data:`ACCESS_FLUSH` are buffered."""
        with self._guard:
            self._last = time.monotonic()
            seen = self._pending.setdefault(user_id, {})
            for memory_id in ids:
                count, _ = seen.get(memory_id, (0, now))
                seen[memory_id] = (count + 1, now)
            pending = sum(len(v) for v in self._pending.values())
            if pending >= ACCESS_FLUSH and self._worker is None and not self._hurry.is_set():
                self._worker = threading.Thread(
                    target=self._flush_in_background, name="hybridmem-access", daemon=True
                )
                self._worker.start()

    def forced_after(self) -> float:
        """Seconds a due write waits at most for a pause: :data:`ACCESS_WAIT`, or ``1 /
        ACCESS_SHARE - 1`` times what the last write took when that is longer (the share)."""
        return max(ACCESS_WAIT, self._spent * (1 / ACCESS_SHARE - 1))

    def _flush_in_background(self) -> None:
        try:
            due = time.monotonic() + self.forced_after()
            while (quiet := time.monotonic() - self._last) < ACCESS_IDLE and time.monotonic() < due:
                if self._hurry.wait(min(ACCESS_IDLE - quiet, due - time.monotonic())):
                    return  # close() writes everything
            self._paced()
        except Exception as exc:  # counts are a hint: never let them break anything
            log.warning("writing access counts failed (%s); they are dropped", exc)
        finally:
            with self._guard:
                self._worker = None

    def _paced(self) -> None:
        """Write what is buffered now, :data:`ACCESS_PART` memories at a time, resting between
        parts (no rest once :meth:`close` hurries); accesses noted meanwhile wait for the next
        write, unless they add to a memory not written yet."""
        with self._guard:
            left = sum(len(v) for v in self._pending.values())
        while left > 0:
            part = self._take(min(ACCESS_PART, left))
            if not part:
                return
            started = time.monotonic()
            for uid, seen in part.items():
                self._write(uid, seen)
            left -= sum(len(v) for v in part.values())
            self._hurry.wait((time.monotonic() - started) * (1 / ACCESS_SHARE - 1))

    def _take(self, n: int) -> dict[str, dict[str, tuple[int, datetime]]]:
        """Up to ``n`` buffered counts, removed from the buffer (oldest users first)."""
        out: dict[str, dict[str, tuple[int, datetime]]] = {}
        with self._guard:
            for uid in list(self._pending):
                seen = self._pending[uid]
                ids = list(itertools.islice(seen, n))
                out[uid] = {i: seen.pop(i) for i in ids}
                if not seen:
                    del self._pending[uid]
                n -= len(ids)
                if n <= 0:
                    break
        return out

    def close(self) -> None:
        """Stop waiting for a pause, then write what is left."""
        self._hurry.set()
        with self._guard:
            worker = self._worker
        if worker is not None:
            worker.join()
        self.flush()

    def forget(self, user_id: str) -> None:
        """Drop what is buffered for a user being erased."""
        with self._guard:
            self._pending.pop(user_id, None)

    def flush(self, user_id: str | None = None) -> None:
        """Write buffered counts and last-accessed times (all users', or one user's)."""
        with self._guard:
            if user_id is None:
                pending, self._pending = self._pending, {}
            else:
                pending = {user_id: self._pending.pop(user_id)} if user_id in self._pending else {}
        started = time.monotonic()
        for uid, seen in pending.items():
            self._write(uid, seen)
        if pending:
            self._spent = time.monotonic() - started

    def _write(self, uid: str, seen: dict[str, tuple[int, datetime]]) -> None:
        with self._lock_for(uid):
            items = [
                item.model_copy(update={
                    "access_count": item.access_count + seen[item.id][0],
                    "last_accessed_at": seen[item.id][1],
                })
                for item in self._stores.vectors.get(uid, list(seen))
            ]
            if items:
                self._stores.vectors.update(uid, items)


class Extras:
    """Whether a user has key facts / summary episodes / procedures, for context(). Each answer
    costs the vector store a metadata scan, so it is cached for :data:`EXTRAS_TTL` seconds (this
    process's own writes refresh it at once; another process's new fact or episode shows within
    the TTL).

    A context about now shows current ones only, so it asks about current ones only
    (``current``): on a Chroma server those live in the user's main collection, and a question
    that also covers the archive is a second round trip per scan (two, when the user has no
    archive: asking for a missing collection is one). A context ``as_of`` a past time asks
    about all of them. Both answers are cached."""

    def __init__(self, stores: Stores) -> None:
        self._stores = stores
        self._cache: OrderedDict[tuple[str, bool], tuple[float, bool, bool, bool]] = \
            OrderedDict()
        self._guard = threading.Lock()

    def of(self, user_id: str, *, current: bool = False,
           pool: Executor | None = None) -> tuple[bool, bool, bool]:
        """(has key facts, has summary episodes, has procedures): current ones only with
        ``current``. With ``pool`` the three questions are asked at once: on a Chroma server
        each is a round trip."""
        now = time.monotonic()
        key = (user_id, current)
        with self._guard:
            cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            return cached[1], cached[2], cached[3]
        vectors = self._stores.vectors
        pin = eq("current", True) if current else None

        def has(where: Filter) -> bool:
            return bool(vectors.list(user_id, where=all_of(where, pin), limit=1))

        asked = (eq("has_key", True), eq("kind", "summary"), eq("kind", "procedure"))
        if pool is None:
            has_facts, has_episodes, has_procedures = map(has, asked)
        else:
            futures = [pool.submit(contextvars.copy_context().run, has, where) for where in asked]
            has_facts, has_episodes, has_procedures = (f.result() for f in futures)
        with self._guard:
            self._cache[key] = (now + EXTRAS_TTL, has_facts, has_episodes, has_procedures)
            self._cache.move_to_end(key)
            while len(self._cache) > MAX_EXTRAS:
                self._cache.popitem(last=False)
        return has_facts, has_episodes, has_procedures

    def changed(self, user_id: str, items: Sequence[MemoryItem]) -> None:
        """Forget the cached answer when a write added or changed a key fact, an episode or a
        procedure."""
        if any(i.key or i.kind in ("summary", "procedure") for i in items):
            self.forget(user_id)

    def forget(self, user_id: str) -> None:
        """Drop the user's cached answers (its next context() asks the vector store again)."""
        with self._guard:
            for current in (False, True):
                self._cache.pop((user_id, current), None)
