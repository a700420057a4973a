"""The hybridmem exception tree.

Every error subclasses :class:`HybridMemError` *and* the builtin it resembles, and carries an HTTP
``status_code`` so the REST service maps errors by class, never by message text::

    HybridMemError
    ├── ConfigError                (ValueError, 500)   settings are wrong or an optional extra is missing
    ├── InvalidInputError          (ValueError, 422)   bad text, metadata, limit, budget ...
    │   └── InvalidUserIdError     (ValueError, 422)   a user id that could not be stored safely
    ├── NotFoundError              (LookupError, 404)  unknown memory id
    ├── StorageError               (RuntimeError, 500) the vector store, graph or index failed
    │   ├── CorruptStateError      (500)               a file on disk cannot be read back
    │   └── EmbedderMismatchError  (409)               a collection was built by another embedder
    └── BackendError               (RuntimeError, 502) the configured OpenAI-compatible endpoint failed
        ├── BackendUnavailableError (503)              connection refused, timeout, 5xx after retries
        ├── BackendAuthError        (502)              401/403: the key was refused
        └── BackendRateLimitError   (429)              429 after the client's retries
"""

from __future__ import annotations

__all__ = [
    "BackendAuthError",
    "BackendError",
    "BackendRateLimitError",
    "BackendUnavailableError",
    "ConfigError",
    "CorruptStateError",
    "EmbedderMismatchError",
    "HybridMemError",
    "InvalidInputError",
    "InvalidUserIdError",
    "NotFoundError",
    "StorageError",
]


class HybridMemError(Exception):
    """Base of every error hybridmem raises on purpose."""

    status_code: int = 500


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


class StorageError(HybridMemError, RuntimeError):
    """A store (Chroma, graph file, lexical index) failed."""

    status_code = 500


class CorruptStateError(StorageError):
    """A file hybridmem wrote cannot be read back; the message names it."""


class EmbedderMismatchError(StorageError):
    """A user's collection was built by a different embedder than the one configured."""

    status_code = 409


class BackendError(HybridMemError, RuntimeError):
    """The configured OpenAI-compatible endpoint failed (after the client's own retries)."""

    status_code = 502


class BackendUnavailableError(BackendError):
    """The endpoint could not be reached, timed out, or answered 5xx."""

    status_code = 503


class BackendAuthError(BackendError):
    """The endpoint refused the key (401/403)."""

    status_code = 502


class BackendRateLimitError(BackendError):
    """The endpoint kept answering 429."""

    status_code = 429
