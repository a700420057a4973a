"""The :class:`Memory` facade: validates at the boundary, takes the user's lock, and composes.

It holds no rules of its own. Where each concern lives:

- :mod:`hybridmem.backends` — what a Memory is made of: the embedder, extractor, counter and
  stores the settings name, assembled with the write and read pipelines
  (:func:`~hybridmem.backends.assemble`);
- :mod:`hybridmem.write.writer` — the write path (plan, dedup/merge, extraction, apply, supersede);
- :mod:`hybridmem.read.retrieval` and :mod:`hybridmem.read.access` — hybrid search; access counts and
  the key-fact/episode cache;
- :mod:`hybridmem.read.context` — what enters a context, in what order, within the budget;
- :mod:`hybridmem.write.episodes` and :mod:`hybridmem.ops.bundle` — summaries, export and import;
- :mod:`hybridmem.ops.backup` and :mod:`hybridmem.chroma.reembed` — snapshots with rotation, and
  moving memories to another embedder.
"""

from __future__ import annotations

import builtins
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, overload

from pydantic import ValidationError

from hybridmem.write import distill, episodes
from hybridmem.write import policy
from hybridmem import backends
from hybridmem.ops.backup import load_snapshot, write_snapshot
from hybridmem.ops.bundle import export_bundle, import_bundle
from hybridmem.read.context import assemble, build_context, section_budgets
from hybridmem.config import Settings
from hybridmem.errors import (
    BackendError,
    ClosedError,
    ConfigError,
    HybridMemError,
    InvalidInputError,
    NotFoundError,
)
from hybridmem.filters import all_of, as_of_filter, eq, memory_filter
from hybridmem.graph.export import check_format, graph_bytes
from hybridmem.models import (
    MAX_LIMIT,
    MAX_PATHS,
    AddRequest,
    ChatReply,
    Context,
    Entity,
    GraphEntity,
    GraphPath,
    GraphRelation,
    HistoryEvent,
    Hit,
    MemoryItem,
    MemoryStatus,
    Relation,
    UpdateRequest,
    Usage,
    UserStats,
    as_utc,
    pydantic_message,
    to_request,
    utcnow,
    validate_as_of,
    validate_limit,
    validate_memory_id,
    validate_text,
    validate_user_id,
)
from hybridmem.protocols import (
    ChatMessage,
    ChatModel,
    Embedder,
    Extractor,
    GraphStore,
    HistoryLog,
    LexicalIndex,
    Pingable,
    Reembeddable,
    Reporting,
    TokenCounter,
    VectorStore,
)
from hybridmem.observe import Observer
from hybridmem.read.retrieval import GRAPH_SEED_HITS

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["Memory"]

log = logging.getLogger(__name__)
#: Episodes (summaries) offered to a context, searched separately so they always get a place.
MAX_CONTEXT_EPISODES = 2
#: Procedures offered to a context, searched separately like episodes.
MAX_CONTEXT_PROCEDURES = 3
#: Key facts offered to a context beyond those the search found.
MAX_CONTEXT_FACTS = 10
#: The longest path (hops) :meth:`Memory.query_path` looks for; with ``MAX_PATHS`` it bounds the
#: search's cost on any graph.
MAX_PATH_DEPTH = 6
#: Longest key of :meth:`Memory.remember`.
MAX_KEY_CHARS = 100
#: Longest idle time :meth:`Memory.prune` takes (a thousand years: the cutoff stays a real date).
MAX_IDLE_DAYS = 365_000.0


