"""The REST service: ``create_app(memory)`` returns a FastAPI app over one memory.

Every ``/v1`` route is scoped by user (``/v1/users/{user_id}/...``), mirrors one ``Memory`` method
(its operation id is the route function's name) and needs ``Authorization: Bearer <key>`` when keys
are configured (``HYBRIDMEM_SERVER_API_KEY``, comma-separated for several); the OpenAI-compatible
``/v1/chat/completions`` and ``/v1/models`` are the exception to the scoping (see
:mod:`hybridmem.server.proxy`). Every error has one body, OpenAI's shape, ``{"error": {"message",
"type": "<ClassName>", "param", "code"}}``, mapped by exception class through
``HybridMemError.status_code``; request validation errors (422) add FastAPI's ``detail`` list.

Endpoints are ``async def`` and await an :class:`~hybridmem.AsyncMemory` (``create_app`` wraps a
plain :class:`Memory` in one): the blocking work runs in its bounded worker threads, writes of one
user queue behind each other on an async per-user gate without holding a thread, and no request
holds a lock another user's request needs. Streaming chat is the async iterator
:meth:`AsyncMemory.chat_stream` framed as server-sent events.

Pure ASGI middlewares check the Host header (against DNS rebinding), the key, admission and the
body size (413) before any body is parsed, and log one INFO line per request: method, route
*template* (never a user id, key or memory text), status and milliseconds (all in
:mod:`hybridmem.server.asgi`).

Each request's work is bounded: a body of at most ``max_body_bytes`` (so the text of one request
is too), at most ``MAX_BATCH`` memories or turns, ``limit`` at most ``MAX_LIMIT``, ``max_tokens`` at
most ``MAX_CONTEXT_TOKENS``, a graph path at most ``MAX_PATH_DEPTH`` hops, and every model call
within the ``request_deadline`` setting. At most ``max_inflight`` ``/v1`` requests run at once; one
that cannot start within ``queue_timeout`` seconds is answered 503 with ``Retry-After`` before any
of it ran, so it can be retried unchanged. Running requests are not cut at a deadline: their work
runs in threads, and a write stopped halfway is worse than a late answer.

``/docs`` (Swagger UI) and ``/redoc`` load their scripts and styles from this service, from the
files the ``fastapi-offline`` package ships (part of the ``server`` extra), never from a CDN; the
schema is at ``/openapi.json``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Annotated, Any, Literal

try:
    from fastapi import APIRouter, Body, FastAPI, Query, Security
    from fastapi.responses import Response, StreamingResponse
    from fastapi.routing import APIRoute
    from fastapi.security import HTTPBearer
    from fastapi_offline import FastAPIOffline
except ImportError as exc:  # pragma: no cover
    raise ImportError("the REST service needs: pip install 'hybridmem[server]'") from exc
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from hybridmem import AsyncMemory, Memory
from hybridmem.server.asgi import (
    API_PREFIX,
    Admission,
    AdmissionMiddleware,
    BodyLimitMiddleware,
    GateMiddleware,
    LogMiddleware,
    error_response,
    install_error_handlers,
    sse,
)
from hybridmem.server.metrics import METRICS_PATH, Metrics, MetricsMiddleware
from hybridmem.server.proxy import COMPLETIONS_PATH, MODELS_PATH, OpenAIProxy, openai_router
from hybridmem.errors import ConfigError, HybridMemError
from hybridmem.models import (
    GRAPH_FORMATS,
    MAX_LIMIT,
    MAX_PATHS,
    AddRequest,
    ChatReply,
    Context,
    GraphEntity,
    GraphFormat,
    GraphPath,
    GraphRelation,
    HistoryEvent,
    Hit,
    MemoryItem,
    Text,
    UpdateRequest,
    UserStats,
)

__all__ = ["DOCS_ASSETS_URL", "DOCS_URL", "LOOPBACK_HOSTS", "REDOC_URL", "create_app"]

log = logging.getLogger(__name__)

#: Most memories (or conversation turns) accepted in one request.
MAX_BATCH = 1000
#: Largest context budget one request may ask for.
MAX_CONTEXT_TOKENS = 100_000
#: Longest graph path one request may ask for.
MAX_PATH_DEPTH = 4
#: The Host names answered by default (a page on another origin, DNS-rebound to 127.0.0.1, sends
#: its own name and is refused).
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
#: The API documentation pages, and where their scripts and styles are served from.
DOCS_URL, REDOC_URL, DOCS_ASSETS_URL = "/docs", "/redoc", "/docs-assets"

Limit = Annotated[int, Field(ge=1, le=MAX_LIMIT)]
Where = dict[str, Any]


# -- request and response bodies -----------------------------------------------------------------
class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AddManyBody(_Body):
    """Several memories in one request (one embedding batch)."""

    memories: list[AddRequest] = Field(min_length=1, max_length=MAX_BATCH)


class Turn(_Body):
    role: Literal["user", "assistant", "system"]
    content: Text


class MessagesBody(_Body):
    """Conversation turns, stored in order as memories of kind ``turn``."""

    messages: list[Turn] = Field(min_length=1, max_length=MAX_BATCH)


class FactBody(_Body):
    """A key fact: one current value per ``key`` (older values stay, superseded)."""

    key: Annotated[str, Field(min_length=1, max_length=100)]
    value: Text
    category: str = "general"
    confidence: float = Field(default=1.0, ge=0, le=1)
    importance: float = Field(default=0.8, ge=0, le=1)


class _QueryBody(_Body):
    """A query over the user's memories, with the filters search and context share."""

    query: Text
    limit: Limit = 10
    where: Where | None = None
    category: str | None = None
    include_superseded: bool = False
    min_score: float | None = Field(
        default=None, ge=0, allow_inf_nan=False,
        description="Leave out hits scoring below this (default: the min_score setting).")
    as_of: datetime | None = Field(
        default=None, description="The memory as it stood at this time (ISO 8601; no zone: UTC).")


