"""The :class:`Memory` facade: the only module that knows every seam.

Writes go to the vector store (the source of truth), then the lexical index, then the graph, under a
per-user lock; if a later store fails, the earlier writes are undone, so nothing is half-written.
"""

from __future__ import annotations

import builtins

import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

import numpy as np

from hybridmem import _records, policy
from hybridmem._files import remove_tree, user_dir
from hybridmem.config import Settings
from hybridmem.context import ContextCandidate, build_context
from hybridmem.errors import (
    BackendError,
    HybridMemError,
    InvalidInputError,
    NotFoundError,
    StorageError,
)
from hybridmem.models import (
    AddRequest,
    ChatReply,
    Context,
    Extraction,
    HistoryEvent,
    Hit,
    MemoryItem,
    Relation,
    Usage,
    as_utc,
    new_id,
    utcnow,
    validate_metadata,
    validate_text,
    validate_user_id,
)
from hybridmem.protocols import (
    ChatModel,
    Embedder,
    Extractor,
    GraphStore,
    LexicalIndex,
    StoredRecord,
    TokenCounter,
    VectorStore,
)
from hybridmem.ranking import Candidate, Weights, explain, fuse

__all__ = ["Memory"]

log = logging.getLogger(__name__)
EXPORT_FORMAT = "hybridmem-export"
EXPORT_VERSION = 1
MAX_LIMIT = 1000
#: How many of the top hits lend their entities to graph expansion.
GRAPH_SEED_HITS = 5
#: Most texts sent to an LLM extractor in one call.
EXTRACT_BATCH = 16
#: Most turns (and characters) one summary episode covers.
MAX_SUMMARY_TURNS = 200
MAX_SUMMARY_CHARS = 12_000
SUMMARY_PROMPT = (
    "Summarise this conversation with the user for their long-term memory: the facts, decisions, "
    "preferences and open issues, in at most 5 short sentences. Plain text, no preamble."
)
#: Episodes (summaries) offered to a context, searched separately so they always get a place.
MAX_CONTEXT_EPISODES = 2
#: Key facts offered to a context beyond those the search found.
MAX_CONTEXT_FACTS = 10
#: Seconds a "does this user have key facts / episodes" answer is reused by context().
EXTRAS_TTL = 5.0
#: Buffered memory accesses written to the store at once.
ACCESS_FLUSH = 512


def _check_limit(limit: int, name: str = "limit") -> int:
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidInputError(f"{name} must be an integer between 1 and {MAX_LIMIT}, got {limit!r}")
    return limit


