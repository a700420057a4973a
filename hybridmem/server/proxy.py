"""The OpenAI-compatible routes: ``POST /v1/chat/completions`` and ``GET /v1/models``, so any
OpenAI client given ``base_url=<service>/v1`` gets the configured endpoint's answers, with the
user's memory added to what the model sees and the exchange remembered.

- **Whose memory.** The header ``X-HybridMem-User``, else the body's standard ``user`` field.
  With neither, the body goes upstream as it came and nothing is stored; the response says so in
  ``X-HybridMem-Memory: off (no user)``.
- **What the model sees.** The context for the last user message (:meth:`AsyncMemory.context`),
  behind ``Settings.proxy_prompt``, as one system message before the caller's messages; the whole
  message fits ``max_context_tokens`` (``Settings.context_max_tokens``, or per request the body's
  ``hybridmem: {"max_context_tokens", "store", "min_score"}``). No memory found: no message.
  Everything else of the body (the caller's system prompt, tools, ``response_format``, unknown
  fields) is sent as it came, except ``hybridmem`` (removed) and ``model`` (mapped by
  ``Settings.proxy_model_map`` when set).
- **What is remembered.** The last user message and the assistant's final text, as two turns
  (:meth:`AsyncMemory.add_messages`), after the response has been sent. A reply that calls tools
  is not stored: the loop's final answer is, with the same user message. ``store: false`` or
  ``Settings.store_chat=False`` stores nothing. A failure to store is logged and counted in
  :class:`ProxyStats`, never turned into a failed completion. :meth:`OpenAIProxy.drain` waits
  until no store is pending (a store is pending from the moment its response is built).
- **Upstream.** ``Settings.base_url`` (OpenAI's own API when only ``OPENAI_API_KEY`` is set) with
  the key :meth:`Settings.key_for` names. The caller's ``Authorization`` is checked by the service's
  gate and never forwarded; the upstream key is masked in any error relayed. No retries here: the
  caller's client retries, and ``Retry-After`` is relayed to it.
- **Errors** come in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``: the
  upstream's own body and status (a key the upstream refuses is the service's fault: 502), else 400
  for a bad body, 502 when the endpoint cannot be reached or answers garbage, 503 when none is
  configured, 504 when it does not answer within ``request_timeout``.
- **Streaming.** Events are relayed as they arrive; a client that hangs up cancels the upstream
  request; a stream the upstream cuts ends with one ``event: error`` (OpenAI's error object) and no
  ``[DONE]``, and its partial text is not stored.

The upstream is reached with httpx, not the package's own OpenAI client: that one is not a public
name, and it parses replies into its own types, where this route must relay bodies and events as
the endpoint sent them.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import anyio
import httpx

try:
    from fastapi import APIRouter, Header, Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from starlette.background import BackgroundTask
except ImportError as exc:  # pragma: no cover
    raise ImportError("the REST service needs: pip install 'hybridmem[server]'") from exc
from pydantic import BaseModel, ConfigDict, Field

from hybridmem import AsyncMemory, InvalidInputError, InvalidUserIdError, Settings
from hybridmem.models import MAX_TEXT_CHARS, validate_user_id
from hybridmem.server.asgi import API_PREFIX, error_body, error_response

__all__ = ["COMPLETIONS_PATH", "MODELS_PATH", "ChatCompletionRequest", "OpenAIProxy", "ProxyStats"]

log = logging.getLogger("hybridmem.server.app")

COMPLETIONS_PATH = API_PREFIX + "/chat/completions"
MODELS_PATH = API_PREFIX + "/models"
#: Where a request goes when only ``OPENAI_API_KEY`` is configured.
OPENAI_BASE_URL = "https://api.openai.com/v1"
#: The header naming the user, over the body's ``user``.
USER_HEADER = "X-HybridMem-User"
#: Upstream response headers relayed to the caller (so its client backs off as told).
RELAYED_HEADERS = ("retry-after", "retry-after-ms", "x-request-id")
#: The longest last user message used as the context query (its end: the question).
MAX_QUERY_CHARS = 4000

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


# -- the request body: what this route reads; every other field passes through -------------------
class WireMessage(BaseModel):
    """One chat message; fields besides ``role`` and ``content`` (``tool_calls``, ``name``,
    ``tool_call_id`` ...) pass through unchecked."""

    model_config = ConfigDict(extra="allow", strict=True)

    role: Role
    content: str | list[dict[str, Any]] | None = None


class MemoryOptions(BaseModel):
    """The body's ``hybridmem`` field (``extra_body`` of the ``openai`` client); never sent on."""

    model_config = ConfigDict(extra="forbid", strict=True)

    max_context_tokens: int | None = Field(
        default=None, ge=1, le=100_000,
        description="Tokens the memory message may take (default: context_max_tokens).")
    store: bool | None = Field(
        default=None, description="false: remember nothing of this exchange (default: "
        "store_chat).")
    min_score: float | None = Field(
        default=None, ge=0, allow_inf_nan=False,
        description="Leave out memories scoring below this (default: the min_score setting).")


