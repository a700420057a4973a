"""ASGI plumbing of the REST service (:mod:`hybridmem.server.app`): the one error body, the exception
handlers that map errors by class, server-sent events, and three pure ASGI middlewares that run
before any body is parsed — request log, Host and key gate, body-size cap.

Kept apart from the routes so that each file holds one concern: ``server.py`` says *what* the
service answers, this module *how* every answer is framed and guarded.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio

try:
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.requests import Request
    from starlette.types import ASGIApp, Message, Receive, Scope, Send
except ImportError as exc:  # pragma: no cover
    raise ImportError("the REST service needs: pip install 'hybridmem[server]'") from exc

from hybridmem.errors import HybridMemError
from hybridmem.models import pydantic_message

__all__ = [
    "API_PREFIX", "Admission", "AdmissionMiddleware", "BodyLimitMiddleware", "GateMiddleware",
    "LogMiddleware", "error_body", "error_response", "install_error_handlers", "route_template",
    "sse",
]

#: The service logs under one name, whichever of its two modules speaks.
log = logging.getLogger("hybridmem.server.app")
#: Paths under this prefix carry a user id: never logged raw.
API_PREFIX = "/v1"


async def sse(first: str | None, rest: AsyncIterator[str]) -> AsyncIterator[str]:
    """Server-sent events: ``data: {"delta": ...}`` per piece, ``data: [DONE]`` at the end; an error
    in mid-stream becomes one ``event: error`` with the usual error object, and no ``[DONE]``.
    ``first`` is the piece the route already pulled (None: the reply was empty)."""
    try:
        if first is not None:
            yield _event({"delta": first})
            async for delta in rest:
                yield _event({"delta": delta})
    except HybridMemError as exc:
        log.warning("chat stream failed: %s", type(exc).__name__)
        yield "event: error\n" + _event(error_body(type(exc).__name__, str(exc)))
        return
    yield "data: [DONE]\n\n"


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


# -- errors ---------------------------------------------------------------------------------------
def error_body(kind: str, message: str, *, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """The one error body, OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``;
    ``type`` is the error class (``NotFoundError``), ``param`` the field at fault, if one is."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(status: int, kind: str, message: str, *, param: str | None = None,
                   code: str | None = None, **headers: str) -> JSONResponse:
    return JSONResponse(error_body(kind, message, param=param, code=code), status_code=status,
                        headers=headers or None)


def install_error_handlers(app: FastAPI, *, wire_paths: Sequence[str] = ()) -> None:
    """Map errors by class: ``HybridMemError.status_code``; never by message text. A request
    that fails validation on one of ``wire_paths`` (the OpenAI-compatible routes) is a 400
    ``invalid_request_error``, as OpenAI answers it; elsewhere a 422."""

    @app.exception_handler(HybridMemError)
    async def hybridmem_error(request: Request, exc: HybridMemError) -> JSONResponse:
        if exc.status_code >= 500:
            log.warning("%s %s failed: %s", request.method, route_template(request.scope),
                        type(exc).__name__)
        retry = {"Retry-After": "1"} if exc.retryable else {}
        return error_response(exc.status_code, type(exc).__name__, str(exc), **retry)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        details = exc.errors()
        message = pydantic_message(details)
        # FastAPI's own ``detail`` stays, for clients that know it; ``input`` echoes what the
        # client sent (it could be memory text), so it is dropped.
        detail = [{k: v for k, v in e.items() if k not in {"input", "ctx", "url"}}
                  for e in details]
        if any(e.get("loc", ())[-1:] == ("memories",) for e in details):
            message += "; to add several memories, POST {\"memories\": [...]} to .../memories/batch"
        param = _param([[str(part) for part in e.get("loc", ())] for e in details])
        if route_template(request.scope) in wire_paths:
            return JSONResponse(error_body("invalid_request_error", message, param=param),
                                status_code=400)
        return JSONResponse(
            {**error_body("RequestValidationError", message, param=param), "detail": detail},
            status_code=422,
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, "HTTPException", str(exc.detail),
                               **(exc.headers or {}))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed unexpectedly: %s", request.method, route_template(request.scope),
                  type(exc).__name__)
        return error_response(500, "InternalServerError", "internal error; see the server log")


def _param(locs: list[list[str]]) -> str | None:
    """The field at fault, dotted: what every error's location shares (the alternatives of a
    union add their type names), else the first error's; without the leading ``body``."""
    shared: list[str] = []
    for parts in zip(*locs):
        if len(set(parts)) > 1:
            break
        shared.append(parts[0])
    loc = shared if len(shared) > 1 or not locs else locs[0]
    return ".".join(loc[1:] if loc[:1] == ["body"] else loc) or None


# -- middleware (pure ASGI: no body is read before the key and the size are checked) ---------------
def route_template(scope: Scope) -> str:
    """The route's path template (``/v1/users/{user_id}/memories``): never a raw ``/v1`` path,
    which carries a user id."""
    path = getattr(scope.get("route"), "path", None)
    if isinstance(path, str):
        return path
    raw = str(scope.get("path", ""))
    return f"{API_PREFIX}/*" if raw.startswith(API_PREFIX) else raw[:100]


