"""The read path: hybrid search over one Memory's stores.

:meth:`Retriever.search` gathers candidates from three retrievers — the vector store (cosine), the
lexical index (BM25) and the graph (activation spread from the best hits and the query's entities,
see :mod:`hybridmem.graph.activation`) — hydrates them from the vector store, drops expired ones and
fuses the signals with :func:`hybridmem.read.ranking.fuse`. :class:`QueryBatcher` embeds the queries
of concurrent searches in one call. What a search leaves behind (access counts) is
:mod:`hybridmem.read.access`'s.
"""

from __future__ import annotations

import contextvars
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

from hybridmem.config import Settings
from hybridmem.filters import Filter
from hybridmem.graph.activation import LINK_FLOOR, LINK_NODES
from hybridmem.graph.name_vectors import NAME_VECTORS, NameVectors
from hybridmem.models import Hit, MemoryItem, utcnow
from hybridmem.observe import NullObserver, Observer
from hybridmem.protocols import Preloading
from hybridmem.read.ranking import (Candidate, Weights, best, breakdown, explain, graph_seeds,
                                    last_written, uses_history)
from hybridmem.stores import Stores

__all__ = ["GRAPH_SEED_HITS", "NAME_VECTORS", "POOL_EXTRA", "POOL_PER_LIMIT", "QUERY_CACHE",
           "NameVectors", "QueryBatcher", "Retriever", "Warmed", "pool_size"]

#: How many of the top hits lend their relations to context() (graph search uses graph_seeds).
GRAPH_SEED_HITS = 5
Embed = Callable[[Sequence[str]], list[list[float]]]
#: Query embeddings kept per Memory (~12 KB each for 384 Python floats: ~6 MB when full).
QUERY_CACHE = 512
#: A search fetches from each retriever at least this many times its ``limit`` (at most
#: :data:`POOL_EXTRA` more than it): fusion can only lift what some retriever fetched.
POOL_PER_LIMIT = 2
POOL_EXTRA = 500
#: Threads that run a search's lexical lookup beside its embedding (one per concurrent search),
#: and the reads of a context() that do not wait for one another: a first one on a Chroma server
#: runs five at once (the graph's and the lexical cache's loads, and three questions about the
#: user's sections).
READ_THREADS = 6


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
        frequency=settings.frequency_weight,
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


@dataclass(frozen=True)
class Warmed:
    """What :meth:`Retriever.warm` started for a gathering: the query's embedding and the
    graph's entities of the query (None: not started)."""

    vector: Future[list[float]] | None
    entities: Future[list[str]] | None


