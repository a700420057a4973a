"""Everything that speaks the OpenAI wire: embeddings, chat and LLM extraction via ``base_url``.

Why one module: key choice, error mapping and the one-INFO-line-per-call log live in one place, so
the embedder, the chat model and the extractor cannot drift apart. Importing it imports ``openai``
(most of a second), so :mod:`hybridmem.memory` imports it only when an endpoint is configured.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar, cast
from urllib.parse import urlparse

import openai
from pydantic import BaseModel, ValidationError

from hybridmem.config import NO_KEY, Settings, is_openai_url
from hybridmem.errors import (
    BackendAuthError,
    BackendError,
    BackendRateLimitError,
    BackendUnavailableError,
    ConfigError,
    HybridMemError,
    InvalidInputError,
)
from hybridmem.models import Entity, Extraction, Relation, Usage
from hybridmem.prompts import EXTRACT_BATCH_PROMPT, EXTRACT_PROMPT, EXTRACT_RETRY_PROMPT
from hybridmem.protocols import ChatMessage, ChatModel, ChatResult
from hybridmem.text import predicate_key

__all__ = ["LLMExtractor", "OpenAIChat", "OpenAIEmbedder", "map_openai_error"]

log = logging.getLogger(__name__)
T = TypeVar("T")
OPENAI_BASE_URL = "https://api.openai.com/v1"
#: Sizes of OpenAI's own embedding models, so api.openai.com needs no probe call.
KNOWN_DIMENSIONS = {"text-embedding-3-small": 1536, "text-embedding-3-large": 3072}
_KEY_LIKE = re.compile(r"\b(sk|rk|pk)-[A-Za-z0-9_*.\-]{3,}")
_AUTH_FIX = "Check HYBRIDMEM_API_KEY (OPENAI_API_KEY for api.openai.com) and HYBRIDMEM_BASE_URL."
#: openai exception -> (our error, what to do). First match wins; 5xx is InternalServerError.
_ERRORS: list[tuple[type[Exception], type[BackendError], str]] = [
    (openai.AuthenticationError, BackendAuthError, _AUTH_FIX),
    (openai.PermissionDeniedError, BackendAuthError, _AUTH_FIX),
    (openai.RateLimitError, BackendRateLimitError, "Wait, or raise HYBRIDMEM_MAX_RETRIES."),
    (openai.APITimeoutError, BackendUnavailableError, "Raise HYBRIDMEM_REQUEST_TIMEOUT."),
    (openai.APIConnectionError, BackendUnavailableError, "Check HYBRIDMEM_BASE_URL is up."),
    (openai.InternalServerError, BackendUnavailableError, "It failed every retry; try later."),
]


def _host(url: str | None) -> str:
    """``host[:port]`` of a URL, for logs and messages (never user:password)."""
    parsed = urlparse(url or OPENAI_BASE_URL)
    return f"{parsed.hostname}:{parsed.port}" if parsed.port else parsed.hostname or "?"


def map_openai_error(exc: BaseException, *, secrets: Sequence[str] = ()) -> BackendError:
    """The hybridmem error for an ``openai`` exception, with a message that says what to fix.

    The endpoint's own message is kept (it often names the problem) with keys masked: OpenAI's
    401 echoes part of the key, and ``secrets`` are masked wherever they appear.
    """
    request = getattr(exc, "request", None)
    where = f"the endpoint {_host(str(request.url))}" if request is not None else "the endpoint"
    detail = str(getattr(exc, "message", None) or exc)
    for secret in (s for s in secrets if len(s) >= 4):
        detail = detail.replace(secret, "***")
    detail = _KEY_LIKE.sub(r"\1-***", detail)[:300]
    kind, fix = next(
        ((kind, fix) for cls, kind, fix in _ERRORS if isinstance(exc, cls)),
        (BackendError, "Check HYBRIDMEM_CHAT_MODEL / HYBRIDMEM_EMBEDDING_MODEL and the URL."),
    )
    status = getattr(exc, "status_code", None)
    what = f"HTTP {status}" if isinstance(status, int) else type(exc).__name__
    return kind(f"{where} failed ({what}: {detail}). {fix}")


def _usage(raw: Any) -> Usage:
    """The client's usage object (or None) as our :class:`Usage`."""
    names = ("prompt_tokens", "completion_tokens", "total_tokens")
    return Usage(**{name: getattr(raw, name, 0) or 0 for name in names})