class SearchBody(_QueryBody):
    """A hybrid search; ``where`` filters on metadata (see :meth:`Memory.search`)."""


class ContextBody(_QueryBody):
    """A token-bounded context; ``max_tokens`` defaults to the configured ``context_max_tokens``."""

    max_tokens: int | None = Field(default=None, ge=1, le=MAX_CONTEXT_TOKENS)
    limit: Limit = 30
    budgets: dict[str, Annotated[int, Field(ge=0, le=MAX_CONTEXT_TOKENS)]] | None = Field(
        default=None, description="Tokens guaranteed to each named section (facts, relations, "
        "procedures, episodes, memories); the others keep their default share.")


class ChatBody(_Body):
    """A chat turn answered with the user's memory; ``stream`` answers as server-sent events."""

    message: Text
    max_context_tokens: int | None = Field(default=None, ge=1, le=MAX_CONTEXT_TOKENS)
    stream: bool = False


class PruneBody(_Body):
    """The retention policy's thresholds (see :meth:`Memory.prune`); a dry run by default."""

    dry_run: bool = Field(default=True, description="true: list what would be removed, remove "
                          "nothing; false: remove it.")
    min_importance: float = Field(default=0.1, description="Idle memories below this importance "
                                  "(0 to 1) go.")
    idle_days: float = Field(default=120.0, description="Days without an access (or since "
                             "creation) that make a memory idle.")


class Pruned(BaseModel):
    dry_run: bool = Field(description="Whether this was a dry run (nothing removed).")
    memories: list[MemoryItem] = Field(description="What was (or would be) removed: expired "
                                       "memories first, then idle ones.")


class Deleted(BaseModel):
    deleted: int = Field(description="How many memories the delete removed.")


class Imported(BaseModel):
    imported: int = Field(description="How many memories the import loaded.")


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    version: str


class Ready(BaseModel):
    status: Literal["ready"] = "ready"


class ErrorDetail(BaseModel):
    message: str = Field(description="What went wrong and what to do.")
    type: str = Field(description="The error class, e.g. NotFoundError, InvalidUserIdError.")
    param: str | None = Field(default=None, description="The field at fault, if one is.")
    code: str | int | None = Field(default=None, description="A finer code, if there is one.")


class ErrorBody(BaseModel):
    """The one error body, OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``;
    on 422 also FastAPI's ``detail``."""

    error: ErrorDetail
    detail: list[dict[str, Any]] | None = Field(
        default=None, description="Request validation errors only: FastAPI's list of problems.")


