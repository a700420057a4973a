"""The README's and the docs' Python code blocks run as written (offline) and print what their
"Output (real ...)" blocks show; the README's two commands are the real ones; the configuration
table is the real Settings; the REST examples run against a real server."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = {p.name: p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md"))}
#: Every page a reader sees, README first.
PAGES = {"README.md": README, **{f"docs/{name}": text for name, text in DOCS.items()}}
#: Scores may move this much between CPUs (ONNX kernels differ in the last digits).
SCORE_TOLERANCE = 0.01
_NUMBER = re.compile(r"-?\d+\.\d+")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_OUTPUT = re.compile(r"```python\n(.*?)```\s*\nOutput \(real[^\n]*\n+```text\n(.*?)```", flags=re.S)


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def _printed_blocks(text: str) -> list[tuple[str, str]]:
    """(python block, the "Output (real ...)" text block right after it)."""
    return _OUTPUT.findall(text)


def _differences(expected: str, actual: str) -> list[str]:
    """Lines that differ beyond dates (today's) and decimals (within SCORE_TOLERANCE)."""
    want, got = expected.strip().splitlines(), actual.strip().splitlines()
    if len(want) != len(got):
        return [f"{len(got)} lines printed, the page shows {len(want)}:\n{actual}"]
    out = []
    for w, g in zip(want, got):
        w_shape, g_shape = (_NUMBER.sub("#", _DATE.sub("DATE", x)) for x in (w, g))
        w_nums = [float(n) for n in _NUMBER.findall(_DATE.sub("DATE", w))]
        g_nums = [float(n) for n in _NUMBER.findall(_DATE.sub("DATE", g))]
        if w_shape != g_shape or any(abs(a - b) > SCORE_TOLERANCE for a, b in zip(w_nums, g_nums)):
            out.append(f"shown: {w}\nprinted: {g}")
    return out


def _run(block: str, filename: str) -> str:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block, filename, "exec"), {"__name__": "__docs__"})  # noqa: S102
    return printed.getvalue()


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HYBRIDMEM_DATA_DIR", str(tmp_path / "hm-data"))
    return tmp_path


def _check_page(name: str) -> None:
    """Run every python block of one page, in order, in one directory; compare shown outputs."""
    text = PAGES[name]
    shown = dict(_printed_blocks(text))
    assert text.count("\nOutput (real") == len(_printed_blocks(text)), (
        f"{name}: an 'Output (real ...)' line is not right after a python block and before a "
        "text block, so nothing would check it")
    for block in _blocks(text, "python"):
        printed = _run(block, name)
        if block in shown:
            diffs = _differences(shown[block], printed)
            assert diffs == [], f"{name} shows another output than its block prints:\n" + \
                "\n".join(diffs)


def test_readme_python_blocks_run_and_print_the_shown_output(in_tmp: Path) -> None:
    assert _blocks(README, "python"), "README has no python blocks"
    assert _printed_blocks(README), "README shows no 'Output (real)' block after a python block"
    _check_page("README.md")


@pytest.mark.parametrize("name", [n for n in PAGES if n != "README.md" and "```python" in PAGES[n]])
def test_docs_python_blocks_run_and_print_the_shown_output(name: str, in_tmp: Path) -> None:
    _check_page(name)


def test_the_docs_have_executed_examples() -> None:
    pages = [n for n in PAGES if _printed_blocks(PAGES[n])]
    for page in ("docs/quickstart.md", "docs/search.md", "docs/lifecycle.md",
                 "docs/operations.md", "docs/langgraph.md"):
        assert page in pages, f"{page} shows no checked output"


def test_the_output_comparison_can_fail() -> None:
    text = "1.5678  A\n        cosine 0.52  bm25 0.42\n138 tokens\n- [2026-11-30] A"
    assert _differences(text, text.replace("2026-11-30", "2031-01-02")) == []
    assert _differences(text, text.replace("1.5678", "1.5701")) == []
    assert _differences(text, text.replace("1.5678", "1.6678"))  # a score moved
    assert _differences(text, text.replace("cosine", "bm25"))  # a label changed
    assert _differences(text, text.replace("138", "139"))  # the budget used changed
    assert _differences(text, text + "\nextra")
    unchecked = "```python\nprint(1)\n```\n\nOutput (real):\n\n```\n1\n```\n"
    assert unchecked.count("\nOutput (real") != len(_printed_blocks(unchecked))


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [line.strip() for line in _blocks(README, "bash")[0].splitlines() if line.strip()]
    test_command = next(c for c in commands if "pytest" in c)
    assert test_command in ci
    assert ci.startswith("#!") and os.access(ROOT / ".ci" / "run", os.X_OK), (
        ".ci/run must be an executable script (chmod +x .ci/run)")


