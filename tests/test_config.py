"""Settings precedence, key routing and the public API surface."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import hybridmem
from hybridmem.config import NO_KEY, Settings


def test_env_then_kwargs_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HYBRIDMEM_CHAT_MODEL", "from-env")
    monkeypatch.setenv("HYBRIDMEM_DATA_DIR", str(tmp_path / "env"))
    assert Settings().chat_model == "from-env"
    assert Settings().data_dir == tmp_path / "env"
    assert Settings(chat_model="kw").chat_model == "kw"


def test_default_data_dir_is_documented_home_folder() -> None:
    assert Settings().data_dir == Path("~/.hybridmem").expanduser()


def test_openai_key_never_goes_to_a_third_party(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    third = Settings(base_url="https://api.holysheep.ai/v1")
    assert third.key_for(third.base_url) == NO_KEY
    openai = Settings()
    assert openai.key_for(openai.base_url) == "sk-openai"
    explicit = Settings(base_url="https://openrouter.ai/api/v1", api_key="sk-or")
    assert explicit.key_for(explicit.base_url) == "sk-or"
    # the chat key is not sent to a different embeddings host either
    split = Settings(base_url="https://a.example/v1", api_key="sk-a",
                     embedding_base_url="https://b.example/v1")
    assert split.key_for(split.resolved_embedding_base_url) == NO_KEY


def test_repr_never_shows_keys() -> None:
    s = Settings(api_key="sk-secret-1", openai_api_key="sk-secret-2", server_api_key="k1,k2")
    assert "sk-secret" not in repr(s) and "k1" not in repr(s)
    assert s.server_keys() == ["k1", "k2"]


@pytest.mark.parametrize("url", ["ftp://x", "not a url", "http://"])
def test_bad_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError):
        Settings(base_url=url)


#: The whole public surface. Changing it is an API change: update this pin on purpose, and the
#: README, in the same commit.
PUBLIC_NAMES = [
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
MEMORY_METHODS = {
    "add": "user_id text *kind *category *importance *confidence *source *metadata *created_at *expires_at *infer *entities *relations",
    "add_many": "user_id items *infer",
    "add_messages": "user_id messages *infer",
    "chat": "user_id message *max_context_tokens",
    "backup": "dest *user_id",
    "chat_model": "property",
    "chat_stream": "user_id message *max_context_tokens",
    "close": "",
    "context": "user_id query *max_tokens *where *category *limit *include_superseded *min_score *budgets *as_of",
    "count": "user_id",
    "embedder": "property",
    "entities": "user_id",
    "export": "user_id",
    "export_graph": "user_id *format *as_of",
    "extractor": "property",
    "facts": "user_id *category *as_of",
    "flush_access": "",
    "forget": "user_id memory_id",
    "get": "user_id memory_id",
    "graph": "user_id *as_of",
    "history": "user_id memory_id",
    "import_": "user_id bundle *overwrite",
    "list": "user_id *category *where *limit *offset *include_superseded",
    "prune": "user_id *dry_run *min_importance *idle_days",
    "ping": "",
    "purge_now": "",
    "query_path": "user_id a b *max_depth *k",
    "reembed": "user_id *progress",
    "reextract": "user_id",
    "refresh": "user_id",
    "relations": "user_id",
    "restore": "source *user_id *replace",
    "remember": "user_id key value *category *confidence *importance",
    "search": "user_id query *limit *where *category *include_superseded *min_score *as_of",
    "stats": "user_id",
    "status": "",
    "summarize": "user_id",
    "tokens": "property",
    "update": "user_id memory_id *text *category *importance *confidence *metadata *expires_at",
    "usage": "property",
}


def _shape(function: object) -> str:
    """Parameter names after ``self``; keyword-only ones marked with ``*``."""
    params = list(inspect.signature(function).parameters.values())[1:]  # type: ignore[arg-type]
    return " ".join(("*" if p.kind is p.KEYWORD_ONLY else "") + p.name for p in params)


def test_public_api_is_pinned() -> None:
    assert hybridmem.__all__ == PUBLIC_NAMES
    for name in hybridmem.__all__:
        assert hasattr(hybridmem, name)
    ours = {n for n in dir(hybridmem) if not n.startswith("_")
            and str(getattr(getattr(hybridmem, n), "__module__", "")).startswith("hybridmem")}
    assert ours <= set(PUBLIC_NAMES), ours - set(PUBLIC_NAMES)  # nothing of ours left unlisted


def test_memory_methods_are_pinned() -> None:
    Memory = hybridmem.Memory
    found = {
        name: "property" if isinstance(getattr(Memory, name), property)
        else _shape(getattr(Memory, name))
        for name in dir(Memory) if not name.startswith("_")
    }
    assert found == MEMORY_METHODS


def test_errors_carry_status_and_builtin_base() -> None:
    assert issubclass(hybridmem.InvalidUserIdError, ValueError)
    assert hybridmem.InvalidInputError.status_code == 422
    assert issubclass(hybridmem.NotFoundError, LookupError)
    assert hybridmem.NotFoundError.status_code == 404
    assert hybridmem.BackendRateLimitError.status_code == 429
    assert hybridmem.EmbedderMismatchError.status_code == 409
