"""The write path, in one place: plan a batch, apply the plan to the stores, supersede.

One :meth:`Writer.write` call:

1. **plan** — exact duplicates (same :func:`~hybridmem.text.text_hash` as a current fact, or as an
   earlier fact of the batch) bump the existing memory; the rest become fresh items, embedded in
   one call; near-duplicates (:func:`~hybridmem.write.policy.near_duplicate`, or the LLM judge in the
   undecided cosine band) merge into the memory they repeat; entities are extracted (a failing
   model never loses a memory: the rules extract instead and the memory is marked);
2. **apply** — vectors first (the source of truth), then the graph, with the lexical index and
   the history beside it (:func:`~hybridmem.write.journal.apply`); if a later store fails, the
   new vectors and index rows are removed again;
3. **supersede** — a functional relation with a new object (:func:`~hybridmem.write.policy.conflicting`)
   marks the older memory invalid since the newer became valid; nothing is deleted.

Everything a batch will change is decided in a :class:`WritePlan` before anything is written, and
only the plan's own methods change it. The rules themselves are pure and live in
:mod:`hybridmem.write.policy`.

**Model calls run outside the user's lock.** :meth:`Writer.write` plans once without the lock
(:meth:`Writer.prepare`), calling the embedder, the extractor and the judge for what that plan
needs, and keeps their answers in a :class:`Prepared` keyed by text. Under the lock it plans again
from what the stores hold *now* (:meth:`Writer.try_commit`): a memory another write merged, changed
or superseded meanwhile is simply seen as it is. If the new plan needs an answer the first did not
ask for (a text now fresh that was a duplicate before, a new pair in the judge's band), the lock is
released, the missing calls made, and it plans again; the last attempt (:meth:`Writer.commit`)
makes do without (the judge keeps both; the rules extract and the memory stays marked
``needs_extraction``). A slow or hanging endpoint therefore delays only its own call, never another
add or a search of the user.

Each plan is made with one :class:`~hybridmem.write.plan.OnMissing`, which alone says what it does
about an answer the :class:`Prepared` lacks:

- ``CALL`` (:meth:`Writer.prepare`, without the lock): make the call and keep the answer;
- ``GIVE_UP`` (:meth:`Writer.try_commit`, under the lock): call nothing, write nothing, return None;
- ``MAKE_DO`` (:meth:`Writer.commit`, under the lock): call no chat model, proceed without the
  answer (a missing vector is still embedded).

Whether an extractor calls a model is its declared :attr:`~hybridmem.protocols.Extractor.offline`:
an offline one (the rules) runs even with ``infer=False`` and extracts first, so new node names
join the texts' embedding call; its memories are never re-extracted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import timedelta

import numpy as np

from hybridmem.write import journal
from hybridmem.write import policy
from hybridmem.write.extraction import Extractors, reextract, store_reextracted
from hybridmem.write.journal import Intent
from hybridmem.runtime.locks import WriteLocks
from hybridmem.stores import Stores
from hybridmem.config import Settings
from hybridmem.errors import BackendError
from hybridmem.filters import Condition, all_of, eq
from hybridmem.write.plan import (
    Found,
    Key,
    OnMissing,
    Prepared,
    UsageMeter,
    WritePlan,
    new_item,
    speaker,
)
from hybridmem.models import AddRequest, Extraction, HistoryEvent, MemoryItem, Relation
from hybridmem.graph.name_vectors import NameVectors
from hybridmem.protocols import ChatModel, Extractor, VectorHit
from hybridmem.text import text_hash

__all__ = ["PLAN_ATTEMPTS", "Found", "Prepared", "UsageMeter", "WritePlan", "Writer"]

log = logging.getLogger(__name__)
#: Plans under the lock before one makes do with the model answers it has (see the docstring).
PLAN_ATTEMPTS = 3
Embed = Callable[[Sequence[str]], list[list[float]]]


class _Unanswered(Exception):
    """Planning under :attr:`OnMissing.GIVE_UP` needs a model answer the Prepared lacks: the
    plan stops before anything is written (caught by :meth:`Writer.try_commit` alone)."""


class Writer:
    """Plans and applies writes for one Memory. :meth:`write` takes the user's lock itself
    (:attr:`locks`, shared with the Memory); the other write methods expect their caller to hold
    it."""

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
        names: NameVectors | None = None,
    ) -> None:
        self._settings = settings
        self._names = names  # the topic signal's name vectors: embedded before the lock
        self._stores = stores
        self._embed = embed
        #: the configured extractor, the rules it falls back to, and re-extraction
        self._extractors = Extractors(extractor, rules, usage)
        self._chat = chat
        self._usage = usage
        #: The users' write locks (shared with the Memory; with a Chroma server, leases). The
        #: writer owns the journal, so it finishes a dead holder's batch; the graph cache feeds
        #: supersession and the record copy dedup, so both catch up when another process wrote
        #: last.
        self.locks = WriteLocks(stores.leases, recover=self._recover_orphan,
                                refresh=stores.refresh, settle=stores.settle)

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
        was merged into). Model calls run without the user's lock (see the module docstring)."""
        prepared = self.prepare(user_id, requests, infer=infer, key=key, cause=cause)
        for _ in range(PLAN_ATTEMPTS - 1):
            with self.locks(user_id):
                stored = self.try_commit(prepared)
            if stored is not None:
                return stored
            self._fill(prepared)  # the answers the newer plan lacked, without the lock
        with self.locks(user_id):
            return self.commit(prepared)

    def prepare(
        self,
        user_id: str,
        requests: Sequence[AddRequest],
        *,
        infer: bool,
        key: str | None = None,
        cause: str = "add",
    ) -> Prepared:
        """Plan the batch from the stores as they are, making every model call that plan needs
        (embedding, extraction, judge); the caller need not hold the lock, and nothing is written."""
        prepared = Prepared(user_id=user_id, requests=list(requests), infer=infer, key=key,
                            cause=cause)
        self._fill(prepared)
        return prepared

    def _fill(self, prepared: Prepared) -> None:
        prepared.epoch = self.locks.epoch(prepared.user_id)  # before the reads it vouches for
        prepared.planned = self._plan(prepared, OnMissing.CALL)

    def commit(self, prepared: Prepared) -> list[MemoryItem]:
        """Plan again from the stores as they are now and apply it (the caller holds the lock);
        a model answer ``prepared`` lacks is done without (:attr:`OnMissing.MAKE_DO`)."""
        return self._commit(prepared, OnMissing.MAKE_DO)

    def try_commit(self, prepared: Prepared) -> list[MemoryItem] | None:
        """Like :meth:`commit`, but None (nothing written) when the plan needs a model answer
        ``prepared`` lacks (:attr:`OnMissing.GIVE_UP`): release the lock, :meth:`prepare` again,
        retry."""
        try:
            return self._commit(prepared, OnMissing.GIVE_UP)
        except _Unanswered:
            return None

    def _commit(self, prepared: Prepared, on_missing: OnMissing) -> list[MemoryItem]:
        planned, prepared.planned = prepared.planned, None
        if planned is None or prepared.epoch != self.locks.epoch(prepared.user_id):
            planned = self._plan(prepared, on_missing)  # something was written since: plan again
        plan, order = planned
        self.apply(prepared.user_id, plan, cause=prepared.cause)
        if plan.fresh:
            self._supersede_contradictions(prepared.user_id, plan)
        return [plan.items[plan.merged_into.get(i, i)] for i in order]

    def prepare_text(self, user_id: str, text: str, *, source: str) -> Prepared:
        """The vector and extraction of a caller's new text for :meth:`update`, made before the
        lock is taken."""
        prepared = Prepared(user_id=user_id, requests=[], infer=True, cause="update")
        self._vectors_for(prepared, [text], OnMissing.CALL)
        self._found_for(prepared, [(text, speaker(user_id, source))], OnMissing.CALL)
        return prepared

    def update(self, user_id: str, old: MemoryItem, new: MemoryItem,
               *, prepared: Prepared | None = None) -> None:
        """Write a changed memory; a new text is re-embedded, re-indexed and re-extracted (with
        the answers of :meth:`prepare_text` when given, so no model is called here)."""
        plan = WritePlan()
        event = HistoryEvent(memory_id=new.id, action="update", cause="updated by the caller")
        if new.text != old.text:
            p = prepared or Prepared(user_id=user_id, requests=[], infer=True, cause="update")
            self._vectors_for(p, [new.text], OnMissing.CALL)  # only without prepare_text's vector
            plan.erase = True
            plan.rewrite(new, p.vectors[new.text], event)
            self._extract_into(p, plan, OnMissing.CALL if prepared is None else OnMissing.MAKE_DO)
        else:
            plan.touch(new, event)
        self.apply(user_id, plan, cause="update")
        if new.text != old.text:  # the old text must leave no trace in the history either
            self._stores.history.scrub(user_id, [new.id])

    def supersede(self, user_id: str, older: Sequence[MemoryItem], newer: MemoryItem,
                  *, cause: str) -> None:
        """Mark stored memories as superseded by ``newer`` (metadata, graph, history)."""
        plan = WritePlan()
        for item in older:
            plan.supersede(item, newer, cause=cause)
        self.apply(user_id, plan, cause=cause)

    def delete(self, user_id: str, ids: Sequence[str], *, action: str, cause: str) -> None:
        """Delete memories from every store, physically (the vector store's files within its
        purge delay, see :meth:`VectorStore.purge`); their history keeps the event, not the text."""
        self._run(Intent(user_id=user_id, deleted=list(ids), events=[
            HistoryEvent(memory_id=i, action=action, cause=cause) for i in ids  # type: ignore[arg-type]
        ]))

    def apply(self, user_id: str, plan: WritePlan, *, cause: str) -> None:
        """Write the plan through the journal: vectors first (the source of truth), then the
        graph, with the lexical index and the history beside it."""
        writes = plan.written
        added = [
            HistoryEvent(memory_id=i, action="add", cause=cause, text=plan.items[i].text,
                         at=plan.items[i].created_at)
            for i in plan.fresh if i not in plan.merged_into
        ]
        self._run(Intent(
            user_id=user_id, written=[plan.items[i] for i in writes], rewritten=plan.rewritten,
            erase=plan.erase,
            extractions={i: plan.extractions[i] for i in [*writes, *plan.updated]
                         if i in plan.extractions},
            updated=[plan.items[i] for i in plan.updated], superseded=plan.superseded,
            events=added + plan.events,
        ), [plan.vectors[i] for i in writes])

    def _run(self, intent: Intent, vectors: Sequence[list[float]] = ()) -> None:
        """Journal the batch, write every store, clear the journal. An exception here undoes
        the new vectors (so nothing is half-written) and clears the journal; a crash leaves the
        journal for :meth:`recover`."""
        user_id = intent.user_id
        self._journal(user_id, intent)
        if intent.written:
            self._stores.vectors.upsert(user_id, intent.written, vectors)
        try:
            journal.apply(self._stores, intent)
        except Exception:
            new = [i.id for i in intent.written if i.id not in intent.rewritten]
            self._stores.vectors.delete(user_id, new)
            self._stores.lexical.delete(user_id, new)
            self._journal(user_id, None)
            raise
        self._journal(user_id, None)

    def recover(self) -> int:
        """Finish or undo the batches a crash left in the journal (call before any write);
        returns how many there were. (Server mode keeps its journal in the user's lease, see
        :mod:`hybridmem.replica.lease`: the next process to take a dead holder's lease recovers it.)"""
        return journal.recover(self._settings.data_dir, self._stores)

    def _recover_orphan(self, user_id: str, text: str) -> None:
        """Finish a batch a dead process left in the lease this process just took."""
        journal.settle(self._stores, Intent.model_validate_json(text))
        self._journal(user_id, None)

    def _journal(self, user_id: str, intent: Intent | None) -> None:
        """Make a batch durable before its first store write (None: forget it after the last):
        in the user's lease with a Chroma server, else in the user's folder."""
        lease = self.locks.lease(user_id)
        if lease is not None and self.locks.leases is not None:
            self.locks.leases.journal(lease, "" if intent is None else intent.model_dump_json())
        elif intent is not None:
            journal.begin(self._settings.data_dir, intent)
        else:
            journal.finish(self._settings.data_dir, user_id)

    # -- planning ----------------------------------------------------------------------------------
    def _plan(self, p: Prepared, on_missing: OnMissing) -> tuple[WritePlan, list[str]]:
        """The batch's plan from the stores as they are, and the memory id of each request; a
        model answer ``p`` lacks is handled as ``on_missing`` says (:class:`OnMissing`)."""
        user_id, now = p.user_id, p.now
        plan = WritePlan()
        dedup = self._settings.dedup
        existing = self._existing_by_hash(
            user_id, [r.text for r in p.requests if r.kind != "turn"]
        ) if dedup else {}
        by_hash: dict[str, str] = {}
        order: list[str] = []
        for r in p.requests:
            h = text_hash(r.text)
            target = None
            if r.kind != "turn" and dedup:
                target = by_hash.get(h) or (existing[h].id if h in existing else None)
            if target is not None:
                base = plan.items.get(target) or existing[h]
                bumped = policy.bumped(base, r, now)
                plan.touch(bumped, HistoryEvent(
                    memory_id=target, action="merge", cause="identical text"))
                plan.stated(base, bumped)
                order.append(target)
                continue
            # items of one batch keep their order: each gets its own microsecond
            item = new_item(user_id, r, now + timedelta(microseconds=len(order)), key=p.key)
            plan.add_fresh(item)
            by_hash[h] = item.id
            order.append(item.id)
        if plan.fresh:
            calls = on_missing is OnMissing.CALL
            names = self._names_first(p, plan) if calls else []
            self._vectors_for(p, [plan.items[i].text for i in plan.fresh] + names, on_missing)
            if self._names is not None:  # new node names share the texts' embedding call
                self._names.offer(user_id, names, [p.vectors[n] for n in names])
            plan.vectors.update((i, p.vectors[plan.items[i].text]) for i in plan.fresh)
            if dedup:
                self._merge_near_duplicates(p, plan, on_missing)
            self._extract_into(p, plan, on_missing)
            if calls and self._names is not None:  # an LLM's names, or a fresh plan's
                self._names.prefetch(user_id, plan.extractions.values())
        return plan, order

    def _names_first(self, p: Prepared, plan: WritePlan) -> list[str]:
        """An offline extractor (cheap) extracts first: new node names join the texts' embedding
        call."""
        if self._names is None or not self._extractors.offline:
            return []
        keys = [(plan.items[i].text, speaker(p.user_id, plan.items[i].source)) for i in plan.fresh]
        self._found_for(p, keys, OnMissing.CALL)
        return self._names.wanted(p.user_id, [p.found[k].extraction for k in keys])

    def _vectors_for(self, p: Prepared, texts: Sequence[str], on_missing: OnMissing) -> None:
        """Embed the texts ``p`` has no vector for (under ``MAKE_DO`` too: no memory is stored
        without its vector)."""
        lacking = [t for t in dict.fromkeys(texts) if t not in p.vectors]
        if lacking:
            if on_missing is OnMissing.GIVE_UP:
                raise _Unanswered
            p.vectors.update(zip(lacking, self._embed(lacking)))

    def _existing_by_hash(self, user_id: str, texts: Sequence[str]) -> dict[str, MemoryItem]:
        hashes = tuple(sorted({text_hash(t) for t in texts}))
        if not hashes:
            return {}
        where = all_of(
            Condition("text_hash", "$in", hashes), eq("current", True),
            Condition("kind", "$ne", "turn"),
        )
        return {text_hash(i.text): i for i in self._stores.vectors.list(user_id, where=where)}

    def _merge_near_duplicates(self, p: Prepared, plan: WritePlan, on_missing: OnMissing) -> None:
        """Merge each fresh fact into the current fact it repeats: a stored one (among its three
        nearest, see :meth:`_stored_repeated`) or else an earlier fact of the batch (among its
        three nearest, by the rules alone)."""
        facts = [i for i in plan.fresh if plan.items[i].kind == "fact"]
        if not facts:
            return
        stored = self._stores.vectors.query(
            p.user_id, [plan.vectors[i] for i in facts], limit=3,
            where=all_of(eq("current", True), eq("kind", "fact")),
        )
        seen: list[int] = []  # positions in ``facts`` of the batch's distinct facts
        matrix = np.asarray([plan.vectors[i] for i in facts], dtype=np.float32)
        for position, (memory_id, hits) in enumerate(zip(facts, stored)):
            item = plan.items[memory_id]
            best = self._stored_repeated(p, plan, item, hits, on_missing)
            if best is None and seen:
                sims = matrix[seen] @ matrix[position]
                earlier = [(float(sims[k]), plan.items[facts[seen[int(k)]]])
                           for k in np.argsort(-sims)[:3]]
                best = next(((cosine, prior) for cosine, prior in earlier
                             if self._near_duplicate(item, prior, cosine)), None)
            if best is None:
                seen.append(position)
            else:
                plan.merge(item, best[1], p.now, cosine=best[0])

    def _stored_repeated(self, p: Prepared, plan: WritePlan, item: MemoryItem,
                         hits: Sequence[VectorHit], on_missing: OnMissing,
                         ) -> tuple[float, MemoryItem] | None:
        """The stored fact the fresh ``item`` repeats (and their cosine): the first of its nearest
        ``hits`` judged a duplicate by :meth:`_verdict_on_stored`. A stored fact judged updated
        by ``item`` on the way is superseded by it."""
        for hit in hits:
            old = plan.items.get(hit.item.id) or hit.item
            verdict = self._verdict_on_stored(p, old, item, hit.similarity, on_missing)
            if verdict == "DUPLICATE":
                return hit.similarity, old
            if verdict == "UPDATE":
                plan.supersede(old, item, cause="LLM judged it an update")
        return None

    def _verdict_on_stored(self, p: Prepared, old: MemoryItem, new: MemoryItem, cosine: float,
                           on_missing: OnMissing) -> policy.Verdict | None:
        """Whether the fresh ``new`` repeats the stored ``old`` ("DUPLICATE"), updates it
        ("UPDATE") or stands beside it ("KEEP_BOTH", or None: no verdict). The rules decide
        first; in the judge's cosine band, the judge (asked as ``on_missing`` says: under
        ``MAKE_DO`` a pair it was not asked about gets None)."""
        s = self._settings
        if self._near_duplicate(new, old, cosine):
            return "DUPLICATE"
        if not (s.judge_band_min <= cosine and s.llm_configured and s.judge):
            return None
        pair = (old.text, new.text)
        if pair not in p.verdicts:
            if on_missing is OnMissing.GIVE_UP:
                raise _Unanswered
            p.verdicts[pair] = self._judge(*pair) if on_missing is OnMissing.CALL else None
        return p.verdicts[pair]

    def _near_duplicate(self, new: MemoryItem, old: MemoryItem, cosine: float) -> bool:
        """:func:`policy.near_duplicate` with this memory's thresholds."""
        s = self._settings
        return policy.near_duplicate(new.text, old.text, cosine,
                                     jaccard_min=s.dedup_jaccard, cosine_min=s.dedup_cosine)

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

    def _extract_into(self, p: Prepared, plan: WritePlan, on_missing: OnMissing) -> None:
        """Attach the extraction of every written text (see :meth:`_found_for`), with what the
        caller stated about it (:attr:`~hybridmem.models.MemoryItem.knowledge`) merged in."""
        items = [plan.items[i] for i in plan.written]
        keys = [(i.text, speaker(p.user_id, i.source)) for i in items]
        self._found_for(p, keys, on_missing)
        for item, k in zip(items, keys):
            f = p.found[k]
            found = item.knowledge.over(f.extraction) if item.knowledge else f.extraction
            plan.extracted(item.model_copy(update={
                "extractor": f.extractor, "needs_extraction": f.needs_extraction}), found)

    def _found_for(self, p: Prepared, keys: Sequence[Key], on_missing: OnMissing) -> None:
        """Extract the texts ``p`` has no extraction for: under ``CALL`` with the extractor (a
        model when ``p.infer``), under ``MAKE_DO`` offline as with ``infer=False``, the memory
        marked for :meth:`reextract` when a model should have run."""
        lacking = [k for k in dict.fromkeys(keys) if k not in p.found]
        if not lacking:
            return
        if on_missing is OnMissing.GIVE_UP:
            raise _Unanswered
        if on_missing is OnMissing.CALL:
            p.found.update(zip(lacking, self._extractors.found(lacking, infer=p.infer)))
            return
        wanted = p.infer and self._extractors.calls_a_model
        for k, f in zip(lacking, self._extractors.found(lacking, infer=False)):
            p.found[k] = Found(f.extractor, f.needs_extraction or wanted, f.extraction)

    def reextract(self, user_id: str) -> list[tuple[MemoryItem, Extraction]]:
        """See :func:`hybridmem.write.extraction.reextract` (model calls; no lock needed)."""
        return reextract(self._extractors, self._stores, user_id)

    def store_reextracted(self, user_id: str,
                          results: Sequence[tuple[MemoryItem, Extraction]]) -> int:
        """See :func:`hybridmem.write.extraction.store_reextracted` (callers hold the lock)."""
        return store_reextracted(self._stores, user_id, results)

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