_ERROR_STATUSES = {
    400: "Invalid request to an OpenAI-compatible route, or the endpoint refused it",
    401: "Missing or wrong bearer key",
    404: "No such memory or route",
    409: "The stored collection was built by another embedder",
    413: "Request body too large",
    421: "Host header not allowed (HYBRIDMEM_SERVER_ALLOWED_HOSTS)",
    422: "Invalid input: body, parameters or user id",
    429: "The model endpoint is rate limiting",
    500: "Internal error (see the server log)",
    502: "The model endpoint failed or refused the key",
    503: "Unavailable: no endpoint configured, the endpoint is down, or a store is busy",
    504: "The model endpoint did not answer in time (OpenAI-compatible routes)",
}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": text} for status, text in _ERROR_STATUSES.items()
}
#: The statuses the memory routes answer (400, 504 and 404 from an endpoint are the proxy's).
V1_RESPONSES = {s: r for s, r in ERROR_RESPONSES.items() if s not in (400, 504)}
NO_ENDPOINT = ("no chat endpoint is configured: set HYBRIDMEM_BASE_URL (with HYBRIDMEM_API_KEY and "
               "HYBRIDMEM_CHAT_MODEL as needed), or OPENAI_API_KEY for OpenAI")


def _operation_id(route: APIRoute) -> str:
    return route.name  # the route function's name: add_memory, search, query_path, ...