class _Remote:
    """One ``openai.OpenAI`` for one URL and key, with error mapping, call logs and close."""

    model: str

    def __init__(self, settings: Settings, url: str | None, key: str) -> None:
        if is_openai_url(url) and key == NO_KEY:
            raise ConfigError(
                "no key for api.openai.com: set OPENAI_API_KEY or HYBRIDMEM_API_KEY, or point "
                "HYBRIDMEM_BASE_URL at a local OpenAI-compatible server."
            )
        self.host, self._key = _host(url), key
        #: each attempt's timeout, so that every attempt of one call fits in the deadline
        self._attempt_timeout = min(settings.request_timeout,
                                    settings.request_deadline / (settings.max_retries + 1))
        self._client: openai.OpenAI | None = openai.OpenAI(  # no I/O until the first request
            base_url=url or OPENAI_BASE_URL,  # never None: the client would read OPENAI_BASE_URL
            api_key=key,
            timeout=self._attempt_timeout,
            max_retries=settings.max_retries,
        )

    @contextmanager
    def _calling(
        self, op: str, *, passthrough: tuple[type[Exception], ...] = ()
    ) -> Iterator[openai.OpenAI]:
        """Yield the client; map *every* failure in the block (except ``passthrough`` and our
        own errors) to a :class:`BackendError` subclass, and log one INFO line.

        The block should read the reply too: a 200 that is not JSON, an HTML page from a proxy or
        JSON of the wrong shape fails there (as ``ValueError``, ``AttributeError``, ``TypeError``
        ...), and becomes ``BackendError`` here like any HTTP error.
        """
        if self._client is None:
            raise BackendError(f"{self!r} is closed; create a new one")
        start, outcome = time.perf_counter(), "failed"
        try:
            yield self._client
            outcome = "ok"
        except passthrough as exc:
            outcome = type(exc).__name__
            raise
        except HybridMemError as exc:  # already ours (a check of the reply's content)
            outcome = type(exc).__name__
            raise
        except openai.OpenAIError as exc:
            outcome = type(exc).__name__
            raise map_openai_error(exc, secrets=[self._key]) from exc
        except GeneratorExit:  # a stream abandoned by its reader
            outcome = "abandoned"
            raise
        except Exception as exc:  # not JSON, not OpenAI-shaped, a broken connection ...
            outcome = type(exc).__name__
            raise BackendError(
                f"the endpoint {self.host} returned a reply that is not an OpenAI "
                f"{op} reply ({type(exc).__name__}); check HYBRIDMEM_BASE_URL points at the API "
                "itself, not a proxy or web page"
            ) from exc
        finally:
            ms = (time.perf_counter() - start) * 1000
            log.info("%s %s model=%s %.0f ms %s", op, self.host, self.model, ms, outcome)

    def close(self) -> None:
        """Release the HTTP connections; idempotent. A closed client refuses use."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self: T) -> T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model!r}, host={self.host!r})"


class OpenAIEmbedder(_Remote):
    """Embeddings from an OpenAI-compatible endpoint, batched and L2-normalised.

    ``dimension`` is learnt from the first reply (one probe call if asked before any embedding),
    because third-party servers serve models of every size under every name.
    """

    def __init__(self, settings: Settings) -> None:
        url = settings.resolved_embedding_base_url
        super().__init__(settings, url, settings.key_for(url, settings.embedding_api_key))
        self.model = settings.embedding_model
        self.name = f"openai:{self.model}"
        self.batch_size = settings.embedding_batch_size
        self._dimension = KNOWN_DIMENSIONS.get(self.model) if is_openai_url(url) else None

    @property
    def dimension(self) -> int:
        """Vector size; the first access may cost one probe call, then it is cached."""
        if self._dimension is None:
            self.embed_batch(["dimension probe"])
        return cast(int, self._dimension)

    @dimension.setter
    def dimension(self, value: int) -> None:
        """Set a known size (say, a collection's) to skip the probe; replies are checked by it."""
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInputError(f"dimension must be a positive int, got {value!r}")
        self._dimension = value

    def embed_batch(self, texts: Sequence[str]) -> list[list[float]]:
        """One unit vector per text, in order, in requests of at most ``batch_size`` texts."""
        vectors: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            vectors.extend(self._embed(list(texts[start : start + self.batch_size])))
        return vectors

    def _embed(self, texts: list[str]) -> list[list[float]]:
        with self._calling("embeddings") as client:
            reply = client.embeddings.create(model=self.model, input=texts, encoding_format="float")
            data = sorted(reply.data, key=lambda d: int(d.index))
            vectors = [[float(x) for x in d.embedding] for d in data]
        norms = [math.sqrt(math.fsum(x * x for x in v)) for v in vectors]
        if len(vectors) != len(texts) or not all(math.isfinite(n) and n > 0 for n in norms):
            raise BackendError(f"{self.host} returned missing, zero or non-finite embeddings")
        sizes = {len(v) for v in vectors} | ({self._dimension} if self._dimension else set())
        if len(sizes) != 1:
            raise BackendError(
                f"{self.host} returned vectors of sizes {sorted(sizes)} for {self.model}; check "
                "HYBRIDMEM_EMBEDDING_MODEL and the server behind the URL"
            )
        self._dimension = sizes.pop()
        return [[float(x) / n for x in v] for v, n in zip(vectors, norms)]


class OpenAIChat(_Remote):
    """Chat completions from an OpenAI-compatible endpoint (``base_url``, ``chat_model``).

    Structured replies ask for ``json_schema``; endpoints that refuse it with a 400 get
    ``json_object`` plus the schema in the system prompt, and that choice is remembered.
    """

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings, settings.base_url, settings.key_for(settings.base_url))
        self.model = settings.chat_model
        self._json_object_only = False
        self.last_usage = Usage()  # of the last finished stream, if the endpoint reported it

    def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        json_schema: Mapping[str, Any] | None = None,
        schema_name: str = "result",
    ) -> ChatResult:
        """One completion; with ``json_schema`` the reply text is JSON that should match it."""
        sent = [dict(m) for m in messages]
        if json_schema is None:
            return self._create(sent, None)
        if not self._json_object_only:
            name = re.sub(r"[^A-Za-z0-9_-]", "_", schema_name)[:64] or "result"
            spec = {"name": name, "schema": dict(json_schema), "strict": False}
            try:
                return self._create(sent, {"type": "json_schema", "json_schema": spec}, True)
            except openai.BadRequestError:
                log.info("%s refused json_schema; using json_object", self.host)
        hint = f"Reply with one JSON object matching this JSON schema:\n{json.dumps(json_schema)}"
        if sent and sent[0].get("role") == "system":  # some servers take one system message only
            sent[0] = {**sent[0], "content": f"{sent[0].get('content', '')}\n\n{hint}"}
        else:
            sent.insert(0, {"role": "system", "content": hint})
        result = self._create(sent, {"type": "json_object"})
        self._json_object_only = True
        return result

    def _create(
        self, messages: list[dict[str, str]], fmt: dict[str, Any] | None, refusable: bool = False
    ) -> ChatResult:
        passthrough = (openai.BadRequestError,) if refusable else ()
        with self._calling("chat", passthrough=passthrough) as client:
            reply = client.chat.completions.create(
                model=self.model,
                messages=cast(Any, messages),
                response_format=cast(Any, fmt) if fmt is not None else openai.omit,
            )
            if not isinstance(reply.choices, list) or not reply.choices:
                raise BackendError(f"{self.host} returned no choices for {self.model}")
            text = reply.choices[0].message.content or ""
            if not isinstance(text, str):
                raise BackendError(f"{self.host} returned a non-text reply for {self.model}")
            model = reply.model if isinstance(reply.model, str) and reply.model else self.model
            usage = _usage(reply.usage)
        return ChatResult(text=text, usage=usage, model=model)

    def stream(self, messages: Sequence[ChatMessage]) -> Iterator[str]:
        """The reply as text deltas; usage (if reported) lands in :attr:`last_usage`.

        A stream that breaks, or ends before a choice says it finished, raises
        :class:`BackendError` after the deltas that did arrive (so a caller can show them and
        then the error)."""
        sent = cast(Any, [dict(m) for m in messages])
        finished = False
        with self._calling("chat.stream") as client:
            chunks = client.chat.completions.create(
                model=self.model, messages=sent, stream=True, stream_options={"include_usage": True}
            )
            with chunks:
                for chunk in chunks:
                    self.last_usage = _usage(chunk.usage) if chunk.usage else self.last_usage
                    for choice in chunk.choices:
                        finished = finished or choice.finish_reason is not None
                        if choice.delta.content:
                            yield str(choice.delta.content)
            if not finished:
                raise BackendError(
                    f"the stream from {self.host} ended before the reply finished; try again"
                )