class ChatCompletionRequest(BaseModel):
    """An OpenAI chat completion request; the fields named here are checked, every other one
    (``tools``, ``temperature``, ``response_format``, ``stream_options`` ...) passes through."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str = Field(min_length=1)
    messages: list[WireMessage] = Field(min_length=1)
    stream: bool = False
    user: str | None = Field(default=None, description="Whose memory (X-HybridMem-User wins).")
    hybridmem: MemoryOptions | None = None


# -- the route's state ---------------------------------------------------------------------------
@dataclass
class ProxyStats:
    """Counters of the OpenAI-compatible route: exchanges stored, stores that failed, stores
    pending (responses sent or being sent whose exchange is not stored, skipped or failed yet),
    and the tokens the upstream reported in its answers' ``usage`` (a stream reports it only when
    the caller asked, with ``stream_options: {"include_usage": true}``)."""

    stored: int = 0
    store_failures: int = 0
    pending: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add_usage(self, usage: Any) -> None:
        """Count an answer's ``usage`` object; anything else (absent, malformed) counts nothing."""
        if not isinstance(usage, dict):
            return
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(prompt, int) and not isinstance(prompt, bool) and prompt >= 0:
            self.prompt_tokens += prompt
        if isinstance(completion, int) and not isinstance(completion, bool) and completion >= 0:
            self.completion_tokens += completion


@dataclass
class _Reply:
    """What the upstream answered, as far as remembering it goes."""

    text: list[str] = field(default_factory=list)
    complete: bool = False
    tool_calls: bool = False

    def observe_choice(self, choice: Any, *, delta: bool) -> None:
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            return
        part = choice.get("delta" if delta else "message")
        if isinstance(part, dict):
            if isinstance(part.get("content"), str):
                self.text.append(part["content"])
            if part.get("tool_calls") or part.get("function_call"):
                self.tool_calls = True
        if choice.get("finish_reason") in ("tool_calls", "function_call"):
            self.tool_calls = True


def _text(content: Any) -> str:
    """The text of a message's content: a string, or the text parts of a list."""
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content
                         if isinstance(p, dict) and isinstance(p.get("text"), str))
    return content if isinstance(content, str) else ""


