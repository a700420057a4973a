"""The README's Python code blocks run as written (offline), and its two commands are the real ones."""

from __future__ import annotations

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


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_readme_python_blocks_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HYBRIDMEM_DATA_DIR", str(tmp_path / "hm-data"))
    blocks = _blocks("python")
    assert blocks, "README has no python blocks"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {"__name__": "__readme__"})  # noqa: S102


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [line.strip() for line in _blocks("bash")[0].splitlines() if line.strip()]
    test_command = next(c for c in commands if "pytest" in c)
    assert test_command in ci
    assert os.access(ROOT / ".ci" / "run", os.X_OK) or ci.startswith("#!")


def test_configuration_table_lists_every_setting() -> None:
    from hybridmem import Settings

    table = README.split("| env var | field | default | meaning |")[1].split("\n\n")[0]
    fields = {row.split("|")[2].strip().strip("`") for row in table.strip().splitlines()[1:]}
    assert fields == set(Settings.model_fields)
    for row in table.strip().splitlines()[1:]:
        env, field = (cell.strip().strip("`") for cell in row.split("|")[1:3])
        assert env == ("OPENAI_API_KEY" if field == "openai_api_key" else f"HYBRIDMEM_{field.upper()}")
    assert "| `graph_weight` | `0.1` |" in README  # what the code uses (ranking's measurement)


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