# -- LLM extraction: the shapes asked for (a JSON schema via pydantic), tolerant parsing; the
# prompts are in hybridmem.prompts


class EntityOut(BaseModel):
    name: str
    type: str = "thing"


class RelationOut(BaseModel):
    subject: str
    predicate: str
    object: str
    confidence: float = 1.0


class ExtractionOut(BaseModel):
    entities: list[EntityOut]
    relations: list[RelationOut]


class BatchItemOut(ExtractionOut):
    index: int


class BatchOut(BaseModel):
    results: list[BatchItemOut]


_FIRST_PERSON = {"i", "me", "my", "myself", "we", "us", "user", "the user", "speaker"}
Found = tuple[list[Entity], list[Relation]]


def _json_object(text: str) -> Any:
    """The outermost ``{...}`` of a reply (fences and chatter around it ignored), or None."""
    start, end = text.find("{"), text.rfind("}")
    try:
        return json.loads(text[start : end + 1]) if 0 <= start < end else None
    except ValueError:
        return None


def _entity(raw: Any) -> Entity | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        return None
    try:
        return Entity(name=raw["name"].strip(), type=str(raw.get("type") or "thing").lower())
    except ValidationError:
        return None


def _relation(raw: dict[str, Any], speaker: str) -> Relation | None:
    parts = [raw.get(k) for k in ("subject", "predicate", "object")]
    if not all(isinstance(p, str) for p in parts):
        return None
    subject, predicate, obj = (str(p).strip() for p in parts)
    subject, obj = (speaker if p.lower() in _FIRST_PERSON else p for p in (subject, obj))
    confidence = raw.get("confidence", 1.0)
    ok = isinstance(confidence, (int, float)) and math.isfinite(confidence)
    confidence = min(1.0, max(0.0, float(confidence))) if ok else 1.0
    predicate = predicate_key(predicate)
    try:
        return Relation(subject=subject, predicate=predicate, object=obj, confidence=confidence)
    except ValidationError:
        return None


