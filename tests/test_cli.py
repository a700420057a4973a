"""The ``hybridmem`` command: every command, its ``--json`` output and its exit codes.

Commands run in-process through Typer's runner (each opens a real Memory on a real data dir), and
``--help`` / the console script once as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hybridmem import Memory, Settings
from hybridmem.cli import app
from openai_wire import OpenAIWireServer, Reply

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    """A runner whose commands share one data dir; the hash embedder keeps each command quick."""
    monkeypatch.setenv("HYBRIDMEM_DATA_DIR", str(tmp_path / "hm"))
    monkeypatch.setenv("HYBRIDMEM_EMBEDDER", "hash")
    return CliRunner()


def run(cli: CliRunner, *args: str, code: int = 0) -> str:
    result = cli.invoke(app, list(args))
    assert result.exit_code == code, (result.exit_code, result.output)
    return result.output


def test_add_search_context_stats_json(cli: CliRunner) -> None:
    memory_id = run(cli, "add", "client_1", "I bought the ROG laptop.", "--category", "purchase")
    assert len(memory_id.strip()) == 32
    item = json.loads(run(cli, "add", "client_1", "The Dell 4K monitor complements the ROG laptop.",
                          "--json"))
    assert item["text"].startswith("The Dell 4K monitor") and item["user_id"] == "client_1"
    hits = json.loads(run(cli, "search", "client_1", "which laptop did I buy?", "--json"))
    assert hits[0]["item"]["id"] == memory_id.strip()
    ctx = json.loads(run(cli, "context", "client_1", "laptop", "--max-tokens", "80", "--json"))
    assert 0 < ctx["tokens"] <= 80 and "ROG laptop" in ctx["text"]
    stats = json.loads(run(cli, "stats", "client_1", "--json"))
    with Memory(Settings()) as mem:  # the same data dir and embedder, through the library
        entities, relations = mem.entities("client_1"), mem.relations("client_1")
    assert stats == {"user_id": "client_1", "memories": 2, "current": 2,
                     "entities": len(entities), "relations": len(relations)}
    assert stats["entities"] >= 3 and stats["relations"] >= 2  # client_1, ROG laptop, monitor
    plain = run(cli, "stats", "client_1")
    assert f"entities: {len(entities)}" in plain


def test_export_import_forget(cli: CliRunner, tmp_path: Path) -> None:
    first = run(cli, "add", "alice", "I live in Lyon.").strip()
    run(cli, "add", "alice", "I work at Acme.")
    out = tmp_path / "alice.json"
    run(cli, "export", "alice", "-o", str(out))
    bundle = json.loads(out.read_text(encoding="utf-8"))
    assert bundle["format"] == "hybridmem-export" and len(bundle["memories"]) == 2
    assert "imported 2 memories into bob" in run(cli, "import", "bob", str(out))
    hits = json.loads(run(cli, "search", "bob", "where do I live?", "--json"))
    assert hits[0]["item"]["text"] == "I live in Lyon."
    assert "removed 1 memory" in run(cli, "forget", "alice", first)
    assert "removed 1 memory" in run(cli, "forget", "alice")  # the one that was left
    assert json.loads(run(cli, "stats", "alice", "--json"))["memories"] == 0


def test_import_jsonl_and_csv(cli: CliRunner, tmp_path: Path) -> None:
    jsonl = tmp_path / "m.jsonl"
    jsonl.write_text('{"text": "I prefer matte screens.", "category": "preference"}\n\n'
                     '{"text": "I own a Kindle."}\n', encoding="utf-8")
    assert "imported 2 memories" in run(cli, "import", "carol", str(jsonl))
    table = tmp_path / "m.csv"
    table.write_text("text,category\nI like jazz.,taste\n", encoding="utf-8")
    assert "imported 1 memories" in run(cli, "import", "carol", str(table))
    assert json.loads(run(cli, "stats", "carol", "--json"))["memories"] == 3
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "fine"}\nnot json\n', encoding="utf-8")
    output = run(cli, "import", "carol", str(broken), code=2)
    assert "broken.jsonl:2" in output


def test_errors_are_one_line_with_exit_codes(cli: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    output = run(cli, "search", "../etc", "anything", code=1)
    assert "error:" in output and "Traceback" not in output
    run(cli, "forget", "dave", "no-such-memory", code=1)
    run(cli, "search", "dave", "q", "--limit", "0", code=2)  # typer's own range check
    monkeypatch.setenv("HYBRIDMEM_CANDIDATES", "many")
    output = run(cli, "stats", "dave", code=2)
    assert "invalid setting" in output and "candidates" in output


def test_serve_refuses_a_public_interface_without_a_key(cli: CliRunner) -> None:
    output = run(cli, "serve", "--host", "0.0.0.0", code=2)
    assert "refusing to serve" in output
    run(cli, "serve", "--log-level", "loud", code=2)


def test_chat_through_the_configured_endpoint(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch, openai_server: OpenAIWireServer
) -> None:
    monkeypatch.setenv("HYBRIDMEM_BASE_URL", openai_server.base_url)
    monkeypatch.setenv("HYBRIDMEM_API_KEY", "sk-cli")
    monkeypatch.setenv("HYBRIDMEM_EXTRACTOR", "rules")
    monkeypatch.setenv("HYBRIDMEM_MAX_RETRIES", "0")
    run(cli, "add", "erin", "I bought the ROG laptop.")
    openai_server.script(Reply.text("Get the Dell 4K monitor."))
    reply = json.loads(run(cli, "chat", "erin", "Which monitor?", "--json"))
    assert reply["text"] == "Get the Dell 4K monitor."
    assert "ROG laptop" in reply["context"]["text"]
    sent = openai_server.requests_to("chat")[-1]
    assert sent.api_key == "sk-cli"


def test_demo_json_runs_offline_on_the_shipped_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                    ) -> None:
    monkeypatch.setenv("HYBRIDMEM_EMBEDDER", "hash")
    result = CliRunner().invoke(app, ["demo", "--data", str(ROOT / "data"), "--json",
                                      "--data-dir", str(tmp_path / "demo")])
    assert result.exit_code == 0, result.output
    answers = json.loads(result.output)
    queries = json.loads((ROOT / "data" / "demo_queries.json").read_text(encoding="utf-8"))
    assert [a["query"] for a in answers] == [q["query"] for q in queries]
    assert all(a["hits"] for a in answers)


def test_help_is_a_real_process_that_loads_no_model() -> None:
    code = (
        "import sys; from hybridmem.cli import main; sys.argv = ['hybridmem', '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('onnxruntime', 'chromadb', 'tiktoken') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Usage" in done.stdout and done.stdout.strip().endswith("[]")