async def _send_error(send: Send, status: int, kind: str, message: str,
                      headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps(error_body(kind, message)).encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()), *headers],
    })
    await send({"type": "http.response.body", "body": body})


class LogMiddleware:
    """One INFO line per request: method, route template, status, milliseconds."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
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
            log.info("%s %s %d %.1fms", scope["method"], route_template(scope), status,
                     (time.perf_counter() - started) * 1000)


def _header(scope: Scope, name: bytes) -> bytes:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return b""


def _host_name(value: bytes) -> str:
    """The name of a Host header value, lower-case, without port or IPv6 brackets."""
    host = value.decode("latin-1").strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class GateMiddleware:
    """Two checks before any body is read. The Host header must name an allowed host (``*``: any),
    so a web page that DNS-rebinds its own name to 127.0.0.1 cannot reach a keyless loopback
    service (421). Paths under ``prefix`` need ``Authorization: Bearer <key>`` when keys are
    configured (401), and so do the ``guarded`` paths outside it (``/metrics``); keys are compared
    in constant time with :func:`hmac.compare_digest`, each of them, so timing tells nothing."""

    def __init__(self, app: ASGIApp, *, hosts: Sequence[str], keys: Sequence[str],
                 prefix: str, guarded: Sequence[str] = ()) -> None:
        self.app, self.prefix = app, prefix
        self.guarded = frozenset(guarded)
        self.any_host = "*" in hosts
        self.hosts = {h.strip().lower().strip("[]") for h in hosts}
        self.keys = [k.encode("utf-8") for k in keys]

    def _key_ok(self, scope: Scope) -> bool:
        scheme, _, token = _header(scope, b"authorization").partition(b" ")
        token = token.strip()
        ok = False
        for key in self.keys:
            ok |= hmac.compare_digest(token, key)
        return ok and scheme.lower() == b"bearer" and bool(token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = _host_name(_header(scope, b"host"))
        if not self.any_host and host not in self.hosts:
            await _send_error(send, 421, "HostNotAllowed",
                              f"this service does not answer for host {host[:100]!r}; add it "
                              "to HYBRIDMEM_SERVER_ALLOWED_HOSTS if it is yours")
            return
        path = str(scope.get("path", ""))
        guarded = (path == self.prefix or path.startswith(self.prefix + "/")
                   or path in self.guarded)
        if self.keys and guarded and not self._key_ok(scope):
            await _send_error(send, 401, "AuthenticationError",
                              "missing or wrong API key: send 'Authorization: Bearer <key>'",
                              [(b"www-authenticate", b"Bearer")])
            return
        await self.app(scope, receive, send)


class Admission:
    """What the admission queue holds, for the service's metrics: requests running, requests
    waiting for a slot, and requests refused (503) since the start. Changed only on the event
    loop's thread; read at scrape time."""

    def __init__(self) -> None:
        self.running = self.waiting = self.refused = 0


class AdmissionMiddleware:
    """At most ``max_inflight`` requests under ``prefix`` run at once (a streaming reply counts
    until it ends). A request that finds no free slot within ``wait`` seconds is answered 503 with
    ``Retry-After`` before any of it ran — its body is not even read — so the client may retry it
    unchanged. Requests that did start are never cut: see :mod:`hybridmem.server.app`.
    ``admission`` counts them (see :class:`Admission`)."""

    def __init__(self, app: ASGIApp, *, max_inflight: int, wait: float, prefix: str,
                 admission: Admission | None = None) -> None:
        self.app, self.prefix, self.wait, self.max = app, prefix, wait, max_inflight
        self.slots = anyio.Semaphore(max_inflight)
        self.admission = admission if admission is not None else Admission()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if scope["type"] != "http" or not (path == self.prefix
                                           or path.startswith(self.prefix + "/")):
            await self.app(scope, receive, send)
            return
        admitted = False
        self.admission.waiting += 1
        try:
            with anyio.move_on_after(self.wait):
                await self.slots.acquire()
                admitted = True
        finally:
            self.admission.waiting -= 1
        if not admitted:
            self.admission.refused += 1
            log.warning("%s %s refused: %d requests in flight for %.1fs", scope["method"],
                        route_template(scope), self.max, self.wait)
            await _send_error(send, 503, "ServerBusy",
                              "the service is busy; nothing of this request ran: retry it later",
                              [(b"retry-after", b"1")])
            return
        self.admission.running += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.admission.running -= 1
            self.slots.release()


class BodyLimitMiddleware:
    """Refuse bodies over ``max_body_bytes`` with 413: at once by ``Content-Length``, else while
    reading (chunked uploads). The body is read here (it is small by construction) and replayed."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self.app = app
        self.max = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _header(scope, b"content-length")
        if length and (not length.isdigit() or int(length) > self.max):
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
