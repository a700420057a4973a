"""Settings precedence, key routing and the public API surface."""

from __future__ import annotations

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


def test_public_api_is_pinned() -> None:
    assert hybridmem.__all__ == sorted(hybridmem.__all__, key=lambda n: (n.startswith("_"), n))
    assert {"Memory", "Settings", "Hit", "MemoryItem", "Context", "HybridMemError"} <= set(
        hybridmem.__all__
    )
    for name in hybridmem.__all__:
        assert hasattr(hybridmem, name)


def test_errors_carry_status_and_builtin_base() -> None:
    assert issubclass(hybridmem.InvalidUserIdError, ValueError)
    assert hybridmem.InvalidInputError.status_code == 422
    assert issubclass(hybridmem.NotFoundError, LookupError)
    assert hybridmem.NotFoundError.status_code == 404
    assert hybridmem.BackendRateLimitError.status_code == 429
    assert hybridmem.EmbedderMismatchError.status_code == 409
