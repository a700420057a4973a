"""Repair of an embedded Chroma collection whose HNSW index a crash tore: rebuilt from Chroma's
SQLite file, never a memory lost.

Why: embedded Chroma (1.5.9) persists a collection's HNSW index in place, in five files under
``<chroma>/<vector segment id>/``, every ``sync_threshold`` records. A process killed while it
writes them leaves a torn index, and what Chroma then does depends on the file (measured by
tearing each file of a 500-record collection, each case in its own process):

- ``index_metadata.pickle`` cut, empty or garbage; ``header.bin`` empty, garbage or missing;
  ``data_level0.bin``, ``link_lists.bin`` or ``length.bin`` missing: the collection opens, then
  *every* call — ``count``, ``get``, ``query``, ``add`` — raises ``chromadb.errors.InternalError``
  ("Error constructing hnsw segment reader ...");
- ``header.bin`` cut in half, ``data_level0.bin`` garbage: the process dies (SIGSEGV) at the first
  call, so nothing can be caught: the files must be checked *before* Chroma loads them;
- ``index_metadata.pickle`` missing: calls succeed but the index is empty (a query finds 1 of 500);
  ``data_level0.bin`` empty: ``get`` works, ``query`` fails; ``data_level0.bin`` cut,
  ``link_lists.bin`` / ``length.bin`` cut, empty or garbage: calls succeed on a damaged graph.

So :func:`torn` checks a collection's files before its first use in a process (what the header
says against every file's size, the level-0 links, the vectors' norms, the link lists' framing,
the pickle's ids against the records): a torn index is rebuilt before Chroma ever reads it.

What survives: ``chroma.sqlite3`` keeps every record's id, document and metadata in the metadata
segment (written in the same call as the log); the vectors may exist only in the torn index
(Chroma purges its log once the index persisted), so they are recomputed with the configured
embedder (deterministic embedders give the same vectors back).

The rebuild (:class:`Repair`), under the user's lock, crash-safe at every step — a marker file
``<chroma>/repair-<collection>.json`` (fsync'd) says which step is done, and the next open of the
collection finishes what a kill interrupted:

1. ``staging``: the records are read from SQLite, embedded and written to a fresh collection
   ``r-<name>``; a kill here leaves the torn collection untouched, and the step starts over;
2. ``staged``: the staging collection holds every record with its vector; the torn collection is
   dropped, created again under its own name and filled from the staging one (a kill here: the
   step starts over, from the intact staging collection);
3. the staging collection is dropped and the marker removed.

The collection keeps its name, so the lexical index, the graph's provenance and the history — all
keyed by memory id — are untouched and agree with it afterwards. Server mode is not covered: a
Chroma server keeps its index files to itself, and a torn index there is the server's to repair.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import sqlite3
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from hybridmem.chroma.client import (
    STAGING,
    CollectionHandles,
    create_collection,
    drop_collection,
    is_internal,
    is_not_found,
)
from hybridmem.runtime.files import atomic_write_bytes
from hybridmem.errors import CorruptStateError, StorageError

if TYPE_CHECKING:
    from chromadb.api import ClientAPI
    from chromadb.api.models.Collection import Collection

__all__ = ["FILES", "Repair", "Vetting", "read_records", "torn"]

log = logging.getLogger(__name__)
#: The files of a persisted HNSW index (all present, or none yet: fewer records than a sync).
FILES = ("header.bin", "data_level0.bin", "length.bin", "link_lists.bin", "index_metadata.pickle")
#: hnswlib's header as Chroma writes it: version, offsetLevel0, max_elements, cur_element_count,
#: size_data_per_element, label_offset, offsetData, maxlevel, enterpoint_node, maxM, maxM0, M,
#: mult, ef_construction (little-endian, 100 bytes).
HEADER = struct.Struct("<iQQQQQQiIQQQdQ")
#: Records per write while rebuilding, and per chunk of the level-0 check.
CHUNK = 4096
BATCH = 1000
DOCUMENT_KEY = "chroma:document"
Embed = Callable[[Sequence[str]], list[list[float]]]
T = TypeVar("T")


class _NoGlobals(pickle.Unpickler):
    """Chroma's index metadata is plain dicts and numbers: refuse anything else (a torn or
    foreign file must never run code)."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"unexpected global {module}.{name}")


