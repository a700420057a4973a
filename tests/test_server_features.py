"""The REST faces of min_score, as_of, budgets, procedures and pruning, over real HTTP."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx

from hybridmem import Memory, Settings
from hybridmem.offline import HashEmbedder
from hybridmem.server import create_app
from uvicorn_thread import serve


def test_search_context_and_facts_take_the_new_fields(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "hm", extractor="rules")
    with Memory(settings, embedder=HashEmbedder()) as mem, serve(
            create_app(mem, api_keys=[])) as url, httpx.Client(base_url=url, timeout=30) as c:
        base = "/v1/users/u1"
        assert c.post(f"{base}/memories", json={
            "text": "To reset the router: hold reset for 10 s.", "kind": "procedure",
        }).status_code == 201
        c.post(f"{base}/facts", json={"key": "plan", "value": "silver"}).raise_for_status()
        between = c.get(f"{base}/facts").json()[0]["created_at"]
        c.post(f"{base}/facts", json={"key": "plan", "value": "gold"}).raise_for_status()
        old = c.get(f"{base}/facts", params={"as_of": between}).json()
        assert [f["text"] for f in old] == ["plan: silver"]
        hits = c.post(f"{base}/search", json={"query": "router reset"}).json()
        assert hits and c.post(f"{base}/search", json={
            "query": "router reset", "min_score": 99}).json() == []
        assert c.post(f"{base}/search", json={
            "query": "router", "as_of": "2020-01-01"}).json() == []
        ctx = c.post(f"{base}/context", json={
            "query": "router reset", "budgets": {"procedures": 100, "facts": 20}}).json()
        assert "procedures" in {line["section"] for line in ctx["lines"]}
        assert c.get(f"{base}/memories", params={"kind": "procedure"}).json()[0]["kind"] == (
            "procedure")
        bad = c.post(f"{base}/context", json={"query": "x", "budgets": {"fact": 3}})
        assert bad.status_code == 422 and "unknown sections" in bad.text
        assert c.post(f"{base}/search", json={"query": "x", "min_score": -1}).status_code == 422


def test_context_is_the_models_json_and_documented_as_context(tmp_path: Path) -> None:
    """The context endpoint writes the Context out directly (no second validation): the body is
    what Memory.context returns, as JSON, and the schema still names Context."""
    settings = Settings(data_dir=tmp_path / "hm", extractor="rules")
    with Memory(settings, embedder=HashEmbedder()) as mem, serve(
            create_app(mem, api_keys=[])) as url, httpx.Client(base_url=url, timeout=30) as c:
        mem.add_many("u1", ["Alice bought a ROG laptop in Lyon", "Alice's café is «Le Zinc»"])
        got = c.post("/v1/users/u1/context", json={"query": "Alice café", "max_tokens": 300})
        assert got.headers["content-type"] == "application/json"
        want = mem.context("u1", "Alice café", max_tokens=300)
        assert got.json() == want.model_dump(mode="json") and "«Le Zinc»" in got.json()["text"]
        schema = c.get("/openapi.json").json()["paths"]["/v1/users/{user_id}/context"]["post"]
        ok = schema["responses"]["200"]["content"]["application/json"]["schema"]
        assert ok == {"$ref": "#/components/schemas/Context"}


def test_prune_is_a_dry_run_unless_told(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "hm", extractor="rules")
    old = datetime.now(timezone.utc) - timedelta(days=400)
    with Memory(settings, embedder=HashEmbedder()) as mem, serve(
            create_app(mem, api_keys=[])) as url, httpx.Client(base_url=url, timeout=30) as c:
        stale = mem.add("u1", "Asked once about gift wrapping.", importance=0.05, created_at=old)
        coupon = mem.add("u1", "Coupon SPRING5 valid this week.",
                         expires_at=datetime.now(timezone.utc) - timedelta(seconds=1))
        mem.add("u1", "Loyalty tier is gold.", importance=0.9, created_at=old)
        before = mem.history("u1")
        path = "/v1/users/u1/prune"
        for dry in (c.post(path), c.post(path, json={}), c.post(path, json={"dry_run": True})):
            assert dry.status_code == 200, dry.text
            assert dry.json()["dry_run"] is True
            assert [m["id"] for m in dry.json()["memories"]] == [coupon.id, stale.id]
        assert mem.count("u1") == 3 and mem.history("u1") == before
        tight = c.post(path, json={"dry_run": False, "idle_days": 1000, "min_importance": 0.01})
        assert [m["id"] for m in tight.json()["memories"]] == [coupon.id]  # expired all the same
        done = c.post(path, json={"dry_run": False}).json()
        assert done["dry_run"] is False and [m["id"] for m in done["memories"]] == [stale.id]
        assert [m.text for m in mem.list("u1")] == ["Loyalty tier is gold."]
        for bad, kind in (({"min_importance": 2}, "InvalidInputError"),
                          ({"idle_days": -1}, "InvalidInputError"),
                          ({"dry_run": "maybe"}, "RequestValidationError"),
                          ({"dry_run": False, "extra": 1}, "RequestValidationError")):
            refused = c.post(path, json=bad)
            assert (refused.status_code, refused.json()["error"]["type"]) == (422, kind), bad
        assert mem.count("u1") == 1
        bad_user = c.post("/v1/users/a..b/prune")
        assert bad_user.json()["error"]["type"] == "InvalidUserIdError"
