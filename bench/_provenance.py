"""What a benchmark figure was measured on: the code (git commit + a hash of the package's
sources, since the tree may be dirty) and the machine (cores, Python, load, package versions)."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def git_info() -> dict[str, Any]:
    """The commit, whether the tree is dirty, and a sha256 of every ``hybridmem/**/*.py``."""

    def run(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=20, check=True
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = run("rev-parse", "HEAD")
    digest = hashlib.sha256()
    for path in sorted((REPO / "hybridmem").rglob("*.py")):
        digest.update(path.relative_to(REPO).as_posix().encode() + b"\0" + path.read_bytes())
    return {
        "commit": commit or None,
        "dirty": bool(run("status", "--porcelain")) if commit else None,
        "hybridmem_sources_sha256": digest.hexdigest(),
    }


def machine_info(packages: Sequence[str]) -> dict[str, Any]:
    """Cores, Python, platform, load average now, and the versions of ``packages``."""
    versions: dict[str, str | None] = {}
    for name in packages:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    return {
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "packages": versions,
    }
