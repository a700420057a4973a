"""Server-mode history: the audit log of a user's memories in the Chroma server, shared by every
process (with ``chroma_url`` nothing of a user may live on one host's disk).

One record per :class:`~hybridmem.models.HistoryEvent` in the side collection ``h-<user key>``:
id the event's id (Chroma's ``add`` keeps an existing id, so recording an event twice — a
recovered batch, an import — changes nothing), no document, metadata ``event`` (the event as
JSON), ``memory_id`` and ``seq`` (the recording time in nanoseconds plus the event's position in
its batch: the order events are listed in, as the SQLite log's rowid is embedded). Scrubbing a
deleted memory rewrites its events' ``event`` without their text.

Why the event is a metadata value and not the document: Chroma indexes every document for
full-text search, which costs the server about three times what the same bytes cost as metadata
(see :mod:`hybridmem.replica.snapshot`), and nothing searches events by text. A record without
``event`` is read as the layout of earlier versions, the event JSON in its document; a scrub
moves it into ``event`` and empties the document.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from hybridmem.chroma import client as _chroma
from hybridmem.models import HistoryEvent

if TYPE_CHECKING:
    from chromadb.api import ClientAPI
    from chromadb.api.models.Collection import Collection
    from chromadb.api.types import Metadata, PyEmbedding, Where

__all__ = ["ChromaHistoryLog"]

_UNIT = [1.0]  # Chroma wants a vector per record; events are never searched by vector
BATCH = 1000
_SCHEMA = 1
#: The metadata key holding a record's event as JSON.
EVENT = "event"


def _payload(meta: Mapping[str, Any] | None, document: str | None) -> str:
    """A record's event JSON: its ``event`` metadata, or the document of an older record."""
    value = (meta or {}).get(EVENT)
    return value if isinstance(value, str) and value else (document or "{}")


def _of(memory_ids: Sequence[str]) -> Where:
    among: dict[Literal["$in", "$nin"], list[str | int | float | bool]] = {"$in": [*memory_ids]}
    return {"memory_id": among}


class ChromaHistoryLog:
    """:class:`~hybridmem.protocols.HistoryLog` in a Chroma server (see the module docstring).
    Thread-safe; the client (or the handles, see :func:`~hybridmem.chroma.client.handles_of`)
    is borrowed (the vector store owns and closes it)."""

    def __init__(self, client: ClientAPI | _chroma.CollectionHandles) -> None:
        self._handles = _chroma.handles_of(
            client, hint="check that the Chroma server at chroma_url is reachable")

    def __repr__(self) -> str:
        return "ChromaHistoryLog()"

    def _run(self, user_id: str, what: str, call: Any, *, create: bool = False) -> Any:
        meta: _chroma.CollectionMeta | None = (
            {"kind": "hybridmem-history", "schema": _SCHEMA} if create else None)
        return self._handles.run(_chroma.collection_name(user_id, "history"), call, user_id=user_id,
                                 what=what, create=meta)

    def record(self, user_id: str, events: Sequence[HistoryEvent]) -> None:
        """Append events (an event id already present is ignored)."""
        if not events:
            return
        start = time.time_ns()
        for lo in range(0, len(events), BATCH):
            part = events[lo : lo + BATCH]
            metas: list[Metadata] = [
                {"memory_id": e.memory_id, "seq": start + lo + n, EVENT: e.model_dump_json()}
                for n, e in enumerate(part)]
            units: list[PyEmbedding] = [_UNIT] * len(part)

            def add(c: Collection, part: Sequence[HistoryEvent] = part,
                    metas: list[Metadata] = metas, units: list[PyEmbedding] = units) -> None:
                c.add(ids=[e.id for e in part], embeddings=units, metadatas=metas)

            self._run(user_id, "record history", add, create=True)

    def list(self, user_id: str, memory_id: str | None = None) -> builtins.list[HistoryEvent]:
        """Events oldest first, all of the user's or one memory's."""
        where = _of([memory_id]) if memory_id is not None else None
        got = self._run(user_id, "read the history", lambda c: c.get(
            where=where, include=["documents", "metadatas"]))
        if not got:
            return []
        rows = sorted(
            (int((m or {}).get("seq", 0)), i, _payload(m, d))
            for i, d, m in zip(got["ids"], got["documents"] or [], got["metadatas"] or [])
        )
        return [HistoryEvent.model_validate_json(d) for _, _, d in rows]

    def scrub(self, user_id: str, memory_ids: Sequence[str]) -> None:
        """Remove the texts that events of deleted memories carried."""
        if not memory_ids:
            return
        for lo in range(0, len(memory_ids), BATCH):
            where = _of(memory_ids[lo : lo + BATCH])

            def scrub(c: Collection, where: Where = where) -> None:
                got = c.get(where=where, include=["documents", "metadatas"])
                if not got["ids"]:
                    return
                clean: list[Metadata] = [{EVENT: HistoryEvent.model_validate_json(
                    _payload(m, d)).model_copy(update={"text": None, "detail": {}}
                                               ).model_dump_json()}
                    for d, m in zip(got["documents"] or [], got["metadatas"] or [])]
                units: list[PyEmbedding] = [_UNIT] * len(clean)  # else Chroma re-embeds
                # the document is emptied too: an older record's event (with its text) is there
                c.update(ids=got["ids"], metadatas=clean, documents=[""] * len(clean),
                         embeddings=units)

            self._run(user_id, "scrub the history", scrub)

    def drop_user(self, user_id: str) -> None:
        """Delete the user's history collection."""
        self._handles.drop(_chroma.collection_name(user_id, "history"), user_id=user_id,
                           what="delete the history")

    def close(self) -> None:
        """Forget cached handles (the client is the vector store's)."""
        self._handles.clear()
