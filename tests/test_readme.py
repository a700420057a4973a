"""The README's Python code blocks run as written (offline) and print what its "Output (real)" block
shows; its two commands are the real ones."""

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

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
#: Scores may move this much between CPUs (ONNX kernels differ in the last digits).
SCORE_TOLERANCE = 0.01
_NUMBER = re.compile(r"-?\d+\.\d+")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def _printed_blocks() -> list[tuple[str, str]]:
    """(python block, the "Output (real ...)" text block right after it)."""
    return re.findall(r"```python\n(.*?)```\s*\nOutput \(real[^\n]*\n+```text\n(.*?)```",
                      README, flags=re.S)


def _differences(expected: str, actual: str) -> list[str]:
    """Lines that differ beyond dates (today's) and decimals (within SCORE_TOLERANCE)."""
    want, got = expected.strip().splitlines(), actual.strip().splitlines()
    if len(want) != len(got):
        return [f"{len(got)} lines printed, the README shows {len(want)}:\n{actual}"]
    out = []
    for w, g in zip(want, got):
        w_shape, g_shape = (_NUMBER.sub("#", _DATE.sub("DATE", x)) for x in (w, g))
        w_nums = [float(n) for n in _NUMBER.findall(_DATE.sub("DATE", w))]
        g_nums = [float(n) for n in _NUMBER.findall(_DATE.sub("DATE", g))]
        if w_shape != g_shape or any(abs(a - b) > SCORE_TOLERANCE for a, b in zip(w_nums, g_nums)):
            out.append(f"README: {w}\nprinted: {g}")
    return out


def _run(block: str) -> str:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block, "README.md", "exec"), {"__name__": "__readme__"})  # noqa: S102
    return printed.getvalue()


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HYBRIDMEM_DATA_DIR", str(tmp_path / "hm-data"))
    return tmp_path


def test_readme_python_blocks_run_and_print_the_shown_output(in_tmp: Path) -> None:
    blocks = _blocks("python")
    assert blocks, "README has no python blocks"
    shown = dict(_printed_blocks())
    assert shown, "README shows no 'Output (real)' block after a python block"
    for block in blocks:
        printed = _run(block)
        if block in shown:
            assert _differences(shown[block], printed) == []


def test_the_output_comparison_can_fail() -> None:
    text = "1.5678  A\n        why: vector 0.52 #1 · just now\n138 tokens\n- [2026-11-30] A"
    assert _differences(text, text.replace("2026-11-30", "2031-01-02")) == []
    assert _differences(text, text.replace("1.5678", "1.5701")) == []
    assert _differences(text, text.replace("1.5678", "1.6678"))  # a score moved
    assert _differences(text, text.replace("#1", "#2"))  # a rank changed
    assert _differences(text, text.replace("138", "139"))  # the budget used changed
    assert _differences(text, text + "\nextra")


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [line.strip() for line in _blocks("bash")[0].splitlines() if line.strip()]
    test_command = next(c for c in commands if "pytest" in c)
    assert test_command in ci
    assert ci.startswith("#!") and os.access(ROOT / ".ci" / "run", os.X_OK), (
        ".ci/run must be an executable script (chmod +x .ci/run)")


def test_configuration_table_lists_every_setting() -> None:
    from hybridmem import Settings

    table = README.split("| env var | field | default | meaning |")[1].split("\n\n")[0]
    fields = {row.split("|")[2].strip().strip("`") for row in table.strip().splitlines()[1:]}
    assert fields == set(Settings.model_fields)
    for row in table.strip().splitlines()[1:]:
        env, field = (cell.strip().strip("`") for cell in row.split("|")[1:3])
        assert env == ("OPENAI_API_KEY" if field == "openai_api_key" else f"HYBRIDMEM_{field.upper()}")
    assert "| `graph_weight` | `1.0` |" in README  # what the code uses (ranking's measurement)


def test_local_servers_have_their_own_ports() -> None:
    for port, server in (("8080", "llama.cpp"), ("8000", "vLLM"), ("11434", "Ollama")):
        line = next(line for line in README.splitlines() if f"127.0.0.1:{port}/v1" in line)
        assert server in line


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
def test_readme_rest_examples_run_against_a_real_server(
    tmp_path: Path, embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    from hybridmem import Memory, Settings
    from hybridmem.server import create_app

    block = next(b for b in _blocks("bash") if "# the REST examples" in b)
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
