"""The intent journal: a write that touches several stores is recoverable after a crash.

Before the first store is written, the whole batch — the memories (the vector store is the source
of truth), their extractions, the fields that change, the deletions and the history events — is
written to ``users/<hash>/pending.json`` (temp file, fsync, rename, directory fsync). After the
last store it is removed. A process killed in between leaves the file; the next Memory on the
data dir finishes the batch before anything else touches the user (see
:meth:`hybridmem.write.Writer.recover`): forward when the vectors landed, back when they did not.
Every step is idempotent, so recovering twice, or recovering a batch that had in fact finished,
changes nothing.

The file carries memory text only while its batch is in flight; nothing of it stays afterwards.

**Server mode** (``chroma_url``) writes the same :class:`Intent` into the user's write lease in the
Chroma server instead of a local file (:mod:`hybridmem._lease`), so any process, on any host, can
finish a batch whose writer died: the next one to take the user's lease after it expired does,
before its own write. It covers what this journal covers — the main collection's records (the
commit point), the graph records, the history and the lexical rows of this process's cache (other
processes' caches catch up by their own checks) — for every batch written through
:class:`~hybridmem.write.Writer`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hybridmem._files import atomic_write_bytes, user_dir
from hybridmem.errors import CorruptStateError
from hybridmem.models import Extraction, HistoryEvent, MemoryItem

__all__ = ["PENDING_FILE", "Intent", "begin", "finish", "pending"]

log = logging.getLogger(__name__)
PENDING_FILE = "pending.json"


class Intent(BaseModel):
    """Everything one batch writes, in the order :class:`~hybridmem.write.Writer` writes it."""

    model_config = ConfigDict(extra="forbid")

    user_id: str
    written: list[MemoryItem] = Field(default_factory=list)  # upserted with new vectors
    rewritten: list[str] = Field(default_factory=list)  # of ``written``: stored ones, new text
    erase: bool = False  # rewritten texts were the caller's to erase
    extractions: dict[str, Extraction] = Field(default_factory=dict)
    updated: list[MemoryItem] = Field(default_factory=list)  # fields only
    superseded: list[str] = Field(default_factory=list)
    deleted: list[str] = Field(default_factory=list)
    events: list[HistoryEvent] = Field(default_factory=list)


def _path(data_dir: Path, user_id: str) -> Path:
    return user_dir(data_dir, user_id) / PENDING_FILE


def begin(data_dir: Path, intent: Intent) -> None:
    """Make the batch durable before any store is written."""
    atomic_write_bytes(_path(data_dir, intent.user_id), intent.model_dump_json().encode("utf-8"))


def finish(data_dir: Path, user_id: str) -> None:
    """The batch is in every store: forget it. (If this removal is lost in a crash, recovery
    replays a finished batch, which changes nothing.)"""
    try:
        os.unlink(_path(data_dir, user_id))
    except FileNotFoundError:
        pass


def pending(data_dir: Path) -> Iterator[Intent]:
    """The batches a crash left unfinished under ``data_dir``, one per user at most."""
    for path in sorted((data_dir / "users").glob(f"*/{PENDING_FILE}")):
        try:
            yield Intent.model_validate_json(path.read_bytes())
        except (OSError, ValidationError) as exc:
            raise CorruptStateError(
                f"the unfinished write {path} cannot be read ({exc}); move it away to drop that "
                "batch (its memories then stay as the vector store has them)"
            ) from exc