def _table(text: str) -> dict[str, list[str]]:
    """The configuration table of a page: field -> its cells (env var, field, default, meaning)."""
    body = text.split("| env var | field | default | meaning |")[1].split("\n\n")[0]
    rows = [[c.strip() for c in row.strip().strip("|").split(" | ")]
            for row in body.strip().splitlines()[1:]]
    return {cells[1].strip("`"): cells for cells in rows}


def _shown_default(cell: str, default: Any, fields: frozenset[str] = frozenset()) -> bool:
    """Whether a table's default cell says what Settings uses: a literal in backticks first (a
    number, a boolean or a string); for None, ``unset`` or another field's name (``base_url``)."""
    literal = re.match(r"`([^`]*)`", cell)
    if default is None:
        return cell.startswith("unset") or (literal is not None and literal.group(1) in fields)
    if literal is None or not isinstance(default, (bool, int, float, str)):
        return True  # prose ("a short instruction") or a path: nothing exact to compare
    value = literal.group(1)
    if isinstance(default, bool):
        return value == str(default).lower()
    if isinstance(default, (int, float)):
        return float(value) == float(default)
    return value == default


def test_configuration_table_lists_every_setting() -> None:
    from hybridmem import Settings

    table = _table(DOCS["configuration.md"])
    assert set(table) == set(Settings.model_fields)
    for field, (env, _, default, _) in table.items():
        assert env.strip("`") == (
            "OPENAI_API_KEY" if field == "openai_api_key" else f"HYBRIDMEM_{field.upper()}")
        assert _shown_default(default, Settings.model_fields[field].default,
                              frozenset(Settings.model_fields)), (field, default)
    assert table["graph_weight"][2] == "`1.0`"  # what the code uses (ranking's measurement)


def test_readme_configuration_rows_agree_with_the_full_table() -> None:
    full, short = _table(DOCS["configuration.md"]), _table(README)
    assert {"data_dir", "base_url", "api_key", "openai_api_key", "chat_model", "embedder",
            "chroma_url"} <= set(short)
    for field, cells in short.items():
        assert cells[:3] == full[field][:3], field  # env var, field and default agree


#: For each README row: a value its env var can take, and the field that value gives.
_README_ENV = {
    "data_dir": ("/srv/hm-data", Path("/srv/hm-data")),
    "chroma_url": ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
    "base_url": ("http://127.0.0.1:11434/v1", "http://127.0.0.1:11434/v1"),
    "api_key": ("sk-local", "sk-local"),
    "openai_api_key": ("sk-openai", "sk-openai"),
    "chat_model": ("llama3.1", "llama3.1"),
    "embedder": ("hash", "hash"),
    "extractor": ("rules", "rules"),
    "dedup": ("false", False),
    "graph_weight": ("0.5", 0.5),
    "fusion": ("rrf", "rrf"),
    "min_score": ("0.2", 0.2),
    "context_max_tokens": ("600", 600),
    "max_open_users": ("16", 16),
    "server_api_key": ("k1-0123456789, k2-0123456789", "k1-0123456789, k2-0123456789"),
}


def _plain(value: Any) -> Any:
    return value.get_secret_value() if hasattr(value, "get_secret_value") else value


