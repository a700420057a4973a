"""hybridmem: long-term memory for LLM applications — vectors, an entity graph, fused ranking and
token-bounded context, offline by default, any OpenAI-compatible endpoint when configured.

:class:`Memory` and :class:`AsyncMemory` are imported on first use (PEP 562), so ``import hybridmem``
— and importing one store module, as the CLI's ``--help`` does — never pulls in Chroma or the
embedding runtime.
"""

from typing import TYPE_CHECKING, Any

from hybridmem.config import Settings
from hybridmem.errors import (
    BackendAuthError,
    BackendError,
    BackendRateLimitError,
    BackendUnavailableError,
    ClosedError,
    ConfigError,
    CorruptStateError,
    DataDirLockedError,
    EmbedderError,
    EmbedderMismatchError,
    HybridMemError,
    InvalidInputError,
    InvalidUserIdError,
    NotFoundError,
    StorageError,
    StoreBusyError,
)
from hybridmem.models import (
    ChatReply,
    Context,
    ContextLine,
    Entity,
    Extraction,
    GraphEntity,
    GraphPath,
    GraphRelation,
    Hit,
    Knowledge,
    MemoryItem,
    MemoryStatus,
    Relation,
    ScoreBreakdown,
    Usage,
    UserStats,
)

if TYPE_CHECKING:
    from hybridmem.aio import AsyncMemory
    from hybridmem.memory import Memory

__version__ = "0.2.0"

__all__ = [
    "AsyncMemory",
    "BackendAuthError",
    "BackendError",
    "BackendRateLimitError",
    "BackendUnavailableError",
    "ChatReply",
    "ClosedError",
    "ConfigError",
    "Context",
    "ContextLine",
    "CorruptStateError",
    "DataDirLockedError",
    "EmbedderError",
    "EmbedderMismatchError",
    "Entity",
    "Extraction",
    "GraphEntity",
    "GraphPath",
    "GraphRelation",
    "Hit",
    "HybridMemError",
    "InvalidInputError",
    "InvalidUserIdError",
    "Knowledge",
    "Memory",
    "MemoryItem",
    "MemoryStatus",
    "NotFoundError",
    "Relation",
    "ScoreBreakdown",
    "Settings",
    "StorageError",
    "StoreBusyError",
    "Usage",
    "UserStats",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name == "Memory":
        from hybridmem.memory import Memory

        return Memory
    if name == "AsyncMemory":
        from hybridmem.aio import AsyncMemory

        return AsyncMemory
    raise AttributeError(f"module 'hybridmem' has no attribute {name!r}")
