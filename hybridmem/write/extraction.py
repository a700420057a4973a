"""Running the extractor: batches, the rules as fallback, and re-extraction of what they covered.

A failing model never loses a memory: when the configured extractor raises a
:class:`~hybridmem.errors.BackendError`, the offline rules extract instead and the memory is
marked ``needs_extraction``; :func:`reextract` later asks the model again for the user's marked
memories and :func:`store_reextracted` writes what came back.

- :class:`Extractors` — the configured extractor and its fallback; what an (text, speaker) holds.
- :func:`reextract` — the model's extraction of the user's marked memories (no lock needed).
- :func:`store_reextracted` — replace their graph evidence and clear the mark (under the lock).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from hybridmem.errors import BackendError
from hybridmem.filters import all_of, eq
from hybridmem.models import Extraction, HistoryEvent, MemoryItem
from hybridmem.protocols import BatchExtractor, Extractor
from hybridmem.stores import Stores
from hybridmem.write.plan import Found, Key, UsageMeter, speaker

__all__ = ["EXTRACT_BATCH", "Extractors", "reextract", "store_reextracted"]

log = logging.getLogger(__name__)
#: Most texts sent to an LLM extractor in one call.
EXTRACT_BATCH = 16


class Extractors:
    """The configured extractor (None: no graph) and the offline rules it gives way to, created
    on first need by ``rules``; every extraction's token usage goes to ``usage``."""

    def __init__(self, extractor: Extractor | None, rules: Callable[[], Extractor],
                 usage: UsageMeter) -> None:
        self.configured = extractor
        self._rules = rules
        self._usage = usage

    @property
    def offline(self) -> bool:
        """Whether extraction calls no model (the rules are configured)."""
        return self.configured is not None and self.configured.offline

    @property
    def calls_a_model(self) -> bool:
        """Whether the configured extractor calls a model (so its memories can be re-extracted)."""
        return self.configured is not None and not self.configured.offline

    def found(self, keys: Sequence[Key], *, infer: bool) -> list[Found]:
        """The entities of each (text, speaker), at most :data:`EXTRACT_BATCH` texts per model
        call. A failing model never loses a memory: the rules extract instead and the memory is
        marked ``needs_extraction``. ``infer=False`` never calls a model: an extractor that is
        not :attr:`~hybridmem.protocols.Extractor.offline` gives way to the rules."""
        extractor = self.configured
        if extractor is None or not keys:
            return [Found("none", False, Extraction()) for _ in keys]
        if not infer and not extractor.offline:
            extractor = self._rules()
        out: list[Found] = []
        for start in range(0, len(keys), EXTRACT_BATCH):
            chunk = keys[start : start + EXTRACT_BATCH]
            texts, speakers = [k[0] for k in chunk], [k[1] for k in chunk]
            try:
                if isinstance(extractor, BatchExtractor) and len(chunk) > 1:
                    found = extractor.extract_batch(texts, list(speakers))
                else:
                    found = [extractor.extract(t, speaker=sp) for t, sp in chunk]
                name, failed = extractor.name, False
            except BackendError as exc:
                log.warning("extraction with %s failed (%s); rules used, marked for re-extraction",
                            extractor.name, type(exc).__name__)
                rules = self._rules()
                found = [rules.extract(t, speaker=sp) for t, sp in chunk]
                name, failed = rules.name, True
            for extraction in found:
                self._usage.add(extraction.usage)
            out.extend(Found(name, failed, e) for e in found)
        return out

    def of_items(self, user_id: str, items: Sequence[MemoryItem], *,
                 infer: bool) -> list[tuple[MemoryItem, Extraction]]:
        """Each item (marked with who extracted it) and its entities; see :meth:`found`."""
        keys = [(i.text, speaker(user_id, i.source)) for i in items]
        return [
            (i.model_copy(update={"extractor": f.extractor,
                                  "needs_extraction": f.needs_extraction}), f.extraction)
            for i, f in zip(items, self.found(keys, infer=infer))
        ]


def reextract(extractors: Extractors, stores: Stores,
              user_id: str) -> list[tuple[MemoryItem, Extraction]]:
    """Extract again the user's current memories marked ``needs_extraction`` (model calls;
    callers need not hold the user's lock). Returns those that succeeded, unmarked."""
    if not extractors.calls_a_model:
        return []
    marked = stores.vectors.list(
        user_id, where=all_of(eq("needs_extraction", True), eq("current", True)))
    marked.sort(key=lambda i: (i.created_at, i.id))
    return [(item, found) for item, found in extractors.of_items(user_id, marked, infer=True)
            if not item.needs_extraction]


def store_reextracted(stores: Stores, user_id: str,
                      results: Sequence[tuple[MemoryItem, Extraction]]) -> int:
    """Write :func:`reextract`'s results (callers hold the user's lock): the graph evidence
    of each memory is replaced and the mark cleared. Memories deleted, changed or superseded
    since are skipped. Returns how many were written."""
    if not results:
        return 0
    now = {i.id: i for i in stores.vectors.get(user_id, [r[0].id for r in results])}
    kept = [(item, found) for item, found in results if item.id in now
            and now[item.id].text == item.text and now[item.id].is_current]
    if not kept:
        return 0
    items = [now[i.id].model_copy(update={"needs_extraction": False,
                                          "extractor": i.extractor}) for i, _ in kept]
    ids = [i.id for i in items]
    # the graph first: if a crash comes between, the marks stay and a new call redoes it
    stores.graph.remove_memory(user_id, ids)
    # links=False: the memories redone come from many conversations, not one; each loses
    # its place in its own episode (remove_memory unlinks it), which costs the graph an
    # episodic edge, never a wrong one
    # what the caller stated with a memory stays beside what the model found in it
    stores.graph.add_extractions(user_id, [
        (i.id, i.knowledge.over(f) if i.knowledge else f) for i, (_, f) in zip(items, kept)
    ], links=False)
    stores.vectors.update(user_id, items)
    stores.history.record(user_id, [
        HistoryEvent(memory_id=i.id, action="update", cause=f"re-extracted with {i.extractor}")
        for i in items
    ])
    return len(items)