def _db(chroma: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{chroma / 'chroma.sqlite3'}?mode=ro", uri=True, timeout=30)


def _segments(conn: sqlite3.Connection, name: str) -> dict[str, str]:
    """The collection's segment ids by scope (VECTOR, METADATA); {} when it does not exist."""
    return {scope: sid for sid, scope in conn.execute(
        "SELECT s.id, s.scope FROM segments s JOIN collections c ON s.collection = c.id "
        "WHERE c.name = ?", (name,))}


def torn(chroma: Path, name: str) -> str | None:
    """Why the HNSW index of collection ``name`` in the embedded store at ``chroma`` is torn, or
    None when its files are whole (or the collection or its index does not exist yet)."""
    if not (chroma / "chroma.sqlite3").exists():
        return None
    conn = _db(chroma)
    try:
        seg = _segments(conn, name)
        if "VECTOR" not in seg or "METADATA" not in seg:
            return None
        stored = conn.execute("SELECT count(*) FROM embeddings WHERE segment_id = ?",
                              (seg["METADATA"],)).fetchone()[0]
        row = conn.execute("SELECT seq_id FROM max_seq_id WHERE segment_id = ?",
                           (seg["VECTOR"],)).fetchone()
        queued = conn.execute(  # writes the index has not applied yet (replayed from the log)
            "SELECT count(*) FROM embeddings_queue WHERE topic LIKE ? AND seq_id > ?",
            ("%/" + conn.execute("SELECT collection FROM segments WHERE id = ?",
                                 (seg["VECTOR"],)).fetchone()[0],
             row[0] if row and isinstance(row[0], int) else 0)).fetchone()[0]
    finally:
        conn.close()
    folder = chroma / seg["VECTOR"]
    if not (folder / "index_metadata.pickle").exists():
        # never persisted (Chroma writes the pickle last, at the first sync): it rebuilds the
        # index from its log, and the binary files are unused placeholders; whole if the log
        # still holds every record, else the persisted index is gone
        return None if stored <= queued else f"the index of {stored} records is gone"
    missing = [f for f in FILES if not (folder / f).exists()]
    if missing:
        return f"{missing} missing"
    try:
        return _check_files(folder, stored, queued)
    except (OSError, ValueError, EOFError, pickle.UnpicklingError, struct.error,
            AttributeError, TypeError, IndexError, KeyError) as exc:
        return f"{type(exc).__name__}: {exc}"


def _check_files(folder: Path, stored: int, queued: int) -> str | None:
    head = (folder / "header.bin").read_bytes()
    if len(head) != HEADER.size:
        return f"header.bin has {len(head)} bytes, not {HEADER.size}"
    (version, off0, cap, count, size, label_at, data_at, _maxlevel, entry, _max_m, max_m0,
     _m, _mult, _ef) = HEADER.unpack(head)
    if (version != 1 or off0 != 0 or count > cap or label_at != size - 8
            or data_at != 4 + 4 * max_m0 or label_at <= data_at or (count and entry >= count)):
        return "header.bin does not describe an index"
    # written up to the element count (at least), the preallocated capacity at most
    if not count * size <= (folder / "data_level0.bin").stat().st_size <= cap * size:
        return "data_level0.bin is not as long as header.bin says"
    if not count * 4 <= (folder / "length.bin").stat().st_size <= cap * 4:
        return "length.bin is not as long as header.bin says"
    with open(folder / "index_metadata.pickle", "rb") as fh:
        meta = _NoGlobals(fh).load()
    labels = meta["label_to_id"]
    if not isinstance(labels, dict) or len(labels) > count:
        return "index_metadata.pickle does not match header.bin"
    if len(labels) + queued < stored:
        return f"the index holds {len(labels)} of {stored} records"
    if count:
        why = _check_level0(folder, count, size, label_at, data_at, max_m0)
        if why:
            return why
        lengths = np.fromfile(folder / "length.bin", dtype="<f4", count=count)
        if not np.all(np.isfinite(lengths)) or np.any(lengths < 0):
            return "length.bin holds values no vector has"
    return _check_links(folder / "link_lists.bin", count)


def _check_level0(folder: Path, count: int, size: int, label_at: int, data_at: int,
                  max_m0: int) -> str | None:
    """Level-0 links point inside the index and the stored vectors are unit length (Chroma
    normalises them for cosine) — what a torn or overwritten ``data_level0.bin`` breaks, and
    what crashed Chroma when it did."""
    raw = np.memmap(folder / "data_level0.bin", dtype=np.uint8, mode="r", shape=(count, size))
    slots = np.arange(max_m0)[None, :]
    for lo in range(0, count, CHUNK):  # in chunks: the file is ~1.7 KB a record (384-d)
        rows = np.asarray(raw[lo:lo + CHUNK])
        links = np.ascontiguousarray(rows[:, :data_at]).view("<u4")
        n_links = links[:, 0] & 0xFFFF
        if np.any(n_links > max_m0):
            return "data_level0.bin has link lists longer than the index allows"
        if np.any(links[:, 1:][slots < n_links[:, None]] >= count):
            return "data_level0.bin links outside the index"
        vectors = np.ascontiguousarray(rows[:, data_at:label_at]).view("<f4")
        with np.errstate(all="ignore"):
            norms = np.sqrt(np.einsum("ij,ij->i", vectors, vectors))
        if not np.all(np.isfinite(norms)) or np.any((np.abs(norms - 1) > 1e-3) & (norms > 1e-6)):
            return "data_level0.bin holds vectors that are not unit length"
    return None


def _check_links(path: Path, count: int) -> str | None:
    """``link_lists.bin`` holds ``count`` frames (a uint32 length, then that many bytes)."""
    data = path.read_bytes()
    at = 0
    for _ in range(count):
        if at + 4 > len(data):
            return "link_lists.bin ends early"
        at += 4 + int.from_bytes(data[at:at + 4], "little")
    return None if at <= len(data) else "link_lists.bin ends early"


def read_records(chroma: Path, name: str) -> tuple[list[str], list[str], list[dict[str, Any]]]:
    """Ids, documents and metadata of every record of collection ``name``, read from Chroma's
    SQLite metadata segment directly (Chroma's own ``get`` fails while the index is torn)."""
    conn = _db(chroma)
    try:
        seg = _segments(conn, name).get("METADATA")
        if seg is None:
            return [], [], []
        rows: dict[int, tuple[str, dict[str, Any]]] = {}
        for rid, eid in conn.execute("SELECT id, embedding_id FROM embeddings WHERE segment_id = ? "
                                     "ORDER BY id", (seg,)):
            rows[rid] = (eid, {})
        for table, many in (("embedding_metadata", False), ("embedding_metadata_array", True)):
            for rid, key, s, i, f, b in conn.execute(
                    f"SELECT m.id, m.key, m.string_value, m.int_value, m.float_value, m.bool_value "
                    f"FROM {table} m JOIN embeddings e ON e.id = m.id WHERE e.segment_id = ?",
                    (seg,)):
                value = s if s is not None else i if i is not None else f if f is not None \
                    else (bool(b) if b is not None else None)
                meta = rows[rid][1]
                meta[key] = [*meta.get(key, []), value] if many else value
    except sqlite3.Error as exc:
        raise CorruptStateError(f"could not read the records of {name} from Chroma's SQLite "
                                f"file ({exc}); restore the data dir from a backup") from exc
    finally:
        conn.close()
    ids = [eid for eid, _ in rows.values()]
    docs = [str(m.pop(DOCUMENT_KEY, "") or "") for _, m in rows.values()]
    return ids, docs, [m for _, m in rows.values()]


class Repair:
    """Rebuilds torn collections of the embedded store at ``chroma`` (see the module docstring);
    the caller holds the user's lock. ``embed`` recomputes vectors."""

    def __init__(self, chroma: Path, embed: Embed | None) -> None:
        self.chroma = chroma
        self._embed = embed

    def __repr__(self) -> str:
        return f"Repair({str(self.chroma)!r})"

    def marker(self, name: str) -> Path:
        return self.chroma / f"repair-{name}.json"

    def pending(self, name: str) -> bool:
        """Whether a rebuild of ``name`` was interrupted (finish it with :meth:`run`)."""
        return self.marker(name).exists()

    def run(self, client: ClientAPI, name: str, meta: dict[str, Any], why: str) -> int:
        """Rebuild collection ``name`` (collection metadata ``meta``) from its records; returns
        how many. Resumes an interrupted rebuild from its marker."""
        marker, staging = self.marker(name), STAGING + name
        step = json.loads(marker.read_bytes()).get("step") if marker.exists() else None
        if step != "staged":
            current = client.get_collection(name, embedding_function=None).metadata
            meta = dict(current or meta)  # its own (an older schema is migrated after)
            log.warning("the vector index of collection %s is torn (%s): rebuilding it from "
                        "Chroma's SQLite file and the embedder", name, why)
            self._mark(marker, "staging", meta)
            drop_collection(client, staging)
            ids, docs, metas = read_records(self.chroma, name)
            if ids and self._embed is None:
                raise CorruptStateError(f"the vector index of {name} is torn ({why}) and no "
                                        "embedder is configured to rebuild it")
            target = create_collection(client, staging, meta)
            for lo in range(0, len(ids), BATCH):
                hi = lo + BATCH
                assert self._embed is not None
                target.add(ids=ids[lo:hi], documents=docs[lo:hi],
                           metadatas=metas[lo:hi],  # type: ignore[arg-type]
                           embeddings=self._embed(docs[lo:hi]))  # type: ignore[arg-type]
            if target.count() != len(ids):
                raise CorruptStateError(f"rebuilding {name}: {target.count()} of {len(ids)} "
                                        "records landed")
            self._mark(marker, "staged", meta)
        else:
            log.warning("finishing the interrupted rebuild of collection %s", name)
            meta = json.loads(marker.read_bytes())["meta"]
        try:
            source = client.get_collection(staging, embedding_function=None)
        except Exception as exc:  # dropped after a complete copy: only the marker was left
            if not is_not_found(exc):
                raise
            marker.unlink()
            return client.get_collection(name, embedding_function=None).count()
        drop_collection(client, name)
        target = create_collection(client, name, meta)
        offset = 0
        while True:
            got = source.get(limit=BATCH, offset=offset,
                             include=["embeddings", "documents", "metadatas"])
            if not got["ids"]:
                break
            target.add(ids=got["ids"], embeddings=got["embeddings"], documents=got["documents"],
                       metadatas=got["metadatas"])
            offset += len(got["ids"])
        total = target.count()
        if total != source.count():
            raise CorruptStateError(f"rebuilding {name}: {total} of {source.count()} copied")
        drop_collection(client, staging)
        marker.unlink()
        log.warning("rebuilt the vector index of collection %s: %d records", name, total)
        return total

    @staticmethod
    def _mark(marker: Path, step: str, meta: dict[str, Any]) -> None:
        atomic_write_bytes(marker, json.dumps({"step": step, "meta": meta}).encode())


class Vetting:
    """Each collection's files are checked (:func:`torn`) before its first use in this process,
    and a torn one rebuilt (:class:`Repair`) under the user's lock; checked names are kept in an
    LRU of ``cap`` (checked again once evicted). ``drop_cached`` drops what the process
    keeps of a user's records."""

    def __init__(self, repair: Repair, handles: CollectionHandles, *,
                 lock: Callable[[str], AbstractContextManager[object]],
                 drop_cached: Callable[[str], None], cap: int) -> None:
        self.repair = repair
        self._handles, self._lock, self._drop_cached = handles, lock, drop_cached
        self._vetted: OrderedDict[str, None] = OrderedDict()
        self._cap = max(1, cap)
        self._guard = threading.Lock()

    def __repr__(self) -> str:
        return f"Vetting(vetted={len(self._vetted)})"

    def run(self, user_id: str, name: str, meta: dict[str, Any], call: Callable[[], T]) -> T:
        """``call()`` on a vetted collection; when Chroma fails inside (``InternalError``, as a
        torn index makes it), the files are checked again and, if torn, rebuilt and the call
        tried once more."""
        self.vet(user_id, name, meta)
        try:
            return call()
        except StorageError as exc:
            if not is_internal(exc.__cause__) or not self.vet(user_id, name, meta, again=True):
                raise
        return call()

    def vet(self, user_id: str, name: str, meta: dict[str, Any], *, again: bool = False) -> bool:
        """Check ``name`` once (``again``: even if checked before), rebuilding it if torn;
        returns whether it was rebuilt."""
        if not again and name in self._vetted:
            return False
        with self._lock(user_id):
            with self._guard:
                if not again and name in self._vetted:
                    return False
            pending = self.repair.pending(name)
            why = "an earlier rebuild was interrupted" if pending else torn(self.repair.chroma, name)
            if why is not None:
                self._drop_cached(user_id)
                self._handles.forget(name)
                with self._handles.borrowed() as client:
                    self.repair.run(client, name, meta, why)
                self._handles.forget(name)
            with self._guard:
                self._vetted[name] = None
                self._vetted.move_to_end(name)
                while len(self._vetted) > self._cap:
                    self._vetted.popitem(last=False)
            return why is not None
