"""The intent journal: a write that touches several stores is recoverable after a crash.

Before the first store is written, the whole batch — the memories (the vector store is the source
of truth), their extractions, the fields that change, the deletions and the history events — is
written to ``users/<hash>/pending.json`` and fsync'd. After the last store the file is truncated
to nothing. A process killed in between leaves it; the next Memory on the data dir finishes the
batch before anything else touches the user (:func:`recover`, :func:`settle`):
forward when the vectors landed, back when they did not. Every step is idempotent, so recovering
twice, or recovering a batch that had in fact finished (a truncation lost in a power cut),
changes nothing.

**One file, rewritten in place.** The file stays between batches (empty: nothing pending) and
each batch overwrites it: truncate, write, one fsync. Why: a temp file, rename and directory
fsync per batch, then an unlink, are four directory changes the file system must commit; they
were about a tenth of a single ``add``. In-place writes are not atomic, so the content is framed:
a header line with the body's length and SHA-256 (:data:`MAGIC`). A body that does not match its
header is a batch whose journal write was cut short — before any store was written, since the
first store write waits for the fsync — so it is dropped (and logged). A file without the header
is read as the whole-file JSON of earlier versions.

The file carries memory text only while its batch is in flight; nothing of it stays afterwards.

**Server mode** (``chroma_url``) writes the same :class:`Intent` into the user's write lease in the
Chroma server instead of a local file (:mod:`hybridmem.replica.lease`), so any process, on any host, can
finish a batch whose writer died: the next one to take the user's lease after it expired does,
before its own write. It covers what this journal covers — the main collection's records (the
commit point), the graph records, the history and the lexical rows of this process's cache (other
processes' caches catch up by their own checks) — for every batch written through
:class:`~hybridmem.write.writer.Writer`.
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hybridmem.runtime.files import user_dir
from hybridmem.errors import CorruptStateError, StorageError
from hybridmem.models import Extraction, HistoryEvent, MemoryItem
from hybridmem.stores import Stores

__all__ = ["MAGIC", "PENDING_FILE", "Intent", "apply", "begin", "finish", "frame", "parse", "pending",
           "recover", "settle"]

log = logging.getLogger(__name__)
PENDING_FILE = "pending.json"
#: The start of a journal's header line: ``hybridmem-intent 1 <body bytes> <sha256 hex>``.
MAGIC = b"hybridmem-intent 1 "


class Intent(BaseModel):
    """Everything one batch writes, in the order :class:`~hybridmem.write.writer.Writer` writes it."""

    model_config = ConfigDict(extra="forbid")

    user_id: str
    written: list[MemoryItem] = Field(default_factory=list)  # upserted with new vectors
    rewritten: list[str] = Field(default_factory=list)  # of ``written``: stored ones, new text
    erase: bool = False  # rewritten texts were the caller's to erase
    #: graph evidence of ``written`` (extracted, and stated by the caller), and of the
    #: ``updated`` that gained caller knowledge
    extractions: dict[str, Extraction] = Field(default_factory=dict)
    updated: list[MemoryItem] = Field(default_factory=list)  # fields only
    superseded: list[str] = Field(default_factory=list)
    deleted: list[str] = Field(default_factory=list)
    events: list[HistoryEvent] = Field(default_factory=list)


def _path(data_dir: Path, user_id: str, *, create: bool = True) -> Path:
    return user_dir(data_dir, user_id, create=create) / PENDING_FILE


def frame(intent: Intent) -> bytes:
    """The file's content for ``intent``: the header line, then the JSON body."""
    body = intent.model_dump_json().encode("utf-8")
    return MAGIC + f"{len(body)} {hashlib.sha256(body).hexdigest()}\n".encode("ascii") + body


def begin(data_dir: Path, intent: Intent) -> None:
    """Make the batch durable before any store is written (one fsync; the directory is fsync'd
    too when the file is new)."""
    path = _path(data_dir, intent.user_id)
    data = frame(intent)
    try:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            created = True
        except FileExistsError:
            fd = os.open(path, os.O_WRONLY)
            created = False
        try:
            os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
    except OSError as exc:
        raise StorageError(f"could not write {path}: {exc}") from exc


def finish(data_dir: Path, user_id: str) -> None:
    """The batch is in every store: forget it (truncate the file; no fsync: if the truncation is
    lost in a crash, recovery replays a finished batch, which changes nothing)."""
    try:
        os.truncate(_path(data_dir, user_id, create=False), 0)
    except FileNotFoundError:  # never written, or the user was forgotten since
        pass
    except OSError as exc:
        raise StorageError(f"could not clear the journal of {user_id!r}: {exc}") from exc


