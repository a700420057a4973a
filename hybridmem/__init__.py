"""hybridmem: long-term memory for LLM applications — vectors, an entity graph, fused ranking and
token-bounded context, offline by default, any OpenAI-compatible endpoint when configured."""

from hybridmem.config import Settings
from hybridmem.errors import (
    BackendAuthError,
    BackendError,
    BackendRateLimitError,
    BackendUnavailableError,
    ConfigError,
    CorruptStateError,
    EmbedderMismatchError,
    HybridMemError,
    InvalidInputError,
    InvalidUserIdError,
    NotFoundError,
    StorageError,
)
from hybridmem.memory import Memory
from hybridmem.models import (
    ChatReply,
    Context,
    ContextLine,
    Entity,
    Extraction,
    Hit,
    MemoryItem,
    Relation,
    ScoreBreakdown,
    Usage,
)

__version__ = "0.1.0"

__all__ = [
    "BackendAuthError",
    "BackendError",
    "BackendRateLimitError",
    "BackendUnavailableError",
    "ChatReply",
    "ConfigError",
    "Context",
    "ContextLine",
    "CorruptStateError",
    "EmbedderMismatchError",
    "Entity",
    "Extraction",
    "Hit",
    "HybridMemError",
    "InvalidInputError",
    "InvalidUserIdError",
    "Memory",
    "MemoryItem",
    "NotFoundError",
    "Relation",
    "ScoreBreakdown",
    "Settings",
    "StorageError",
    "Usage",
    "__version__",
]
