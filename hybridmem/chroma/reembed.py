"""Re-embedding: move a user's memories to the configured embedder, resumably.

A user's memory collection records the embedder that built it (name and dimension), and a Memory
configured with another embedder refuses it (:class:`~hybridmem.errors.EmbedderMismatchError`).
:func:`reembed_user` moves the collection to the configured embedder without touching anything
else (the lexical index, graph and history hold no vectors):

1. a staging collection ``r-<user key>`` is created with the *new* identity (the old collection's
   metadata with ``embedder`` and ``dimension`` replaced);
2. the old collection is read page by page; each page's texts are embedded with the new embedder
   and written to the staging collection with the same ids, documents and metadata — pages whose
   ids the staging collection already holds are skipped, so a run killed midway resumes where it
   stopped;
3. the swap: the old collection is deleted and the staging one renamed to its name. A crash
   between the two leaves only the staging collection, which the next run renames.

The user's archive collection (memories no longer current, see :mod:`hybridmem.chroma.vector`) records
the same identity and is moved the same way, after the hot one.

The caller holds the user's lock for the whole move (the user is unusable under the new embedder
until it is done anyway). Both embedded Chroma and a Chroma server: only the client's API is used.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from hybridmem.chroma import client as _chroma
from hybridmem.errors import StorageError

if TYPE_CHECKING:
    from chromadb.api import ClientAPI

__all__ = ["PAGE", "reembed_user"]

log = logging.getLogger(__name__)
#: Memories read, embedded and written per step (and per progress report).
PAGE = 128
Embed = Callable[[Sequence[str]], list[list[float]]]
Progress = Callable[[int, int], None]


def _user_collections(user_id: str) -> tuple[str, str]:
    """The names of the user's hot and archive collections, both moved by :func:`reembed_user`."""
    return _chroma.collection_name(user_id), _chroma.collection_name(user_id, "archive")


def reembed_user(
    client: ClientAPI,
    user_id: str,
    *,
    embedder: str,
    dimension: int,
    embed: Embed,
    progress: Progress | None = None,
) -> int:
    """Move the user's memories to ``embedder`` (see the module docstring); returns how many
    memories were embedded by this call (0 when the collections already have that identity)."""
    return sum(_reembed_collection(client, name, embedder=embedder, dimension=dimension,
                                   embed=embed, progress=progress)
               for name in _user_collections(user_id))


def _reembed_collection(client: ClientAPI, name: str, *, embedder: str, dimension: int,
                        embed: Embed, progress: Progress | None) -> int:
    staging_name = _chroma.STAGING + name
    old = _chroma.open_collection(client, name)
    staging = _chroma.open_collection(client, staging_name)
    if old is not None and staging is None:
        meta = dict(old.metadata or {})
        if meta.get("embedder") == embedder and meta.get("dimension") == dimension:
            return 0
        meta.update(embedder=embedder, dimension=dimension)
        staging = _chroma.create_collection(client, staging_name, meta)
    if staging is None:
        return 0  # no such collection: nothing to move
    done = 0
    if old is not None:
        total = old.count()
        for offset in range(0, total, PAGE):
            page: Any = old.get(limit=PAGE, offset=offset, include=["documents", "metadatas"])
            ids: list[str] = list(page["ids"])
            have = set(staging.get(ids=ids, include=[])["ids"]) if ids else set()
            todo = [i for i, id_ in enumerate(ids) if id_ not in have]
            if todo:
                docs = [page["documents"][i] or "" for i in todo]
                vectors: Any = embed(docs)
                staging.upsert(ids=[ids[i] for i in todo], embeddings=vectors, documents=docs,
                               metadatas=[page["metadatas"][i] for i in todo])
                done += len(todo)
            if progress is not None:
                progress(min(offset + PAGE, total), total)
        if staging.count() < total:  # pragma: no cover - Chroma lost a write
            raise StorageError(f"re-embedding collection {name!r} copied {staging.count()} of "
                               f"{total} memories; run it again")
        _chroma.drop_collection(client, name)
    staging.modify(name=name)
    log.info("re-embedded %d memories of a user with %s", done, embedder)
    return done
