"""The CLI faces of min_score, as_of, budgets and procedures (and, below, backups,
re-embedding, the purge, key facts, listing and pruning): real commands on a real data dir
through Typer's runner."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hybridmem.cli import app


@pytest.fixture()
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("HYBRIDMEM_DATA_DIR", str(tmp_path / "hm"))
    monkeypatch.setenv("HYBRIDMEM_EMBEDDER", "hash")
    return CliRunner()


def run(cli: CliRunner, *args: str, code: int = 0) -> str:
    result = cli.invoke(app, list(args))
    assert result.exit_code == code, (result.exit_code, result.output)
    return result.output


def test_search_and_context_take_min_score_as_of_and_budgets(cli: CliRunner) -> None:
    run(cli, "add", "u1", "To reset the router: hold reset for 10 seconds.", "--kind", "procedure")
    run(cli, "add", "u1", "I bought a Nighthawk router.")
    hits = json.loads(run(cli, "search", "u1", "router reset", "--json"))
    assert len(hits) == 2
    assert json.loads(run(cli, "search", "u1", "router reset", "--min-score", "99", "--json")) == []
    assert json.loads(run(cli, "search", "u1", "router", "--as-of", "2020-01-01", "--json")) == []
    ctx = json.loads(run(cli, "context", "u1", "router reset", "--budget", "procedures=100",
                         "--budget", "memories=50", "--json"))
    assert {"procedures", "memories"} <= {line["section"] for line in ctx["lines"]}
    assert "Procedures (steps that worked before):" in ctx["text"]
    run(cli, "context", "u1", "router", "--budget", "facts", code=2)
    assert "unknown sections" in run(cli, "context", "u1", "router", "--budget", "fact=3", code=1)


def test_backup_restore_and_reembed_commands(
    cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run(cli, "add", "u1", "I bought a ROG laptop.")
    run(cli, "add", "u2", "To reset the router: hold reset for 10 s.", "--kind", "procedure")
    made = json.loads(run(cli, "backup", str(tmp_path / "b"), "--json"))
    assert sorted(u["user_id"] for u in made["users"]) == ["u1", "u2"]
    assert "1 users, 1 memories" in run(cli, "backup", str(tmp_path / "b"), "--user", "u1")
    assert "have memories here" in run(cli, "restore", str(tmp_path / "b"), code=1)
    fresh = ["--data-dir", str(tmp_path / "fresh")]
    assert "restored 1 memories" in run(cli, "restore", str(tmp_path / "b"), *fresh)  # newest
    assert "restored 2 memories" in run(cli, "restore", made["snapshot"], "--replace", *fresh)
    monkeypatch.setenv("HYBRIDMEM_EMBEDDER", "local")
    assert "were embedded with 'hash-256'" in run(cli, "search", "u1", "laptop", *fresh, code=1)
    done = run(cli, "reembed", *fresh)
    assert "re-embedding u1" in done and "re-embedded 2 memories with all-MiniLM" in done
    hits = json.loads(run(cli, "search", "u1", "which computer?", "--json", *fresh))
    assert hits[0]["item"]["text"] == "I bought a ROG laptop."


def test_purge_makes_erasures_physical_now(cli: CliRunner, tmp_path: Path) -> None:
    from hybridmem import Memory, Settings

    with Memory(Settings(data_dir=tmp_path / "hm", embedder="hash", purge_delay=3600)) as mem:
        mem.forget("u1", mem.add("u1", "My safe code is Qp6620k3.").id)
        # the marker of a purge still owed, as a crash would leave it
        left = (tmp_path / "hm" / "chroma" / "purge.pending").read_bytes()
    (tmp_path / "hm" / "chroma" / "purge.pending").write_bytes(left)
    assert "purged" in run(cli, "purge")
    assert not (tmp_path / "hm" / "chroma" / "purge.pending").exists()


def test_remember_facts_list_and_search_by_category(cli: CliRunner) -> None:
    first = run(cli, "remember", "u1", "city", "Lyon", "--category", "profile").strip()
    fact = json.loads(run(cli, "remember", "u1", "city", "Paris", "--category", "profile",
                          "--json"))
    assert fact["key"] == "city" and fact["text"] == "city: Paris" and fact["id"] != first
    run(cli, "remember", "u1", "diet", "vegetarian", "--importance", "0.9")
    assert run(cli, "facts", "u1").splitlines() == ["city: Paris", "diet: vegetarian"]
    facts = json.loads(run(cli, "facts", "u1", "--category", "profile", "--json"))
    assert [f["text"] for f in facts] == ["city: Paris"]
    assert json.loads(run(cli, "facts", "nobody", "--json")) == []

    run(cli, "add", "u1", "I bought a Nighthawk router.", "--category", "purchase")
    run(cli, "add", "u1", "I want a router with WiFi 7.", "--category", "wish")
    listed = json.loads(run(cli, "list", "u1", "--json"))
    assert [m["text"] for m in listed] == [  # current memories, oldest first
        "city: Paris", "diet: vegetarian", "I bought a Nighthawk router.",
        "I want a router with WiFi 7."]
    assert [m["text"] for m in json.loads(run(cli, "list", "u1", "--limit", "1", "--json"))] == [
        "city: Paris"]
    wishes = json.loads(run(cli, "list", "u1", "--category", "wish", "--json"))
    assert [m["category"] for m in wishes] == ["wish"]
    assert "Nighthawk" in run(cli, "list", "u1", "--category", "purchase")

    hits = json.loads(run(cli, "search", "u1", "router", "--json"))
    assert {h["item"]["category"] for h in hits} >= {"purchase", "wish"}
    hits = json.loads(run(cli, "search", "u1", "router", "--category", "wish", "--json"))
    assert [h["item"]["text"] for h in hits] == ["I want a router with WiFi 7."]

    assert "error:" in run(cli, "remember", "u1", "", "x", code=1)
    assert "error:" in run(cli, "list", "../etc", code=1)
    run(cli, "list", "u1", "--limit", "0", code=2)


def test_prune_dry_run_then_for_real(cli: CliRunner, tmp_path: Path) -> None:
    from hybridmem import Memory, Settings

    old = datetime.now(timezone.utc) - timedelta(days=400)
    with Memory(Settings(data_dir=tmp_path / "hm", embedder="hash")) as mem:
        stale = mem.add("u1", "Asked once about gift wrapping.", importance=0.05, created_at=old)
        mem.add("u1", "Loyalty tier is gold.", importance=0.9, created_at=old)
    dry = json.loads(run(cli, "prune", "u1", "--dry-run", "--json"))
    assert dry["dry_run"] is True and [m["id"] for m in dry["memories"]] == [stale.id]
    assert "would remove 1 memory (dry run)" in run(cli, "prune", "u1", "--dry-run")
    assert len(json.loads(run(cli, "list", "u1", "--json"))) == 2
    # a tighter policy finds nothing, and removes nothing
    assert "removed 0 memories" in run(cli, "prune", "u1", "--idle-days", "1000")
    done = run(cli, "prune", "u1")
    assert stale.id in done and "removed 1 memory" in done
    assert [m["text"] for m in json.loads(run(cli, "list", "u1", "--json"))] == [
        "Loyalty tier is gold."]
    run(cli, "prune", "u1", "--min-importance", "2", code=2)
    assert "error:" in run(cli, "prune", "a..b", code=1)
