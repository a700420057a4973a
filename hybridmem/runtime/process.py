"""Process-wide tricks the stores need from the C library and the kernel, each saying why.

- :func:`scrub_freed_heap` — glibc overwrites freed heap memory, so erased text cannot reach
  embedded Chroma's index files through reused memory.
- :func:`release_freed_heap` — glibc returns freed heap to the system (``malloc_trim``).
- :func:`file_budget` — a store's constructor sees only a share of the open-file limit.
- :func:`file_limit`, :func:`open_descriptors` — the limit, and what is open now.

Each returns False or None where the platform lacks it (not Linux/glibc, not POSIX).
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["file_budget", "file_limit", "open_descriptors", "release_freed_heap",
           "scrub_freed_heap"]

#: glibc's mallopt parameter and the byte freed memory is overwritten with.
M_PERTURB = -6
PERTURB_BYTE = 0x5A


def scrub_freed_heap() -> bool:
    """Ask glibc to overwrite freed heap memory and fill new allocations (``M_PERTURB``).

    Why: embedded Chroma's HNSW index persists its whole preallocated capacity, uninitialised, to
    ``data_level0.bin`` / ``length.bin``. Those bytes can hold freed heap — including the text of a
    user who was just forgotten — so erasure could leave a copy inside *another* user's index file
    (seen about once in 25 runs). With ``M_PERTURB`` freed chunks are overwritten — except those
    glibc's per-thread cache (tcache) keeps, chunks up to ~1 KB (measured: 84 of 100 bytes survived
    a free and malloc on glibc 2.36); start the process with
    ``GLIBC_TUNABLES=glibc.malloc.tcache_count=0`` to cover those too. It is process-wide and
    costs a memset per malloc/free; ``Settings(scrub_heap=False)`` turns it off. Returns False
    where it is not available (not Linux/glibc).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_PERTURB, PERTURB_BYTE))
    except (OSError, AttributeError):
        return False


def release_freed_heap() -> bool:
    """Give the heap glibc holds free back to the system (``malloc_trim(0)``); False where
    there is no glibc.

    Why: when a client is replaced (:meth:`CollectionHandles.run`, every ``max_open`` opened
    collections) embedded Chroma frees the HNSW indexes it had loaded (~2 MB each for a small
    user, their preallocated capacity), but glibc kept those pages instead of returning them,
    and the next client did not reuse them all. So RSS grew by about the index cache at each
    replacement: measured on raw Chroma, 128 one-record collections per client, 367 MB after
    100 collections and 1,133 MB after 800; with this call after each replacement it stays
    between 150 and 420 MB (the cache filling and emptying).
    One call took 16 ms after 128 indexes were freed; it runs once per ``max_open`` users."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True


@contextmanager
def file_budget(share: float, cap: int | None = None) -> Iterator[None]:
    """Let embedded Chroma see only ``share`` of the open-file limit (and at most ``cap`` files)
    while it starts.

    Why: Chroma sizes its HNSW file cache (4 open files per collection) from ``RLIMIT_NOFILE`` at
    client creation, as if the whole process were its own, so with one collection per user the
    process ran out of descriptors (seen at ~200 users under ``ulimit -n 1024``). The soft limit is
    lowered for the duration of the constructor only and restored at once. ``cap`` also bounds
    its RAM: every cached index is loaded in memory, so under ``ulimit -n 20000`` Chroma kept up to
    1,000 users' indexes and RSS grew with every user searched (1.5 GB at 1k users, 2.2 GB at 2k)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft < 64:
        yield
        return
    lowered = int(soft * share) if cap is None else min(int(soft * share), cap)
    # never below what is open already (plus room), or the constructor's own opens fail
    lowered = min(soft, max(64, lowered, open_descriptors() + 64))
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowered, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def open_descriptors() -> int:
    """How many files this process has open (0 where /proc is not there to tell)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def file_limit() -> int | None:
    """The process's soft open-file limit (None when unlimited or unknown)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return None
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return None if soft == resource.RLIM_INFINITY else int(soft)
