"""The REST service: ``create_app(memory)`` returns a FastAPI app over one :class:`Memory`.

Every ``/v1`` route is scoped by user (``/v1/users/{user_id}/...``) and needs
``Authorization: Bearer <key>`` when keys are configured (``HYBRIDMEM_SERVER_API_KEY``,
comma-separated for several). Errors are mapped by exception class through
``HybridMemError.status_code``, answered as ``{"error": {"type": "<ClassName>", "message": ...}}``;
FastAPI's own validation errors stay 422 (the same ``error`` object next to FastAPI's ``detail``).

Endpoints are plain ``def``: FastAPI runs them in its thread pool, because :class:`Memory` blocks
(embedding, Chroma) and is thread-safe. Pure ASGI middlewares check the key and cap the body (413)
before any body is parsed, and log one INFO line per request: method, route *template* (never a
user id, key or memory text), status and milliseconds.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Annotated, Any, Literal, Union

from fastapi import APIRouter, Body, FastAPI, Query, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.security import HTTPBearer
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hybridmem.errors import ConfigError, HybridMemError
from hybridmem import Memory
from hybridmem.models import (
    MAX_LIMIT,
    AddRequest,
    ChatReply,
    Context,
    Hit,
    MemoryItem,
    Text,
    UpdateRequest,
    pydantic_message,
)

__all__ = ["create_app"]

log = logging.getLogger(__name__)

API_PREFIX = "/v1"
#: Most memories accepted in one ``{"memories": [...]}`` body.
MAX_BATCH = 1000

Limit = Annotated[int, Field(ge=1, le=MAX_LIMIT)]
Where = dict[str, Any]


# -- request and response bodies -----------------------------------------------------------------
class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AddManyBody(_Body):
    """Several memories in one request (one embedding batch)."""

    memories: list[AddRequest] = Field(min_length=1, max_length=MAX_BATCH)


def _add_shape(value: Any) -> str:
    return "many" if isinstance(value, dict) and "memories" in value else "one"


#: One memory (``AddRequest``: text, category, importance, ...) or ``{"memories": [...]}``.
AddBody = Annotated[
    Union[Annotated[AddRequest, Tag("one")], Annotated[AddManyBody, Tag("many")]],
    Discriminator(_add_shape),
]


#: The fields to change (see :class:`~hybridmem.models.UpdateRequest`).
UpdateBody = UpdateRequest


class _QueryBody(_Body):
    """A query over the user's memories, with the filters search and context share."""

    query: Text
    limit: Limit = 10
    where: Where | None = None
    category: str | None = None
    include_superseded: bool = False


class SearchBody(_QueryBody):
    """A hybrid search; ``where`` filters on metadata (see :meth:`Memory.search`)."""


class ContextBody(_QueryBody):
    """A token-bounded context; ``max_tokens`` defaults to the configured ``context_max_tokens``."""

    max_tokens: int | None = Field(default=None, ge=1)
    limit: Limit = 30


class ChatBody(_Body):
    """A chat turn answered with the user's memory; ``stream`` answers as server-sent events."""

    message: Text
    max_context_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False


class Deleted(BaseModel):
    """How many memories a delete removed."""

    deleted: int


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    version: str


class ErrorDetail(BaseModel):
    type: str
    message: str


class ErrorBody(BaseModel):
    """Every error the service answers (validation errors add FastAPI's ``detail`` list)."""

    error: ErrorDetail


