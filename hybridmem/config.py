"""Configuration: one typed class. Precedence: keyword arguments > ``HYBRIDMEM_*`` env > defaults.

Keys are :class:`~pydantic.SecretStr`: ``repr()`` never shows them and they are never written to disk.
``OPENAI_API_KEY`` is only ever sent to OpenAI's own endpoint; a third-party ``base_url`` gets
``HYBRIDMEM_API_KEY`` (or nothing).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from hybridmem.prompts import CHAT_SYSTEM_PROMPT, PROXY_PROMPT

__all__ = ["DEFAULT_DATA_DIR", "Settings"]

#: Where memories live when ``data_dir`` is not set.
DEFAULT_DATA_DIR = Path("~/.hybridmem").expanduser()
OPENAI_HOST = "api.openai.com"
#: Sent as the key to endpoints that need none (local servers); the official client insists on one.
NO_KEY = "no-key"


def is_openai_url(url: str | None) -> bool:
    """True for OpenAI's own API (or no URL, which the client sends to OpenAI)."""
    return url is None or (urlparse(url).hostname or "") == OPENAI_HOST


class Settings(BaseSettings):
    """Everything hybridmem can be told. Every field can be set as ``HYBRIDMEM_<FIELD>``."""

    model_config = SettingsConfigDict(
        env_prefix="HYBRIDMEM_", extra="forbid", validate_default=True, frozen=True
    )

    # storage
    data_dir: Path = Field(default=DEFAULT_DATA_DIR, description="Where memories are stored.")
    chroma_url: str | None = Field(
        default=None, description="Chroma server URL (http://host:port); embedded when unset."
    )
    lease_ttl: float = Field(
        default=30.0, gt=0, le=3600,
        description="Server mode: seconds a user's write lease lasts without renewal, so how long "
        "that user's writes wait after its holder died mid-write (a holder must finish a batch "
        "within it).",
    )

    # endpoint (chat, extraction, embeddings)
    base_url: str | None = Field(default=None, description="OpenAI-compatible endpoint URL.")
    api_key: SecretStr | None = Field(default=None, description="Key for base_url.")
    openai_api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("openai_api_key", "OPENAI_API_KEY"),
        description="Used only when the endpoint is OpenAI's own.",
    )
    chat_model: str = "gpt-4o-mini"
    request_timeout: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=2, ge=0, le=10)
    request_deadline: float = Field(
        default=90.0, gt=0,
        description="Total seconds one endpoint call may take, retries included: each attempt "
        "gets at most request_deadline / (max_retries + 1), and no retry starts after it.",
    )

    # embeddings
    embedder: Literal["local", "openai", "hash"] = "local"
    embedding_model: str = "text-embedding-3-small"
    embedding_base_url: str | None = None
    embedding_api_key: SecretStr | None = None
    embedding_batch_size: int = Field(default=64, ge=1, le=2048)
    onnx_threads: int = Field(default=2, ge=1, le=64)

    # extraction
    extractor: Literal["auto", "rules", "llm", "none"] = Field(
        default="auto", description="auto: llm when an endpoint is configured, else rules."
    )

    max_open_users: int = Field(
        default=128, ge=1, le=100_000,
        description="Users whose open state (SQLite connections, graphs, collection handles) a "
        "process keeps; the least recently used beyond this are closed, so open files stay flat.",
    )
    scrub_heap: bool = Field(
        default=True,
        description="Overwrite freed heap memory (glibc M_PERTURB) so erased text cannot reach "
        "embedded Chroma's index files; see hybridmem.runtime.process.scrub_freed_heap.",
    )
    purge_delay: float = Field(
        default=5.0, ge=0, le=3600,
        description="Seconds within which a background compaction makes what forget, prune and "
        "update erased physical in embedded Chroma's shared file, once for all erasures of that "
        "time (0: in the erasing call); close() and purge_now() do it at once. See "
        "docs/lifecycle.md, 'Erasure'.",
    )

    # write policy (see hybridmem.write.policy)
    dedup: bool = Field(default=True, description="Merge identical and near-duplicate facts.")
    dedup_jaccard: float = Field(default=0.6, ge=0, le=1)
    dedup_cosine: float = Field(
        default=0.68, ge=0, le=1,
        description="Cosine at which two facts are near-duplicates (local MiniLM; see "
        "bench/dedup_calibration.py).",
    )
    judge: bool = Field(default=True, description="Ask the LLM about facts in the cosine band.")
    judge_band_min: float = Field(default=0.5, ge=0, le=1)

    # ranking (see hybridmem.read.ranking for the formula)
    candidates: int = Field(
        default=50, ge=1, le=1000,
        description="Candidates each retriever fetches before fusion (a search of `limit` results "
        "fetches at least twice `limit`, at most 500 more; see hybridmem.read.retrieval.pool_size).",
    )
    vector_weight: float = Field(default=1.0, ge=0)
    lexical_weight: float = Field(default=1.0, ge=0)
    graph_weight: float = Field(default=1.0, ge=0)
    recency_weight: float = Field(default=0.0, ge=0)
    half_life_days: float = Field(
        default=30.0, gt=0,
        description="Days after a memory's last write (created, updated, merged into, said "
        "again) at which recency decay halves its score (with recency_weight > 0).",
    )
    frequency_weight: float = Field(
        default=0.0, ge=0, le=1,
        description="Boost for memories said again (mention_count) and often returned "
        "(access_count), log-scaled and bounded: at most x(1 + frequency_weight); 0: off. "
        "See hybridmem.read.ranking.",
    )
    importance_weight: float = Field(default=0.0, ge=0)
    rrf_k: float = Field(default=60.0, gt=0)
    fusion: Literal["rrf", "weighted"] = Field(
        default="weighted", description="How signals are fused; see hybridmem.read.ranking."
    )
    graph_hops: int = Field(
        default=1, ge=0, le=4, description="Steps graph activation spreads from the best hits."
    )
    graph_seeds: int = Field(
        default=10, ge=0, le=100, description="Best hits graph activation starts from."
    )
    graph_episodic: float = Field(
        default=0.5, ge=0, le=1,
        description="Share of a hit's activation passed to the memories written just before and "
        "after it in one batch (0: no episodic links).",
    )
    graph_focus: float = Field(
        default=0.4, ge=0, le=2,
        description="Graph signal a hit gets for naming the query's entities, even very common "
        "ones like the person asked about (0: none); see hybridmem.graph.activation.",
    )
    graph_session: float = Field(
        default=1.0, ge=0, le=1,
        description="Share of a hit's activation spread evenly over the other memories of its "
        "conversation (up to 24 each side along the episodic links; 0: off).",
    )
    graph_topic: float = Field(
        default=0.45, ge=0, le=2,
        description="Graph signal per unit of cosine between the query and the closest entity "
        "or concept name of a memory that names the query's entities (0: off, and no name "
        "vectors are made); node names are embedded when written, never in a search; see "
        "hybridmem.graph.activation and hybridmem.graph.name_vectors.",
    )
    graph_link: float = Field(
        default=0.0, ge=0, le=2,
        description="Seed mass per unit of cosine of the graph nodes whose names are closest to "
        "the query (the 5 best above cosine 0.3; needs graph_topic > 0 for the name vectors; "
        "0: off); see hybridmem.graph.activation.",
    )
    graph_speakers: bool = Field(
        default=True,
        description="The rule extractor links a conversation turn (\"Name: ...\") to its speaker "
        "and leaves out names only addressed (\"Thanks, Mel!\").",
    )
    min_score: float = Field(
        default=0.0, ge=0,
        description="Hits with a fused score below this are left out of search and context "
        "(0: none is); see docs/search.md, 'Score threshold', for the measured scale.",
    )

    # episodes: with an endpoint, every N stored conversation turns get a summary (0: never)
    episode_turns: int = Field(default=20, ge=0)
    distill: bool = Field(
        default=True,
        description="With an endpoint, add_messages asks the model once per call for the key "
        "facts of the new turns and stores them as remember() does (off, or without an "
        "endpoint: only remember() makes key facts).",
    )

    # context and chat
    context_max_tokens: int = Field(default=1500, ge=16)
    token_encoding: Literal["o200k_base", "cl100k_base"] = "o200k_base"
    store_chat: bool = True
    system_prompt: str = CHAT_SYSTEM_PROMPT

    # the OpenAI-compatible route of the REST service (POST /v1/chat/completions)
    proxy_prompt: str = Field(
        default=PROXY_PROMPT,
        description="Sent ahead of the user's memory in the system message the OpenAI-compatible "
        "route adds before the caller's messages.",
    )
    proxy_model_map: str | None = Field(
        default=None,
        description="Model names the OpenAI-compatible route sends upstream instead of the "
        "requested one: 'asked=sent' pairs, comma-separated, '*=sent' for every other name; "
        "unset: the requested model is sent as is.",
    )

    # backups
    backup_keep: int = Field(
        default=7, ge=1, le=10_000,
        description="Snapshots Memory.backup keeps in its folder; older ones are deleted.")

    # server
    server_api_key: SecretStr | None = Field(
        default=None, description="Bearer key(s) for the REST service, comma-separated."
    )
    server_allowed_hosts: str | None = Field(
        default=None,
        description="Host header values the REST service answers, comma-separated ('*': any); "
        "unset: the loopback names (localhost, 127.0.0.1, [::1]), against DNS rebinding.",
    )

    @field_validator("data_dir")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser()

    @field_validator("base_url", "embedding_base_url", "chroma_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        parsed = urlparse(value)
        if parsed.scheme not in {"http", "https"} or not parsed.hostname:
            raise ValueError(f"{value!r} is not an http(s) URL")
        return value.rstrip("/")

    @field_validator("proxy_model_map")
    @classmethod
    def _model_map(cls, value: str | None) -> str | None:
        for pair in (value or "").split(","):
            asked, equals, sent = (part.strip() for part in pair.partition("="))
            if pair.strip() and not (asked and equals and sent):
                raise ValueError(f"proxy_model_map: {pair.strip()!r} is not 'asked=sent' "
                                 "(e.g. 'gpt-4o-mini=llama3.1:8b,*=qwen2.5:7b')")
        return value or None

    def proxy_models(self) -> dict[str, str]:
        """``proxy_model_map`` as a mapping (``"*"``: every name not listed); {} when unset."""
        pairs = (p.partition("=") for p in (self.proxy_model_map or "").split(",") if p.strip())
        return {asked.strip(): sent.strip() for asked, _, sent in pairs}

    @property
    def llm_configured(self) -> bool:
        """True when an endpoint was configured (a base_url, or a key for OpenAI)."""
        return self.base_url is not None or self.api_key is not None or (
            self.openai_api_key is not None
        )

    def key_for(self, url: str | None, explicit: SecretStr | None = None) -> str:
        """The key to send to ``url``: ``explicit`` if given; ``api_key`` only if ``url`` is
        ``base_url``; ``OPENAI_API_KEY`` only if ``url`` is OpenAI's own; else a placeholder (local
        servers need none). So no key ever reaches a host it was not configured for."""
        if explicit is not None:
            return explicit.get_secret_value()
        if self.api_key is not None and url == self.base_url:
            return self.api_key.get_secret_value()
        if is_openai_url(url) and self.openai_api_key is not None:
            return self.openai_api_key.get_secret_value()
        return NO_KEY

    @property
    def resolved_embedding_base_url(self) -> str | None:
        """``embedding_base_url``, defaulting to ``base_url``."""
        return self.embedding_base_url or self.base_url

    def server_hosts(self) -> list[str]:
        """The Host names the REST service accepts (lower-case, without port); [] when unset."""
        if not self.server_allowed_hosts:
            return []
        return [h.strip().lower() for h in self.server_allowed_hosts.split(",") if h.strip()]

    def server_keys(self) -> list[str]:
        """The REST service's accepted bearer keys."""
        if self.server_api_key is None:
            return []
        return [k.strip() for k in self.server_api_key.get_secret_value().split(",") if k.strip()]