class Memory:
    """Long-term memory for LLM apps: add, search, context, chat, forget — per user.

    ``Memory()`` reads ``HYBRIDMEM_*`` settings from the environment; every seam can be passed in
    (tests pass real, small backends rather than mocks). Safe to share between threads.
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
        token_counter: TokenCounter | None = None,
    ) -> None:
        self.settings = settings if settings is not None else Settings()
        s = self.settings
        s.data_dir.mkdir(parents=True, exist_ok=True)
        self._chat = chat_model
        self.embedder: Embedder = embedder or self._default_embedder()
        self.extractor: Extractor | None = extractor or self._default_extractor()
        self._rules: Extractor | None = None
        self.tokens: TokenCounter = token_counter or _default_counter(s.token_encoding)
        if vector_store is None:
            from hybridmem.vector import ChromaVectorStore

            vector_store = ChromaVectorStore(
                embedder_name=self.embedder.name,
                dimension=self.embedder.dimension,
                path=None if s.chroma_url else s.data_dir / "chroma",
                url=s.chroma_url,
                scrub_heap=s.scrub_heap,
            )
        self.vectors: VectorStore = vector_store
        if lexical_index is None:
            if s.chroma_url:  # shared by every process: a cache of the server's documents
                from hybridmem.shared import ChromaLexicalIndex

                lexical_index = ChromaLexicalIndex(url=s.chroma_url)
            else:
                from hybridmem.lexical import SqliteLexicalIndex

                lexical_index = SqliteLexicalIndex(s.data_dir)
        self.lexical: LexicalIndex = lexical_index
        if graph_store is None:
            if s.chroma_url:  # shared by every process: rebuilt from records in the server
                from hybridmem.shared import ChromaGraphStore

                graph_store = ChromaGraphStore(url=s.chroma_url)
            else:
                from hybridmem.graph import NetworkXGraphStore

                graph_store = NetworkXGraphStore(s.data_dir)
        self.graph: GraphStore = graph_store
        self.weights = Weights(
            vector=s.vector_weight,
            lexical=s.lexical_weight,
            graph=s.graph_weight,
            recency=s.recency_weight,
            half_life_days=s.half_life_days,
            importance=s.importance_weight,
            rrf_k=s.rrf_k,
            fusion=s.fusion,
        )
        from hybridmem.history import HistoryStore

        self.history_store = HistoryStore(s.data_dir)
        #: Token usage of every model call made by this Memory (extraction, judge, chat).
        self.usage = Usage()
        self._access: dict[str, dict[str, tuple[int, datetime]]] = {}
        self._extras: dict[str, tuple[float, bool, bool]] = {}
        self._locks: dict[str, threading.RLock] = {}
        self._locks_guard = threading.Lock()
        self._closed = False

    # -- construction of defaults ----------------------------------------------------------------
    def _default_embedder(self) -> Embedder:
        s = self.settings
        if s.embedder == "openai":
            from hybridmem.openai_compat import OpenAIEmbedder

            return OpenAIEmbedder(s)
        if s.embedder == "hash":
            from hybridmem.offline import HashEmbedder

            return HashEmbedder()
        from hybridmem.offline import LocalEmbedder

        return LocalEmbedder(threads=s.onnx_threads)

    def _default_extractor(self) -> Extractor | None:
        choice = self.settings.extractor
        if choice == "none":
            return None
        if choice == "llm" or (choice == "auto" and self.settings.llm_configured):
            from hybridmem.openai_compat import LLMExtractor

            return LLMExtractor(self.chat_model)
        from hybridmem.extract import RuleExtractor

        return RuleExtractor()

    @property
    def chat_model(self) -> ChatModel:
        """The chat endpoint, created on first use (offline use never needs one)."""
        if self._chat is None:
            from hybridmem.openai_compat import OpenAIChat

            self._chat = OpenAIChat(self.settings)
        return self._chat

    def _rule_extractor(self) -> Extractor:
        if self._rules is None:
            from hybridmem.extract import RuleExtractor

            self._rules = RuleExtractor()
        return self._rules

    # -- lifecycle -------------------------------------------------------------------------------
    def close(self) -> None:
        """Release stores; idempotent. A closed Memory refuses use."""
        if self._closed:
            return
        try:
            self.flush_access()
        finally:
            self._closed = True
            for store in (self.vectors, self.lexical, self.graph, self.history_store):
                store.close()

    def __enter__(self) -> Memory:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = self.settings.chroma_url or str(self.settings.data_dir)
        return f"Memory(store={mode!r}, embedder={self.embedder.name!r})"

    def _check(self, user_id: str) -> str:
        if self._closed:
            raise HybridMemError("this Memory is closed; create a new one")
        return validate_user_id(user_id)

    def _lock(self, user_id: str) -> threading.RLock:
        with self._locks_guard:
            return self._locks.setdefault(user_id, threading.RLock())

    # -- writes ----------------------------------------------------------------------------------
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
    ) -> MemoryItem:
        """Store one memory and return it (or the existing identical memory, its count bumped)."""
        request = {
            "text": text,
            "kind": kind,
            "category": category,
            "importance": importance,
            "confidence": confidence,
            "source": source,
            "metadata": dict(metadata) if metadata else {},
            "created_at": created_at,
            "expires_at": expires_at,
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

        Each item is a text or a dict of :meth:`add`'s fields. Facts equal to a current memory up to
        case, spacing and punctuation, or near-duplicates of one (token Jaccard / cosine above the
        configured bars), are merged into it instead of stored twice; a fact that contradicts an
        older one supersedes it (see :mod:`hybridmem.policy`). Conversation turns are never merged.
        Returns one item per input, in order (a merged input returns the memory it merged into).
        """
        self._check(user_id)
        requests = [_to_request(item) for item in items]
        if not requests:
            return []
        with self._lock(user_id):
            return self._write(user_id, requests, infer=infer)

    def _write(
        self,
        user_id: str,
        requests: Sequence[AddRequest],
        *,
        infer: bool,
        key: str | None = None,
        cause: str = "add",
    ) -> builtins.list[MemoryItem]:
        now = utcnow()
        plan = _WritePlan()
        existing = self._existing_by_hash(user_id, [r.text for r in requests if r.kind != "turn"])
        by_hash: dict[str, str] = {}
        order: builtins.list[str] = []
        for r in requests:
            h = _records.text_hash(r.text)
            target = None
            if r.kind != "turn" and self.settings.dedup:
                target = by_hash.get(h) or (existing[h].id if h in existing else None)
            if target is not None:
                base = plan.items.get(target) or existing[h]
                plan.touch(_bump(base, r, now), event=("merge", "identical text"))
                order.append(target)
                continue
            # items of one batch keep their order: each gets its own microsecond
            item = _new_item(user_id, r, now + timedelta(microseconds=len(order)), key=key)
            plan.add_fresh(item)
            by_hash[h] = item.id
            order.append(item.id)
        if plan.fresh:
            vectors = self._embed([plan.items[i].text for i in plan.fresh])
            plan.vectors.update(zip(plan.fresh, vectors))
            if self.settings.dedup:
                self._merge_near_duplicates(user_id, plan, now)
            self._extract_into(user_id, plan, infer=infer)
        self._apply(user_id, plan, cause=cause)
        if plan.fresh:
            self._supersede_contradictions(user_id, plan)
        return [plan.items[plan.merged_into.get(i, i)] for i in order]

    def _merge_near_duplicates(self, user_id: str, plan: _WritePlan, now: datetime) -> None:
        """Merge fresh facts into near-identical current facts (stored or earlier in the batch)."""
        s = self.settings
        facts = [i for i in plan.fresh if plan.items[i].kind == "fact"]
        if not facts:
            return
        where = {"$and": [{"current": True}, {"kind": "fact"}]}
        stored = self.vectors.query_batch(
            user_id, [plan.vectors[i] for i in facts], limit=3, where=where
        )
        seen: builtins.list[int] = []  # positions in ``facts`` of the batch's distinct facts
        matrix = np.asarray([plan.vectors[i] for i in facts], dtype=np.float32)
        for position, (memory_id, hits) in enumerate(zip(facts, stored)):
            item = plan.items[memory_id]
            best: tuple[float, MemoryItem] | None = None
            for hit in hits:
                other = plan.items.get(hit.record.id) or _records.from_record(hit.record)
                if policy.near_duplicate(
                    item.text, other.text, hit.similarity,
                    jaccard_min=s.dedup_jaccard, cosine_min=s.dedup_cosine,
                ):
                    best = (hit.similarity, other)
                    break
                if s.judge_band_min <= hit.similarity and self._judge_available():
                    verdict = self._judge(other.text, item.text, plan)
                    if verdict == "DUPLICATE":
                        best = (hit.similarity, other)
                        break
                    if verdict == "UPDATE":
                        plan.supersede(other, item, cause="LLM judged it an update")
            if best is None and seen:
                sims = matrix[seen] @ matrix[position]
                for index in np.argsort(-sims)[:3]:
                    prior = plan.items[facts[seen[int(index)]]]
                    if policy.near_duplicate(
                        item.text, prior.text, float(sims[index]),
                        jaccard_min=s.dedup_jaccard, cosine_min=s.dedup_cosine,
                    ):
                        best = (float(sims[index]), prior)
                        break
            if best is None:
                seen.append(position)
                continue
            plan.merge(item, best[1], now, cosine=best[0])

    def _judge_available(self) -> bool:
        return self.settings.llm_configured and self.settings.judge

    def _judge(self, old: str, new: str, plan: _WritePlan) -> policy.Verdict | None:
        """One structured call: is ``new`` an update, a duplicate, or a separate fact?"""
        messages = [
            {"role": "system", "content": policy.JUDGE_PROMPT},
            {"role": "user", "content": f"OLD: {old}\nNEW: {new}"},
        ]
        try:
            result = self.chat_model.complete(messages, json_schema=policy.JUDGE_SCHEMA,
                                              schema_name="memory_judgement")
        except BackendError as exc:
            log.warning("the dedup judge failed (%s); keeping both", type(exc).__name__)
            return None
        self.usage = self.usage + result.usage
        return policy.parse_verdict(result.text)

    def _extract_into(self, user_id: str, plan: _WritePlan, *, infer: bool) -> None:
        ids = [i for i in plan.fresh if i not in plan.merged_into] + plan.rewritten
        items, found = self._extract(user_id, [plan.items[i] for i in ids], infer=infer)
        for item, extraction in zip(items, found):
            plan.items[item.id] = item
            plan.extractions[item.id] = extraction

    def _apply(self, user_id: str, plan: _WritePlan, *, cause: str) -> None:
        """Write the plan: vectors first (the source of truth), then lexical, graph, history."""
        writes = [i for i in plan.fresh if i not in plan.merged_into] + plan.rewritten
        updates = [i for i in plan.touched if i not in writes]
        if writes:
            items = [plan.items[i] for i in writes]
            self.vectors.upsert(
                user_id, writes, [i.text for i in items], [plan.vectors[i] for i in writes],
                [_records.to_metadata(i) for i in items],
            )
            try:
                self.lexical.add(user_id, writes, [i.text for i in items])
                if plan.rewritten:
                    self.graph.remove_memory(user_id, plan.rewritten)
                self.graph.add_extractions(user_id, [(i, plan.extractions[i]) for i in writes])
            except Exception:
                new = [i for i in writes if i not in plan.rewritten]
                self.vectors.delete(user_id, new)
                self.lexical.delete(user_id, new)
                raise
        if updates:
            self.vectors.update_metadata(
                user_id, updates, [_records.to_metadata(plan.items[i]) for i in updates]
            )
        if plan.superseded:
            self.graph.remove_memory(user_id, plan.superseded)
        events = [
            HistoryEvent(memory_id=i, action="add", cause=cause, text=plan.items[i].text,
                         at=plan.items[i].created_at)
            for i in plan.fresh if i not in plan.merged_into
        ]
        self.history_store.record(user_id, events + plan.events)
        if any(plan.items[i].key or plan.items[i].kind == "summary" for i in writes):
            self._extras.pop(user_id, None)

    def _supersede_contradictions(self, user_id: str, plan: _WritePlan) -> None:
        """Rule path: a functional relation (lives_in, works_at ...) with a new object supersedes
        the older memory that stated the old object. The later ``valid_from`` wins."""
        late = _WritePlan()
        for memory_id in plan.fresh:
            if memory_id in plan.merged_into or not plan.items[memory_id].is_current:
                continue
            for rel in policy.functional(plan.extractions.get(memory_id, Extraction()).relations):
                for old_id, old_rel in self._relations_of(user_id, rel.subject, rel.predicate):
                    if old_id == memory_id or not policy.conflicting(rel, old_rel):
                        continue
                    records = self.vectors.get(user_id, [old_id], where={"current": True})
                    if not records:
                        continue
                    old = late.items.get(old_id) or _records.from_record(records[0])
                    new = late.items.get(memory_id) or plan.items[memory_id]
                    if not old.is_current or not new.is_current:
                        continue
                    older, newer = sorted((old, new), key=lambda i: (i.valid_from or i.created_at))
                    late.supersede(older, newer, cause=f"{rel.predicate} changed")
        self._apply_supersessions(user_id, late)

    def _apply_supersessions(self, user_id: str, late: _WritePlan) -> None:
        """Write supersessions decided after the batch was stored: metadata, graph, history."""
        if late.touched:
            self.vectors.update_metadata(
                user_id, late.touched, [_records.to_metadata(late.items[i]) for i in late.touched]
            )
            self.graph.remove_memory(user_id, late.superseded)
            self.history_store.record(user_id, late.events)

    def _relations_of(self, user_id: str, subject: str, predicate: str) -> builtins.list[tuple[str, Relation]]:
        """(memory id, relation) for every stored edge ``subject -predicate-> *``."""
        node = self.graph.entity(user_id, subject) if hasattr(self.graph, "entity") else None
        if not node:
            return []
        out: builtins.list[tuple[str, Relation]] = []
        for row in self.graph.relations(user_id, node.get("memory_ids", [])):
            if row["subject_key"] != node["key"] or row["predicate"] != predicate:
                continue
            rel = Relation(subject=row["subject"], predicate=predicate, object=row["object"])
            out.extend((m, rel) for m in row["memory_ids"])
        return out

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
        if len(key) > 100:
            raise InvalidInputError("key must be at most 100 characters")
        request = _to_request({
            "text": f"{key}: {validate_text(value, what='value')}", "category": category,
            "confidence": confidence, "importance": importance, "source": "user",
        })
        with self._lock(user_id):
            old = [
                _records.from_record(r)
                for r in self.vectors.list(user_id, where={"$and": [{"key": key}, {"current": True}]})
            ]
            if old and old[0].text == request.text:
                return old[0]
            (item,) = self._write(user_id, [request], infer=False, key=key, cause="remember")
            late = _WritePlan()
            for prior in old:
                late.supersede(prior, item, cause=f"new value for {key!r}")
            self._apply_supersessions(user_id, late)
            return item

    def facts(self, user_id: str, *, category: str | None = None) -> builtins.list[MemoryItem]:
        """The user's current key facts (see :meth:`remember`)."""
        self._check(user_id)
        flt = _records.and_filters(
            {"has_key": True}, {"current": True}, {"category": category} if category else None
        )
        items = map(_records.from_record, self.vectors.list(user_id, where=flt))
        return sorted(items, key=lambda i: i.key or "")

    def add_messages(
        self, user_id: str, messages: Sequence[Mapping[str, str]], *, infer: bool = True
    ) -> builtins.list[MemoryItem]:
        """Store conversation turns (``{"role": ..., "content": ...}``) as memories of kind "turn"."""
        items = []
        for message in messages:
            if not isinstance(message, Mapping) or "content" not in message:
                raise InvalidInputError("each message needs 'role' and 'content'")
            role = str(message.get("role", "user"))
            if role not in {"user", "assistant", "system"}:
                raise InvalidInputError(f"message role must be user, assistant or system, not {role!r}")
            items.append({"text": message["content"], "kind": "turn", "source": role})
        stored = self.add_many(user_id, items, infer=infer)
        every = self.settings.episode_turns
        if infer and every > 0 and self.settings.llm_configured:
            if len(self._unsummarized(user_id)) >= every:
                self.summarize(user_id)
        return stored

    def _unsummarized(self, user_id: str) -> builtins.list[MemoryItem]:
        """Turns newer than the newest summary episode, oldest first."""
        summaries = self.vectors.list(user_id, where={"kind": "summary"})
        since = max((float(r.metadata.get("created_at_ts") or 0) for r in summaries), default=0.0)
        where = {"$and": [{"kind": "turn"}, {"created_at_ts": {"$gt": since}}]}
        turns = [_records.from_record(r) for r in self.vectors.list(user_id, where=where)]
        return sorted(turns, key=lambda i: (i.created_at, i.id))

    def summarize(self, user_id: str) -> MemoryItem | None:
        """Store a summary episode of the turns since the last one (one LLM call); None when there
        is nothing new. ``add_messages`` calls this every ``episode_turns`` turns when an endpoint
        is configured."""
        self._check(user_id)
        with self._lock(user_id):
            turns = self._unsummarized(user_id)[-MAX_SUMMARY_TURNS:]
            if not turns:
                return None
            transcript = "\n".join(f"{t.source}: {t.text}" for t in turns)
            messages = [
                {"role": "system", "content": SUMMARY_PROMPT},
                {"role": "user", "content": transcript[-MAX_SUMMARY_CHARS:]},
            ]
            result = self.chat_model.complete(messages)
            self.usage = self.usage + result.usage
            if not result.text.strip():
                return None
            request = _to_request({
                "text": result.text.strip()[:MAX_SUMMARY_CHARS], "kind": "summary",
                "source": "system", "created_at": turns[-1].created_at,
                "metadata": {"turns": len(turns), "first_turn": turns[0].id,
                             "last_turn": turns[-1].id},
            })
            (item,) = self._write(user_id, [request], infer=False, cause="summary")
            return item

    def _existing_by_hash(self, user_id: str, texts: Sequence[str]) -> dict[str, MemoryItem]:
        hashes = sorted({_records.text_hash(t) for t in texts})
        if not hashes:
            return {}
        where = {"$and": [
            {"text_hash": {"$in": hashes}}, {"current": True}, {"kind": {"$ne": "turn"}}
        ]}
        records = self.vectors.list(user_id, where=where)
        return {r.metadata["text_hash"]: _records.from_record(r) for r in records}  # type: ignore[misc]

    def _extract(
        self, user_id: str, items: builtins.list[MemoryItem], *, infer: bool
    ) -> tuple[builtins.list[MemoryItem], builtins.list[Extraction]]:
        """Extract entities, at most :data:`EXTRACT_BATCH` texts per model call. A failing model
        never loses a memory: the rules extract instead and the memory is marked for re-extraction.
        ``infer=False`` never calls a model (the rules still run: they are cheap and offline)."""
        extractor = self.extractor
        if extractor is None or not items:
            return items, [Extraction() for _ in items]
        if not infer and not extractor.name.startswith("rules"):
            extractor = self._rule_extractor()
        out_items: builtins.list[MemoryItem] = []
        out_found: builtins.list[Extraction] = []
        batch = getattr(extractor, "extract_batch", None)
        for start in range(0, len(items), EXTRACT_BATCH):
            chunk = items[start : start + EXTRACT_BATCH]
            speakers = [user_id if i.source == "user" else i.source for i in chunk]
            try:
                if batch is not None and len(chunk) > 1:
                    found: builtins.list[Extraction] = batch([i.text for i in chunk], speakers)
                else:
                    found = [extractor.extract(i.text, speaker=s) for i, s in zip(chunk, speakers)]
                marked = [i.model_copy(update={"extractor": extractor.name}) for i in chunk]
            except BackendError as exc:
                log.warning("extraction with %s failed (%s); rules used, marked for re-extraction",
                            extractor.name, type(exc).__name__)
                rules = self._rule_extractor()
                found = [rules.extract(i.text, speaker=s) for i, s in zip(chunk, speakers)]
                marked = [
                    i.model_copy(update={"needs_extraction": True, "extractor": rules.name})
                    for i in chunk
                ]
            for extraction in found:
                self.usage = self.usage + extraction.usage
            out_items.extend(marked)
            out_found.extend(found)
        return out_items, out_found

    def _embed(self, texts: Sequence[str]) -> builtins.list[builtins.list[float]]:
        try:
            return self.embedder.embed_batch(list(texts))
        except HybridMemError:
            raise
        except Exception as exc:
            raise StorageError(f"the embedder {self.embedder.name!r} failed: {exc}") from exc

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
        """Change a memory; a new text is re-embedded, re-indexed and re-extracted."""
        self._check(user_id)
        with self._lock(user_id):
            item = self.get(user_id, memory_id)
            changes: dict[str, Any] = {"updated_at": utcnow()}
            if category is not None:
                changes["category"] = category
            if importance is not None:
                changes["importance"] = importance
            if confidence is not None:
                changes["confidence"] = confidence
            if metadata is not None:
                changes["metadata"] = validate_metadata(dict(metadata))
            if expires_at is not None:
                changes["expires_at"] = as_utc(expires_at)
            if text is not None:
                changes["text"] = validate_text(text)
            try:
                updated = MemoryItem.model_validate({**item.model_dump(), **changes})
            except ValueError as exc:
                raise InvalidInputError(str(exc)) from exc
            plan = _WritePlan()
            plan.touch(updated, event=("update", "updated by the caller"))
            if text is not None and text != item.text:
                plan.touched.remove(memory_id)
                plan.rewritten.append(memory_id)
                plan.vectors[memory_id] = self._embed([updated.text])[0]
                self._extract_into(user_id, plan, infer=True)
            self._apply(user_id, plan, cause="update")
            return self.get(user_id, memory_id)

    def forget(self, user_id: str, memory_id: str | None = None) -> int:
        """Delete one memory, or with no id everything of the user. Returns how many were removed."""
        self._check(user_id)
        with self._lock(user_id):
            if memory_id is not None:
                self.get(user_id, memory_id)
                self._delete(user_id, [memory_id], action="delete", cause="deleted by the caller")
                return 1
            count = self.vectors.count(user_id)
            self._access.pop(user_id, None)
            self._extras.pop(user_id, None)
            self.vectors.drop_user(user_id)
            self.lexical.drop_user(user_id)
            self.graph.drop_user(user_id)
            self.history_store.drop_user(user_id)
            remove_tree(user_dir(self.settings.data_dir, user_id, create=False))
            purge = getattr(self.vectors, "purge", None)
            if purge is not None:
                purge()  # embedded Chroma keeps deleted rows in free pages until VACUUM
            return count

    def _delete(self, user_id: str, ids: Sequence[str], *, action: str, cause: str) -> None:
        """Delete memories from every store; their history keeps the event, not the text."""
        self.vectors.delete(user_id, ids)
        self.lexical.delete(user_id, ids)
        self.graph.remove_memory(user_id, ids)
        self.history_store.scrub(user_id, ids)
        self.history_store.record(user_id, [
            HistoryEvent(memory_id=i, action=action, cause=cause) for i in ids  # type: ignore[arg-type]
        ])

    def history(self, user_id: str, memory_id: str | None = None) -> builtins.list[HistoryEvent]:
        """What happened to the user's memories (add, merge, update, supersede, expire, delete),
        oldest first; one memory's events when ``memory_id`` is given."""
        self._check(user_id)
        return self.history_store.list(user_id, memory_id)

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
        ``dry_run``, would be) removed."""
        self._check(user_id)
        self.flush_access()
        now = utcnow()
        cutoff = now - timedelta(days=idle_days)
        with self._lock(user_id):
            doomed = []
            for item in map(_records.from_record, self.vectors.list(user_id)):
                expired = item.expires_at is not None and item.expires_at <= now
                seen = item.last_accessed_at or item.created_at
                if expired or (item.importance < min_importance and seen < cutoff):
                    doomed.append(item)
            if not dry_run and doomed:
                expired_ids = [i.id for i in doomed if i.expires_at is not None and i.expires_at <= now]
                idle_ids = [i.id for i in doomed if i.id not in expired_ids]
                if expired_ids:
                    self._delete(user_id, expired_ids, action="expire", cause="expires_at passed")
                if idle_ids:
                    self._delete(user_id, idle_ids, action="delete",
                                 cause=f"pruned: importance < {min_importance}, idle {idle_days} days")
            return doomed

    # -- reads -----------------------------------------------------------------------------------
    def get(self, user_id: str, memory_id: str) -> MemoryItem:
        """One memory by id; :class:`NotFoundError` when the user has no such memory."""
        self._check(user_id)
        if not isinstance(memory_id, str) or not memory_id:
            raise InvalidInputError("memory_id must be a non-empty string")
        records = self.vectors.get(user_id, [memory_id])
        if not records:
            raise NotFoundError(f"user {user_id!r} has no memory {memory_id!r}")
        return _records.from_record(records[0])

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
        _check_limit(limit)
        if not isinstance(offset, int) or offset < 0:
            raise InvalidInputError("offset must be a non-negative integer")
        flt = self._filter(where, category, include_superseded)
        items = [_records.from_record(r) for r in self.vectors.list(user_id, where=flt)]
        items.sort(key=lambda i: (i.created_at, i.id))
        return items[offset : offset + limit]

    def count(self, user_id: str) -> int:
        """How many memories the user has (current and superseded)."""
        self._check(user_id)
        return self.vectors.count(user_id)

    @staticmethod
    def _filter(
        where: Mapping[str, Any] | None, category: str | None, include_superseded: bool
    ) -> dict[str, Any] | None:
        return _records.and_filters(
            _records.translate_where(where),
            {"category": category} if category is not None else None,
            None if include_superseded else {"current": True},
        )

    def search(
        self,
        user_id: str,
        query: str,
        *,
        limit: int = 10,
        where: Mapping[str, Any] | None = None,
        category: str | None = None,
        include_superseded: bool = False,
    ) -> builtins.list[Hit]:
        """Hybrid search: vector ∪ lexical ∪ graph neighbourhood, fused (see :mod:`ranking`)."""
        self._check(user_id)
        validate_text(query, what="query")
        _check_limit(limit)
        s = self.settings
        flt = self._filter(where, category, include_superseded)
        pool = max(s.candidates, limit)
        records: dict[str, StoredRecord] = {}
        cands: dict[str, Candidate] = {}

        def cand(memory_id: str) -> Candidate:
            return cands.setdefault(memory_id, Candidate(memory_id))

        if self.weights.vector > 0 or not (self.weights.lexical > 0):
            qvec = self._embed([query])[0]
            for rank, hit in enumerate(self.vectors.query(user_id, qvec, limit=pool, where=flt), 1):
                records[hit.record.id] = hit.record
                c = cand(hit.record.id)
                c.vector, c.vector_rank = hit.similarity, rank
        if self.weights.lexical > 0:
            for rank, (memory_id, score) in enumerate(
                self.lexical.search(user_id, query, limit=pool), 1
            ):
                c = cand(memory_id)
                c.lexical, c.lexical_rank = score, rank
        if self.weights.graph > 0:
            self._graph_candidates(user_id, query, list(cands), cand, pool)
        missing = [m for m in cands if m not in records]
        for record in self.vectors.get(user_id, missing, where=flt) if missing else []:
            records[record.id] = record
        now = utcnow()
        items: dict[str, MemoryItem] = {}
        for memory_id in builtins.list(cands):
            found = records.get(memory_id)
            item = _records.from_record(found) if found is not None else None
            if item is None or (item.expires_at is not None and item.expires_at <= now):
                del cands[memory_id]
                continue
            items[memory_id] = item
            c = cands[memory_id]
            c.age_days = max((now - item.created_at).total_seconds() / 86400.0, 0.0)
            c.importance, c.confidence = item.importance, item.confidence
        ranked = fuse(list(cands.values()), self.weights)[:limit]
        self._note_access(user_id, [c.memory_id for c, _ in ranked], now)
        return [
            Hit(item=items[c.memory_id], score=b.fused, breakdown=b, why=explain(b))
            for c, b in ranked
        ]

    def _note_access(self, user_id: str, ids: Sequence[str], now: datetime) -> None:
        """Count returned memories in memory; written to the store in batches (see flush_access),
        so search never waits for a write."""
        with self._locks_guard:
            seen = self._access.setdefault(user_id, {})
            for memory_id in ids:
                count, _ = seen.get(memory_id, (0, now))
                seen[memory_id] = (count + 1, now)
            pending = sum(len(v) for v in self._access.values())
        if pending >= ACCESS_FLUSH:
            self.flush_access()

    def flush_access(self) -> None:
        """Write buffered access counts and last-accessed times (also done on close)."""
        with self._locks_guard:
            pending, self._access = self._access, {}
        for user_id, seen in pending.items():
            with self._lock(user_id):
                records = self.vectors.get(user_id, list(seen))
                items = []
                for record in records:
                    item = _records.from_record(record)
                    count, when = seen[item.id]
                    items.append(item.model_copy(update={
                        "access_count": item.access_count + count, "last_accessed_at": when,
                    }))
                if items:
                    self.vectors.update_metadata(
                        user_id, [i.id for i in items], [_records.to_metadata(i) for i in items]
                    )

    def _graph_candidates(
        self, user_id: str, query: str, found: builtins.list[str], cand: Any, pool: int
    ) -> None:
        hops = self.settings.graph_hops
        seeds = self.graph.entities_in(user_id, query)
        reached: dict[str, tuple[int, str]] = {}
        if seeds:
            reached.update(self.graph.neighbourhood(user_id, seeds, hops=hops))
        top_entities = self.graph.entities_of(user_id, found[:GRAPH_SEED_HITS])
        if top_entities and hops > 0:
            for memory_id, (h, path) in self.graph.neighbourhood(
                user_id, top_entities, hops=hops - 1
            ).items():
                if memory_id not in reached or reached[memory_id][0] > h + 1:
                    reached[memory_id] = (h + 1, path)
        ordered = sorted(reached.items(), key=lambda kv: kv[1][0])[:pool]
        for rank, (memory_id, (h, path)) in enumerate(ordered, 1):
            c = cand(memory_id)
            c.graph_hops, c.graph_path, c.graph_rank = h, path, rank

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
    ) -> Context:
        """The best memories for ``query`` packed into at most ``max_tokens`` tokens (exact).

        Sections: key facts (see :meth:`remember`), relations of the top memories, conversation
        summaries, then memories with their dates. Only currently valid memories are shown unless
        ``include_superseded``; superseded ones are then labelled as such."""
        budget = self.settings.context_max_tokens if max_tokens is None else max_tokens
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
            raise InvalidInputError(f"max_tokens must be a positive integer, got {budget!r}")
        hits = self.search(user_id, query, limit=limit, where=where, category=category,
                           include_superseded=include_superseded)
        memories = [
            ContextCandidate(_section(h.item), _line(h.item), h.item.id, h.why) for h in hits
        ]
        hit_ids = {h.item.id for h in hits}
        has_facts, has_episodes = self._has_extras(user_id)
        facts = [
            ContextCandidate("facts", _line(f), f.id, "key fact")
            for f in self.facts(user_id, category=category)[:MAX_CONTEXT_FACTS]
            if f.id not in hit_ids
        ] if has_facts else []
        relations = [
            ContextCandidate("relations", f"{r['subject']} -{r['predicate']}-> {r['object']}",
                             None, "graph relation of the top memories")
            for r in self.graph.relations(user_id, [h.item.id for h in hits[:GRAPH_SEED_HITS]])
        ][:8]
        episodes = [
            ContextCandidate("episodes", _line(h.item), h.item.id, h.why)
            for h in self.search(user_id, query, limit=MAX_CONTEXT_EPISODES,
                                 where={"kind": "summary"})
            if h.item.id not in hit_ids
        ] if has_episodes else []
        ordered = memories[:3] + episodes + relations + memories[3:] + facts
        return build_context(ordered, counter=self.tokens, max_tokens=budget)

    def _has_extras(self, user_id: str) -> tuple[bool, bool]:
        """Whether the user has key facts / summary episodes. Each answer costs Chroma a metadata
        scan, so it is cached for :data:`EXTRAS_TTL` seconds (this process's own writes refresh it
        at once; another process's new fact or episode shows up within the TTL)."""
        now = time.monotonic()
        cached = self._extras.get(user_id)
        if cached is not None and cached[0] > now:
            return cached[1], cached[2]
        has_facts = bool(self.vectors.list(user_id, where={"has_key": True}, limit=1))
        has_episodes = bool(self.vectors.list(user_id, where={"kind": "summary"}, limit=1))
        self._extras[user_id] = (now + EXTRAS_TTL, has_facts, has_episodes)
        return has_facts, has_episodes

    def query_path(self, user_id: str, a: str, b: str, *, max_depth: int = 3) -> builtins.list[str]:
        """How two entities are related in the user's graph (readable edges), [] when not."""
        self._check(user_id)
        return self.graph.query_path(user_id, a, b, max_depth=max_depth)

    # -- chat ------------------------------------------------------------------------------------
    def _chat_messages(
        self, user_id: str, message: str, max_context_tokens: int | None
    ) -> tuple[builtins.list[dict[str, str]], Context]:
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
        self._store_exchange(user_id, message, "".join(parts))

    def _store_exchange(self, user_id: str, message: str, reply: str) -> None:
        if not self.settings.store_chat:
            return
        turns = [{"role": "user", "content": message}]
        if reply.strip():
            turns.append({"role": "assistant", "content": reply[:20_000]})
        self.add_messages(user_id, turns)

    # -- export / import -------------------------------------------------------------------------
    def export(self, user_id: str) -> dict[str, Any]:
        """Everything of the user as JSON-ready data that :meth:`import_` loads back."""
        self._check(user_id)
        self.flush_access()
        with self._lock(user_id):
            items = [_records.from_record(r) for r in self.vectors.list(user_id)]
            items.sort(key=lambda i: (i.created_at, i.id))
            return {
                "format": EXPORT_FORMAT,
                "version": EXPORT_VERSION,
                "user_id": user_id,
                "exported_at": utcnow().isoformat(),
                "embedder": self.embedder.name,
                "memories": [i.model_dump(mode="json") for i in items],
                "facts": {i.key: i.id for i in items if i.key and i.is_current},
                "graph": self.graph.export(user_id),
                "history": [e.model_dump(mode="json") for e in self.history_store.list(user_id)],
            }

    def import_(self, user_id: str, bundle: Mapping[str, Any]) -> int:
        """Load an :meth:`export` bundle into ``user_id`` (ids and times kept, re-embedded with the
        configured embedder). Returns the number of memories loaded."""
        self._check(user_id)
        if not isinstance(bundle, Mapping) or bundle.get("format") != EXPORT_FORMAT:
            raise InvalidInputError("not a hybridmem export (missing format marker)")
        try:
            items = [
                MemoryItem.model_validate({**m, "user_id": user_id})
                for m in bundle.get("memories", [])
            ]
            events = [HistoryEvent.model_validate(e) for e in bundle.get("history", [])]
        except ValueError as exc:
            raise InvalidInputError(f"invalid memory in export: {exc}") from exc
        with self._lock(user_id):
            for start in range(0, len(items), 256):
                chunk = items[start : start + 256]
                ids = [i.id for i in chunk]
                vectors = self._embed([i.text for i in chunk])
                self.vectors.upsert(
                    user_id, ids, [i.text for i in chunk], vectors,
                    [_records.to_metadata(i) for i in chunk],
                )
                self.lexical.add(user_id, ids, [i.text for i in chunk])
            self.history_store.record(user_id, events)
            graph = bundle.get("graph")
            importer = getattr(self.graph, "import_graph", None)
            if graph and importer is not None:
                importer(user_id, graph)
        return len(items)


@dataclass
class _WritePlan:
    """Everything one write batch will change, decided before anything is written."""

    items: dict[str, MemoryItem] = field(default_factory=dict)
    fresh: builtins.list[str] = field(default_factory=list)
    vectors: dict[str, builtins.list[float]] = field(default_factory=dict)
    extractions: dict[str, Extraction] = field(default_factory=dict)
    touched: builtins.list[str] = field(default_factory=list)
    rewritten: builtins.list[str] = field(default_factory=list)
    merged_into: dict[str, str] = field(default_factory=dict)
    superseded: builtins.list[str] = field(default_factory=list)
    events: builtins.list[HistoryEvent] = field(default_factory=list)

    def add_fresh(self, item: MemoryItem) -> None:
        self.items[item.id] = item
        self.fresh.append(item.id)

    def touch(self, item: MemoryItem, event: tuple[str, str] | None = None) -> None:
        self.items[item.id] = item
        if item.id not in self.fresh and item.id not in self.touched:
            self.touched.append(item.id)
        if event is not None:
            self.events.append(HistoryEvent(memory_id=item.id, action=event[0], cause=event[1]))  # type: ignore[arg-type]

    def merge(self, new: MemoryItem, into: MemoryItem, now: datetime, *, cosine: float) -> None:
        """Fold the fresh ``new`` into ``into``: richer text, union of metadata, counts bumped."""
        text = policy.richer_text(into.text, new.text)
        merged = into.model_copy(update={
            "text": text,
            "mention_count": into.mention_count + new.mention_count,
            "confidence": max(into.confidence, new.confidence),
            "importance": max(into.importance, new.importance),
            "metadata": policy.merge_metadata(into.metadata, new.metadata),
            "updated_at": now,
        })
        self.merged_into[new.id] = into.id
        self.items[into.id] = merged
        if text != into.text:
            self.vectors[into.id] = self.vectors[new.id]
            if into.id not in self.fresh and into.id not in self.rewritten:
                self.rewritten.append(into.id)
        elif into.id not in self.fresh and into.id not in self.touched:
            self.touched.append(into.id)
        self.events.append(HistoryEvent(
            memory_id=into.id, action="merge", cause=f"near duplicate (cosine {cosine:.2f})",
            text=new.text,
        ))

    def supersede(self, older: MemoryItem, newer: MemoryItem, *, cause: str) -> None:
        """Mark ``older`` as no longer valid since ``newer`` became valid (nothing is deleted)."""
        updated = older.model_copy(update={
            "invalid_at": newer.valid_from or newer.created_at,
            "superseded_by": newer.id,
            "updated_at": utcnow(),
        })
        self.touch(updated)
        if older.id not in self.superseded:
            self.superseded.append(older.id)
        self.events.append(HistoryEvent(
            memory_id=older.id, action="supersede", cause=cause, detail={"by": newer.id},
        ))


def _new_item(user_id: str, r: AddRequest, now: datetime, *, key: str | None) -> MemoryItem:
    created = r.created_at or now
    return MemoryItem(
        id=new_id(), user_id=user_id, text=r.text, kind=r.kind, category=r.category,
        importance=r.importance, confidence=r.confidence, source=r.source, created_at=created,
        updated_at=created, valid_from=created, expires_at=r.expires_at, metadata=r.metadata,
        key=key,
    )


def _bump(base: MemoryItem, r: AddRequest, now: datetime) -> MemoryItem:
    """An identical memory said again: one more mention, the higher confidence and importance."""
    return base.model_copy(update={
        "mention_count": base.mention_count + 1,
        "confidence": max(base.confidence, r.confidence),
        "importance": max(base.importance, r.importance),
        "metadata": policy.merge_metadata(base.metadata, r.metadata),
        "updated_at": now,
    })


def _to_request(item: str | Mapping[str, Any] | AddRequest) -> AddRequest:
    if isinstance(item, AddRequest):
        return item
    if isinstance(item, str):
        item = {"text": item}
    if not isinstance(item, Mapping):
        raise InvalidInputError("each memory must be a text or a dict with a 'text' field")
    try:
        return AddRequest.model_validate({k: v for k, v in item.items() if v is not None})
    except InvalidInputError:
        raise
    except ValueError as exc:
        raise InvalidInputError(_pydantic_message(exc)) from exc


def _pydantic_message(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        parts = []
        for e in errors():
            loc = ".".join(str(p) for p in e.get("loc", ()))
            parts.append(f"{loc}: {e.get('msg', '')}" if loc else str(e.get("msg", "")))
        return "; ".join(parts)
    return str(exc)


def _line(item: MemoryItem) -> str:
    who = "" if item.source == "user" else f"({item.source}) "
    old = "" if item.is_current else (
        f" (superseded {item.invalid_at:%Y-%m-%d})" if item.invalid_at else " (superseded)"
    )
    return f"[{item.created_at:%Y-%m-%d}] {who}{item.text}{old}"


def _section(item: MemoryItem) -> Any:
    if item.key:
        return "facts"
    return "episodes" if item.kind == "summary" else "memories"


def _default_counter(encoding: str) -> TokenCounter:
    from hybridmem.offline import TiktokenCounter

    return TiktokenCounter(encoding)
