"""The :class:`Memory` facade: the only module that knows every seam.

Writes go to the vector store (the source of truth), then the lexical index, then the graph, under a
per-user lock; if a later store fails, the earlier writes are undone, so nothing is half-written.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any

from hybridmem import _records
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
    Hit,
    MemoryItem,
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
            )
        self.vectors: VectorStore = vector_store
        if lexical_index is None:
            from hybridmem.lexical import SqliteLexicalIndex

            lexical_index = SqliteLexicalIndex(s.data_dir)
        self.lexical: LexicalIndex = lexical_index
        if graph_store is None:
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
        )
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
        self._closed = True
        for store in (self.vectors, self.lexical, self.graph):
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
    ) -> list[MemoryItem]:
        """Store many memories in one batch (one embedding call, one write per store).

        Each item is a text or a dict of :meth:`add`'s fields. Texts equal up to case, spacing and
        punctuation to a current memory are not stored twice: the existing memory is returned with
        its ``mention_count`` bumped.
        """
        self._check(user_id)
        requests = [_to_request(item) for item in items]
        if not requests:
            return []
        now = utcnow()
        with self._lock(user_id):
            existing = self._existing_by_hash(user_id, [r.text for r in requests])
            results: list[MemoryItem | None] = []
            fresh: list[MemoryItem] = []
            bumped: dict[str, MemoryItem] = {}
            batch_hashes: dict[str, MemoryItem] = {}
            for r in requests:
                h = _records.text_hash(r.text)
                if h in existing:
                    base = bumped.get(existing[h].id, existing[h])
                    updated = base.model_copy(
                        update={
                            "mention_count": base.mention_count + 1,
                            "confidence": max(base.confidence, r.confidence),
                            "importance": max(base.importance, r.importance),
                            "updated_at": now,
                        }
                    )
                    bumped[base.id] = updated
                    results.append(updated)
                    continue
                if h in batch_hashes:
                    results.append(batch_hashes[h])
                    continue
                created = r.created_at or now
                item = MemoryItem(
                    id=new_id(),
                    user_id=user_id,
                    text=r.text,
                    kind=r.kind,
                    category=r.category,
                    importance=r.importance,
                    confidence=r.confidence,
                    source=r.source,
                    created_at=created,
                    updated_at=created,
                    valid_from=created,
                    expires_at=r.expires_at,
                    metadata=r.metadata,
                )
                batch_hashes[h] = item
                fresh.append(item)
                results.append(item)
            fresh = self._extract_and_write(user_id, fresh, infer=infer)
            by_id = {item.id: item for item in fresh}
            if bumped:
                self.vectors.update_metadata(
                    user_id, list(bumped), [_records.to_metadata(i) for i in bumped.values()]
                )
        final = [by_id.get(r.id, bumped.get(r.id, r)) if r else r for r in results]
        return [r for r in final if r is not None]

    def add_messages(
        self, user_id: str, messages: Sequence[Mapping[str, str]], *, infer: bool = True
    ) -> list[MemoryItem]:
        """Store conversation turns (``{"role": ..., "content": ...}``) as memories of kind "turn"."""
        items = []
        for message in messages:
            if not isinstance(message, Mapping) or "content" not in message:
                raise InvalidInputError("each message needs 'role' and 'content'")
            role = str(message.get("role", "user"))
            if role not in {"user", "assistant", "system"}:
                raise InvalidInputError(f"message role must be user, assistant or system, not {role!r}")
            items.append({"text": message["content"], "kind": "turn", "source": role})
        return self.add_many(user_id, items, infer=infer)

    def _existing_by_hash(self, user_id: str, texts: Sequence[str]) -> dict[str, MemoryItem]:
        hashes = sorted({_records.text_hash(t) for t in texts})
        where = {"$and": [{"text_hash": {"$in": hashes}}, {"current": True}]}
        records = self.vectors.list(user_id, where=where)
        return {r.metadata["text_hash"]: _records.from_record(r) for r in records}  # type: ignore[misc]

    def _extract(
        self, user_id: str, items: list[MemoryItem], *, infer: bool
    ) -> tuple[list[MemoryItem], list[Extraction]]:
        """Extract entities; a failing model never loses a memory (it is marked for re-extraction)."""
        extractor = self.extractor
        if extractor is None:
            return items, [Extraction() for _ in items]
        if not infer and not extractor.name.startswith("rules"):
            extractor = self._rule_extractor()
        speakers = [user_id if i.source == "user" else i.source for i in items]
        try:
            batch = getattr(extractor, "extract_batch", None)
            if batch is not None and len(items) > 1:
                found: list[Extraction] = batch([i.text for i in items], speakers)
            else:
                found = [extractor.extract(i.text, speaker=s) for i, s in zip(items, speakers)]
            return [i.model_copy(update={"extractor": extractor.name}) for i in items], found
        except BackendError as exc:
            log.warning("extraction with %s failed (%s); using rules, marked for re-extraction",
                        extractor.name, type(exc).__name__)
            rules = self._rule_extractor()
            found = [rules.extract(i.text, speaker=s) for i, s in zip(items, speakers)]
            marked = [
                i.model_copy(update={"needs_extraction": True, "extractor": rules.name})
                for i in items
            ]
            return marked, found

    def _extract_and_write(
        self, user_id: str, items: list[MemoryItem], *, infer: bool
    ) -> list[MemoryItem]:
        if not items:
            return []
        items, extractions = self._extract(user_id, items, infer=infer)
        vectors = self._embed([i.text for i in items])
        ids = [i.id for i in items]
        self.vectors.upsert(
            user_id, ids, [i.text for i in items], vectors, [_records.to_metadata(i) for i in items]
        )
        try:
            self.lexical.add(user_id, ids, [i.text for i in items])
            self.graph.add_extractions(user_id, list(zip(ids, extractions)))
        except Exception:
            self.vectors.delete(user_id, ids)
            self.lexical.delete(user_id, ids)
            raise
        return items

    def _embed(self, texts: Sequence[str]) -> list[list[float]]:
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
            if text is not None and text != item.text:
                self.graph.remove_memory(user_id, [memory_id])
                self._extract_and_write(user_id, [updated], infer=True)
            else:
                self.vectors.update_metadata(user_id, [memory_id], [_records.to_metadata(updated)])
            return self.get(user_id, memory_id)

    def forget(self, user_id: str, memory_id: str | None = None) -> int:
        """Delete one memory, or with no id everything of the user. Returns how many were removed."""
        self._check(user_id)
        with self._lock(user_id):
            if memory_id is not None:
                self.get(user_id, memory_id)
                self.vectors.delete(user_id, [memory_id])
                self.lexical.delete(user_id, [memory_id])
                self.graph.remove_memory(user_id, [memory_id])
                return 1
            count = self.vectors.count(user_id)
            self.vectors.drop_user(user_id)
            self.lexical.drop_user(user_id)
            self.graph.drop_user(user_id)
            remove_tree(user_dir(self.settings.data_dir, user_id, create=False))
            return count

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
    ) -> list[MemoryItem]:
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
    ) -> list[Hit]:
        """Hybrid search: vector ∪ lexical ∪ graph neighbourhood, fused (see :mod:`ranking`)."""
        self._check(user_id)
        validate_text(query, what="query")
        _check_limit(limit)
        s = self.settings
        flt = self._filter(where, category, include_superseded)
        pool = max(s.candidates, limit)
        records: dict[str, Any] = {}
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
        items = {}
        for memory_id in list(cands):
            record = records.get(memory_id)
            item = _records.from_record(record) if record is not None else None
            if item is None or (item.expires_at is not None and item.expires_at <= now):
                del cands[memory_id]
                continue
            items[memory_id] = item
            c = cands[memory_id]
            c.age_days = max((now - item.created_at).total_seconds() / 86400.0, 0.0)
            c.importance, c.confidence = item.importance, item.confidence
        ranked = fuse(list(cands.values()), self.weights)[:limit]
        return [
            Hit(item=items[c.memory_id], score=b.fused, breakdown=b, why=explain(b))
            for c, b in ranked
        ]

    def _graph_candidates(
        self, user_id: str, query: str, found: list[str], cand: Any, pool: int
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
    ) -> Context:
        """The best memories for ``query`` packed into at most ``max_tokens`` tokens (exact)."""
        budget = self.settings.context_max_tokens if max_tokens is None else max_tokens
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
            raise InvalidInputError(f"max_tokens must be a positive integer, got {budget!r}")
        hits = self.search(user_id, query, limit=limit, where=where, category=category)
        memories = [
            ContextCandidate("memories", _line(h.item), h.item.id, h.why) for h in hits
        ]
        relations = [
            ContextCandidate("relations", f"{r['subject']} -{r['predicate']}-> {r['object']}",
                             None, "graph relation of the top memories")
            for r in self.graph.relations(user_id, [h.item.id for h in hits[:GRAPH_SEED_HITS]])
        ][:8]
        ordered = memories[:3] + relations + memories[3:]
        return build_context(ordered, counter=self.tokens, max_tokens=budget)

    def query_path(self, user_id: str, a: str, b: str, *, max_depth: int = 3) -> list[str]:
        """How two entities are related in the user's graph (readable edges), [] when not."""
        self._check(user_id)
        return self.graph.query_path(user_id, a, b, max_depth=max_depth)

    # -- chat ------------------------------------------------------------------------------------
    def _chat_messages(
        self, user_id: str, message: str, max_context_tokens: int | None
    ) -> tuple[list[dict[str, str]], Context]:
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
        parts: list[str] = []
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
                "graph": self.graph.export(user_id),
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
            graph = bundle.get("graph")
            importer = getattr(self.graph, "import_graph", None)
            if graph and importer is not None:
                importer(user_id, graph)
        return len(items)


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
    return f"[{item.created_at:%Y-%m-%d}] {who}{item.text}"


def _default_counter(encoding: str) -> TokenCounter:
    from hybridmem.offline import TiktokenCounter

    return TiktokenCounter(encoding)
