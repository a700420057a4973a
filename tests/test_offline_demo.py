"""The demo runs offline from any directory: no socket is opened, nothing is downloaded, no
telemetry is attempted — even with an endpoint and keys in the environment, which it never reads."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Runs the CLI demo in a fresh interpreter where any socket connect or DNS lookup raises.
GUARD = r"""
import sys
def guard(event, args):
    if event in ("socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "urllib.Request"):
        raise RuntimeError(f"network attempted: {event} {args!r}")
sys.addaudithook(guard)
from hybridmem.cli import main
sys.argv = ["hybridmem", "demo", "--json", "--data-dir", sys.argv[1]]
main()
"""


def _env(tmp_path: Path) -> dict[str, str]:
    """A bare environment with this checkout first on the path, and an endpoint with keys that
    the demo must ignore (the port is closed: a connection attempt would fail loudly)."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(ROOT),
            "OPENAI_API_KEY": "sk-never-sent", "HYBRIDMEM_BASE_URL": "http://127.0.0.1:9/v1",
            "HYBRIDMEM_API_KEY": "never-sent", "HYBRIDMEM_EMBEDDER": "openai"}


def test_demo_opens_no_socket_from_any_directory(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", GUARD, str(tmp_path / "store")],
        capture_output=True, text=True, timeout=300, cwd="/", env=_env(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "network attempted" not in proc.stderr
    results = json.loads(proc.stdout)
    assert len(results) >= 10 and all(r["hits"] for r in results)


# The demo, then a wait: onnxruntime's native telemetry fires ~10 s after import, so a short run
# could miss it.
LINGER = r"""
import sys, time
from hybridmem.cli import app
app(["demo", "--json", "--data-dir", sys.argv[1]], standalone_mode=False)
time.sleep(15)
"""


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace not installed")
def test_demo_attempts_no_connection_at_syscall_level(tmp_path: Path) -> None:
    """Native code (onnxruntime, Chroma's Rust core) is invisible to audit hooks: check syscalls."""
    log = tmp_path / "strace.log"
    proc = subprocess.run(
        ["strace", "-f", "-e", "trace=connect", "-o", str(log), sys.executable, "-c", LINGER,
         str(tmp_path / "store")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=_env(tmp_path),
    )
    if proc.returncode != 0 and "PTRACE" in proc.stderr.upper():
        pytest.skip("ptrace not permitted here")
    assert proc.returncode == 0, proc.stderr[-2000:]
    connects = [line for line in log.read_text().splitlines() if "connect(" in line]
    assert connects or log.stat().st_size > 0
    # AF_UNIX connects to a local nscd/syslog are not network; anything AF_INET* is.
    assert not [c for c in connects if "AF_INET" in c], connects