def _check_number(name: str, value: object, top: float) -> None:
    """Refuse anything but a finite number from 0 to ``top`` (a bool is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and 0 <= value <= top):
        raise InvalidInputError(f"{name} must be a number from 0 to {top:g}, got {value!r}")


class Memory:
    """Long-term memory for LLM apps: add, search, context, chat, forget — per user.

    ``Memory()`` reads ``HYBRIDMEM_*`` settings from the environment; every seam can be passed in
    (tests pass real, small backends rather than mocks). Safe to share between threads. What it
    creates itself (stores, endpoint clients) it closes in :meth:`close`; what it is given, the
    caller closes. ``observer`` (see :mod:`hybridmem.observe`) is told how long each stage of
    the work takes and what tokens the endpoint used; by default nothing is.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        embedder: Embedder | None = None,
        extractor: Extractor | None = None,
        chat_model: ChatModel | None = None,
        vector_store: VectorStore | None = None,
        lexical_index: LexicalIndex | None = None,
        graph_store: GraphStore | None = None,
        history_log: HistoryLog | None = None,
        token_counter: TokenCounter | None = None,
        observer: Observer | None = None,
    ) -> None:
        parts = backends.assemble(
            settings if settings is not None else Settings(), embedder=embedder,
            extractor=extractor, chat_model=chat_model, vector_store=vector_store,
            lexical_index=lexical_index, graph_store=graph_store, history_log=history_log,
            token_counter=token_counter, observer=observer,
        )
        self.settings = parts.settings
        self._parts = parts  # closed in close()
        self._embedder = parts.embedder
        self._extractor = parts.extractor
        self._counter = parts.counter
        self._stores = parts.stores  # the four stores, used through their Protocols
        self._names = parts.names  # the graph topic signal's name vectors, or None
        self._usage = parts.usage
        self._writer = parts.writer  # the write path
        self._lock = parts.writer.locks  # the users' write locks (leases with a Chroma server)
        self._retriever = parts.retriever  # hybrid search
        self._access = parts.access  # access counts, written in batches
        self._extras = parts.extras  # key facts, procedures and episodes of a context
        self._closed = False

    # -- what it is made of ------------------------------------------------------------------------
    @property
    def embedder(self) -> Embedder:
        """The embedder (its ``name`` and ``dimension`` are stored with every collection)."""
        return self._embedder

    @property
    def extractor(self) -> Extractor | None:
        """The entity extractor (None when ``extractor="none"``)."""
        return self._extractor

    @property
    def tokens(self) -> TokenCounter:
        """The token counter contexts are measured with."""
        return self._counter

    @property
    def usage(self) -> Usage:
        """Token usage of every model call made so far (extraction, judge, summaries, chat)."""
        return self._usage.total

    @property
    def chat_model(self) -> ChatModel:
        """The chat endpoint, created on first use (offline use never needs one)."""
        return self._parts.chat.get()

    # -- lifecycle ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Write buffered access counts, close the stores and the clients this Memory created;
        idempotent. A closed Memory refuses use with :class:`ClosedError`."""
        if self._closed:
            return
        self._closed = True
        self._parts.close()

    def __enter__(self) -> Memory:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = self.settings.chroma_url or str(self.settings.data_dir)
        return f"{type(self).__name__}(store={mode!r}, embedder={self._embedder.name!r})"

    def _check(self, user_id: str) -> str:
        if self._closed:
            raise ClosedError("this Memory is closed; create a new one")
        return validate_user_id(user_id)

    def _embed(self, texts: Sequence[str]) -> builtins.list[builtins.list[float]]:
        return self._parts.embed(texts)

    # -- writes ------------------------------------------------------------------------------------
    def add(
        self,
        user_id: str,
        text: str,
        *,
        kind: str = "fact",
        category: str = "general",
        importance: float = 0.5,
        confidence: float = 1.0,
        source: str = "user",
        metadata: Mapping[str, Any] | None = None,
        created_at: datetime | None = None,
        expires_at: datetime | None = None,
        infer: bool = True,
        entities: Sequence[str | Mapping[str, Any] | Entity] | None = None,
        relations: Sequence[Sequence[str] | Mapping[str, Any] | Relation] | None = None,
    ) -> MemoryItem:
        """Store one memory and return it (or the existing identical memory, its count bumped).

        ``entities`` and ``relations`` are what the caller already knows the text is about (a
        catalogue's products, a CRM's accounts): entities as names or ``{"name", "type"}``,
        relations as ``(subject, predicate, object)`` or ``{"subject", "predicate", "object"}``.
        They join the graph as the extractor's findings do, merged with them — the same name
        resolution, this memory as their evidence — so forget, export and import treat them
        alike (limits: :class:`~hybridmem.models.Knowledge`)."""
        request = {
            "text": text, "kind": kind, "category": category, "importance": importance,
            "confidence": confidence, "source": source, "metadata": metadata,
            "created_at": created_at, "expires_at": expires_at,
            "entities": entities, "relations": relations,
        }
        return self.add_many(user_id, [request], infer=infer)[0]

    def add_many(
        self,
        user_id: str,
        items: Sequence[str | Mapping[str, Any] | AddRequest],
        *,
        infer: bool = True,
    ) -> builtins.list[MemoryItem]:
        """Store many memories in one batch (one embedding call, one write per store).

        Each item is a text or a dict of :meth:`add`'s fields (``entities`` and ``relations``
        included). Facts equal to a current memory up to
        case, spacing and punctuation, or near-duplicates of one (token Jaccard / cosine above the
        configured bars), are merged into it instead of stored twice; a fact that contradicts an
        older one supersedes it (see :mod:`hybridmem.write.writer`). Conversation turns are never merged.
        Returns one item per input, in order (a merged input returns the memory it merged into).
        """
        self._check(user_id)
        if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
            raise InvalidInputError("items must be a list of texts or dicts")
        requests = [to_request(item) for item in items]
        if not requests:
            return []
        # the writer takes the user's lock itself, after the model calls (see hybridmem.write.writer)
        stored = self._writer.write(user_id, requests, infer=infer)
        self._extras.changed(user_id, stored)
        return stored

    def add_messages(
        self, user_id: str, messages: Sequence[Mapping[str, str]], *, infer: bool = True
    ) -> builtins.list[MemoryItem]:
        """Store conversation turns (``{"role": ..., "content": ...}``) as memories of kind "turn".

        With an endpoint configured (and ``infer``), the model also reads the new turns for key
        facts in one structured call (``distill`` setting), stored as :meth:`remember` stores
        them, and every ``episode_turns`` turns writes a summary. Once the turns are stored this
        never raises: a failed summary is logged and tried again at the next call; failed
        distillation is logged and the turns stay as they are."""
        stored = self.add_many(user_id, episodes.turn_requests(messages), infer=infer)
        if not (infer and self.settings.llm_configured):
            return stored
        every = self.settings.episode_turns
        if every > 0 and len(episodes.unsummarized(self._stores.vectors, user_id)) >= every:
            try:
                self.summarize(user_id)
            except HybridMemError as exc:
                log.warning("summary failed (%s); retried later", type(exc).__name__)
        if self.settings.distill and stored:
            try:
                self._distill(user_id, stored)
            except HybridMemError as exc:
                log.warning("key-fact distillation failed (%s); the turns are stored",
                            type(exc).__name__)
        return stored

    def _distill(self, user_id: str, turns: builtins.list[MemoryItem]) -> builtins.list[MemoryItem]:
        """Key facts the model reads in ``turns`` (one structured call, outside the user's lock),
        each stored as the current value of its key; returns them. A reply that is not the
        asked JSON raises :class:`BackendError` and stores nothing."""
        known = sorted({i.key for i in self._stores.vectors.list(
            user_id, where=all_of(eq("has_key", True), eq("current", True))) if i.key})
        result = self.chat_model.complete(distill.distill_messages(turns, known),
                                          json_schema=distill.DISTILL_SCHEMA,
                                          schema_name="distill_key_facts")
        self._usage.add(result.usage)
        facts = distill.parse_facts(result.text)
        if facts is None:
            raise BackendError("the endpoint's key-fact reply was not the asked JSON")
        return [self._upsert_key(user_id, fact.key, distill.fact_request(fact, turns),
                                 cause="distill") for fact in facts]

    def summarize(self, user_id: str) -> MemoryItem | None:
        """Store a summary episode of the turns since the last one (one LLM call, made outside
        the user's lock); None when there is nothing new. ``add_messages`` calls this every
        ``episode_turns`` turns when an endpoint is configured."""
        self._check(user_id)
        turns = episodes.unsummarized(self._stores.vectors, user_id)[-episodes.MAX_SUMMARY_TURNS:]
        if not turns:
            return None
        result = self.chat_model.complete(episodes.summary_messages(turns))
        self._usage.add(result.usage)
        if not result.text.strip():
            return None
        prepared = self._writer.prepare(user_id, [episodes.summary_request(turns, result.text)],
                                        infer=False, cause="summary")
        with self._lock(user_id):  # another call may have summarised these turns meanwhile
            if not episodes.still_unsummarized(self._stores.vectors, user_id, turns):
                return None
            (item,) = self._writer.commit(prepared)
            self._extras.changed(user_id, [item])
            return item

    def reextract(self, user_id: str) -> int:
        """Extract entities again, with the configured extractor, from the memories a failing
        model left marked ``needs_extraction``; returns how many were re-extracted (and unmarked).
        The model calls run outside the user's lock."""
        self._check(user_id)
        results = self._writer.reextract(user_id)
        with self._lock(user_id):
            return self._writer.store_reextracted(user_id, results)

    def remember(
        self,
        user_id: str,
        key: str,
        value: str,
        *,
        category: str = "general",
        confidence: float = 1.0,
        importance: float = 0.8,
    ) -> MemoryItem:
        """Upsert a key fact: one current value per ``key``; older values stay as superseded history."""
        self._check(user_id)
        key = validate_text(key, what="key").strip()
        if len(key) > MAX_KEY_CHARS:
            raise InvalidInputError(f"key must be at most {MAX_KEY_CHARS} characters")
        request = to_request({
            "text": f"{key}: {validate_text(value, what='value')}", "category": category,
            "confidence": confidence, "importance": importance, "source": "user",
        })
        return self._upsert_key(user_id, key, request, cause="remember")

    def _upsert_key(self, user_id: str, key: str, request: AddRequest, *, cause: str) -> MemoryItem:
        """Store ``request`` as the current value of ``key`` (embedded before the lock is taken);
        the key's older values are superseded, an identical current value is returned as it is."""
        prepared = self._writer.prepare(user_id, [request], infer=False, key=key, cause=cause)
        with self._lock(user_id):
            old = self._stores.vectors.list(user_id, where=all_of(eq("key", key), eq("current", True)))
            if old and old[0].text == request.text:
                return old[0]
            (item,) = self._writer.commit(prepared)
            self._extras.changed(user_id, [item])
            self._writer.supersede(user_id, [o for o in old if o.id != item.id], item,
                                   cause=f"new value for {key!r}")
            return item

    def facts(
        self, user_id: str, *, category: str | None = None, as_of: datetime | None = None
    ) -> builtins.list[MemoryItem]:
        """The user's current key facts (see :meth:`remember`), by key; with ``as_of``, the
        values they had at that time."""
        self._check(user_id)
        when = validate_as_of(as_of)
        where = all_of(eq("has_key", True), memory_filter(None, category=category, as_of=when))
        return sorted(self._stores.vectors.list(user_id, where=where), key=lambda i: i.key or "")

    def update(
        self,
        user_id: str,
        memory_id: str,
        *,
        text: str | None = None,
        category: str | None = None,
        importance: float | None = None,
        confidence: float | None = None,
        metadata: Mapping[str, Any] | None = None,
        expires_at: datetime | None = None,
    ) -> MemoryItem:
        """Change a memory; a new text is re-embedded, re-indexed and re-extracted.

        Fields left out (None) keep their value. ``metadata`` replaces the whole mapping
        (``metadata={}`` clears it). To merge, pass the old mapping with your changes:
        ``metadata={**item.metadata, "tier": "gold"}``; to remove a key, pass it without that key:
        ``metadata={k: v for k, v in item.metadata.items() if k != "tier"}``."""
        self._check(user_id)
        meta = dict(metadata) if isinstance(metadata, Mapping) else metadata  # lists are refused
        try:
            request = UpdateRequest(text=text, category=category, importance=importance,
                                    confidence=confidence, expires_at=expires_at, metadata=meta)
        except ValidationError as exc:
            raise InvalidInputError(pydantic_message(exc.errors())) from exc
        prepared = None
        if request.text is not None:  # embedded and extracted before the lock is taken
            source = self.get(user_id, memory_id).source
            prepared = self._writer.prepare_text(user_id, request.text, source=source)
        with self._lock(user_id):
            item = self.get(user_id, memory_id)
            changes = {**request.model_dump(exclude_none=True), "updated_at": utcnow()}
            updated = item.model_copy(update=changes)
            self._writer.update(user_id, item, updated, prepared=prepared)
            self._extras.changed(user_id, [updated])
            return self.get(user_id, memory_id)

    def forget(self, user_id: str, memory_id: str | None = None) -> int:
        """Delete one memory, or with no id everything of the user. Returns how many were removed."""
        self._check(user_id)
        with self._lock(user_id):
            if memory_id is not None:
                item = self.get(user_id, memory_id)
                self._writer.delete(user_id, [memory_id], action="delete",
                                    cause="deleted by the caller")
                self._extras.changed(user_id, [item])
                return 1
            count = self._stores.vectors.count(user_id)
            self._access.forget(user_id)
            self._extras.forget(user_id)
            self._stores.drop_user(self.settings, user_id)
            return count

    def purge_now(self) -> None:
        """Make every erasure so far physical now, instead of within ``purge_delay`` seconds:
        embedded Chroma's shared file is compacted before this returns (a rewrite of the whole
        file; with a Chroma server, its operator compacts). See docs/lifecycle.md, 'Erasure'."""
        if self._closed:
            raise ClosedError("this Memory is closed; create a new one")
        self._stores.vectors.purge()

    def prune(
        self,
        user_id: str,
        *,
        dry_run: bool = True,
        min_importance: float = 0.1,
        idle_days: float = 120.0,
    ) -> builtins.list[MemoryItem]:
        """Apply the retention policy: expired memories, and memories with importance below
        ``min_importance`` not accessed (or created) for ``idle_days``. Returns what is (or, with
        ``dry_run``, would be) removed; a dry run changes nothing stored. ``min_importance``
        runs from 0 to 1 and ``idle_days`` from 0 to :data:`MAX_IDLE_DAYS`
        (:class:`InvalidInputError` otherwise, before anything is read)."""
        self._check(user_id)
        if not isinstance(dry_run, bool):
            raise InvalidInputError(f"dry_run must be true or false, got {dry_run!r}")
        _check_number("min_importance", min_importance, 1.0)
        _check_number("idle_days", idle_days, MAX_IDLE_DAYS)
        self._access.flush(user_id)
        with self._lock(user_id):
            expired, idle = policy.doomed(self._stores.vectors.list(user_id), now=utcnow(),
                                          min_importance=min_importance, idle_days=idle_days)
            if not dry_run and expired:
                self._writer.delete(user_id, [i.id for i in expired], action="expire",
                                    cause="expires_at passed")
            if not dry_run and idle:
                self._writer.delete(user_id, [i.id for i in idle], action="delete", cause=(
                    f"pruned: importance < {min_importance}, idle {idle_days} days"))
            if not dry_run and (expired or idle):
                self._extras.forget(user_id)
            return expired + idle

    # -- reads -------------------------------------------------------------------------------------
    def get(self, user_id: str, memory_id: str) -> MemoryItem:
        """One memory by id; :class:`NotFoundError` when the user has no such memory."""
        self._check(user_id)
        found = self._stores.vectors.get(user_id, [validate_memory_id(memory_id)])
        if not found:
            raise NotFoundError(f"user {user_id!r} has no memory {memory_id!r}")
        return found[0]

    def list(
        self,
        user_id: str,
        *,
        category: str | None = None,
        where: Mapping[str, Any] | None = None,
        limit: int = 100,
        offset: int = 0,
        include_superseded: bool = False,
    ) -> builtins.list[MemoryItem]:
        """The user's memories, oldest first, optionally filtered."""
        self._check(user_id)
        validate_limit(limit)
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise InvalidInputError("offset must be a non-negative integer")
        flt = memory_filter(where, category=category, current_only=not include_superseded)
        items = sorted(self._stores.vectors.list(user_id, where=flt),
                       key=lambda i: (i.created_at, i.id))
        return items[offset : offset + limit]

    def count(self, user_id: str) -> int:
        """How many memories the user has (current and superseded)."""
        self._check(user_id)
        return self._stores.vectors.count(user_id)

    def history(self, user_id: str, memory_id: str | None = None) -> builtins.list[HistoryEvent]:
        """What happened to the user's memories (add, merge, update, supersede, expire, delete),
        oldest first; one memory's events when ``memory_id`` is given."""
        self._check(user_id)
        if memory_id is not None:
            validate_memory_id(memory_id)
        return self._stores.history.list(user_id, memory_id)

    def search(
        self,
        user_id: str,
        query: str,
        *,
        limit: int = 10,
        where: Mapping[str, Any] | None = None,
        category: str | None = None,
        include_superseded: bool = False,
        min_score: float | None = None,
        as_of: datetime | None = None,
    ) -> builtins.list[Hit]:
        """Hybrid search: vector ∪ lexical ∪ graph neighbourhood, fused (see :mod:`ranking`).

        Hits scoring below ``min_score`` (default: the ``min_score`` setting) are left out.
        With ``as_of``, the search sees the memory as it stood at that time: memories recorded
        by then and not yet superseded (all recorded by then with ``include_superseded``), aged
        and expired as of that time."""
        self._check(user_id)
        validate_text(query, what="query")
        validate_limit(limit)
        floor = self._min_score(min_score)
        when = validate_as_of(as_of)
        flt = memory_filter(where, category=category, current_only=not include_superseded,
                            as_of=when)
        hits = self._retriever.search(user_id, query, limit=limit, where=flt, now=when)
        if floor > 0:  # 0 is off: a fused score can be negative (cosine below 0)
            hits = [h for h in hits if h.score >= floor]
        self._access.note(user_id, [h.item.id for h in hits], utcnow())
        return hits

    def _min_score(self, min_score: float | None) -> float:
        floor = self.settings.min_score if min_score is None else min_score
        if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not (
                math.isfinite(floor) and floor >= 0):
            raise InvalidInputError(f"min_score must be a finite number >= 0, got {floor!r}")
        return float(floor)

    def refresh(self, user_id: str) -> None:
        """With a Chroma server, catch up with other processes' writes to the user now, instead
        of within ``refresh_interval`` (1 s); embedded, there is nothing to catch up with."""
        self._check(user_id)
        self._stores.lexical.refresh(user_id)
        self._stores.refresh(user_id)

    def flush_access(self) -> None:
        """Write buffered access counts and last-accessed times (also done on close)."""
        self._access.flush()

    def context(
        self,
        user_id: str,
        query: str,
        *,
        max_tokens: int | None = None,
        where: Mapping[str, Any] | None = None,
        category: str | None = None,
        limit: int = 30,
        include_superseded: bool = False,
        min_score: float | None = None,
        budgets: Mapping[str, int] | None = None,
        as_of: datetime | None = None,
    ) -> Context:
        """The best memories for ``query`` packed into at most ``max_tokens`` tokens (exact).

        Sections: key facts (see :meth:`remember`), relations of the top memories, procedures,
        conversation summaries, then memories with their dates (see
        :func:`hybridmem.read.context.assemble`). Each section is guaranteed a share of the budget —
        ``budgets`` names tokens per section (``{"facts": 150, "episodes": 200}``), the others
        keep :data:`~hybridmem.read.context.DEFAULT_SHARES` — and what a section leaves unused goes to
        the others. ``min_score`` and ``as_of`` work as in :meth:`search` (key facts are not
        search hits: they are shown whatever their score). Only currently valid memories are
        shown unless ``include_superseded``; superseded ones are then labelled as such."""
        budget = self.settings.context_max_tokens if max_tokens is None else max_tokens
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
            raise InvalidInputError(f"max_tokens must be a positive integer, got {budget!r}")
        if budgets is not None and not isinstance(budgets, Mapping):
            raise InvalidInputError("budgets must be a mapping of section names to token counts")
        section_budgets(budget, budgets)  # refuse a bad budget before any search
        self._check(user_id)
        validate_text(query, what="query")
        validate_limit(limit)
        floor = self._min_score(min_score)
        when = validate_as_of(as_of)
        # the graph loads, and the query is embedded, while the sections are asked for
        warmed = self._retriever.warm(user_id, query, embed=True)
        # about now, every section below shows current memories only: so the question is
        has_facts, has_episodes, has_procedures = self._extras.of(
            user_id, current=when is None, pool=self._retriever.pool())
        # one gathering feeds every section: the memories, then summaries and procedures
        sections = [(limit, memory_filter(where, category=category,
                                          current_only=not include_superseded, as_of=when))]
        if has_episodes:
            sections.append((MAX_CONTEXT_EPISODES, memory_filter({"kind": "summary"}, as_of=when)))
        if has_procedures:
            sections.append((MAX_CONTEXT_PROCEDURES,
                             memory_filter({"kind": "procedure"}, as_of=when)))
        found = self._retriever.gather(user_id, query, sections, now=when, warmed=warmed)
        if floor > 0:  # 0 is off: a fused score can be negative (cosine below 0)
            found = [[h for h in hits if h.score >= floor] for hits in found]
        self._access.note(user_id, list(dict.fromkeys(h.item.id for hits in found for h in hits)),
                          utcnow())
        hits = found[0]
        summaries = found[1] if has_episodes else []
        procedures = found[-1] if has_procedures else []
        facts = self.facts(user_id, category=category, as_of=as_of)[:MAX_CONTEXT_FACTS] \
            if has_facts else []
        relations = self._stores.graph.relations(
            user_id, [h.item.id for h in hits[:GRAPH_SEED_HITS]]
        )
        with self._parts.observer.stage("pack"):
            lines = assemble(hits, facts=facts, relations=relations, episodes=summaries,
                             procedures=procedures, as_of=validate_as_of(as_of))
            return build_context(lines, counter=self._counter, max_tokens=budget,
                                 budgets=budgets)

    # -- the graph ---------------------------------------------------------------------------------
    def entities(self, user_id: str) -> builtins.list[GraphEntity]:
        """Every entity of the user's graph, by key."""
        self._check(user_id)
        return self._stores.graph.entities(user_id)

    def relations(self, user_id: str) -> builtins.list[GraphRelation]:
        """Every relation of the user's graph (one per edge and predicate)."""
        self._check(user_id)
        return self._stores.graph.relations(user_id)

    @overload
    def query_path(self, user_id: str, a: str, b: str, *, max_depth: int = 3,
                   k: None = None) -> builtins.list[str]: ...
    @overload
    def query_path(self, user_id: str, a: str, b: str, *, max_depth: int = 3,
                   k: int) -> builtins.list[GraphPath]: ...
    def query_path(self, user_id: str, a: str, b: str, *, max_depth: int = 3,
                   k: int | None = None) -> builtins.list[str] | builtins.list[GraphPath]:
        """How two entities are related in the user's graph, ignoring the edges' direction.

        Without ``k``: the shortest path as readable edges ("Alice -bought-> ROG laptop"), []
        when there is none of at most ``max_depth`` hops. With ``k`` (1 to :data:`MAX_PATHS`):
        up to ``k`` shortest simple paths, shortest first, each a
        :class:`~hybridmem.models.GraphPath` with its entities and each hop's predicates.
        ``max_depth`` is 1 to :data:`MAX_PATH_DEPTH`: the search stays within that many hops of
        both ends, so its cost does not grow with the graph."""
        self._check(user_id)
        if (not isinstance(max_depth, int) or isinstance(max_depth, bool)
                or not 1 <= max_depth <= MAX_PATH_DEPTH):
            raise InvalidInputError(
                f"max_depth must be an integer from 1 to {MAX_PATH_DEPTH}, got {max_depth!r}")
        if k is None:
            return self._stores.graph.query_path(user_id, a, b, max_depth=max_depth)
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_PATHS:
            raise InvalidInputError(f"k must be an integer from 1 to {MAX_PATHS}, got {k!r}")
        return self._stores.graph.query_paths(user_id, a, b, k=k, max_depth=max_depth)

    def graph(self, user_id: str, *, as_of: datetime | None = None) -> nx.DiGraph[str]:
        """A copy of the user's entity graph as a ``networkx.DiGraph`` (changing it changes
        nothing stored), for analysis or drawing.

        Nodes are keyed by the entity's key (:attr:`GraphEntity.key`) and carry ``name`` (first
        surface form), ``type``, ``aliases`` (set of surface forms), ``mentions`` (how many
        memories mention it), ``memory_ids`` (set), ``first_seen`` and ``last_seen`` (aware UTC
        datetimes: when a memory naming it was first and last written). An edge runs from
        subject to object and carries ``predicates`` (list), ``evidence`` ({predicate: {memory
        id: confidence}}), ``memory_ids`` (set), ``weight`` (supporting memories) and
        ``confidence`` (the highest). The graph attribute ``next`` ({memory id: memory id})
        holds the episodic links between memories written in order. The graph holds what
        current memories say: a superseded or deleted memory's support is gone from it.

        With ``as_of``, only what the memories recorded by then (``created_at <= as_of``)
        support, among those the graph holds: nodes and edges none of them supports are left
        out, and ``memory_ids``, ``mentions``, ``evidence``, ``predicates``, ``weight`` and
        ``confidence`` count those memories only; ``first_seen`` and ``last_seen`` stay the
        times of the whole graph. Before the first memory, the graph is empty."""
        self._check(user_id)
        when = validate_as_of(as_of)
        if when is None:
            return self._stores.graph.graph(user_id)
        recorded = self._stores.vectors.list(user_id, where=as_of_filter(when, valid_only=False))
        return self._stores.graph.graph(user_id, [item.id for item in recorded])

    def export_graph(
        self, user_id: str, *, format: str = "node-link", as_of: datetime | None = None
    ) -> bytes:
        """The user's entity graph (:meth:`graph`) as a file graph tools open: ``"node-link"``
        JSON (``nx.node_link_graph(data, edges="edges")`` reads it back), ``"graphml"`` or
        ``"gexf"``, UTF-8, written by NetworkX's own writers. GraphML and GEXF hold scalars
        only: there times are ISO 8601 text and sets, lists and the evidence JSON text. Media
        types: :data:`hybridmem.models.GRAPH_FORMATS`. An unknown ``format`` is refused with
        :class:`InvalidInputError` before anything is read."""
        check_format(format)
        return graph_bytes(self.graph(user_id, as_of=as_of), format)

    def stats(self, user_id: str) -> UserStats:
        """Counts for one user: memories (all and current), graph entities and relations; and
        whether an erasure in the data dir awaits its purge (see :meth:`purge_now`)."""
        self._check(user_id)
        current = self._stores.vectors.list(user_id, where=eq("current", True))
        return UserStats(
            user_id=user_id, memories=self._stores.vectors.count(user_id), current=len(current),
            entities=len(self._stores.graph.entities(user_id)),
            relations=len(self._stores.graph.relations(user_id)),
            purge_pending=self._stores.vectors.purge_pending,
        )

    # -- the service's view ----------------------------------------------------------------------
    def status(self) -> MemoryStatus:
        """Counts of the whole Memory for a service's metrics (open users, record-cache hits,
        a pending purge, token usage): cheap, no store is read, and no user id or text is in it."""
        if self._closed:
            raise ClosedError("this Memory is closed; create a new one")
        vectors = self._stores.vectors
        report = vectors.report() if isinstance(vectors, Reporting) else None
        return MemoryStatus(
            open_users=None if report is None else report.open_users,
            record_cache_hits=None if report is None else report.cache_hits,
            record_cache_misses=None if report is None else report.cache_misses,
            purge_pending=vectors.purge_pending, usage=self._usage.total,
        )

    def ping(self) -> None:
        """Return when every store can serve; else raise what the first that cannot says
        (:class:`ClosedError`, :class:`StorageError`). For a readiness probe: reads and writes
        no user's data. Stores that cannot tell (no ``ping``) are taken as serving."""
        if self._closed:
            raise ClosedError("this Memory is closed; create a new one")
        s = self._stores
        for store in (s.vectors, s.lexical, s.graph, s.history):
            if isinstance(store, Pingable):
                store.ping()

    # -- chat --------------------------------------------------------------------------------------
    def _chat_messages(
        self, user_id: str, message: str, max_context_tokens: int | None
    ) -> tuple[builtins.list[ChatMessage], Context]:
        validate_text(message, what="message")
        ctx = self.context(user_id, message, max_tokens=max_context_tokens)
        system = self.settings.system_prompt + (f"\n\n{ctx.text}" if ctx.text else "")
        return [{"role": "system", "content": system}, {"role": "user", "content": message}], ctx

    def chat(
        self, user_id: str, message: str, *, max_context_tokens: int | None = None
    ) -> ChatReply:
        """Answer ``message`` with the user's memory as context, through the configured endpoint."""
        self._check(user_id)
        messages, ctx = self._chat_messages(user_id, message, max_context_tokens)
        result = self.chat_model.complete(messages)
        self._usage.add(result.usage)
        self._store_exchange(user_id, message, result.text)
        return ChatReply(text=result.text, context=ctx, usage=result.usage, model=result.model)

    def chat_stream(
        self, user_id: str, message: str, *, max_context_tokens: int | None = None
    ) -> Iterator[str]:
        """Like :meth:`chat`, yielding the reply as it arrives; stores the exchange at the end."""
        self._check(user_id)
        messages, _ = self._chat_messages(user_id, message, max_context_tokens)
        parts: builtins.list[str] = []
        for delta in self.chat_model.stream(messages):
            parts.append(delta)
            yield delta
        self._usage.add(self.chat_model.last_usage)
        self._store_exchange(user_id, message, "".join(parts))

    def _store_exchange(self, user_id: str, message: str, reply: str) -> None:
        if not self.settings.store_chat:
            return
        turns = [{"role": "user", "content": message}]
        if reply.strip():
            turns.append({"role": "assistant", "content": reply[:20_000]})
        self.add_messages(user_id, turns)

    # -- export / import ---------------------------------------------------------------------------
    def export(self, user_id: str) -> dict[str, Any]:
        """Everything of the user as JSON-ready data that :meth:`import_` loads back."""
        self._check(user_id)
        self._access.flush(user_id)
        with self._lock(user_id):
            return export_bundle(self._stores, user_id, embedder=self._embedder.name)

    def import_(self, user_id: str, bundle: Mapping[str, Any], *, overwrite: bool = False) -> int:
        """Load an :meth:`export` bundle, all or nothing (see :mod:`hybridmem.ops.bundle`); ids the
        user has are refused unless ``overwrite``. Returns the number of memories loaded."""
        self._check(user_id)
        with self._lock(user_id):
            count = import_bundle(self._stores, user_id, bundle, embed=self._embed,
                                  data_dir=self.settings.data_dir, overwrite=overwrite)
            self._extras.forget(user_id)
            return count

    # -- backups and re-embedding ------------------------------------------------------------------
    def backup(self, dest: str | Path, *, user_id: str | None = None) -> Path:
        """Write a snapshot of every user (or one) into the folder ``dest`` and keep the newest
        ``backup_keep`` there; returns the snapshot's folder. Each user is copied under its lock,
        while the Memory stays in use (see :mod:`hybridmem.ops.backup`)."""
        users = ([self._check(user_id)] if user_id is not None
                 else self._stores.vectors.users())
        bundles = ((u, self.export(u)) for u in users)
        return write_snapshot(Path(dest), bundles, embedder=self._embedder.name,
                              keep=self.settings.backup_keep)

    def restore(self, source: str | Path, *, user_id: str | None = None,
                replace: bool = False) -> int:
        """Bring back the users of a snapshot (``source``: a snapshot folder, or a backup folder
        for its newest), or only ``user_id``; returns the memories restored. A user who has
        memories is refused unless ``replace``, which forgets the user's memories first."""
        snapshot, bundles = load_snapshot(Path(source), user_id=user_id)
        if not replace:
            busy = [u for u in snapshot.users if self.count(u)]
            if busy:
                raise InvalidInputError(f"{len(busy)} users of the snapshot have memories here "
                                        f"(e.g. {busy[0]!r}); pass replace=True to replace them")
        total = 0
        for user, bundle in bundles:
            if replace:
                self.forget(user)
            total += self.import_(user, bundle)
        return total

    def reembed(self, user_id: str | None = None, *,
                progress: Callable[[str, int, int], None] | None = None) -> int:
        """Move every memory of a user (or of all users) to the configured embedder, and record
        it as the collection's embedder; resumable after a crash (see :mod:`hybridmem.chroma.reembed`).
        ``progress(user_id, done, total)`` is called after each page. Returns the memories
        embedded."""
        vectors = self._stores.vectors
        if not isinstance(vectors, Reembeddable):
            raise ConfigError(f"the vector store {type(vectors).__name__} cannot re-embed in place; "
                              "export each user, then import into a store with the new embedder")
        users = [self._check(user_id)] if user_id is not None else vectors.users()
        total = 0
        for user in users:
            with self._lock(user):
                report = None if progress is None else partial(progress, user)
                total += vectors.reembed_user(user, embedder=self._embedder.name,
                                              dimension=self._embedder.dimension,
                                              embed=self._embed, progress=report)
                if self._names is not None:  # name vectors of the old model are made anew
                    with self._names.held.hold(user):
                        self._names.complete(user)
        return total