def _found(raw: Any, speaker: str | None) -> Found | None:
    """Valid entities and relations of one result: invalid entries are dropped, not fatal.

    None (ask again) when ``raw`` is not a result at all: not a dict, or holding neither list.
    """
    if not isinstance(raw, dict):
        return None
    entities, relations = raw.get("entities"), raw.get("relations")
    if not isinstance(entities, list) and not isinstance(relations, list):
        return None
    unique: dict[str, Entity] = {}
    for entity in map(_entity, entities if isinstance(entities, list) else []):
        if entity is not None:
            unique.setdefault(entity.name.casefold(), entity)
    rels = relations if isinstance(relations, list) else []
    found = [_relation(r, speaker or "user") for r in rels if isinstance(r, dict)]
    return list(unique.values()), [r for r in found if r is not None]


def _found_batch(raw: Any, speakers: Sequence[str | None]) -> list[Found] | None:
    """Results aligned to the texts by ``index`` (or by position when the count matches)."""
    results = raw.get("results") if isinstance(raw, dict) else None
    if not isinstance(results, list):
        return None
    aligned = {r.get("index"): r for r in results if isinstance(r, dict)}
    if not set(range(len(speakers))) <= aligned.keys():
        if len(results) != len(speakers):
            return None
        aligned = dict(enumerate(results))
    found = [_found(aligned[i], who) for i, who in enumerate(speakers)]
    return None if any(f is None for f in found) else cast(list[Found], found)


