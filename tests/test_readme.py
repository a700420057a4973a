"""The README's Python code blocks run as written (offline), and its two commands are the real ones."""

from __future__ import annotations

import os
import re
from pathlib import Path

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
