"""A real OpenAI-wire HTTP server on 127.0.0.1 for tests, for the official ``openai`` client.

Why a server and not mocks: it exercises what the client really sends (headers, JSON bodies, SSE
parsing, timeouts, retries), so a test that passes here passes against a real endpoint too.

    with OpenAIWireServer() as srv:
        srv.script("first reply", Reply.error(429), Reply.slow(3.0), Reply.cut_stream(1))
        ...  # point Settings(base_url=srv.base_url) at it
        srv.requests[0].api_key, srv.requests[0].body["messages"]

Endpoints: ``POST /v1/chat/completions`` (plain and ``stream: true`` as server-sent events),
``POST /v1/embeddings`` (deterministic hashed vectors, float or base64), ``GET /v1/models``.
Scripted replies are consumed one per request of their endpoint; when the queue is empty the
default ``responder`` answers (deterministic, see :func:`default_responder`).
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import math
import re
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["FAULTS", "Fault", "OpenAIWireServer", "RecordedRequest", "Reply", "default_responder", "message_text"]

Endpoint = Literal["chat", "embeddings"]
#: Ways a reply can be broken at the wire (see :meth:`Reply.broken`).
Fault = Literal["non_json", "html", "wrong_shape", "no_choices", "broken_stream"]
FAULTS: tuple[Fault, ...] = ("non_json", "html", "wrong_shape", "no_choices", "broken_stream")
_PATHS: dict[str, Endpoint] = {"/v1/chat/completions": "chat", "/v1/embeddings": "embeddings"}
_TOKEN = re.compile(r"\w+|[^\w\s]")
_WORD = re.compile(r"\w+")
INVALID_JSON = 'Sure! Here is what I found: {"entities": [{"name": "ROG laptop", "type": '


@dataclass(frozen=True)
class Reply:
    """One scripted reply. ``content=None`` means "what the default responder would say"."""

    content: str | None = None
    status: int = 200
    message: str = ""
    delay: float = 0.0
    rejects_json_schema: bool = False
    cut_after: int | None = None
    fault: Fault | None = None
    drip: float = 0.0
    tool_call: tuple[str, str] | None = None
    held: bool = False

    @classmethod
    def text(cls, content: str) -> Reply:
        return cls(content=content)

    @classmethod
    def error(cls, status: int, message: str = "") -> Reply:
        """An HTTP error with an OpenAI-shaped body (401, 403, 429, 500, 503 ...)."""
        return cls(status=status, message=message)

    @classmethod
    def slow(cls, seconds: float, content: str | None = None) -> Reply:
        """Answer after ``seconds`` (cut short when the server is reset or closed)."""
        return cls(content=content, delay=seconds)

    @classmethod
    def held_back(cls, content: str | None = None) -> Reply:
        """Answer only once the test calls :meth:`OpenAIWireServer.release` (a slow model whose
        slowness the test decides, whatever the machine's speed); reset and close answer 503."""
        return cls(content=content, held=True)

    @classmethod
    def cut_stream(cls, after: int, content: str | None = None) -> Reply:
        """A streamed reply whose connection drops after ``after`` content deltas: no finish
        chunk, no ``[DONE]``, and the chunked body is never terminated (the peer just hangs up,
        as a crashed or restarted endpoint does). A request without ``stream`` gets the same
        cut: the connection closes before any response."""
        return cls(content=content, cut_after=after)

    @classmethod
    def dripping(cls, seconds: float, content: str | None = None) -> Reply:
        """A streamed reply that waits ``seconds`` before each event (a slow model); a client
        that hangs up meanwhile is counted in :attr:`OpenAIWireServer.streams_cut`."""
        return cls(content=content, drip=seconds)

    @classmethod
    def calls_tool(cls, name: str, arguments: str) -> Reply:
        """An assistant message that calls the tool ``name`` with ``arguments`` (JSON text):
        no content, ``finish_reason: "tool_calls"``; streamed as tool-call deltas."""
        return cls(content="", tool_call=(name, arguments))

    @classmethod
    def invalid_json(cls) -> Reply:
        """Chat content that is not valid JSON, whatever ``response_format`` asked for."""
        return cls(content=INVALID_JSON)

    @classmethod
    def broken(cls, fault: Fault, content: str | None = None) -> Reply:
        """A 200 that is not a usable reply: ``non_json`` (a JSON content type, garbage body),
        ``html`` (a proxy's login page), ``wrong_shape`` (JSON, but not a completion or an
        embedding list), ``no_choices`` (a completion with ``choices: []``), ``broken_stream``
        (a stream's first deltas, then the connection drops; a non-stream request gets its
        headers and half a body)."""
        return cls(content=content, fault=fault)

    @classmethod
    def refuse_json_schema(cls) -> Reply:
        """A 400 if this request asks for ``json_schema`` (some endpoints do); else the default."""
        return cls(rejects_json_schema=True)


@dataclass(frozen=True)
class RecordedRequest:
    """What one request carried: method, path, lower-cased headers and the parsed JSON body."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any

    @property
    def api_key(self) -> str | None:
        """The bearer token of the Authorization header (None when absent)."""
        auth = self.headers.get("authorization", "")
        return auth[len("Bearer ") :] if auth.startswith("Bearer ") else None

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages", [])) if isinstance(self.body, dict) else []

    @property
    def text(self) -> str:
        """Every message's text, joined: assert that a context was sent with ``in``."""
        return "\n".join(message_text(m) for m in self.messages)


def message_text(message: dict[str, Any]) -> str:
    """The text of a chat message whose content is a string or a list of text parts."""
    content = message.get("content")
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def count_tokens(text: str) -> int:
    """A deterministic stand-in for a tokenizer: words and punctuation marks."""
    return len(_TOKEN.findall(text))


def default_responder(body: dict[str, Any]) -> str:
    """Deterministic chat content for a request body.

    - ``json_schema`` / ``json_object`` for an extraction: empty entities and relations; a batch
      (a user message is JSON with ``texts``) gets one empty result per text, with its ``index``;
    - ``json_schema`` named for key-fact distillation: no facts (``{"facts": []}``);
    - any other JSON request: ``{}``;
    - plain chat: ``"ok: " + the first 50 characters of the last user message``.
    """
    messages = body.get("messages", [])
    users = [message_text(m) for m in messages if m.get("role") == "user"]
    last_user = users[-1] if users else ""
    fmt = body.get("response_format") or {}
    if fmt.get("type") not in ("json_schema", "json_object"):
        return f"ok: {last_user[:50]}"
    name = str((fmt.get("json_schema") or {}).get("name", ""))
    if "distill" in name:
        return json.dumps({"facts": []})
    everything = " ".join(message_text(m) for m in messages)
    if "extract" not in name and "relations" not in everything:
        return "{}"
    for text in reversed(users):  # a retry ends with a correction, the batch came before it
        try:
            texts = json.loads(text).get("texts")
        except (ValueError, AttributeError):
            continue
        if isinstance(texts, list):
            results = [{"index": i, "entities": [], "relations": []} for i in range(len(texts))]
            return json.dumps({"results": results})
    return json.dumps({"entities": [], "relations": []})


def hashed_vector(text: str, dimension: int) -> list[float]:
    """Feature hashing of lower-cased words into ``dimension`` signed buckets, L2-normalised.

    Texts sharing words get positive cosine similarity; the same text always gets the same vector.
    """
    vector = [0.0] * dimension
    for word in _WORD.findall(text.lower()) or [""]:
        digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
        bucket = int.from_bytes(digest[:4], "little") % dimension
        vector[bucket] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(v * v for v in vector))
    if norm == 0.0:  # every word cancelled out: still a unit vector
        vector[0], norm = 1.0, 1.0
    return [v / norm for v in vector]