# -- the app --------------------------------------------------------------------------------------
def create_app(
    memory: Memory,
    *,
    api_keys: Sequence[str] | None = None,
    max_body_bytes: int = 1_000_000,
) -> FastAPI:
    """A FastAPI app serving ``memory``. ``api_keys`` default to ``memory.settings.server_keys()``;
    with none, ``/v1`` is open (for loopback use: ``hybridmem serve`` refuses other hosts)."""
    from hybridmem import __version__

    keys = [k for k in (memory.settings.server_keys() if api_keys is None else api_keys) if k]
    if max_body_bytes < 1:
        raise ConfigError(f"max_body_bytes must be positive, got {max_body_bytes}")
    if not keys:
        log.warning("no server API key configured: /v1 routes need no authentication")

    app = FastAPI(title="hybridmem", version=__version__,
                  summary="Long-term memory for LLM apps, per user.")
    # The dependency only documents the scheme in OpenAPI: the key is checked by _AuthMiddleware,
    # before the body is read, so an unauthenticated client learns nothing from validation errors.
    bearer = HTTPBearer(auto_error=False, description="HYBRIDMEM_SERVER_API_KEY")
    v1 = APIRouter(
        prefix=API_PREFIX + "/users/{user_id}",
        dependencies=[Security(bearer)],
        responses={
            401: {"model": ErrorBody, "description": "Missing or wrong bearer key"},
            413: {"model": ErrorBody, "description": "Request body too large"},
        },
    )
    _errors(app)

    @app.get("/health", tags=["service"])
    def health() -> Health:
        """Liveness; needs no key."""
        return Health(version=__version__)

    @v1.post("/memories", status_code=201, tags=["memories"])
    def add_memories(
        user_id: str,
        body: Annotated[AddBody, Body()],
        infer: bool = Query(True, description="false: extract with the offline rules only"),
    ) -> Union[MemoryItem, list[MemoryItem]]:
        """Store one memory, or ``{"memories": [...]}`` in one batch; an identical memory is
        returned with its ``mention_count`` bumped rather than stored twice."""
        if isinstance(body, AddManyBody):
            return memory.add_many(user_id, body.memories, infer=infer)
        return memory.add_many(user_id, [body], infer=infer)[0]

    @v1.get("/memories", tags=["memories"])
    def list_memories(
        user_id: str,
        limit: int = Query(100, ge=1, le=MAX_LIMIT),
        offset: int = Query(0, ge=0),
        category: str | None = None,
        include_superseded: bool = False,
    ) -> list[MemoryItem]:
        """The user's memories, oldest first."""
        return memory.list(user_id, limit=limit, offset=offset, category=category,
                           include_superseded=include_superseded)

    @v1.get("/memories/{memory_id}", tags=["memories"])
    def get_memory(user_id: str, memory_id: str) -> MemoryItem:
        return memory.get(user_id, memory_id)

    @v1.patch("/memories/{memory_id}", tags=["memories"])
    def update_memory(user_id: str, memory_id: str, body: UpdateBody) -> MemoryItem:
        """Change a memory's fields; a new text is re-embedded and re-extracted."""
        return memory.update(user_id, memory_id, **body.model_dump(exclude_none=True))

    @v1.delete("/memories/{memory_id}", tags=["memories"])
    def delete_memory(user_id: str, memory_id: str) -> Deleted:
        return Deleted(deleted=memory.forget(user_id, memory_id))

    @v1.post("/search", tags=["retrieval"])
    def search(user_id: str, body: SearchBody) -> list[Hit]:
        """Hybrid search (vector, lexical, graph), each hit with its score breakdown and why."""
        return memory.search(user_id, body.query, limit=body.limit, where=body.where,
                             category=body.category, include_superseded=body.include_superseded)

    @v1.post("/context", tags=["retrieval"])
    def context(user_id: str, body: ContextBody) -> Context:
        """The best memories for ``query`` packed into at most ``max_tokens`` tokens."""
        return memory.context(user_id, body.query, max_tokens=body.max_tokens, where=body.where,
                              category=body.category, limit=body.limit,
                              include_superseded=body.include_superseded)

    @v1.post(
        "/chat",
        tags=["chat"],
        response_model=ChatReply,
        responses={200: {"content": {"text/event-stream": {}},
                         "description": "A ChatReply, or with stream: true server-sent events: "
                         '`data: {"delta": "..."}` lines, then `data: [DONE]`.'}},
    )
    def chat(user_id: str, body: ChatBody) -> Any:
        """Answer ``message`` with the user's memory, through the configured endpoint; the
        exchange is stored as memories."""
        if not body.stream:
            return memory.chat(user_id, body.message, max_context_tokens=body.max_context_tokens)
        deltas = memory.chat_stream(user_id, body.message,
                                    max_context_tokens=body.max_context_tokens)
        # Pull the first delta here, so that a bad request or a failing endpoint is answered with
        # its status code instead of a 200 stream that breaks at once.
        first = next(deltas, None)
        return StreamingResponse(
            _sse(first, deltas),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @v1.get("/export", tags=["users"])
    def export(user_id: str) -> dict[str, Any]:
        """Everything of the user as JSON that ``Memory.import_`` (``hybridmem import``) loads."""
        return memory.export(user_id)

    @v1.delete("", tags=["users"])
    def delete_user(user_id: str) -> Deleted:
        """Forget everything of the user."""
        return Deleted(deleted=memory.forget(user_id))

    app.include_router(v1)
    # The last added runs first: log, then authenticate, then cap the body.
    app.add_middleware(_BodyLimitMiddleware, max_body_bytes=max_body_bytes)
    app.add_middleware(_AuthMiddleware, keys=keys, prefix=API_PREFIX)
    app.add_middleware(_LogMiddleware)
    return app


def _sse(first: str | None, rest: Iterator[str]) -> Iterator[str]:
    """Server-sent events: ``data: {"delta": ...}`` per piece, ``data: [DONE]`` at the end; an error
    in mid-stream becomes one ``event: error`` with the usual error object, and no ``[DONE]``."""
    try:
        if first is not None:
            yield _event({"delta": first})
            for delta in rest:
                yield _event({"delta": delta})
    except HybridMemError as exc:
        log.warning("chat stream failed: %s", type(exc).__name__)
        yield "event: error\n" + _event(_error_body(type(exc).__name__, str(exc)))
        return
    yield "data: [DONE]\n\n"


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


# -- errors ---------------------------------------------------------------------------------------
def _error_body(kind: str, message: str) -> dict[str, Any]:
    return {"error": {"type": kind, "message": message}}


def _error_response(status: int, kind: str, message: str, **headers: str) -> JSONResponse:
    return JSONResponse(_error_body(kind, message), status_code=status, headers=headers or None)


def _errors(app: FastAPI) -> None:
    """Map errors by class: ``HybridMemError.status_code``; never by message text."""

    @app.exception_handler(HybridMemError)
    async def hybridmem_error(request: Request, exc: HybridMemError) -> JSONResponse:
        if exc.status_code >= 500:
            log.warning("%s %s failed: %s", request.method, _template(request.scope),
                        type(exc).__name__)
        retry = {"Retry-After": "1"} if exc.retryable else {}
        return _error_response(exc.status_code, type(exc).__name__, str(exc), **retry)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        details = exc.errors()
        message = pydantic_message(details)
        # FastAPI's own ``detail`` stays, for clients that know it; ``input`` echoes what the
        # client sent (it could be memory text), so it is dropped.
        detail = [{k: v for k, v in e.items() if k not in {"input", "ctx", "url"}}
                  for e in details]
        return JSONResponse(
            {**_error_body("RequestValidationError", message), "detail": detail},
            status_code=422,
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error_response(exc.status_code, "HTTPException", str(exc.detail),
                               **(exc.headers or {}))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed unexpectedly: %s", request.method, _template(request.scope),
                  type(exc).__name__)
        return _error_response(500, "InternalServerError", "internal error; see the server log")


# -- middleware (pure ASGI: no body is read before the key and the size are checked) ---------------
def _template(scope: Scope) -> str:
    """The route's path template (``/v1/users/{user_id}/memories``): never a raw ``/v1`` path,
    which carries a user id."""
    path = getattr(scope.get("route"), "path", None)
    if isinstance(path, str):
        return path
    raw = str(scope.get("path", ""))
    return f"{API_PREFIX}/*" if raw.startswith(API_PREFIX) else raw[:100]


async def _send_error(send: Send, status: int, kind: str, message: str,
                      headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps(_error_body(kind, message)).encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()), *headers],
    })
    await send({"type": "http.response.body", "body": body})