class OpenAIProxy:
    """The routes' work over one memory: memory message in, upstream call, exchange stored.
    One httpx client per service, opened on first use and closed by :meth:`aclose`."""

    def __init__(self, memory: AsyncMemory) -> None:
        self.memory = memory
        self.settings: Settings = memory.settings
        self.stats = ProxyStats()
        self.base_url = self.settings.base_url or OPENAI_BASE_URL
        self._key = self.settings.key_for(self.settings.base_url)
        self._models = self.settings.proxy_models()
        self._client: httpx.AsyncClient | None = None
        # Guards stats.pending; a thread other than the service's loop waits on it in drain().
        self._settled = threading.Condition()

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until no exchange is waiting to be stored; False if some still are after
        ``timeout`` seconds. For callers outside the service's event loop (tests, benchmarks,
        a shutdown): it blocks the calling thread."""
        with self._settled:
            return self._settled.wait_for(lambda: self.stats.pending == 0, timeout)

    def _store_after(self, remember: tuple[str, str] | None,
                     reply: _Reply) -> BackgroundTask | None:
        """The background task that stores the exchange once the response is sent, counted as
        pending from now on."""
        if remember is None:
            return None
        with self._settled:
            self.stats.pending += 1
        return BackgroundTask(self._remember, remember, reply)

    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                base_url=self.base_url, timeout=httpx.Timeout(self.settings.request_timeout),
                headers={"Authorization": f"Bearer {self._key}"})
        return self._client

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    # -- the routes ------------------------------------------------------------------------------
    async def complete(self, request: Request, body: ChatCompletionRequest,
                       user_header: str | None) -> Response:
        if not self.settings.llm_configured:
            return _wire_error(503, "EndpointNotConfigured",
                               "no chat endpoint is configured: set HYBRIDMEM_BASE_URL (with "
                               "HYBRIDMEM_API_KEY as needed), or OPENAI_API_KEY for OpenAI")
        payload: dict[str, Any] = await request.json()  # as sent: unknown fields stay as they are
        payload.pop("hybridmem", None)
        if self._models:
            payload["model"] = self._models.get(body.model, self._models.get("*", body.model))
        options = body.hybridmem or MemoryOptions()
        user = user_header if user_header is not None else body.user
        headers: dict[str, str] = {"X-HybridMem-Memory": "off (no user)"}
        remember: tuple[str, str] | None = None
        if user is not None:
            try:
                validate_user_id(user)
            except InvalidUserIdError as exc:
                return _wire_error(400, "invalid_request_error", str(exc),
                                   param="user" if user_header is None else USER_HEADER)
            query = next((_text(m.content) for m in reversed(body.messages)
                          if m.role == "user"), "")
            message, tokens = await self._memory_message(user, query, options)
            if message is not None:
                payload["messages"] = [message, *payload["messages"]]
            store = self.settings.store_chat if options.store is None else options.store
            headers = {"X-HybridMem-Memory": f"on; context_tokens={tokens}; "
                                             f"store={'on' if store else 'off'}"}
            if store and query.strip():
                remember = (user, query)
        if body.stream:
            return await self._stream(payload, headers, remember)
        return await self._complete(payload, headers, remember)

    async def models(self) -> Response:
        """The upstream's models, plus the names ``proxy_model_map`` answers for."""
        if not self.settings.llm_configured:
            return _wire_error(503, "EndpointNotConfigured", "no endpoint is configured: set "
                               "HYBRIDMEM_BASE_URL, or OPENAI_API_KEY for OpenAI")
        started = time.perf_counter()
        try:
            answer = await self.client().get("/models")
        except httpx.HTTPError as exc:
            return self._unreachable(exc)
        self._log("GET", "/models", "-", answer.status_code, started)
        if answer.status_code >= 400:
            return self._relay_error(answer.status_code, answer.content, answer.headers)
        try:
            listing = answer.json()
            data = listing["data"]
            known = {m.get("id") for m in data}
        except (ValueError, KeyError, TypeError, AttributeError):
            return _wire_error(502, "server_error", f"the endpoint at {self.base_url} answered "
                               "GET /models with something other than a model list")
        data.extend({"id": name, "object": "model", "created": 0, "owned_by": "hybridmem"}
                    for name in self._models if name != "*" and name not in known)
        return JSONResponse(listing)

    # -- memory ----------------------------------------------------------------------------------
    async def _memory_message(self, user: str, query: str,
                              options: MemoryOptions) -> tuple[dict[str, str] | None, int]:
        """The system message of the user's memory for ``query`` and its tokens; (None, 0) when
        there is no query, no memory for it, or no room for it in the budget."""
        query = query[-MAX_QUERY_CHARS:]
        if not query.strip():
            return None, 0
        budget = options.max_context_tokens or self.settings.context_max_tokens
        lead = self.settings.proxy_prompt + "\n\n"
        counter = self.memory.tokens
        room = budget - counter.count(lead)
        while room >= 1:
            try:
                ctx = await self.memory.context(user, query, max_tokens=room,
                                                min_score=options.min_score)
            except InvalidInputError as exc:  # a query the memory cannot take (a NUL, ...)
                log.info("no memory context for this request: %s", exc)
                return None, 0
            if not ctx.text:
                return None, 0
            content = lead + ctx.text
            tokens = counter.count(content)
            if tokens <= budget:  # tokens at the seam may merge: re-count the whole message
                return {"role": "system", "content": content}, tokens
            room -= tokens - budget
        return None, 0

    async def _remember(self, remember: tuple[str, str], reply: _Reply) -> None:
        """Store the exchange (a background task: the response has been sent); settled then,
        whatever happened."""
        try:
            await self._store(remember, reply)
        finally:
            with self._settled:
                self.stats.pending -= 1
                self._settled.notify_all()

    async def _store(self, remember: tuple[str, str], reply: _Reply) -> None:
        text = "".join(reply.text)
        if not reply.complete or reply.tool_calls or not text.strip():
            return
        user, query = remember
        turns = [{"role": "user", "content": query[:MAX_TEXT_CHARS]},
                 {"role": "assistant", "content": text[:MAX_TEXT_CHARS]}]
        try:
            await self.memory.add_messages(user, turns)
        except Exception as exc:  # noqa: BLE001 - the completion was answered; never fail it
            self.stats.store_failures += 1
            log.warning("storing a chat completion failed: %s", type(exc).__name__)
            return
        self.stats.stored += 1

    # -- upstream --------------------------------------------------------------------------------
    async def _complete(self, payload: dict[str, Any], headers: dict[str, str],
                        remember: tuple[str, str] | None) -> Response:
        started = time.perf_counter()
        try:
            answer = await self.client().post("/chat/completions", json=payload)
        except httpx.HTTPError as exc:
            return self._unreachable(exc)
        self._log("POST", "/chat/completions", payload.get("model"), answer.status_code, started)
        if answer.status_code >= 400:
            return self._relay_error(answer.status_code, answer.content, answer.headers)
        try:
            completion = answer.json()
            choices = completion["choices"]
        except (ValueError, KeyError, TypeError):
            return _wire_error(502, "server_error", f"the endpoint at {self.base_url} answered "
                               "with something other than a chat completion")
        self.stats.add_usage(completion.get("usage") if isinstance(completion, dict) else None)
        reply = _Reply(complete=True)
        for choice in choices if isinstance(choices, list) else ():
            reply.observe_choice(choice, delta=False)
        background = self._store_after(remember, reply)
        return Response(answer.content, media_type="application/json",
                        headers={**headers, **_relayed(answer.headers)}, background=background)

    async def _stream(self, payload: dict[str, Any], headers: dict[str, str],
                      remember: tuple[str, str] | None) -> Response:
        started = time.perf_counter()
        client = self.client()
        try:
            answer = await client.send(client.build_request("POST", "/chat/completions",
                                                            json=payload), stream=True)
        except httpx.HTTPError as exc:
            return self._unreachable(exc)
        self._log("POST", "/chat/completions (stream)", payload.get("model"), answer.status_code,
                  started)
        if answer.status_code >= 400:
            try:
                content = await answer.aread()
            except httpx.HTTPError:
                content = b""
            finally:
                await answer.aclose()
            return self._relay_error(answer.status_code, content, answer.headers)
        reply = _Reply()
        background = self._store_after(remember, reply)
        return StreamingResponse(
            self._relay(answer, reply), media_type="text/event-stream",
            headers={**headers, **_relayed(answer.headers), "Cache-Control": "no-cache",
                     "X-Accel-Buffering": "no"},
            background=background)

    async def _relay(self, answer: httpx.Response, reply: _Reply) -> AsyncIterator[str]:
        """The upstream's events, one by one as they arrive; ``reply`` learns what they said. A
        cut stream ends with an error event; a cancelled one (the caller hung up) closes the
        upstream connection."""
        lines: list[str] = []
        try:
            async for line in answer.aiter_lines():
                if line:
                    lines.append(line)
                    continue
                if lines:
                    self._observe(lines, reply)
                    yield "\n".join(lines) + "\n\n"
                    lines = []
            if lines:  # an event without its closing blank line: the stream was cut
                raise httpx.RemoteProtocolError("the stream ended inside an event")
            if not reply.complete:
                raise httpx.RemoteProtocolError("the stream ended before [DONE]")
        except httpx.HTTPError as exc:
            reply.complete = False
            log.warning("chat completion stream from the endpoint failed: %s",
                        type(exc).__name__)
            message = (f"the endpoint at {self.base_url} cut the stream "
                       f"({type(exc).__name__}); the reply is incomplete")
            yield "event: error\ndata: " + json.dumps(
                error_body("server_error", message, code="upstream_stream_cut")) + "\n\n"
        finally:
            with anyio.CancelScope(shield=True):  # a cancelled relay still hangs up upstream
                await answer.aclose()

    def _observe(self, lines: list[str], reply: _Reply) -> None:
        data = "\n".join(line[5:].lstrip() for line in lines if line.startswith("data:"))
        if data.strip() == "[DONE]":
            reply.complete = True
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            return
        choices = chunk.get("choices") if isinstance(chunk, dict) else None
        for choice in choices if isinstance(choices, list) else ():
            reply.observe_choice(choice, delta=True)
        if isinstance(chunk, dict):
            self.stats.add_usage(chunk.get("usage"))

    def _relay_error(self, status: int, content: bytes,
                     upstream_headers: httpx.Headers) -> Response:
        """The upstream's error, its body as sent when it is OpenAI's shape, the key masked."""
        text = content.decode("utf-8", "replace")
        if self._key:
            text = text.replace(self._key, "***")
        if status in (401, 403):
            return _wire_error(502, "upstream_auth_error", f"the endpoint at {self.base_url} "
                               f"refused this service's key ({status}); set HYBRIDMEM_API_KEY",
                               code="upstream_auth")
        try:
            parsed = json.loads(text)
            shaped = isinstance(parsed, dict) and isinstance(parsed.get("error"), dict) \
                and isinstance(parsed["error"].get("message"), str)
        except ValueError:
            shaped = False
        if not shaped:
            return _wire_error(status, "server_error",
                               f"the endpoint at {self.base_url} answered {status}: {text[:300]}")
        return Response(text, status_code=status, media_type="application/json",
                        headers=_relayed(upstream_headers))

    def _unreachable(self, exc: httpx.HTTPError) -> Response:
        log.warning("the chat endpoint failed: %s", type(exc).__name__)
        if isinstance(exc, httpx.TimeoutException):
            return _wire_error(504, "server_error", f"the endpoint at {self.base_url} did not "
                               f"answer within {self.settings.request_timeout}s", code="timeout")
        return _wire_error(502, "server_error", f"the endpoint at {self.base_url} could not be "
                           f"reached ({type(exc).__name__})", code="upstream_unreachable")

    def _log(self, method: str, path: str, model: Any, status: int, started: float) -> None:
        log.info("%s %s%s model=%s %d %.1fms", method, self.base_url, path, model, status,
                 (time.perf_counter() - started) * 1000)