def test_every_readme_default_and_env_var_is_what_settings_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each README row, read literally: ``Settings()`` in a clean environment has the default
    the row shows (``unset`` is None, ``~`` is the home directory), and its env var sets it."""
    from hybridmem import Settings

    table = _table(README)
    assert set(table) == set(_README_ENV)
    defaults = Settings()
    for field, (env, _, cell, _) in table.items():
        got = getattr(defaults, field)
        literal = re.match(r"`([^`]*)`", cell)
        if cell.startswith("unset"):
            assert got is None, field
        elif field == "data_dir":
            assert literal is not None and got == Path(literal.group(1)).expanduser(), cell
        else:
            assert literal is not None, (field, cell)
            shown = literal.group(1)
            if isinstance(got, bool):
                assert shown == str(got).lower(), field
            elif isinstance(got, (int, float)):
                assert float(shown) == got, field
            else:
                assert shown == got, field
        raw, expected = _README_ENV[field]
        monkeypatch.setenv(env.strip("`"), raw)
        assert _plain(getattr(Settings(), field)) == expected, field
        monkeypatch.delenv(env.strip("`"))


def test_defaults_named_in_prose_are_the_code_s() -> None:
    """A setting named in running text with its default ("`dedup_cosine` (0.68)", "(`w` 0.4")
    shows the code's default, on every page and in the ranking module's docstring."""
    from hybridmem import Settings
    from hybridmem.read import ranking

    fields = Settings.model_fields
    texts = {**PAGES, "hybridmem/read/ranking.py": ranking.__doc__ or ""}
    found = 0
    for page, text in texts.items():
        for m in re.finditer(r"`+(\w+)`+\s*\((-?\d+(?:\.\d+)?)|\(`+(\w+)`+\s+(-?\d+(?:\.\d+)?)",
                             text):
            name, value = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
            if name in fields and isinstance(fields[name].default, (int, float)):
                found += 1
                assert float(value) == float(fields[name].default), (page, m.group(0))
    assert found >= 8  # the pattern still finds what the pages say


def test_the_default_comparison_can_fail() -> None:
    assert _shown_default("`0.68`", 0.68) and not _shown_default("`0.92`", 0.68)
    assert _shown_default("`true`", True) and not _shown_default("`false`", True)
    assert _shown_default("unset (embedded)", None) and not _shown_default("`5`", 4)
    assert _shown_default("`base_url`", None, frozenset({"base_url"}))
    assert not _shown_default("`0` (off)", None, frozenset({"base_url"}))


def test_local_servers_have_their_own_ports() -> None:
    for port, server in (("8080", "llama.cpp"), ("8000", "vLLM"), ("11434", "Ollama")):
        lines = [line for text in PAGES.values() for line in text.splitlines()
                 if f"HYBRIDMEM_BASE_URL=http://127.0.0.1:{port}/v1" in line]
        assert lines, f"no page shows the {server} endpoint"
        assert all(server in line for line in lines), lines


def test_rest_examples_run_against_a_real_server(
    tmp_path: Path, embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which("curl") is None:
        pytest.fail("curl is required to run the REST examples: install it "
                    "(Debian/Ubuntu: apt-get install curl) — CI must not skip this test")
    import uvicorn

    from hybridmem import Memory, Settings
    from hybridmem.server import create_app

    block = next(b for b in _blocks(DOCS["rest.md"], "bash") if "# the REST examples" in b)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with Memory(Settings(data_dir=tmp_path / "hm", extractor="rules"), embedder=embedder) as mem:
        server = uvicorn.Server(uvicorn.Config(create_app(mem, api_keys=[]), log_level="warning",
                                               lifespan="off"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        try:
            while not server.started:
                assert thread.is_alive()
                time.sleep(0.01)
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", block.replace("http://127.0.0.1:8080", url)],
                capture_output=True, text=True, timeout=300, cwd=tmp_path,
            )
        finally:
            server.should_exit = True
            thread.join(timeout=10)
            sock.close()
        assert done.returncode == 0, done.stderr
        assert "-complements->" in done.stdout and '"memories":5' in done.stdout.replace(" ", "")
        assert mem.count("client_1") == 5 and mem.count("client_1_copy") == 0
        assert [f.key for f in mem.facts("client_1")] == ["city"]
        exported = json.loads((tmp_path / "client_1.json").read_text(encoding="utf-8"))
        assert len(exported["memories"]) == 5
        graph = nx.read_graphml(tmp_path / "client_1.graphml")
        assert set(graph.nodes) == set(mem.graph("client_1").nodes) and graph.number_of_nodes()


def test_readme_is_a_short_read_and_its_links_resolve() -> None:
    assert len(README.splitlines()) <= 250, "README.md: at most 250 lines; move detail to docs/"
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert any(link.startswith("docs/") for link in local)
    missing = [link for link in local if not (ROOT / link).exists()]
    assert missing == [], f"README.md links to missing files: {missing}"