class _LogMiddleware:
    """One INFO line per request: method, route template, status, milliseconds."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            log.info("%s %s %d %.1fms", scope["method"], _template(scope), status,
                     (time.perf_counter() - started) * 1000)


class _AuthMiddleware:
    """``Authorization: Bearer <key>`` on every path under ``prefix``; keys compared in constant
    time with :func:`hmac.compare_digest`, each of them, so timing tells nothing. No keys: open."""

    def __init__(self, app: ASGIApp, *, keys: Sequence[str], prefix: str) -> None:
        self.app = app
        self.keys = [k.encode("utf-8") for k in keys]
        self.prefix = prefix

    def _accepted(self, scope: Scope) -> bool:
        header = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                header = value
                break
        scheme, _, token = header.partition(b" ")
        token = token.strip()
        if scheme.lower() != b"bearer" or not token:
            return False
        ok = False
        for key in self.keys:
            ok |= hmac.compare_digest(token, key)
        return ok

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        guarded = path == self.prefix or path.startswith(self.prefix + "/")
        if self.keys and guarded and not self._accepted(scope):
            await _send_error(send, 401, "AuthenticationError",
                              "missing or wrong API key: send 'Authorization: Bearer <key>'",
                              [(b"www-authenticate", b"Bearer")])
            return
        await self.app(scope, receive, send)


class _BodyLimitMiddleware:
    """Refuse bodies over ``max_body_bytes`` with 413: at once by ``Content-Length``, else while
    reading (chunked uploads). The body is read here (it is small by construction) and replayed."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self.app = app
        self.max = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared < 0 or declared > self.max:
                    await self._too_large(send)
                    return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max:
                await self._too_large(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # after the body: wait for the disconnect, as usual

        await self.app(scope, replay, send)

    async def _too_large(self, send: Send) -> None:
        message = f"the request body is larger than {self.max} bytes; send less per request"
        await _send_error(send, 413, "RequestTooLarge", message)