class Retriever:
    """Hybrid search over one Memory's stores."""

    def __init__(self, settings: Settings, stores: Stores, *, embed: Embed,
                 names: NameVectors | None = None, observer: Observer | None = None) -> None:
        self._settings = settings
        #: times the vector, lexical and graph stages (the embed stage is the embedder's)
        self._observe = observer if observer is not None else NullObserver()
        self._stores = stores
        self._embed = embed
        self.weights = weights_of(settings)
        self._batch = QueryBatcher(embed)
        #: The name vectors of the topic signal (None: no topic signal), see
        #: hybridmem.graph.name_vectors.
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

    def pool(self) -> ThreadPoolExecutor:
        """The reader threads (made at first use): reads of one call that do not wait for one
        another run on them."""
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

    def warm(self, user_id: str, query: str, *, embed: bool = False) -> Warmed:
        """Start loading what a gathering for the user will read first: a reader thread asks
        the graph for the query's entities (unless there is no graph signal), another loads
        the lexical cache if it loads at a first read
        (:class:`~hybridmem.protocols.Preloading`), and with ``embed`` a third embeds the
        query. A first read of the user then loads the graph (a file, or a server's snapshot
        and the records after it) and the texts while the caller does something else:
        context() asks which sections the user has (three scans of metadata, round trips on a
        Chroma server), and the query is embedded meanwhile instead of after them. A failure
        is the gathering's to raise."""
        lexical = self._stores.lexical
        if self.weights.lexical > 0 and isinstance(lexical, Preloading):
            self.pool().submit(contextvars.copy_context().run, lexical.preload, user_id)
        vector = self.pool().submit(contextvars.copy_context().run, self._query_vector,
                                    query) if embed and self._vector_weighted() else None
        entities = self.pool().submit(contextvars.copy_context().run,
                                      self._stores.graph.entities_in, user_id, query) \
            if self.weights.graph > 0 else None
        return Warmed(vector=vector, entities=entities)

    def _vector_weighted(self) -> bool:
        """Whether a gathering searches by vector (also when no signal is weighted at all)."""
        return self.weights.vector > 0 or not self.weights.lexical > 0

    def search(self, user_id: str, query: str, *, limit: int, where: Filter | None,
               now: datetime | None = None) -> list[Hit]:
        """The ``limit`` best memories for ``query`` among those matching ``where``; ages and
        expiry are judged at ``now`` (default: the current time; a past time for ``as_of``)."""
        return self.gather(user_id, query, [(limit, where)], now=now)[0]

    def gather(self, user_id: str, query: str, sections: Sequence[tuple[int, Filter | None]],
               *, now: datetime | None = None,
               warmed: Warmed | None = None) -> list[list[Hit]]:
        """The best memories for ``query`` in each ``(limit, where)`` section, from one
        gathering: one query embedding, one nearest-neighbour search (see
        :meth:`~hybridmem.protocols.VectorStore.query_sections`), one lexical lookup whose
        hits are hydrated as soon as they are known, and one hydration of the graph's, whatever
        the number of sections. context() reads its memories, summaries and procedures this
        way: on a Chroma server each of those reads is a round trip.

        The first section ranks exactly as :meth:`search` ranks it alone. The others share two
        parts: the lexical list is the widest section's, cut to each section's pool (BM25's
        order is total, so the cut is the list a search of its own would fetch), and the graph
        activation runs once, from the first section's candidates: summaries and procedures get
        their graph signal from the neighbourhood of the question's best memories and entities.
        The activation is the costliest in-process step of a search (~4 ms at 3,000 memories);
        run per section it would triple a context()'s graph time. Without the graph
        (``graph_weight`` 0) every section ranks exactly as its own search.

        The graph is asked for the query's entities on a reader thread as the gathering starts
        (see :meth:`warm`), unless the caller started it already (``warmed``, which may hold
        the query's embedding too)."""
        s, w = self._settings, self.weights
        pools = [pool_size(s.candidates, limit) for limit, _ in sections]
        if not sections:
            return []
        widest = max(pools)
        items: list[dict[str, MemoryItem]] = [{} for _ in sections]
        cands: list[dict[str, Candidate]] = [{} for _ in sections]

        def cand_of(n: int) -> Callable[[str], Candidate]:
            mine = cands[n]

            def cand(memory_id: str) -> Candidate:
                c = mine.get(memory_id)  # (not setdefault: it would build a Candidate every call)
                if c is None:
                    c = mine[memory_id] = Candidate(memory_id)
                return c
            return cand

        makers = [cand_of(n) for n in range(len(sections))]
        wheres = [where for _, where in sections]
        vector = self._vector_weighted()
        lexical: Future[tuple[list[tuple[str, float]], list[list[MemoryItem]]]] | None = None
        if w.lexical > 0 and vector:  # FTS5 runs while the query is embedded (both free the GIL)
            lexical = self.pool().submit(contextvars.copy_context().run,  # a trace's parent
                                         self._lexical_read, user_id, query, widest, wheres)
        warm = warmed if warmed is not None else self.warm(user_id, query) if vector else None
        qvec: list[float] | None = None
        if vector:
            qvec = warm.vector.result() if warm is not None and warm.vector is not None \
                else self._query_vector(query)
            with self._observe.stage("vector"):
                lists = self._stores.vectors.query_sections(
                    user_id, qvec, [(pool, where) for pool, (_, where) in zip(pools, sections)])
            for n, hits in enumerate(lists):
                for rank, hit in enumerate(hits, 1):
                    items[n][hit.item.id] = hit.item
                    c = makers[n](hit.item.id)
                    c.vector, c.vector_rank = hit.similarity, rank
        read: set[str] = set()  # memories already read for every section
        if w.lexical > 0:
            if lexical is not None:
                found, got = lexical.result()
                read.update(m for m, _ in found)
                for n, section_items in enumerate(got):
                    for item in section_items:
                        items[n].setdefault(item.id, item)
            else:
                found = self._lexical(user_id, query, widest)
            for n, pool in enumerate(pools):
                for rank, (memory_id, score) in enumerate(found[:pool], 1):
                    c = makers[n](memory_id)
                    c.lexical, c.lexical_rank = score, rank
        if w.graph > 0:  # one activation, from the first section's candidates
            with self._observe.stage("graph"):
                if warm is not None and warm.entities is not None:
                    warm.entities.result()
                reached = self._activation(user_id, query, list(cands[0].values()), qvec)
                # strongest first, ties by id: each section's cut and ranks are canonical
                strongest = sorted([(-r[0], m) for m, r in reached.items()])
                for n, pool in enumerate(pools):
                    _join_graph(reached, strongest, cands[n], makers[n], pool)
        missing = [[m for m in cands[n] if m not in items[n] and m not in read]
                   for n in range(len(sections))]
        wanted = list(dict.fromkeys(m for ids in missing for m in ids))
        if wanted:
            got = self._stores.vectors.get_sections(user_id, wanted, wheres)
            for n, section_items in enumerate(got):
                mine = set(missing[n])
                items[n].update((i.id, i) for i in section_items if i.id in mine)
        now = now or utcnow()
        return [self._ranked(items[n], cands[n], limit, now)
                for n, (limit, _) in enumerate(sections)]

    def _ranked(self, items: dict[str, MemoryItem], cands: dict[str, Candidate], limit: int,
                now: datetime) -> list[Hit]:
        """One section's candidates, hydrated, aged at ``now`` and fused into its best ``limit``
        (expired ones and those its filter refused are dropped).

        As :func:`~hybridmem.read.ranking.fuse`, in its two halves: without a recency or
        frequency weight no score depends on a candidate's ages and counts, so only the
        ``limit`` hits returned get them (for their breakdown), not the few hundred candidates."""
        w = self.weights
        history = uses_history(w)
        kept: list[Candidate] = []
        for memory_id, c in cands.items():
            item = items.get(memory_id)
            if item is None or (item.expires_at is not None and item.expires_at <= now):
                continue
            c.importance, c.confidence = item.importance, item.confidence
            if history:
                _fill_history(c, item, now)
            kept.append(c)
        hits = []
        for score, c in best(kept, w, limit):
            item = items[c.memory_id]
            if not history:
                _fill_history(c, item, now)
            b = breakdown(c, score, w)
            hits.append(Hit(item=item, score=score, breakdown=b, why=explain(b)))
        return hits

    def _lexical(self, user_id: str, query: str, pool: int) -> list[tuple[str, float]]:
        with self._observe.stage("lexical"):
            return self._stores.lexical.search(user_id, query, limit=pool)

    def _lexical_read(self, user_id: str, query: str, pool: int, wheres: Sequence[Filter | None],
                      ) -> tuple[list[tuple[str, float]], list[list[MemoryItem]]]:
        """The lexical hits, and their memories in each section (``wheres``), read as soon as
        the hits are known: before a Chroma server's record copy is loaded that read is a round
        trip, and it then overlaps the vector search and the graph instead of following them.
        (With the copy the same memories are read in the process, earlier.)"""
        found = self._lexical(user_id, query, pool)
        if not found:
            return found, [[] for _ in wheres]
        return found, self._stores.vectors.get_sections(user_id, [m for m, _ in found], wheres)

    def _activation(
        self, user_id: str, query: str, found: list[Candidate], qvec: Sequence[float] | None,
    ) -> dict[str, tuple[float, int, str]]:
        """Graph activation (see :mod:`hybridmem.graph.activation`) from the query's entities and
        the best candidates ``found`` so far: what it reaches, by memory id. With the query's
        embedding ``qvec`` and ``graph_topic`` > 0 the graph also gets the query's similarity to
        node names (from the vectors stored when the nodes were written: a search never embeds a
        name)."""
        s, names = self._settings, self._names
        seeds = graph_seeds(found, self.weights, s.graph_seeds)
        similar = None
        linked: list[tuple[str, float]] = []
        if qvec is not None and s.graph_topic > 0 and names is not None:
            vector = qvec

            def similar(keys: Sequence[str], labels: Sequence[str]) -> list[float]:
                return names.similar(user_id, vector, keys, labels)

            if s.graph_link > 0:
                linked = [(key, s.graph_link * cos) for key, cos
                          in names.nearest(user_id, qvec, LINK_NODES, LINK_FLOOR)]

        return self._stores.graph.activation(
            user_id, seeds, query, hops=s.graph_hops, episodic=s.graph_episodic,
            topic=s.graph_topic, similar=similar, linked=linked,
        )


def _fill_history(c: Candidate, item: MemoryItem, now: datetime) -> None:
    """A candidate's ages (at ``now``) and counts, from its memory."""
    c.age_days = max((now - item.created_at).total_seconds() / 86400.0, 0.0)
    c.idle_days = max((now - last_written(item, now)).total_seconds() / 86400.0, 0.0)
    c.mentions, c.accesses = item.mention_count, item.access_count


def _join_graph(reached: dict[str, tuple[float, int, str]], strongest: list[tuple[float, str]],
                known: Mapping[str, Candidate], cand: Callable[[str], Candidate],
                pool: int) -> None:
    """Give every candidate the activation reached its graph signal; of the memories only the
    graph found, the ``pool`` strongest join. ``strongest``: ``reached`` as (-signal, id),
    sorted (strongest first, ties by id), so the cut and the ranks are canonical; ``known``:
    the section's candidates so far."""
    fresh = rank = 0
    for _s, memory_id in strongest:
        if memory_id not in known:  # (ids are unique: one that joins is not met again)
            if fresh == pool:
                continue
            fresh += 1
        rank += 1
        c = cand(memory_id)
        c.graph, c.graph_hops, c.graph_path = reached[memory_id]
        c.graph_rank = rank
