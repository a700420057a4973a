"""The read path: hybrid search, and the bookkeeping a search leaves behind.

:meth:`Retriever.search` gathers candidates from three retrievers — the vector store (cosine), the
lexical index (BM25) and the graph (activation spread from the best hits and the query's entities,
see :mod:`hybridmem.graph.activation`) — hydrates them from the vector store, drops expired ones and fuses
the signals with :func:`hybridmem.read.ranking.fuse`. :class:`AccessLog` counts what searches returned in
memory and writes the counts in batches, so a search never waits for a write.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from typing import Any


from hybridmem.stores import Stores
from hybridmem.config import Settings
from hybridmem.filters import Filter, eq
from hybridmem.models import Hit, MemoryItem, utcnow
from hybridmem.graph.activation import LINK_FLOOR, LINK_NODES
from hybridmem.graph.name_vectors import NAME_VECTORS, NameVectors
from hybridmem.read.ranking import Candidate, Weights, explain, fuse, graph_seeds

__all__ = ["ACCESS_FLUSH", "ACCESS_PART", "ACCESS_SHARE", "EXTRAS_TTL", "GRAPH_SEED_HITS",
           "NAME_VECTORS", "POOL_EXTRA", "POOL_PER_LIMIT", "QUERY_CACHE", "AccessLog", "Extras",
           "NameVectors", "QueryBatcher", "Retriever", "pool_size"]

log = logging.getLogger(__name__)
#: How many of the top hits lend their relations to context() (graph search uses graph_seeds).
GRAPH_SEED_HITS = 5
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
Embed = Callable[[Sequence[str]], list[list[float]]]
#: Query embeddings kept per Memory (~12 KB each for 384 Python floats: ~6 MB when full).
QUERY_CACHE = 512
#: A search fetches from each retriever at least this many times its ``limit`` (at most
#: :data:`POOL_EXTRA` more than it): fusion can only lift what some retriever fetched.
POOL_PER_LIMIT = 2
POOL_EXTRA = 500
#: Threads that run a search's lexical lookup beside its embedding (one per concurrent search).
READ_THREADS = 4


def pool_size(candidates: int, limit: int) -> int:
    """How many candidates a search of ``limit`` results fetches from each retriever: the
    ``candidates`` setting, and at least ``limit`` plus as many again (up to :data:`POOL_EXTRA`).

    Why: a memory fusion should put at rank ``limit`` is often far lower in each single
    retriever (on LoCoMo dev, with a pool equal to a 100-deep ranking, 137 of 1,105 evidence turns
    were in no retriever's top 100). A pool of just ``limit`` leaves fusion nothing to lift."""
    return max(candidates, limit + min(limit * (POOL_PER_LIMIT - 1), POOL_EXTRA))


def weights_of(settings: Settings) -> Weights:
    """The fusion weights and constants the settings name (see :mod:`hybridmem.read.ranking`)."""
    return Weights(
        vector=settings.vector_weight,
        lexical=settings.lexical_weight,
        graph=settings.graph_weight,
        recency=settings.recency_weight,
        half_life_days=settings.half_life_days,
        importance=settings.importance_weight,
        rrf_k=settings.rrf_k,
        fusion=settings.fusion,
    )


class QueryBatcher:
    """Embeds the queries of concurrent searches in one model call.

    Why: a served context() is bound by CPU, and one batch of 8 short queries costs the ONNX
    model far less than 8 calls of one (and a remote embedder one request instead of 8). How: a
    query joins the queue; if no call is running its caller makes one for everything queued,
    otherwise it waits and is either answered by the running call's successor or makes the next
    call itself. Nothing waits for company: a search alone embeds at once."""

    def __init__(self, embed: Embed) -> None:
        self._embed = embed
        self._cond = threading.Condition()
        self._queue: list[tuple[str, Future[list[float]]]] = []
        self._busy = False

    def __call__(self, query: str) -> list[float]:
        mine: Future[list[float]] = Future()
        with self._cond:
            self._queue.append((query, mine))
            while self._busy and not mine.done():
                self._cond.wait()
            if mine.done():
                return mine.result()
            self._busy = True
            batch, self._queue = self._queue, []
        try:
            vectors = self._embed([text for text, _ in batch])
            for (_, future), vector in zip(batch, vectors, strict=True):
                future.set_result(vector)
        except BaseException as exc:  # each caller gets the failure (its own query's too)
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()
        return mine.result()


class Retriever:
    """Hybrid search over one Memory's stores."""

    def __init__(self, settings: Settings, stores: Stores, *, embed: Embed,
                 names: NameVectors | None = None) -> None:
        self._settings = settings
        self._stores = stores
        self._embed = embed
        self.weights = weights_of(settings)
        self._batch = QueryBatcher(embed)
        #: The name vectors of the topic signal (None: no topic signal), see hybridmem.graph.name_vectors.
        self._names = names
        self._vectors: OrderedDict[str, list[float]] = OrderedDict()  # query -> embedding (LRU)
        self._guard = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None

    def _query_vector(self, query: str) -> list[float]:
        """The query's embedding; the last :data:`QUERY_CACHE` are kept (context() searches a
        query twice when the user has summaries, and chat front ends repeat questions)."""
        with self._guard:
            vector = self._vectors.get(query)
            if vector is not None:
                self._vectors.move_to_end(query)
                return vector
        vector = self._batch(query)
        with self._guard:
            self._vectors[query] = vector
            while len(self._vectors) > QUERY_CACHE:
                self._vectors.popitem(last=False)
        return vector

    def _pool(self) -> ThreadPoolExecutor:
        with self._guard:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=READ_THREADS,
                                                    thread_name_prefix="hybridmem-read")
            return self._executor

    def close(self) -> None:
        """Stop the reader threads (idempotent)."""
        with self._guard:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)

    def search(self, user_id: str, query: str, *, limit: int, where: Filter | None,
               now: datetime | None = None) -> list[Hit]:
        """The ``limit`` best memories for ``query`` among those matching ``where``; ages and
        expiry are judged at ``now`` (default: the current time; a past time for ``as_of``)."""
        s, w = self._settings, self.weights
        pool = pool_size(s.candidates, limit)
        items: dict[str, MemoryItem] = {}
        cands: dict[str, Candidate] = {}

        def cand(memory_id: str) -> Candidate:
            c = cands.get(memory_id)  # (not setdefault: it would build a Candidate every call)
            if c is None:
                c = cands[memory_id] = Candidate(memory_id)
            return c

        vector = w.vector > 0 or not w.lexical > 0
        lexical: Future[list[tuple[str, float]]] | None = None
        if w.lexical > 0 and vector:  # FTS5 runs while the query is embedded (both free the GIL)
            lexical = self._pool().submit(self._stores.lexical.search, user_id, query, limit=pool)
        if vector:
            qvec = self._query_vector(query)
            hits = self._stores.vectors.query(user_id, [qvec], limit=pool, where=where)[0]
            for rank, hit in enumerate(hits, 1):
                items[hit.item.id] = hit.item
                c = cand(hit.item.id)
                c.vector, c.vector_rank = hit.similarity, rank
        if w.lexical > 0:
            found = (lexical.result() if lexical is not None
                     else self._stores.lexical.search(user_id, query, limit=pool))
            for rank, (memory_id, score) in enumerate(found, 1):
                c = cand(memory_id)
                c.lexical, c.lexical_rank = score, rank
        if w.graph > 0:
            self._graph_candidates(user_id, query, list(cands), cand, pool,
                                   qvec if vector else None)
        missing = [m for m in cands if m not in items]
        if missing:
            items.update((i.id, i) for i in self._stores.vectors.get(user_id, missing, where=where))
        now = now or utcnow()
        for memory_id in list(cands):
            item = items.get(memory_id)
            if item is None or (item.expires_at is not None and item.expires_at <= now):
                del cands[memory_id]
                continue
            c = cands[memory_id]
            c.age_days = max((now - item.created_at).total_seconds() / 86400.0, 0.0)
            c.importance, c.confidence = item.importance, item.confidence
        ranked = fuse(list(cands.values()), w, limit)
        return [
            Hit(item=items[c.memory_id], score=b.fused, breakdown=b, why=explain(b))
            for c, b in ranked
        ]

    def _graph_candidates(
        self, user_id: str, query: str, found: list[str], cand: Callable[[str], Candidate],
        pool: int, qvec: Sequence[float] | None,
    ) -> None:
        """Graph activation (see :mod:`hybridmem.graph.activation`) from the query's entities and the
        best hits so far: every candidate it reaches gets its graph signal; of the memories only
        the graph found, the ``pool`` strongest join. With the query's embedding ``qvec`` and
        ``graph_topic`` > 0 the graph also gets the query's similarity to node names (from the
        vectors stored when the nodes were written: a search never embeds a name)."""
        s, names = self._settings, self._names
        seeds = graph_seeds([cand(m) for m in found], self.weights, s.graph_seeds)
        similar = None
        linked: list[tuple[str, float]] = []
        if qvec is not None and s.graph_topic > 0 and names is not None:
            vector = qvec

            def similar(keys: Sequence[str], labels: Sequence[str]) -> list[float]:
                return names.similar(user_id, vector, keys, labels)

            if s.graph_link > 0:
                linked = [(key, s.graph_link * cos) for key, cos
                          in names.nearest(user_id, qvec, LINK_NODES, LINK_FLOOR)]

        reached = self._stores.graph.activation(
            user_id, seeds, query, hops=s.graph_hops, episodic=s.graph_episodic,
            topic=s.graph_topic, similar=similar, linked=linked,
        )
        known = set(found)
        # strongest first, ties by id: the cut and the ranks are canonical
        strongest = [(-r[0], m) for m, r in reached.items()]
        fresh = heapq.nsmallest(pool, [t for t in strongest if t[1] not in known])
        ordered = sorted([t for t in strongest if t[1] in known] + fresh)
        for rank, (_s, memory_id) in enumerate(ordered, 1):
            c = cand(memory_id)
            c.graph, c.graph_hops, c.graph_path = reached[memory_id]
            c.graph_rank = rank


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

    def _flush_in_background(self) -> None:
        try:
            due = time.monotonic() + max(ACCESS_WAIT, self._spent * (1 / ACCESS_SHARE - 1))
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
    the TTL)."""

    def __init__(self, stores: Stores) -> None:
        self._stores = stores
        self._cache: OrderedDict[str, tuple[float, bool, bool, bool]] = OrderedDict()
        self._guard = threading.Lock()

    def of(self, user_id: str) -> tuple[bool, bool, bool]:
        """(has key facts, has summary episodes, has procedures)."""
        now = time.monotonic()
        with self._guard:
            cached = self._cache.get(user_id)
        if cached is not None and cached[0] > now:
            return cached[1], cached[2], cached[3]
        vectors = self._stores.vectors
        has_facts = bool(vectors.list(user_id, where=eq("has_key", True), limit=1))
        has_episodes = bool(vectors.list(user_id, where=eq("kind", "summary"), limit=1))
        has_procedures = bool(vectors.list(user_id, where=eq("kind", "procedure"), limit=1))
        with self._guard:
            self._cache[user_id] = (now + EXTRAS_TTL, has_facts, has_episodes, has_procedures)
            self._cache.move_to_end(user_id)
            while len(self._cache) > MAX_EXTRAS:
                self._cache.popitem(last=False)
        return has_facts, has_episodes, has_procedures

    def changed(self, user_id: str, items: Sequence[MemoryItem]) -> None:
        """Forget the cached answer when a write added or changed a key fact, an episode or a
        procedure."""
        if any(i.key or i.kind in ("summary", "procedure") for i in items):
            self.forget(user_id)

    def forget(self, user_id: str) -> None:
        with self._guard:
            self._cache.pop(user_id, None)
