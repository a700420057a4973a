"""The write path's values: a :class:`WritePlan` (what one batch changes), the model answers a
write gathers before it takes the user's lock (:class:`Prepared`), what planning does about an
answer it lacks (:class:`OnMissing`), and the usage meter. No I/O: :mod:`hybridmem.write.writer`
makes the calls and applies the plans."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum

from hybridmem.write import policy
from hybridmem.models import (
    AddRequest,
    Extraction,
    HistoryEvent,
    MemoryItem,
    Usage,
    new_id,
    utcnow,
)

__all__ = ["Found", "Key", "OnMissing", "Prepared", "UsageMeter", "WritePlan", "new_item",
           "speaker"]


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
    stop being current. ``extractions`` holds the graph evidence of the written memories, and of
    touched ones that gained caller knowledge (:meth:`stated`)."""

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

    def stated(self, before: MemoryItem, after: MemoryItem) -> None:
        """A memory whose text stays gained what a caller stated with a repeat of it: that
        knowledge joins the graph with the memory's evidence (a fresh memory's extraction
        covers it anyway)."""
        if after.knowledge and after.knowledge != before.knowledge and after.id not in self.fresh:
            self.extractions[after.id] = after.knowledge.over(Extraction(extractor="caller"))

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
            self.stated(into, result)
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


Key = tuple[str, str]  # (text, speaker): what an extraction depends on


class OnMissing(Enum):
    """What planning does when it needs a model answer (a vector, an extraction, the judge's
    verdict) that its :class:`Prepared` does not hold. A plan calls a chat model (the extractor,
    the judge) only under ``CALL``, and the embedder only under ``CALL`` and ``MAKE_DO``.
    :meth:`~hybridmem.write.writer.Writer.write` plans with ``CALL`` outside the user's lock,
    with ``GIVE_UP`` under it, and with ``MAKE_DO`` on its last attempt."""

    CALL = "call"
    """Call the embedder, the extractor or the judge, and keep the answer in the
    :class:`Prepared`; new graph node names are embedded too. For planning without the lock."""

    GIVE_UP = "give_up"
    """Call nothing: planning stops and nothing is written, so the caller can release the lock,
    gather the missing answers with ``CALL``, and plan again."""

    MAKE_DO = "make_do"
    """Call no chat model: a pair the judge was not asked about keeps both memories; a text is
    extracted offline (an extractor that calls a model gives way to the rules) and marked
    ``needs_extraction`` when a model should have run. A missing vector is still embedded: no
    memory is stored without one."""


@dataclass
class Found:
    """One text's entities and who found them (``needs_extraction``: the model failed)."""

    extractor: str
    needs_extraction: bool
    extraction: Extraction


@dataclass
class Prepared:
    """The model answers a write needs, gathered before the user's lock is taken and keyed by
    text, so a plan made later from newer store state reuses every answer that still applies."""

    user_id: str
    requests: list[AddRequest]
    infer: bool
    key: str | None = None
    cause: str = "add"
    now: datetime = field(default_factory=utcnow)
    vectors: dict[str, list[float]] = field(default_factory=dict)
    found: dict[Key, Found] = field(default_factory=dict)
    verdicts: dict[tuple[str, str], policy.Verdict | None] = field(default_factory=dict)
    #: The plan made with the answers, and the user's write epoch it was made at: if no write
    #: happened since (same epoch under the lock), it is applied as it is, without re-reading.
    planned: tuple[WritePlan, list[str]] | None = None
    epoch: int | None = None


def new_item(user_id: str, r: AddRequest, now: datetime, *, key: str | None) -> MemoryItem:
    created = r.created_at or now
    return MemoryItem(
        id=new_id(), user_id=user_id, text=r.text, kind=r.kind, category=r.category,
        importance=r.importance, confidence=r.confidence, source=r.source, created_at=created,
        updated_at=created, valid_from=created, expires_at=r.expires_at, metadata=r.metadata,
        key=key, knowledge=r.knowledge,
    )


def speaker(user_id: str, source: str) -> str:
    """Who said a memory, for the extractor: the user's id for the user's own words."""
    return user_id if source == "user" else source
