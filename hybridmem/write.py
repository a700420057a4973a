"""The write path, in one place: plan a batch, apply the plan to the stores, supersede.

One :meth:`Writer.write` call:

1. **plan** — exact duplicates (same :func:`~hybridmem.text.text_hash` as a current fact, or as an
   earlier fact of the batch) bump the existing memory; the rest become fresh items, embedded in
   one call; near-duplicates (:func:`~hybridmem.policy.near_duplicate`, or the LLM judge in the
   undecided cosine band) merge into the memory they repeat; entities are extracted (a failing
   model never loses a memory: the rules extract instead and the memory is marked);
2. **apply** — vectors first (the source of truth), then the lexical index, the graph and the
   history; if a later store fails, the new vectors and index rows are removed again;
3. **supersede** — a functional relation with a new object (:func:`~hybridmem.policy.conflicting`)
   marks the older memory invalid since the newer became valid; nothing is deleted.

Everything a batch will change is decided in a :class:`WritePlan` before anything is written, and
only the plan's own methods change it. The rules themselves are pure and live in
:mod:`hybridmem.policy`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np

from hybridmem import _journal as journal
from hybridmem import policy
from hybridmem._journal import Intent
from hybridmem.backends import Stores
from hybridmem.config import Settings
from hybridmem.errors import BackendError
from hybridmem.filters import Condition, all_of, eq
from hybridmem.models import (
    AddRequest,
    Extraction,
    HistoryEvent,
    MemoryItem,
    Relation,
    Usage,
    new_id,
    utcnow,
)
from hybridmem.protocols import BatchExtractor, ChatModel, Extractor
from hybridmem.text import text_hash

__all__ = ["EXTRACT_BATCH", "UsageMeter", "WritePlan", "Writer"]

log = logging.getLogger(__name__)
#: Most texts sent to an LLM extractor in one call.
EXTRACT_BATCH = 16
Embed = Callable[[Sequence[str]], list[list[float]]]


class UsageMeter:
    """Token usage of every model call a Memory made (extraction, judge, summaries, chat),
    added up under a lock because a Memory is shared between threads."""

    def __init__(self) -> None:
        self._total = Usage()
        self._lock = threading.Lock()

    def add(self, usage: Usage) -> None:
        with self._lock:
            self._total = self._total + usage

    @property
    def total(self) -> Usage:
        with self._lock:
            return self._total


@dataclass
class WritePlan:
    """Everything one write batch will change, decided before anything is written.

    ``fresh``: new memory ids, in input order; ``rewritten``: stored memories whose text changed
    (re-embedded and re-indexed); ``touched``: stored memories whose fields changed only;
    ``merged_into``: fresh id -> the memory it was folded into; ``superseded``: memories that
    stop being current."""

    items: dict[str, MemoryItem] = field(default_factory=dict)
    fresh: list[str] = field(default_factory=list)
    vectors: dict[str, list[float]] = field(default_factory=dict)
    extractions: dict[str, Extraction] = field(default_factory=dict)
    touched: list[str] = field(default_factory=list)
    rewritten: list[str] = field(default_factory=list)
    merged_into: dict[str, str] = field(default_factory=dict)
    superseded: list[str] = field(default_factory=list)
    events: list[HistoryEvent] = field(default_factory=list)
    #: Rewritten texts replace what the caller asked to erase (an update), not a merge.
    erase: bool = False

    @property
    def written(self) -> list[str]:
        """Ids whose text and vector are written: fresh ones not merged away, and rewrites."""
        return [i for i in self.fresh if i not in self.merged_into] + self.rewritten

    @property
    def updated(self) -> list[str]:
        """Ids whose fields only are written."""
        written = set(self.written)
        return [i for i in self.touched if i not in written]

    def add_fresh(self, item: MemoryItem) -> None:
        self.items[item.id] = item
        self.fresh.append(item.id)

    def touch(self, item: MemoryItem, event: HistoryEvent | None = None) -> None:
        """Record new fields of a memory (and why)."""
        self.items[item.id] = item
        if item.id not in self.fresh and item.id not in self.touched and (
            item.id not in self.rewritten
        ):
            self.touched.append(item.id)
        if event is not None:
            self.events.append(event)

    def rewrite(self, item: MemoryItem, vector: list[float], event: HistoryEvent) -> None:
        """A stored memory gets a new text: re-embedded, re-indexed, re-extracted."""
        self.items[item.id] = item
        self.vectors[item.id] = vector
        if item.id in self.touched:
            self.touched.remove(item.id)
        if item.id not in self.rewritten:
            self.rewritten.append(item.id)
        self.events.append(event)

    def extracted(self, item: MemoryItem, extraction: Extraction) -> None:
        self.items[item.id] = item
        self.extractions[item.id] = extraction

    def merge(self, new: MemoryItem, into: MemoryItem, now: datetime, *, cosine: float) -> None:
        """Fold the fresh ``new`` into ``into`` (see :func:`policy.merged`)."""
        result = policy.merged(into, new, now)
        self.merged_into[new.id] = into.id
        if result.text != into.text:
            self.vectors[into.id] = self.vectors[new.id]
            self.items[into.id] = result
            if into.id not in self.fresh and into.id not in self.rewritten:
                self.rewritten.append(into.id)
                if into.id in self.touched:
                    self.touched.remove(into.id)
        else:
            self.touch(result)
        self.events.append(HistoryEvent(
            memory_id=into.id, action="merge", cause=f"near duplicate (cosine {cosine:.2f})",
            text=new.text,
        ))

    def supersede(self, older: MemoryItem, newer: MemoryItem, *, cause: str) -> None:
        """Mark ``older`` as no longer valid since ``newer`` became valid (nothing is deleted)."""
        self.touch(older.model_copy(update={
            "invalid_at": newer.valid_from or newer.created_at,
            "superseded_by": newer.id,
            "updated_at": utcnow(),
        }))
        if older.id not in self.superseded:
            self.superseded.append(older.id)
        self.events.append(HistoryEvent(
            memory_id=older.id, action="supersede", cause=cause, detail={"by": newer.id},
        ))


class Writer:
    """Plans and applies writes for one Memory. Callers hold the user's lock."""

    def __init__(
        self,
        settings: Settings,
        stores: Stores,
        *,
        embed: Embed,
        extractor: Extractor | None,
        rules: Callable[[], Extractor],
        chat: Callable[[], ChatModel],
        usage: UsageMeter,
    ) -> None:
        self._settings = settings
        self._stores = stores
        self._embed = embed
        self._extractor = extractor
        self._rules = rules
        self._chat = chat
        self._usage = usage

    # -- the public steps --------------------------------------------------------------------------
    def write(
        self,
        user_id: str,
        requests: Sequence[AddRequest],
        *,
        infer: bool,
        key: str | None = None,
        cause: str = "add",
    ) -> list[MemoryItem]:
        """Store a batch; one item per request, in order (a merged request returns the memory it
        was merged into)."""
        now = utcnow()
        plan = WritePlan()
        dedup = self._settings.dedup
        existing = self._existing_by_hash(
            user_id, [r.text for r in requests if r.kind != "turn"]
        ) if dedup else {}
        by_hash: dict[str, str] = {}
        order: list[str] = []
        for r in requests:
            h = text_hash(r.text)
            target = None
            if r.kind != "turn" and dedup:
                target = by_hash.get(h) or (existing[h].id if h in existing else None)
            if target is not None:
                base = plan.items.get(target) or existing[h]
                plan.touch(policy.bumped(base, r, now), HistoryEvent(
                    memory_id=target, action="merge", cause="identical text"))
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
            if dedup:
                self._merge_near_duplicates(user_id, plan, now)
            self._extract_into(user_id, plan, infer=infer)
        self.apply(user_id, plan, cause=cause)
        if plan.fresh:
            self._supersede_contradictions(user_id, plan)
        return [plan.items[plan.merged_into.get(i, i)] for i in order]

    def update(self, user_id: str, old: MemoryItem, new: MemoryItem) -> None:
        """Write a changed memory; a new text is re-embedded, re-indexed and re-extracted."""
        plan = WritePlan()
        event = HistoryEvent(memory_id=new.id, action="update", cause="updated by the caller")
        if new.text != old.text:
            plan.erase = True
            plan.rewrite(new, self._embed([new.text])[0], event)
            self._extract_into(user_id, plan, infer=True)
        else:
            plan.touch(new, event)
        self.apply(user_id, plan, cause="update")
        if new.text != old.text:  # the old text must leave no trace: history and Chroma's file
            self._stores.history.scrub(user_id, [new.id])
            self._stores.vectors.purge()

    def supersede(self, user_id: str, older: Sequence[MemoryItem], newer: MemoryItem,
                  *, cause: str) -> None:
        """Mark stored memories as superseded by ``newer`` (metadata, graph, history)."""
        plan = WritePlan()
        for item in older:
            plan.supersede(item, newer, cause=cause)
        self.apply(user_id, plan, cause=cause)

    def delete(self, user_id: str, ids: Sequence[str], *, action: str, cause: str) -> None:
        """Delete memories from every store, physically (see :meth:`VectorStore.purge`); their
        history keeps the event, not the text."""
        self._run(Intent(user_id=user_id, deleted=list(ids), events=[
            HistoryEvent(memory_id=i, action=action, cause=cause) for i in ids  # type: ignore[arg-type]
        ]))
        self._stores.vectors.purge()

    def apply(self, user_id: str, plan: WritePlan, *, cause: str) -> None:
        """Write the plan through the journal: vectors first (the source of truth), then the
        lexical index, the graph and the history."""
        writes = plan.written
        added = [
            HistoryEvent(memory_id=i, action="add", cause=cause, text=plan.items[i].text,
                         at=plan.items[i].created_at)
            for i in plan.fresh if i not in plan.merged_into
        ]
        self._run(Intent(
            user_id=user_id, written=[plan.items[i] for i in writes], rewritten=plan.rewritten,
            erase=plan.erase,
            extractions={i: plan.extractions[i] for i in writes if i in plan.extractions},
            updated=[plan.items[i] for i in plan.updated], superseded=plan.superseded,
            events=added + plan.events,
        ), [plan.vectors[i] for i in writes])

    def _run(self, intent: Intent, vectors: Sequence[list[float]] = ()) -> None:
        """Journal the batch, write every store, clear the journal. An exception here undoes
        the new vectors (so nothing is half-written) and clears the journal; a crash leaves the
        journal for :meth:`recover`."""
        data_dir, user_id = self._settings.data_dir, intent.user_id
        journal.begin(data_dir, intent)
        if intent.written:
            self._stores.vectors.upsert(user_id, intent.written, vectors)
        try:
            self._finish(intent)
        except Exception:
            new = [i.id for i in intent.written if i.id not in intent.rewritten]
            self._stores.vectors.delete(user_id, new)
            self._stores.lexical.delete(user_id, new)
            journal.finish(data_dir, user_id)
            raise
        journal.finish(data_dir, user_id)

    def _finish(self, intent: Intent) -> None:
        """Every write after the vectors' upsert; each is idempotent (recovery may repeat it)."""
        s, user_id = self._stores, intent.user_id
        written = [i.id for i in intent.written]
        if written:
            s.lexical.add(user_id, written, [i.text for i in intent.written])
            if intent.rewritten:  # a caller's new text erases what the old one said
                s.graph.remove_memory(user_id, intent.rewritten, erase=intent.erase)
            s.graph.add_extractions(
                user_id, [(i, intent.extractions.get(i, Extraction())) for i in written]
            )
        if intent.updated:
            s.vectors.update(user_id, intent.updated)
        if intent.superseded:
            s.graph.remove_memory(user_id, intent.superseded)
        if intent.deleted:
            s.vectors.delete(user_id, intent.deleted)
            s.lexical.delete(user_id, intent.deleted)
            s.graph.remove_memory(user_id, intent.deleted, erase=True)
            s.history.scrub(user_id, intent.deleted)
        s.history.record(user_id, intent.events)

    def recover(self) -> int:
        """Finish or undo the batches a crash left in the journal (call before any write);
        returns how many there were. Forward when the batch's vectors landed (the upsert is
        the commit point), back when they did not."""
        found = 0
        for intent in journal.pending(self._settings.data_dir):
            found += 1
            user_id = intent.user_id
            landed = {i.id: i.text for i in self._stores.vectors.get(
                user_id, [i.id for i in intent.written])}
            if all(landed.get(i.id) == i.text for i in intent.written):
                log.warning("finishing a write to %d memories that a crash interrupted",
                            len(intent.written) + len(intent.updated) + len(intent.deleted))
                self._finish(intent)
            else:  # the upsert never happened: nothing after it did either
                log.warning("undoing a write of %d memories that a crash interrupted",
                            len(intent.written))
                new = [i.id for i in intent.written if i.id not in intent.rewritten]
                self._stores.vectors.delete(user_id, new)
                self._stores.lexical.delete(user_id, new)
                self._stores.graph.remove_memory(user_id, new, erase=True)
            journal.finish(self._settings.data_dir, user_id)
        return found

    # -- planning ----------------------------------------------------------------------------------
    def _existing_by_hash(self, user_id: str, texts: Sequence[str]) -> dict[str, MemoryItem]:
        hashes = tuple(sorted({text_hash(t) for t in texts}))
        if not hashes:
            return {}
        where = all_of(
            Condition("text_hash", "$in", hashes), eq("current", True),
            Condition("kind", "$ne", "turn"),
        )
        return {text_hash(i.text): i for i in self._stores.vectors.list(user_id, where=where)}

    def _merge_near_duplicates(self, user_id: str, plan: WritePlan, now: datetime) -> None:
        """Merge fresh facts into near-identical current facts (stored or earlier in the batch)."""
        s = self._settings
        facts = [i for i in plan.fresh if plan.items[i].kind == "fact"]
        if not facts:
            return
        stored = self._stores.vectors.query(
            user_id, [plan.vectors[i] for i in facts], limit=3,
            where=all_of(eq("current", True), eq("kind", "fact")),
        )
        seen: list[int] = []  # positions in ``facts`` of the batch's distinct facts
        matrix = np.asarray([plan.vectors[i] for i in facts], dtype=np.float32)
        for position, (memory_id, hits) in enumerate(zip(facts, stored)):
            item = plan.items[memory_id]
            best: tuple[float, MemoryItem] | None = None
            for hit in hits:
                other = plan.items.get(hit.item.id) or hit.item
                if policy.near_duplicate(item.text, other.text, hit.similarity,
                                         jaccard_min=s.dedup_jaccard, cosine_min=s.dedup_cosine):
                    best = (hit.similarity, other)
                    break
                if s.judge_band_min <= hit.similarity and s.llm_configured and s.judge:
                    verdict = self._judge(other.text, item.text)
                    if verdict == "DUPLICATE":
                        best = (hit.similarity, other)
                        break
                    if verdict == "UPDATE":
                        plan.supersede(other, item, cause="LLM judged it an update")
            if best is None and seen:
                sims = matrix[seen] @ matrix[position]
                for index in np.argsort(-sims)[:3]:
                    prior = plan.items[facts[seen[int(index)]]]
                    if policy.near_duplicate(item.text, prior.text, float(sims[index]),
                                             jaccard_min=s.dedup_jaccard,
                                             cosine_min=s.dedup_cosine):
                        best = (float(sims[index]), prior)
                        break
            if best is None:
                seen.append(position)
                continue
            plan.merge(item, best[1], now, cosine=best[0])

    def _judge(self, old: str, new: str) -> policy.Verdict | None:
        """One structured call: is ``new`` an update, a duplicate, or a separate fact?"""
        messages = [
            {"role": "system", "content": policy.JUDGE_PROMPT},
            {"role": "user", "content": f"OLD: {old}\nNEW: {new}"},
        ]
        try:
            result = self._chat().complete(messages, json_schema=policy.JUDGE_SCHEMA,
                                           schema_name="memory_judgement")
        except BackendError as exc:
            log.warning("the dedup judge failed (%s); keeping both", type(exc).__name__)
            return None
        self._usage.add(result.usage)
        return policy.parse_verdict(result.text)

    def _extract_into(self, user_id: str, plan: WritePlan, *, infer: bool) -> None:
        items = [plan.items[i] for i in plan.written]
        for item, extraction in self.extract(user_id, items, infer=infer):
            plan.extracted(item, extraction)

    def extract(
        self, user_id: str, items: Sequence[MemoryItem], *, infer: bool
    ) -> list[tuple[MemoryItem, Extraction]]:
        """Each item (marked with who extracted it) and its entities, at most
        :data:`EXTRACT_BATCH` texts per model call. A failing model never loses a memory: the
        rules extract instead and the memory is marked ``needs_extraction``. ``infer=False`` never
        calls a model (the rules still run: they are cheap and offline)."""
        extractor = self._extractor
        if extractor is None or not items:
            return [(i, Extraction()) for i in items]
        if not infer and not extractor.name.startswith("rules"):
            extractor = self._rules()
        out: list[tuple[MemoryItem, Extraction]] = []
        for start in range(0, len(items), EXTRACT_BATCH):
            chunk = items[start : start + EXTRACT_BATCH]
            speakers: list[str | None] = [
                user_id if i.source == "user" else i.source for i in chunk
            ]
            try:
                if isinstance(extractor, BatchExtractor) and len(chunk) > 1:
                    found = extractor.extract_batch([i.text for i in chunk], speakers)
                else:
                    found = [extractor.extract(i.text, speaker=s) for i, s in zip(chunk, speakers)]
                marked = [i.model_copy(update={"extractor": extractor.name,
                                               "needs_extraction": False}) for i in chunk]
            except BackendError as exc:
                log.warning("extraction with %s failed (%s); rules used, marked for re-extraction",
                            extractor.name, type(exc).__name__)
                rules = self._rules()
                found = [rules.extract(i.text, speaker=s) for i, s in zip(chunk, speakers)]
                marked = [
                    i.model_copy(update={"needs_extraction": True, "extractor": rules.name})
                    for i in chunk
                ]
            for extraction in found:
                self._usage.add(extraction.usage)
            out.extend(zip(marked, found))
        return out

    def reextract(self, user_id: str) -> list[tuple[MemoryItem, Extraction]]:
        """Extract again the user's current memories marked ``needs_extraction`` (model calls;
        callers need not hold the user's lock). Returns those that succeeded, unmarked."""
        if self._extractor is None or self._extractor.name.startswith("rules"):
            return []
        marked = self._stores.vectors.list(
            user_id, where=all_of(eq("needs_extraction", True), eq("current", True)))
        marked.sort(key=lambda i: (i.created_at, i.id))
        return [(item, found) for item, found in self.extract(user_id, marked, infer=True)
                if not item.needs_extraction]

    def store_reextracted(self, user_id: str,
                          results: Sequence[tuple[MemoryItem, Extraction]]) -> int:
        """Write :meth:`reextract`'s results (callers hold the user's lock): the graph evidence
        of each memory is replaced and the mark cleared. Memories deleted, changed or superseded
        since are skipped. Returns how many were written."""
        if not results:
            return 0
        now = {i.id: i for i in self._stores.vectors.get(user_id, [r[0].id for r in results])}
        kept = [(item, found) for item, found in results if item.id in now
                and now[item.id].text == item.text and now[item.id].is_current]
        if not kept:
            return 0
        items = [now[i.id].model_copy(update={"needs_extraction": False,
                                              "extractor": i.extractor}) for i, _ in kept]
        ids = [i.id for i in items]
        # the graph first: if a crash comes between, the marks stay and a new call redoes it
        self._stores.graph.remove_memory(user_id, ids)
        self._stores.graph.add_extractions(user_id, [(i.id, f) for i, (_, f) in zip(items, kept)])
        self._stores.vectors.update(user_id, items)
        self._stores.history.record(user_id, [
            HistoryEvent(memory_id=i.id, action="update", cause=f"re-extracted with {i.extractor}")
            for i in items
        ])
        return len(items)

    # -- supersession ------------------------------------------------------------------------------
    def _supersede_contradictions(self, user_id: str, plan: WritePlan) -> None:
        """Rule path: a functional relation (lives_in, works_at ...) with a new object supersedes
        the older memory that stated the old object. The later ``valid_from`` wins."""
        late = WritePlan()
        for memory_id in plan.fresh:
            if memory_id in plan.merged_into or not plan.items[memory_id].is_current:
                continue
            for rel in policy.functional(plan.extractions.get(memory_id, Extraction()).relations):
                for old_id, old_rel in self._relations_of(user_id, rel.subject, rel.predicate):
                    if old_id == memory_id or not policy.conflicting(rel, old_rel):
                        continue
                    if old_id in late.items:
                        old: MemoryItem | None = late.items[old_id]
                    else:
                        found = self._stores.vectors.get(user_id, [old_id],
                                                         where=eq("current", True))
                        old = found[0] if found else None
                    new = late.items.get(memory_id) or plan.items[memory_id]
                    if old is None or not old.is_current or not new.is_current:
                        continue
                    older, newer = sorted((old, new), key=lambda i: (i.valid_from or i.created_at))
                    late.supersede(older, newer, cause=f"{rel.predicate} changed")
        if late.touched:
            self.apply(user_id, late, cause="supersede")

    def _relations_of(self, user_id: str, subject: str, predicate: str) -> list[tuple[str, Relation]]:
        """(memory id, relation) for every stored edge ``subject -predicate-> *``."""
        graph = self._stores.graph
        node = graph.entity(user_id, subject)
        if node is None:
            return []
        out: list[tuple[str, Relation]] = []
        for row in graph.relations(user_id, node.memory_ids):
            if row.subject_key != node.key or row.predicate != predicate:
                continue
            rel = Relation(subject=row.subject, predicate=predicate, object=row.object)
            out.extend((m, rel) for m in row.memory_ids)
        return out


def _new_item(user_id: str, r: AddRequest, now: datetime, *, key: str | None) -> MemoryItem:
    created = r.created_at or now
    return MemoryItem(
        id=new_id(), user_id=user_id, text=r.text, kind=r.kind, category=r.category,
        importance=r.importance, confidence=r.confidence, source=r.source, created_at=created,
        updated_at=created, valid_from=created, expires_at=r.expires_at, metadata=r.metadata,
        key=key,
    )