class LLMExtractor:
    """Entities and relations by asking a chat model for JSON: one call per text (or per batch),
    one retry when the reply is not JSON of the right shape, then :class:`BackendError`."""

    offline = False

    def __init__(self, chat: ChatModel) -> None:
        self.chat = chat
        self.name = f"llm:{chat.model}"

    def extract(self, text: str, *, speaker: str | None = None) -> Extraction:
        """Entities and relations of ``text``; ``speaker`` is the subject of first-person facts."""
        if not text.strip():
            return Extraction(extractor=self.name)
        (entities, relations), usage = self._ask(
            EXTRACT_PROMPT, {"speaker": speaker, "text": text}, ExtractionOut, "extraction",
            lambda raw: _found(raw, speaker),
        )
        return Extraction(entities=entities, relations=relations, extractor=self.name, usage=usage)

    def extract_batch(
        self, texts: Sequence[str], speakers: Sequence[str | None] | None = None
    ) -> list[Extraction]:
        """One call for many texts, index-aligned. The whole usage is on the first result, so
        summing the results' usage counts it once."""
        who: Sequence[str | None] = [None] * len(texts) if speakers is None else speakers
        if len(who) != len(texts):
            raise InvalidInputError(f"got {len(texts)} texts but {len(who)} speakers")
        if not texts:
            return []
        items = [{"index": i, "speaker": s, "text": t} for i, (t, s) in enumerate(zip(texts, who))]
        found, usage = self._ask(
            EXTRACT_BATCH_PROMPT, {"texts": items}, BatchOut, "extraction_batch",
            lambda raw: _found_batch(raw, who),
        )
        return [
            Extraction(entities=e, relations=r, extractor=self.name, usage=Usage() if i else usage)
            for i, (e, r) in enumerate(found)
        ]

    def _ask(
        self,
        system: str,
        payload: Mapping[str, Any],
        shape: type[BaseModel],
        schema_name: str,
        parse: Callable[[Any], T | None],
    ) -> tuple[T, Usage]:
        """Ask once, and once more with a correction if the reply does not parse."""
        user = json.dumps(payload, ensure_ascii=False)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        schema, usage = shape.model_json_schema(), Usage()
        for attempt in (1, 2):
            result = self.chat.complete(messages, json_schema=schema, schema_name=schema_name)
            usage += result.usage
            parsed = parse(_json_object(result.text))
            if parsed is not None:
                return parsed, usage
            log.info("extraction reply %d from %s was not valid JSON", attempt, self.chat.model)
            messages += [
                {"role": "assistant", "content": result.text[:2000]},
                {"role": "user", "content": EXTRACT_RETRY_PROMPT},
            ]
        raise BackendError(
            f"the model {self.chat.model} did not return extraction JSON twice; use a model that "
            "follows JSON instructions, or HYBRIDMEM_EXTRACTOR=rules"
        )

    def __repr__(self) -> str:
        return f"LLMExtractor(name={self.name!r})"