class OpenAIWireServer:
    """A threaded HTTP server on a free 127.0.0.1 port that speaks enough OpenAI for the client.

    Tunables, all restored by :meth:`reset`: ``dimension`` of embeddings (64 unless the request
    asks for ``dimensions``); ``json_schema_supported`` (False: every ``json_schema`` request gets
    a 400); ``require_json_word`` (``json_object`` needs "json" in the messages, as OpenAI demands);
    ``required_key`` (other bearer keys get a 401 that echoes the key, as OpenAI's does);
    ``responder`` (request body -> chat content, for requests with nothing scripted).
    ``streams_cut`` counts streamed replies whose client hung up before the end.
    """

    def __init__(self, *, dimension: int = 64) -> None:
        self._initial_dimension = dimension
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._released = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._ids = 0
        self.streams_cut = 0
        self._requests: list[RecordedRequest] = []
        self._queues: dict[str, deque[Reply]] = {"chat": deque(), "embeddings": deque()}
        self._defaults()

    def _defaults(self) -> None:
        self.dimension = self._initial_dimension
        self.json_schema_supported = True
        self.require_json_word = True
        self.required_key: str | None = None
        self.responder: Callable[[dict[str, Any]], str] = default_responder

    # lifecycle -----------------------------------------------------------------------------------
    def start(self) -> OpenAIWireServer:
        """Bind a free port and serve from a daemon thread; idempotent."""
        if self._httpd is None:
            self._httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
            self._httpd.wire = self
            self._thread = threading.Thread(
                target=self._httpd.serve_forever,
                kwargs={"poll_interval": 0.05},  # so close() takes milliseconds, not 0.5 s
                name="openai-wire",
                daemon=True,
            )
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving; idempotent. Slow replies in flight are cut short."""
        httpd, self._httpd = self._httpd, None
        self._wake.set()
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> OpenAIWireServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``, what ``Settings(base_url=...)`` wants."""
        if self._httpd is None:
            raise RuntimeError("the server is not running; use `with OpenAIWireServer() as srv`")
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    # scripting and inspection --------------------------------------------------------------------
    def script(self, *replies: str | Reply, endpoint: Endpoint = "chat") -> None:
        """Queue replies for the next requests of ``endpoint``; a ``str`` is chat content."""
        items = [Reply.text(r) if isinstance(r, str) else r for r in replies]
        with self._lock:
            self._queues[endpoint].extend(items)

    def reset(self) -> None:
        """Forget requests and scripts, restore every tunable, and wake any slow reply."""
        with self._lock:
            self._requests = []
            self.streams_cut = 0
            self._queues = {"chat": deque(), "embeddings": deque()}
            self._wake.set()
            self._wake = threading.Event()
            self._released = threading.Event()
            self._defaults()

    def release(self) -> None:
        """Let every held-back reply (:meth:`Reply.held_back`) answer, now and later."""
        with self._lock:
            self._released.set()

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received since the last reset, in arrival order (a copy)."""
        with self._lock:
            return list(self._requests)

    def requests_to(self, endpoint: Endpoint) -> list[RecordedRequest]:
        """The recorded requests of one endpoint."""
        return [r for r in self.requests if _PATHS.get(r.path) == endpoint]

    @property
    def pending(self) -> int:
        """Scripted replies not consumed yet (all endpoints)."""
        with self._lock:
            return sum(len(q) for q in self._queues.values())

    # called from handler threads -----------------------------------------------------------------
    def _receive(
        self, recorded: RecordedRequest
    ) -> tuple[Reply, threading.Event, threading.Event]:
        with self._lock:
            self._requests.append(recorded)
            queue = self._queues.get(_PATHS.get(recorded.path, ""))
            return (queue.popleft() if queue else Reply()), self._wake, self._released

    def _next_id(self, prefix: str) -> str:
        with self._lock:
            self._ids += 1
            return f"{prefix}-wire{self._ids}"


def _released(released: threading.Event, wake: threading.Event) -> bool:
    """Wait for :meth:`OpenAIWireServer.release`; False when a reset or close came first."""
    while not released.wait(0.05):
        if wake.is_set():
            return False
    return True


class _HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    wire: OpenAIWireServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # timed-out clients hang up
            super().handle_error(request, client_address)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out as two writes: with Nagle's algorithm the body would wait for the
    # client's delayed ACK (~40 ms) on a kept-alive connection, which no real endpoint does.
    disable_nagle_algorithm = True
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/v1/models":
            models = ["gpt-4o-mini", "text-embedding-3-small"]
            data = [{"id": m, "object": "model", "created": 0, "owned_by": "wire"} for m in models]
            self._json(200, {"object": "list", "data": data})
        else:
            self._error(404, f"Unknown path {self.path}", "not_found")

    def do_POST(self) -> None:
        wire = self.server.wire
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body: Any = json.loads(raw or b"null")
        except ValueError:
            body = None
        headers = {k.lower(): v for k, v in self.headers.items()}
        reply, wake, released = wire._receive(RecordedRequest("POST", self.path, headers, body))
        endpoint = _PATHS.get(self.path)
        key = headers.get("authorization", "").removeprefix("Bearer ")
        if endpoint is None:
            self._error(404, f"Unknown path {self.path}", "not_found")
        elif not isinstance(body, dict):
            self._error(400, "We could not parse the JSON body of your request.")
        elif wire.required_key is not None and key != wire.required_key:
            self._error(401, f"Incorrect API key provided: {key}.", "invalid_api_key")
        elif (reply.delay and wake.wait(reply.delay)) or (
            reply.held and not _released(released, wake)
        ):
            self._error(503, "The server is shutting down.")
        elif reply.status >= 400:
            self._error(reply.status, reply.message or _REASONS.get(reply.status, "Error."))
        elif reply.fault is not None and reply.fault != "broken_stream" or (
            reply.fault == "broken_stream" and not body.get("stream")
        ):
            self._fault(reply.fault, endpoint)
        elif endpoint == "embeddings":
            self._embeddings(wire, body)
        else:
            self._chat(wire, body, reply)

    # replies -------------------------------------------------------------------------------------
    def _chat(self, wire: OpenAIWireServer, body: dict[str, Any], reply: Reply) -> None:
        kind = (body.get("response_format") or {}).get("type")
        everything = " ".join(message_text(m) for m in body.get("messages", []))
        if kind == "json_schema" and (reply.rejects_json_schema or not wire.json_schema_supported):
            return self._error(
                400, "Invalid parameter: 'response_format' of type 'json_schema' is not supported."
            )
        if kind == "json_object" and wire.require_json_word and "json" not in everything.lower():
            return self._error(
                400,
                "'messages' must contain the word 'json' in some form, to use 'response_format' "
                "of type 'json_object'.",
            )
        content = reply.content if reply.content is not None else wire.responder(body)
        prompt, completion = count_tokens(everything), count_tokens(content)
        usage = {"prompt_tokens": prompt, "completion_tokens": completion,
                 "total_tokens": prompt + completion}
        cid, model = wire._next_id("chatcmpl"), str(body.get("model", ""))
        if reply.cut_after is not None and not body.get("stream"):
            self.close_connection = True  # hang up without a response
            return None
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return self._stream(cid, model, content, usage if include_usage else None,
                                cut_after=reply.cut_after,
                                broken=reply.fault == "broken_stream", drip=reply.drip,
                                tool_call=reply.tool_call)
        message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
        finish = "stop"
        if reply.tool_call is not None:
            name, arguments = reply.tool_call
            message["content"], finish = None, "tool_calls"
            message["tool_calls"] = [{"id": "call_wire1", "type": "function",
                                      "function": {"name": name, "arguments": arguments}}]
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        self._json(200, {**_envelope(cid, model, "chat.completion", [choice]), "usage": usage})

    def _embeddings(self, wire: OpenAIWireServer, body: dict[str, Any]) -> None:
        inputs = body.get("input")
        if isinstance(inputs, str) or (isinstance(inputs, list) and inputs
                                       and isinstance(inputs[0], int)):
            inputs = [inputs]  # one text, or one list of token ids
        if not isinstance(inputs, list) or not inputs:
            return self._error(400, "'input' must be a non-empty string or list.")
        texts = [i if isinstance(i, str) else " ".join(map(str, i)) for i in inputs]
        dimension = int(body.get("dimensions") or wire.dimension)
        data = []
        for index, text in enumerate(texts):
            vector: Any = hashed_vector(text, dimension)
            if body.get("encoding_format") == "base64":  # the client's default
                vector = base64.b64encode(struct.pack(f"<{dimension}f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": vector})
        tokens = sum(count_tokens(t) for t in texts)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        reply = {"object": "list", "data": data, "model": body.get("model"), "usage": usage}
        self._json(200, reply)

    def _stream(self, cid: str, model: str, content: str, usage: dict[str, int] | None,
                *, cut_after: int | None = None, broken: bool = False,
                drip: float = 0.0, tool_call: tuple[str, str] | None = None) -> None:
        """Server-sent events, chunked: role, word deltas, finish, optional usage, ``[DONE]``;
        with ``cut_after``, the role and that many deltas, then the connection is dropped; with
        ``broken``, two deltas and half an event, then the connection is dropped."""

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return _envelope(cid, model, "chat.completion.chunk", [choice])

        events: list[Any] = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"content": piece}) for piece in re.findall(r"\s*\S+\s*", content)]
        if tool_call is not None:
            name, arguments = tool_call
            events.append(chunk({"tool_calls": [{"index": 0, "id": "call_wire1", "type": "function",
                                                 "function": {"name": name, "arguments": ""}}]}))
            events.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}))
        events.append(chunk({}, "stop" if tool_call is None else "tool_calls"))
        if usage is not None:
            events.append({**_envelope(cid, model, "chat.completion.chunk", []), "usage": usage})
        payloads = [f"data: {json.dumps(e)}\n\n".encode() for e in events] + [b"data: [DONE]\n\n"]
        ending = [b""]  # the empty chunk ends the body
        if cut_after is not None:
            payloads, ending = payloads[: 1 + cut_after], []
            self.close_connection = True
        if broken:  # the role and first two deltas, then half an event, then the connection drops
            payloads, ending = [*payloads[:3], b'data: {"id": "chatcmpl-cut", "choi'], []
            self.close_connection = True
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for data in [*payloads, *ending]:
                if drip:
                    time.sleep(drip)
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
        except OSError:
            self.close_connection = True
            with self.server.wire._lock:
                self.server.wire.streams_cut += 1

    def _fault(self, fault: Fault | None, endpoint: Endpoint) -> None:
        """A broken 200 (see :meth:`Reply.broken`)."""
        if fault == "html":
            page = b"<html><head><title>Sign in</title></head><body>Proxy login</body></html>"
            return self._raw(200, page, "text/html; charset=utf-8")
        if fault == "non_json":
            return self._raw(200, b"upstream said: {not json at all", "application/json")
        if fault == "wrong_shape":
            return self._json(200, {"result": "fine", "data": "no", "choices": "none"})
        if fault == "no_choices":
            envelope = _envelope("chatcmpl-empty", "wire", "chat.completion", [])
            return self._json(200, {**envelope, "data": []} if endpoint == "embeddings" else envelope)
        # broken_stream on a plain request: a Content-Length promising more than is sent
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "4096")
            self.end_headers()
            self.wfile.write(b'{"id": "chatcmpl-cut", "choices": [{"index": 0, "mess')
            self.wfile.flush()
        except OSError:
            pass
        self.close_connection = True

    def _raw(self, status: int, data: bytes, content_type: str) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True

    def _error(self, status: int, message: str, code: str | None = None) -> None:
        """An OpenAI-shaped error; 429 and 5xx ask for a 10 ms retry delay to keep tests fast."""
        kind = "server_error" if status >= 500 else "invalid_request_error"
        error = {"message": message, "type": kind, "param": None, "code": code}
        retry = {"retry-after-ms": "10"} if status == 429 or status >= 500 else {}
        self._json(status, {"error": error}, retry)

    def _json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True


_REASONS = {
    400: "Bad request.",
    401: "Incorrect API key provided.",
    403: "You are not allowed to sample from this model.",
    404: "The model does not exist.",
    429: "Rate limit reached for requests.",
    500: "The server had an error while processing your request.",
    503: "The engine is currently overloaded, please try again later.",
}


def _envelope(cid: str, model: str, kind: str, choices: list[Any]) -> dict[str, Any]:
    return {"id": cid, "object": kind, "created": int(time.time()), "model": model,
            "system_fingerprint": "fp_wire", "choices": choices}
