"""The hybridmem exception tree.

Every error subclasses :class:`HybridMemError` *and* the builtin it resembles, and carries an HTTP
``status_code`` so the REST service maps errors by class, never by message text::

    HybridMemError
    ├── ConfigError                (ValueError, 500)   settings are wrong or an optional extra is missing
    ├── InvalidInputError          (ValueError, 422)   bad text, metadata, limit, budget ...
    │   └── InvalidUserIdError     (ValueError, 422)   a user id that could not be stored safely
    ├── NotFoundError              (LookupError, 404)  unknown memory id
    ├── ClosedError                (RuntimeError, 503) the Memory (or a store) was closed
    ├── StorageError               (RuntimeError, 500) the vector store, graph or index failed
    │   ├── CorruptStateError      (500)               a file on disk cannot be read back
    │   ├── EmbedderMismatchError  (409)               a collection was built by another embedder
    │   ├── DataDirLockedError     (409)               another process has the embedded data dir
    │   └── StoreBusyError         (503, retryable)    a database is locked by another writer
    ├── EmbedderError              (RuntimeError, 500) the embedder failed or returned bad vectors
    └── BackendError               (RuntimeError, 502) the configured OpenAI-compatible endpoint failed
        ├── BackendUnavailableError (503)              connection refused, timeout, 5xx after retries
        ├── BackendAuthError        (502)              401/403: the key was refused
        └── BackendRateLimitError   (429)              429 after the client's retries

``retryable`` is True on the classes where the same call may succeed later unchanged (a busy store,
an unavailable or rate-limited endpoint); a server can answer those with ``Retry-After``.
"""

from __future__ import annotations

__all__ = [
    "BackendAuthError",
    "BackendError",
    "BackendRateLimitError",
    "BackendUnavailableError",
    "ClosedError",
    "ConfigError",
    "CorruptStateError",
    "DataDirLockedError",
    "EmbedderError",
    "EmbedderMismatchError",
    "HybridMemError",
    "InvalidInputError",
    "InvalidUserIdError",
    "NotFoundError",
    "StorageError",
    "StoreBusyError",
]


class HybridMemError(Exception):
    """Base of every error hybridmem raises on purpose."""

    status_code: int = 500
    retryable: bool = False


class ConfigError(HybridMemError, ValueError):
    """The configuration cannot work (missing key, unknown embedder, missing optional extra)."""

    status_code = 500


class InvalidInputError(HybridMemError, ValueError):
    """The caller passed something hybridmem refuses to store or query."""

    status_code = 422


class InvalidUserIdError(InvalidInputError):
    """A user id that is empty, too long, or could escape the data directory."""


class NotFoundError(HybridMemError, LookupError):
    """The memory (or user) asked for does not exist."""

    status_code = 404


class ClosedError(HybridMemError, RuntimeError):
    """The :class:`~hybridmem.Memory` (or one of its stores) was closed; create a new one."""

    status_code = 503


class StorageError(HybridMemError, RuntimeError):
    """A store (Chroma, graph file, lexical index) failed."""

    status_code = 500


class CorruptStateError(StorageError):
    """A file hybridmem wrote cannot be read back; the message names it."""


class EmbedderMismatchError(StorageError):
    """A user's collection was built by a different embedder than the one configured."""

    status_code = 409


class DataDirLockedError(StorageError):
    """Another live process has this embedded data dir open (embedded storage is one process's);
    the message names it and the two ways to share a store."""

    status_code = 409


class StoreBusyError(StorageError):
    """Another writer holds a lock on a store's database ("database is locked"); retry later."""

    status_code = 503
    retryable = True


class EmbedderError(HybridMemError, RuntimeError):
    """The embedder failed, or returned the wrong number of vectors or non-finite ones."""

    status_code = 500


class BackendError(HybridMemError, RuntimeError):
    """The configured OpenAI-compatible endpoint failed (after the client's own retries)."""

    status_code = 502


class BackendUnavailableError(BackendError):
    """The endpoint could not be reached, timed out, or answered 5xx."""

    status_code = 503
    retryable = True


class BackendAuthError(BackendError):
    """The endpoint refused the key (401/403)."""

    status_code = 502


class BackendRateLimitError(BackendError):
    """The endpoint kept answering 429."""

    status_code = 429
    retryable = True