# -- the app --------------------------------------------------------------------------------------
def create_app(
    memory: Memory | AsyncMemory,
    *,
    api_keys: Sequence[str] | None = None,
    allowed_hosts: Sequence[str] | None = None,
    max_body_bytes: int = 1_000_000,
    max_inflight: int = 64,
    queue_timeout: float = 10.0,
    metrics: Metrics | None = None,
) -> FastAPI:
    """A FastAPI app serving ``memory`` (a :class:`Memory` is wrapped in an :class:`AsyncMemory`,
    which its creator keeps and closes). ``api_keys`` default to ``settings.server_keys()``;
    with none, ``/v1`` is open (for loopback use: ``hybridmem serve`` refuses other hosts).
    ``allowed_hosts`` (Host header names, ``"*"`` for any) default to ``settings.server_hosts()``,
    else :data:`LOOPBACK_HOSTS`. ``max_inflight`` and ``queue_timeout``: see the module docstring.
    ``metrics`` (see :mod:`hybridmem.server.metrics`): give the one whose ``observer`` the Memory
    was built with, so ``/metrics`` has the stage timings too; by default the app makes its own,
    without them."""
    from hybridmem import __version__

    if isinstance(memory, Memory):
        memory = AsyncMemory.from_memory(memory)
    if not isinstance(memory, AsyncMemory):
        raise ConfigError(f"create_app needs a Memory or an AsyncMemory, got "
                          f"{type(memory).__name__}")
    if max_inflight < 1 or not queue_timeout > 0:
        raise ConfigError(f"max_inflight must be positive and queue_timeout above 0, got "
                          f"{max_inflight} and {queue_timeout}")
    keys = [k for k in (memory.settings.server_keys() if api_keys is None else api_keys) if k]
    hosts = list(allowed_hosts if allowed_hosts is not None else (
        memory.settings.server_hosts() or LOOPBACK_HOSTS))
    if max_body_bytes < 1:
        raise ConfigError(f"max_body_bytes must be positive, got {max_body_bytes}")
    if not hosts:
        raise ConfigError("allowed_hosts is empty: no request could be answered; use '*' for any")
    if not keys:
        log.warning("no server API key configured: /v1 routes need no authentication")

    proxy = OpenAIProxy(memory)
    metrics = metrics if metrics is not None else Metrics()
    admission = Admission()
    metrics.watch(memory, admission, proxy.stats)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await proxy.aclose()  # the OpenAI-compatible route's connections to the endpoint

    # FastAPIOffline: a FastAPI whose /docs and /redoc pages load the assets its package ships.
    app = FastAPIOffline(title="hybridmem", version=__version__,
                         summary="Long-term memory for LLM apps, per user.",
                         docs_url=DOCS_URL, redoc_url=REDOC_URL, static_url=DOCS_ASSETS_URL,
                         swagger_ui_parameters={"validatorUrl": None},
                         generate_unique_id_function=_operation_id, lifespan=lifespan)
    app.state.openai_proxy = proxy
    app.state.metrics = metrics
    # The dependency only documents the scheme in OpenAPI: the key is checked by GateMiddleware,
    # before the body is read, so an unauthenticated client learns nothing from validation errors.
    bearer = HTTPBearer(auto_error=False, description="HYBRIDMEM_SERVER_API_KEY")
    v1 = APIRouter(prefix=API_PREFIX + "/users/{user_id}", dependencies=[Security(bearer)],
                   responses=V1_RESPONSES)
    install_error_handlers(app, wire_paths=(COMPLETIONS_PATH, MODELS_PATH))

    @app.get("/health", tags=["service"], responses={421: ERROR_RESPONSES[421]})
    async def health() -> Health:
        """Liveness; needs no key."""
        return Health(version=__version__)

    @app.get("/ready", tags=["service"], response_model=Ready,
             responses={421: ERROR_RESPONSES[421], 503: ERROR_RESPONSES[503]})
    async def ready() -> Any:
        """Readiness: 200 when the vector store, the lexical index, the graph store and the
        history answer (see :meth:`Memory.ping`), else 503 with the error of the first that does
        not; needs no key."""
        try:
            await memory.ping()
        except HybridMemError as exc:
            log.warning("not ready: %s", type(exc).__name__)
            return error_response(503, type(exc).__name__, str(exc))
        return Ready()

    @app.get(METRICS_PATH, tags=["service"], response_class=Response,
             responses={200: {"content": {"text/plain": {}},
                              "description": "Prometheus' text format"},
                        401: ERROR_RESPONSES[401], 421: ERROR_RESPONSES[421]})
    async def metrics_text() -> Response:
        """The service's metrics in Prometheus' text format (see
        :mod:`hybridmem.server.metrics`); needs the key when keys are configured."""
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    # -- memories
    @v1.post("/memories", status_code=201, tags=["memories"])
    async def add_memory(
        user_id: str,
        body: Annotated[AddRequest, Body()],
        infer: bool = Query(True, description="false: extract with the offline rules only"),
    ) -> MemoryItem:
        """Store one memory; an identical memory is returned with its ``mention_count`` bumped
        rather than stored twice. Several at once: ``POST .../memories/batch``."""
        return (await memory.add_many(user_id, [body], infer=infer))[0]

    @v1.post("/memories/batch", status_code=201, tags=["memories"])
    async def add_memories(
        user_id: str,
        body: AddManyBody,
        infer: bool = Query(True, description="false: extract with the offline rules only"),
    ) -> list[MemoryItem]:
        """Store ``{"memories": [...]}`` in one batch; one item per input, in order."""
        return await memory.add_many(user_id, body.memories, infer=infer)

    @v1.get("/memories", tags=["memories"])
    async def list_memories(
        user_id: str,
        limit: int = Query(100, ge=1, le=MAX_LIMIT),
        offset: int = Query(0, ge=0),
        category: str | None = None,
        kind: Literal["fact", "turn", "summary", "procedure"] | None = None,
        include_superseded: bool = False,
    ) -> list[MemoryItem]:
        """The user's memories, oldest first, optionally of one category and one kind."""
        return await memory.list(user_id, limit=limit, offset=offset, category=category,
                                 where={"kind": kind} if kind else None,
                                 include_superseded=include_superseded)

    @v1.get("/memories/{memory_id}", tags=["memories"])
    async def get_memory(user_id: str, memory_id: str) -> MemoryItem:
        return await memory.get(user_id, memory_id)

    @v1.patch("/memories/{memory_id}", tags=["memories"])
    async def update_memory(user_id: str, memory_id: str, body: UpdateRequest) -> MemoryItem:
        """Change a memory's fields; a new text is re-embedded and re-extracted."""
        return await memory.update(user_id, memory_id, **body.model_dump(exclude_none=True))

    @v1.delete("/memories/{memory_id}", tags=["memories"])
    async def delete_memory(user_id: str, memory_id: str) -> Deleted:
        return Deleted(deleted=await memory.forget(user_id, memory_id))

    @v1.post("/messages", status_code=201, tags=["memories"])
    async def add_messages(
        user_id: str,
        body: MessagesBody,
        infer: bool = Query(True, description="false: extract with the offline rules only"),
    ) -> list[MemoryItem]:
        """Store conversation turns as memories of kind ``turn``, in order."""
        return await memory.add_messages(user_id, [m.model_dump() for m in body.messages],
                                         infer=infer)

    @v1.post("/prune", tags=["memories"])
    async def prune(user_id: str,
                    body: Annotated[PruneBody | None, Body()] = None) -> Pruned:
        """Apply the retention policy: expired memories, and memories below ``min_importance``
        idle for ``idle_days``. A dry run (the default, also with no body) removes nothing and
        lists what would go; ``"dry_run": false`` removes it."""
        body = body if body is not None else PruneBody()
        found = await memory.prune(user_id, dry_run=body.dry_run,
                                   min_importance=body.min_importance, idle_days=body.idle_days)
        return Pruned(dry_run=body.dry_run, memories=found)

    @v1.get("/history", tags=["memories"])
    async def history(user_id: str, memory_id: str | None = None) -> list[HistoryEvent]:
        """What happened to the user's memories (or one memory), oldest first."""
        return await memory.history(user_id, memory_id)

    @v1.post("/facts", tags=["facts"])
    async def remember(user_id: str, body: FactBody) -> MemoryItem:
        """Set a key fact: one current value per key; the older value stays, superseded."""
        return await memory.remember(user_id, body.key, body.value, category=body.category,
                                     confidence=body.confidence, importance=body.importance)

    @v1.get("/facts", tags=["facts"])
    async def facts(user_id: str, category: str | None = None,
                    as_of: datetime | None = None) -> list[MemoryItem]:
        return await memory.facts(user_id, category=category, as_of=as_of)

    # -- retrieval
    # Hits and the Context are our own, already validated models: they are written out as JSON
    # directly, not validated again by FastAPI on their way out (0.4 of 0.5 ms per context
    # request at 30 lines); response_model keeps the schema in the OpenAPI document.
    hits_json = TypeAdapter(list[Hit])

    @v1.post("/search", tags=["retrieval"], response_model=list[Hit])
    async def search(user_id: str, body: SearchBody) -> Response:
        """Hybrid search (vector, lexical, graph), each hit with its score breakdown and why."""
        found = await memory.search(user_id, body.query, limit=body.limit, where=body.where,
                                    category=body.category,
                                    include_superseded=body.include_superseded,
                                    min_score=body.min_score, as_of=body.as_of)
        return Response(hits_json.dump_json(found), media_type="application/json")

    @v1.post("/context", tags=["retrieval"], response_model=Context)
    async def context(user_id: str, body: ContextBody) -> Response:
        """The best memories for ``query`` packed into at most ``max_tokens`` tokens."""
        found = await memory.context(user_id, body.query, max_tokens=body.max_tokens,
                                     where=body.where, category=body.category, limit=body.limit,
                                     include_superseded=body.include_superseded,
                                     min_score=body.min_score, budgets=body.budgets,
                                     as_of=body.as_of)
        return Response(found.model_dump_json(), media_type="application/json")

    # -- the graph
    @v1.get("/entities", tags=["graph"])
    async def entities(user_id: str) -> list[GraphEntity]:
        return await memory.entities(user_id)

    @v1.get("/relations", tags=["graph"])
    async def relations(user_id: str) -> list[GraphRelation]:
        return await memory.relations(user_id)

    @v1.get("/path", tags=["graph"])
    async def query_path(
        user_id: str,
        a: Annotated[str, Query(min_length=1, max_length=500, description="An entity.")],
        b: Annotated[str, Query(min_length=1, max_length=500, description="Another entity.")],
        max_depth: int = Query(3, ge=1, le=MAX_PATH_DEPTH),
    ) -> list[str]:
        """How two entities are related (readable edges such as ``a -bought-> b``); [] if not."""
        return await memory.query_path(user_id, a, b, max_depth=max_depth)

    @v1.get(
        "/graph",
        tags=["graph"],
        response_class=Response,
        responses={200: {"content": {media: {} for media in GRAPH_FORMATS.values()},
                         "description": "The graph as node-link JSON (application/json), "
                         "GraphML or GEXF."}},
    )
    async def graph(
        user_id: str,
        fmt: Annotated[GraphFormat, Query(
            alias="format", description="node-link (JSON that nx.node_link_graph reads back), "
            "graphml or gexf (times as ISO 8601, sets and evidence as JSON text).")] = "node-link",
        as_of: Annotated[datetime | None, Query(
            description="The graph as it stood at this time (ISO 8601; no zone: UTC).")] = None,
    ) -> Response:
        """The user's whole entity graph as a file for graph tools (see
        :meth:`Memory.export_graph`), written by NetworkX's own writers."""
        raw = await memory.export_graph(user_id, format=fmt, as_of=as_of)
        return Response(raw, media_type=GRAPH_FORMATS[fmt])

    @v1.get("/paths", tags=["graph"])
    async def query_paths(
        user_id: str,
        a: Annotated[str, Query(min_length=1, max_length=500, description="An entity.")],
        b: Annotated[str, Query(min_length=1, max_length=500, description="Another entity.")],
        k: int = Query(3, ge=1, le=MAX_PATHS, description="How many paths at most."),
        max_depth: int = Query(3, ge=1, le=MAX_PATH_DEPTH),
    ) -> list[GraphPath]:
        """The ``k`` shortest paths between two entities, shortest first, each with its
        entities and each hop's predicates; [] if none."""
        return await memory.query_path(user_id, a, b, max_depth=max_depth, k=k)

    # -- chat
    @v1.post(
        "/chat",
        tags=["chat"],
        response_model=ChatReply,
        responses={200: {"content": {"text/event-stream": {}},
                         "description": "A ChatReply, or with stream: true server-sent events: "
                         '`data: {"delta": "..."}` lines, then `data: [DONE]`; a failure '
                         "mid-stream ends with `event: error` and the error body."}},
    )
    async def chat(user_id: str, body: ChatBody) -> Any:
        """Answer ``message`` with the user's memory, through the configured endpoint; the
        exchange is stored as memories. 503 when no endpoint is configured."""
        if not memory.settings.llm_configured:
            return error_response(503, "EndpointNotConfigured", NO_ENDPOINT)
        if not body.stream:
            return await memory.chat(user_id, body.message,
                                     max_context_tokens=body.max_context_tokens)
        deltas = memory.chat_stream(user_id, body.message,
                                    max_context_tokens=body.max_context_tokens)
        # Pull the first delta here: a failing endpoint gets its status, not a 200 that breaks.
        try:
            first: str | None = await anext(deltas)
        except StopAsyncIteration:
            first = None
        return StreamingResponse(
            sse(first, deltas),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    # -- users
    @v1.get("/stats", tags=["users"])
    async def stats(user_id: str) -> UserStats:
        return await memory.stats(user_id)

    @v1.get("/export", tags=["users"])
    async def export(user_id: str) -> dict[str, Any]:
        """Everything of the user as JSON that ``POST .../import`` loads back."""
        return await memory.export(user_id)

    @v1.post("/import", status_code=201, tags=["users"])
    async def import_bundle(user_id: str, body: Annotated[dict[str, Any], Body()]) -> Imported:
        """Load an export (``GET .../export``) into this user; ids and times are kept."""
        return Imported(imported=await memory.import_(user_id, body))

    @v1.delete("", tags=["users"])
    async def delete_user(user_id: str) -> Deleted:
        """Forget everything of the user."""
        return Deleted(deleted=await memory.forget(user_id))

    app.include_router(v1)
    app.include_router(openai_router(proxy, ERROR_RESPONSES), dependencies=[Security(bearer)])
    # The last added runs first: count, log, check the Host and the key, admit, cap the body.
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=max_body_bytes)
    app.add_middleware(AdmissionMiddleware, max_inflight=max_inflight, wait=queue_timeout,
                       prefix=API_PREFIX, admission=admission)
    app.add_middleware(GateMiddleware, hosts=hosts, keys=keys, prefix=API_PREFIX,
                       guarded=(METRICS_PATH,))
    app.add_middleware(LogMiddleware)
    app.add_middleware(MetricsMiddleware, metrics=metrics, prefix=API_PREFIX)
    return app
