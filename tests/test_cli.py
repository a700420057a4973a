"""The ``hybridmem`` command: every command, its ``--json`` output and its exit codes.

Commands run in-process through Typer's runner (each opens a real Memory on a real data dir), and
``--help`` / the console script once as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import networkx as nx
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
    assert (item["text"], item["user_id"]) == (
        "The Dell 4K monitor complements the ROG laptop.", "client_1")
    hits = json.loads(run(cli, "search", "client_1", "which laptop did I buy?", "--json"))
    assert hits[0]["item"]["id"] == memory_id.strip()
    ctx = json.loads(run(cli, "context", "client_1", "laptop", "--max-tokens", "80", "--json"))
    day = item["created_at"][:10]
    assert (ctx["tokens"], ctx["text"]) == (64, (
        "<memory>\nRelations:\n- client_1 -bought-> ROG laptop\n"
        f"Memories (most relevant first):\n- [{day}] I bought the ROG laptop.\n"
        f"- [{day}] The Dell 4K monitor complements the ROG laptop.\n</memory>"))
    stats = json.loads(run(cli, "stats", "client_1", "--json"))
    with Memory(Settings()) as mem:  # the same data dir and embedder, through the library
        entities, relations = mem.entities("client_1"), mem.relations("client_1")
    assert stats == {"user_id": "client_1", "memories": 2, "current": 2,
                     "entities": len(entities), "relations": len(relations),
                     "purge_pending": False}
    assert [e.key for e in entities] == ["client_1", "dell 4k monitor", "rog laptop"]
    assert [str(r) for r in relations] == ["client_1 -bought-> ROG laptop",
                                          "Dell 4K monitor -complements-> ROG laptop"]
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
    assert "removed 1 memory" in run(cli, "forget", "alice", "--yes")  # the one that was left
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


def test_ids_with_a_lone_surrogate_exit_1_as_invalid(cli: CliRunner, tmp_path: Path) -> None:
    """Bytes that are not UTF-8 in argv reach Python as lone surrogates (surrogateescape)."""
    kept = run(cli, "add", "dave", "Dave owns a kayak").strip()
    assert run(cli, "stats", "a\udcff", code=1) == (
        "error: user_id is not valid Unicode (it holds a lone surrogate)\n")
    assert run(cli, "forget", "dave", "ab\udcff", code=1) == (
        "error: memory_id is not valid Unicode (it holds a lone surrogate)\n")
    real = subprocess.run(
        [sys.executable, "-m", "hybridmem.cli", "forget", "dave", b"ab\xff"], check=False,
        capture_output=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert (real.returncode, real.stderr) == (
        1, b"error: memory_id is not valid Unicode (it holds a lone surrogate)\n")
    with Memory(Settings()) as mem:
        assert [i.id for i in mem.list("dave")] == [kept]


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


def test_chat_without_an_endpoint_names_the_setting(cli: CliRunner) -> None:
    output = run(cli, "chat", "erin", "Which monitor?", code=1)
    assert "no chat endpoint is configured: set HYBRIDMEM_BASE_URL" in output


def test_demo_is_offline_whatever_the_environment_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An endpoint, keys, a remote embedder and even a broken value: the demo reads none of them.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-would-be-sent")
    monkeypatch.setenv("HYBRIDMEM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("HYBRIDMEM_EMBEDDER", "openai")
    monkeypatch.setenv("HYBRIDMEM_EXTRACTOR", "llm")
    monkeypatch.setenv("HYBRIDMEM_CANDIDATES", "many")
    monkeypatch.chdir(tmp_path)  # no data/ here: the sample comes from the package
    monkeypatch.setenv("COLUMNS", "400")  # rich wraps at the terminal width
    result = CliRunner().invoke(app, ["demo", "--data-dir", str(tmp_path / "demo")])
    assert result.exit_code == 0, result.output
    # rich may still wrap (a console built earlier in this process keeps its width): compare the
    # words, with every run of whitespace as one space
    output = " ".join(result.output.split())
    assert "(embedder all-MiniLM-L6-v2-int8, extractor rules)" in output
    assert "offline: local embedder, rule extractor, no endpoint" in output
    queries = json.loads((ROOT / "hybridmem" / "demo_data" / "demo_queries.json").read_text(encoding="utf-8"))
    assert all(" ".join(q["query"].split()) in output for q in queries)
    # every demo user's graph is whole in graph.json once the demo closed
    folders = sorted((tmp_path / "demo" / "users").iterdir())
    assert len(folders) == 5
    sizes = []
    for folder in folders:
        data = json.loads((folder / "graph.json").read_text(encoding="utf-8"))
        graph = nx.node_link_graph(data["graph"], edges="edges")
        sizes.append((graph.number_of_nodes(), graph.number_of_edges()))
        log = folder / "graph.log"
        assert not log.exists() or log.stat().st_size == 0
    # (nodes, edges) of each demo user's graph, folders in name order (the rules, the demo data)
    assert sizes == [(55, 20), (43, 14), (40, 8), (41, 19), (37, 15)]


def test_help_is_a_real_process_that_loads_no_model() -> None:
    code = (
        "import sys; from hybridmem.cli import main; sys.argv = ['hybridmem', '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('onnxruntime', 'chromadb', 'tiktoken') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Usage" in done.stdout and done.stdout.strip().endswith("[]")


@pytest.mark.parametrize(("command", "collects"), [("stats", False), ("reextract", True)])
def test_one_shot_commands_run_without_the_garbage_collector(
    tmp_path: Path, command: str, collects: bool
) -> None:
    """A real process through the console entry point: a one-shot command skips the cyclic GC
    (its start builds objects that all live until exit), a command that may stay up keeps it."""
    code = (
        "import atexit, gc, sys; from hybridmem.cli import main\n"
        "atexit.register(lambda: print('gc', gc.isenabled()))\n"
        f"sys.argv = ['hybridmem', {command!r}, 'someone']\n"
        "main()\n"
    )
    env = {**os.environ, "HYBRIDMEM_DATA_DIR": str(tmp_path / "hm"), "HYBRIDMEM_EMBEDDER": "hash"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.stdout.strip().splitlines()[-1] == f"gc {collects}", (done.stdout, done.stderr)


# -- import -----------------------------------------------------------------------------------------
def test_import_files_each_row_under_its_own_user(cli: CliRunner) -> None:
    shipped = ROOT / "hybridmem" / "demo_data" / "memories.jsonl"
    rows = [json.loads(line) for line in shipped.read_text(encoding="utf-8").splitlines() if line]
    output = run(cli, "import", str(shipped))  # no USER: every row names its own
    users = sorted({r["user_id"] for r in rows})
    assert f"into {len(users)} users" in output
    with Memory(Settings()) as mem:
        for user in users:
            stored = {i.text for i in mem.list(user, limit=1000, include_superseded=True)}
            mine = {r["text"] for r in rows if r["user_id"] == user}
            assert stored <= mine and len(stored) >= len(mine) - 3, user  # a few merge as dups
        assert mem.count("nobody") == 0


def test_import_user_is_the_default_for_rows_without_one(cli: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    path.write_text('{"text": "I own a red kayak.", "user_id": "zoe"}\n'
                    '{"text": "I play the marimba."}\n', encoding="utf-8")
    assert "into 2 users (zoe, yann)" in run(cli, "import", "yann", str(path))
    assert json.loads(run(cli, "stats", "zoe", "--json"))["memories"] == 1
    assert json.loads(run(cli, "stats", "yann", "--json"))["memories"] == 1
    output = run(cli, "import", str(path), code=2)  # line 2 names no user and there is no USER
    assert "mixed.jsonl:2: no user_id" in output


def test_import_takes_role_content_transcripts_as_turns(cli: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    path.write_text('{"role": "user", "content": "My printer jams on thick paper."}\n'
                    '{"role": "assistant", "content": "Try the rear manual feed slot."}\n'
                    '{"text": "Owns a Brother laser printer.", "category": "purchase"}\n',
                    encoding="utf-8")
    assert "imported 3 memories into ivy" in run(cli, "import", "ivy", str(path))
    with Memory(Settings()) as mem:
        turns = mem.list("ivy", where={"kind": "turn"})
        facts = mem.list("ivy", where={"kind": "fact"})
    assert [(t.source, t.text) for t in turns] == [
        ("user", "My printer jams on thick paper."),
        ("assistant", "Try the rear manual feed slot."),
    ]
    assert [f.category for f in facts] == ["purchase"]


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("list.jsonl", '{"text": "fine"}\n["not", "an", "object"]\n',
         "list.jsonl:2: expected a JSON object, got list"),
        ("number.jsonl", '{"text": "fine"}\n\n42\n', "number.jsonl:3: expected a JSON object"),
        ("field.jsonl", '{"text": "fine"}\n{"text": "x", "colour": "red"}\n',
         "field.jsonl:2: colour"),
        ("turn.jsonl", '{"role": "robot", "content": "beep"}\n', "turn.jsonl:1: a turn is"),
        ("wide.csv", "text,category\nfine,a\ntoo,many,values\n",
         "wide.csv:3: 1 value(s) beyond the header's 2 columns"),
        ("bad.csv", "text,importance\nfine,0.5\nnot fine,7\n", "bad.csv:3: importance"),
    ],
)
def test_a_bad_row_stops_the_import_with_its_line_and_stores_nothing(
    cli: CliRunner, tmp_path: Path, name: str, content: str, expected: str
) -> None:
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    output = run(cli, "import", "kim", str(path), code=2)
    assert expected in output and "Traceback" not in output
    assert json.loads(run(cli, "stats", "kim", "--json"))["memories"] == 0


def test_extra_csv_columns_are_kept_as_metadata(cli: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "orders.csv"
    path.write_text("user_id,text,category,order_id,channel\n"
                    "lea,Bought a USB-C dock.,purchase,B-1001,web\n"
                    "max,Bought a webcam.,purchase,B-1002,\n", encoding="utf-8")
    assert "into 2 users" in run(cli, "import", str(path))
    with Memory(Settings()) as mem:
        (lea,) = mem.list("lea")
        (max_,) = mem.list("max")
    assert lea.metadata == {"order_id": "B-1001", "channel": "web"}
    assert max_.metadata == {"order_id": "B-1002"}  # an empty cell is no value
    assert lea.category == "purchase"


# -- forget, settings, help, version ----------------------------------------------------------------
def test_forget_a_user_needs_confirmation(cli: CliRunner, tmp_path: Path) -> None:
    run(cli, "add", "nina", "I live in Oslo.")
    output = run(cli, "forget", "nina", code=2)  # the runner's stdin is not a terminal
    assert "refusing to erase all 1 memories of 'nina'" in output and "--yes" in output
    assert json.loads(run(cli, "stats", "nina", "--json"))["memories"] == 1
    # On a terminal the command asks: a real process on a pseudo-terminal, answered "n", then "y".
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for answer, kept in (("n", 1), ("y", 0)):
        assert _on_a_terminal(["forget", "nina"], answer + "\n", env) == kept  # exit 1: not erased
        assert json.loads(run(cli, "stats", "nina", "--json"))["memories"] == kept


def _on_a_terminal(args: list[str], answer: str, env: dict[str, str]) -> int:
    """Run the CLI with a pseudo-terminal as stdin, type ``answer``; return its exit code."""
    import pty

    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "hybridmem.cli", *args], stdin=follower,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        os.write(leader, answer.encode())
        _, stderr = proc.communicate(timeout=60)
    finally:
        os.close(follower)
        os.close(leader)
    assert b"Erase all 1 memories of 'nina'?" in stderr, stderr
    return proc.returncode


def test_a_bad_setting_names_the_variable(cli: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYBRIDMEM_GRAPH_WEIGHT", "-1")
    monkeypatch.setenv("HYBRIDMEM_API_KEY", "sk-secret-value")
    output = run(cli, "stats", "someone", code=2)
    assert "invalid setting HYBRIDMEM_GRAPH_WEIGHT (graph_weight): Input should be greater" in output
    assert "sk-secret-value" not in output and "validation error for" not in output


def test_help_shows_no_markup_and_version_is_the_package_version(cli: CliRunner) -> None:
    from hybridmem import __version__

    assert run(cli, "--version").strip() == f"hybridmem {__version__}"
    commands = ["demo", "add", "import", "search", "context", "chat", "forget", "export",
                "stats", "serve"]
    for args in [["--help"], *([c, "--help"] for c in commands)]:
        text = run(cli, *args)
        for markup in (":class:", ":meth:", ":func:", "``", "~hybridmem"):
            assert markup not in text, (args, markup)
    assert all(c in run(cli, "--help") for c in commands)


def test_serve_without_the_server_extra_names_it(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if it were not installed
    output = run(cli, "serve", code=1)
    assert "pip install 'hybridmem[server]'" in output


def test_reextract_and_import_overwrite(cli: CliRunner, tmp_path: Path) -> None:
    assert "re-extracted 0 memories" in run(cli, "reextract", "frank")
    run(cli, "add", "frank", "I live in Lyon.")
    out = tmp_path / "frank.json"
    run(cli, "export", "frank", "-o", str(out))
    output = run(cli, "import", "frank", str(out), code=1)  # the ids exist already
    assert "overwrite" in " ".join(output.split())
    assert "imported 1 memories into frank" in run(cli, "import", "frank", str(out), "--overwrite")