def parse(raw: bytes, path: Path) -> Intent | None:
    """The intent in a journal file's content; None when there is none (empty) or when its
    write was cut short (a body that does not match the header)."""
    if not raw:
        return None
    body = raw
    if raw.startswith(MAGIC):
        head, _, body = raw.partition(b"\n")
        try:
            length, digest = head[len(MAGIC):].decode("ascii").split()
            torn = len(body) != int(length) or hashlib.sha256(body).hexdigest() != digest
        except (UnicodeDecodeError, ValueError):
            torn = True
        if torn:
            log.warning("dropping the journal %s: its write was cut short, before any store "
                        "was written", path)
            return None
    try:
        return Intent.model_validate_json(body)
    except ValidationError as exc:
        raise CorruptStateError(
            f"the unfinished write {path} cannot be read ({exc}); move it away to drop that "
            "batch (its memories then stay as the vector store has them)"
        ) from exc


def pending(data_dir: Path) -> Iterator[Intent]:
    """The batches a crash left unfinished under ``data_dir``, one per user at most."""
    for path in sorted((data_dir / "users").glob(f"*/{PENDING_FILE}")):
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise CorruptStateError(f"the unfinished write {path} cannot be read ({exc})") from exc
        intent = parse(raw, path)
        if intent is not None:
            yield intent
        elif raw:
            os.truncate(path, 0)


# -- applying an intent ------------------------------------------------------------------------
def apply(stores: Stores, intent: Intent) -> None:
    """Every store write of the batch after the vectors' upsert (the commit point): the graph,
    changed fields and supersession in that order while, in a thread beside them, the lexical
    index and the history are written; then deletions. Each step is idempotent, so recovery
    may repeat it.

    Why beside: the lexical index and the history depend on none of the graph's or the fields'
    steps, nor these on them, and in server mode each is a round trip to the Chroma server, so
    the batch waits for the longer instead of the sum. Deletions come after both (a deletion
    follows any write it may undo, and a scrub follows the recording of the events it
    scrubs). Nothing of the batch is still being written when this returns or raises (a
    failure on either side, once both are done). A failure on one side leaves what the other
    wrote, as a failure of any step leaves the steps before it; a crash may leave either side
    done without the other, and recovery finishes both (:func:`settle`)."""
    s, user_id = stores, intent.user_id
    written = [i.id for i in intent.written]

    def beside() -> None:
        if written:
            s.lexical.add(user_id, written, [i.text for i in intent.written])
        s.history.record(user_id, intent.events)

    with _beside(beside):
        if written:
            if intent.rewritten:  # a caller's new text erases what the old one said
                s.graph.remove_memory(user_id, intent.rewritten, erase=intent.erase)
                if intent.erase:  # owed before the journal is cleared: a crash replays this
                    s.vectors.request_purge()
            s.graph.add_extractions(
                user_id, [(i, intent.extractions.get(i, Extraction())) for i in written]
            )
        if intent.updated:
            s.vectors.update(user_id, intent.updated)
            stated = [(i.id, intent.extractions[i.id]) for i in intent.updated
                      if i.id in intent.extractions]
            if stated:  # caller knowledge a repeat of the memory brought (see WritePlan.stated)
                s.graph.add_extractions(user_id, stated, links=False)
        if intent.superseded:
            s.graph.remove_memory(user_id, intent.superseded)
    if intent.deleted:
        s.vectors.delete(user_id, intent.deleted)
        s.lexical.delete(user_id, intent.deleted)
        s.graph.remove_memory(user_id, intent.deleted, erase=True)
        s.history.scrub(user_id, intent.deleted)


@contextmanager
def _beside(work: Callable[[], None]) -> Iterator[None]:
    """Run ``work`` in a thread while the block runs; wait for both, then raise the block's
    failure, else ``work``'s."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            failures.append(exc)

    context = contextvars.copy_context()  # a trace's parent span, as in the caller's thread
    thread = threading.Thread(target=context.run, args=(run,), name="hybridmem-apply",
                              daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()
    if failures:
        raise failures[0]


def settle(stores: Stores, intent: Intent) -> None:
    """Finish a batch a crash interrupted — forward when its vectors landed (the upsert is the
    commit point), back when they did not. Every step is idempotent."""
    user_id = intent.user_id
    landed = {i.id: i.text for i in stores.vectors.get(user_id, [i.id for i in intent.written])}
    if all(landed.get(i.id) == i.text for i in intent.written):
        log.warning("finishing a write to %d memories that a crash interrupted",
                    len(intent.written) + len(intent.updated) + len(intent.deleted))
        apply(stores, intent)
    else:  # the upsert never happened: nothing after it did either
        log.warning("undoing a write of %d memories that a crash interrupted",
                    len(intent.written))
        new = [i.id for i in intent.written if i.id not in intent.rewritten]
        stores.vectors.delete(user_id, new)
        stores.lexical.delete(user_id, new)
        stores.graph.remove_memory(user_id, new, erase=True)


def recover(data_dir: Path, stores: Stores) -> int:
    """Settle every batch a crash left in the data dir's journals (before any write); returns
    how many there were. Server mode keeps its journal in the user's lease instead (see
    :mod:`hybridmem.replica.lease`): the next process to take a dead holder's lease settles it."""
    found = 0
    for intent in pending(data_dir):
        found += 1
        settle(stores, intent)
        finish(data_dir, intent.user_id)
    return found
