"""Schemathesis over the REST service's OpenAPI schema, against a real uvicorn with auth.

Every operation gets generated requests (valid by the schema, and hostile strings inside them):
no answer may be a 5xx, and every answer must match the schema (status code, content type, body).
The chat routes are served by the real OpenAI-wire server on 127.0.0.1, so they never fail for a
missing endpoint.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, seed, settings
from hypothesis.errors import Unsatisfiable
from openai_wire import OpenAIWireServer
from uvicorn_thread import serve
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from hybridmem import Memory, Settings
from hybridmem.offline import LocalEmbedder
from hybridmem.server import create_app

KEY = "fuzz-key-0123456789"
#: Generated requests per operation, per generation mode and Chroma mode: with the status-code
#: pass, 2 x (10 + 10 + 3) = 46 an operation in all. Schemathesis reports how many ran.
EXAMPLES = 10
#: The status-code pass's requests per operation and Chroma mode.
STATUS_EXAMPLES = 3
#: Hypothesis seeds per Chroma mode: reproducible runs, and each mode gets requests of its own.
SEEDS = {"embedded": 20261204, "server": 4120262}
#: What every answer must satisfy. ``status_code_conformance`` runs on its own (see below).
CHECKS = [not_a_server_error, content_type_conformance, response_schema_conformance]




@pytest.fixture(scope="module", params=["embedded", "server"])
def rest(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
         embedder: LocalEmbedder, _openai_wire_session: OpenAIWireServer,
         ) -> Iterator[tuple[str, dict[str, Any], int]]:
    """The service on embedded Chroma and on a real `chroma run`: its URL, its OpenAPI schema
    and the hypothesis seed of that mode."""
    chroma_url = request.getfixturevalue("chroma_server") if request.param == "server" else None
    settings_ = Settings(
        data_dir=tmp_path_factory.mktemp("fuzz-rest") / "hm", server_api_key=KEY,
        extractor="rules", base_url=_openai_wire_session.base_url, api_key="sk-wire",
        max_retries=0, request_timeout=5, chroma_url=chroma_url,
    )
    with Memory(settings_, embedder=embedder) as memory:
        app = create_app(memory)
        with serve(app) as url:
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}) as c:
                added = c.post("/v1/users/fuzz/memories", json={"text": "Fuzz bought a ROG laptop"})
                assert added.status_code == 201, added.text
            yield url, app.openapi(), SEEDS[request.param]


@pytest.mark.parametrize("mode", list(schemathesis.GenerationMode), ids=str)
def test_no_5xx_and_every_answer_matches_the_schema(rest: tuple[str, dict[str, Any], int],
                                                    mode: schemathesis.GenerationMode) -> None:
    """Each operation of the schema in turn, with requests valid by the schema (positive) and
    invalid ones (negative); every failure is collected (with the request that caused it, shrunk
    by hypothesis), then reported together."""
    fuzz(rest, CHECKS, mode=mode)


def test_every_status_code_is_documented(rest: tuple[str, dict[str, Any], int]) -> None:
    fuzz(rest, [status_code_conformance], examples=STATUS_EXAMPLES)


def fuzz(rest: tuple[str, dict[str, Any], int], checks: list[Any], examples: int = EXAMPLES,
         mode: schemathesis.GenerationMode = schemathesis.GenerationMode.POSITIVE) -> None:
    url, spec, seed_ = rest
    failures: list[str] = []
    for result in schemathesis.openapi.from_dict(spec).get_all_operations():
        operation = result.ok()
        check = _checker(operation, mode, examples, url=url, checks=checks, seed_=seed_)
        try:
            check()
        except Unsatisfiable:  # nothing to get wrong: GET /health has no input to make invalid
            assert mode is schemathesis.GenerationMode.NEGATIVE
            assert not list(operation.iter_parameters())
        except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001, F821 - all reported below
            failures.append(f"{operation.label}: {exc}"[:3000])
    counts = {label: n for label, (n,) in RAN.items()}
    RAN.clear()
    print(f"schemathesis {mode.value}: {sum(counts.values())} requests over {len(counts)} "
          f"operations: {counts}")
    assert not failures, "\n\n".join(failures)


def _checker(operation: Any, mode: schemathesis.GenerationMode, examples: int, *, url: str,
             checks: list[Any], seed_: int) -> Any:
    """A hypothesis test sending ``operation``'s generated requests (counted in :data:`RAN`)."""
    ran = RAN.setdefault(operation.label, [0])
    headers = {"Authorization": f"Bearer {KEY}"}

    @seed(seed_)
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def check(case: Any) -> None:
        ran[0] += 1
        case.call_and_validate(base_url=url, headers=headers, checks=checks, timeout=30)

    return check


#: Requests sent per operation label by the running fuzz (printed with -s).
RAN: dict[str, list[int]] = {}


def test_without_the_key_every_v1_route_is_401(rest: tuple[str, dict[str, Any], int]) -> None:
    url, spec, _ = rest
    routes = [(m, p) for p, ops in spec["paths"].items() for m in ops if p.startswith("/v1")]
    # health and readiness are open; the metrics need the key like every v1 route
    assert {p for _, p in routes} == set(spec["paths"]) - {"/health", "/ready", "/metrics"}
    assert len(routes) == 25
    with httpx.Client(base_url=url) as client:
        assert client.get("/metrics").status_code == 401
        for method, path in routes:
            answer = client.request(method.upper(), path.replace("{user_id}", "u")
                                    .replace("{memory_id}", "m"), json={})
            assert answer.status_code == 401, (method, path, answer.text)


_BODY = "RequestValidationError"  # refused by the request model, before any call
_CALL = "InvalidInputError"  # refused by the memory's own validation


@pytest.mark.parametrize(("method", "path", "body", "refusal"), [
    ("POST", "/v1/users/u/memories", '{"text": "a \\ud800 b"}', _BODY),
    ("POST", "/v1/users/u/memories", '{"text": "fine", "metadata": {"k": "\\udc00"}}', _BODY),
    ("POST", "/v1/users/u/memories", '{"text": "fine", "metadata": {"n": 9007199254740993}}',
     _BODY),
    ("POST", "/v1/users/u/memories", '{"text": "fine", "metadata": ["a"]}', _BODY),
    ("POST", "/v1/users/u/search", '{"query": "\\ud800"}', _BODY),
    ("POST", "/v1/users/u/search", '{"query": "x", "where": {"a": {"$in": "abc"}}}', _CALL),
    ("POST", "/v1/users/u/search", '{"query": "x", "where": {"$and": [{}]}}', _CALL),
    ("POST", "/v1/users/u/search", '{"query": "x", "where": {"created_at": {"$gt": "no"}}}',
     _CALL),
    ("POST", "/v1/users/u/context", '{"query": "x", "where": {"a": {"$gt": "a"}}}', _CALL),
    ("POST", "/v1/users/u%E2%80%AE/memories", '{"text": "a bidi user id"}',
     "InvalidUserIdError"),
])
def test_hostile_json_is_a_422(rest: tuple[str, dict[str, Any], int], method: str, path: str,
                               body: str, refusal: str) -> None:
    with httpx.Client(base_url=rest[0], headers={"Authorization": f"Bearer {KEY}",
                                                 "Content-Type": "application/json"}) as c:
        answer = c.request(method, path, content=body.encode())
    assert (answer.status_code, answer.json()["error"]["type"]) == (422, refusal), answer.text