def _relayed(headers: httpx.Headers) -> dict[str, str]:
    return {name: headers[name] for name in RELAYED_HEADERS if name in headers}


def _wire_error(status: int, kind: str, message: str, *, param: str | None = None,
                code: str | None = None) -> JSONResponse:
    return error_response(status, kind, message, param=param, code=code)


# -- the router ----------------------------------------------------------------------------------
def openai_router(proxy: OpenAIProxy, responses: dict[int | str, dict[str, Any]]) -> APIRouter:
    """``POST /v1/chat/completions`` and ``GET /v1/models`` over ``proxy``."""
    router = APIRouter(tags=["openai"])
    # What these routes answer: their own errors, and the endpoint's, relayed (never a 422).
    errors: dict[int | str, dict[str, Any]] = {
        c: responses[c] for c in (400, 401, 404, 413, 421, 429, 500, 502, 503, 504)}
    errors["4XX"] = {"model": responses[400]["model"],
                     "description": "Any other error of the endpoint, relayed with its status"}

    @router.post(
        COMPLETIONS_PATH,
        responses={**errors,
                   200: {"content": {"application/json": {"schema": {"type": "object"}},
                                     "text/event-stream": {}},
                         "description": "OpenAI's chat completion, or with stream: true its "
                         "server-sent chunks then `data: [DONE]`; a stream the endpoint cuts "
                         "ends with `event: error` and OpenAI's error object."}},
        response_class=Response,
    )
    async def chat_completions(
        request: Request,
        body: ChatCompletionRequest,
        x_hybridmem_user: Annotated[str | None, Header(
            alias=USER_HEADER, description="Whose memory (over the body's user).")] = None,
    ) -> Response:
        """OpenAI's chat completions with the user's memory: the context for the last user
        message goes in as a system message first, and the exchange is remembered."""
        return await proxy.complete(request, body, x_hybridmem_user)

    @router.get(MODELS_PATH, responses=errors, response_model=dict[str, Any])
    async def list_models() -> Response:
        """The endpoint's models (OpenAI's list), and the names ``proxy_model_map`` maps."""
        return await proxy.models()

    return router
