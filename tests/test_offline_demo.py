"""The demo runs offline from any directory: no socket is opened, nothing is downloaded, no
telemetry is attempted — even with an endpoint and keys in the environment, which it never
reads — and it finds what each sample query expects."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
QUERIES = json.loads((ROOT / "hybridmem" / "demo_data" / "demo_queries.json").read_text(encoding="utf-8"))
#: Sample queries whose ``expect`` phrase is not in the demo's top 3 today (measured with the local
#: MiniLM embedder and the rule extractor). Pinned both ways: a new miss fails, and so does a fix
#: that is not recorded here — remove the query from this set when retrieval finds it.
KNOWN_MISSES = {
    "what happened with my late headphones delivery?",
    "what did we do about the headset that would not turn on?",
    "what did support say about my keyboard typing double letters?",
    "has the computer I connect to my CalDigit TS4 given me any trouble?",
}

# Runs the CLI demo in a fresh interpreter whose audit hook *records* every network event (a
# raising hook could be silenced by a library that swallows the exception); the record is written
# to a file whatever happens, and the test asserts on it.
GUARD = r"""
import json, sys
attempts = []
NETWORK = ("socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr",
           "socket.sendto", "socket.sendmsg", "urllib.Request", "http.client.connect")
def guard(event, args):
    if event in NETWORK:
        attempts.append(f"{event} {args!r}"[:300])
sys.addaudithook(guard)
record, store = sys.argv[1:3]
try:
    from hybridmem.cli import main
    sys.argv = ["hybridmem", "demo", "--json", "--data-dir", store]  # the packaged data
    main()
finally:
    with open(record, "w", encoding="utf-8") as handle:
        json.dump(attempts, handle)
"""


def _env(home: Path) -> dict[str, str]:
    """A bare environment with this checkout first on the path, and an endpoint with keys that
    the demo must ignore (the port is closed: a connection attempt would fail loudly)."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), "PYTHONPATH": str(ROOT),
            "OPENAI_API_KEY": "sk-never-sent", "HYBRIDMEM_BASE_URL": "http://127.0.0.1:9/v1",
            "HYBRIDMEM_API_KEY": "never-sent", "HYBRIDMEM_EMBEDDER": "openai"}


def _run_guarded(code: str, record: Path, *args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, str(record), *args],
        capture_output=True, text=True, timeout=300, cwd="/", env=_env(home),
    )


def test_demo_opens_no_socket_and_finds_each_expected_memory(tmp_path: Path) -> None:
    record = tmp_path / "attempts.json"
    proc = _run_guarded(GUARD, record, str(tmp_path / "store"), home=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(record.read_text()) == []
    results = json.loads(proc.stdout)
    assert [(r["user_id"], r["query"]) for r in results] == [
        (q["user_id"], q["query"]) for q in QUERIES]
    missed = {q["query"]: (q["expect"], [h["item"]["text"] for h in r["hits"]])
              for q, r in zip(QUERIES, results)
              if not any(q["expect"] in h["item"]["text"] for h in r["hits"])}
    assert set(missed) == KNOWN_MISSES, missed


def test_the_guard_records_a_connect_that_a_library_swallows(tmp_path: Path) -> None:
    """The recording hook is not silenced by ``except Exception: pass`` around a connect."""
    code = GUARD.replace(
        "from hybridmem.cli import main",
        "import socket\n    try:\n        socket.create_connection(('127.0.0.1', 9), timeout=1)\n"
        "    except Exception:\n        pass\n    from hybridmem.cli import main")
    record = tmp_path / "attempts.json"
    proc = _run_guarded(code, record, str(tmp_path / "store"), home=tmp_path)
    attempts = json.loads(record.read_text())
    assert any(a.startswith("socket.connect ") for a in attempts), (attempts, proc.stderr[-500:])


# The demo, then a wait: onnxruntime's native telemetry fires ~10 s after import, so a short run
# could miss it.
LINGER = r"""
import sys, time
from hybridmem.cli import app
app(["demo", "--json", "--data-dir", sys.argv[1]], standalone_mode=False)
time.sleep(15)
"""
# A positive control: strace with this filter must see an AF_INET connect when there is one.
CONNECTS = r"""
import socket
try:
    socket.create_connection(("127.0.0.1", 9), timeout=1)
except OSError:
    pass
"""


def _strace_connects(tmp_path: Path, *argv: str) -> list[str]:
    strace = shutil.which("strace")
    if strace is None:
        pytest.fail("strace is required for the syscall-level offline check: install it "
                    "(Debian/Ubuntu: apt-get install strace) — CI must not skip this test")
    log = tmp_path / "strace.log"
    proc = subprocess.run(
        [strace, "-f", "-e", "trace=connect", "-o", str(log), sys.executable, *argv],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=_env(tmp_path),
    )
    assert proc.returncode == 0, ("strace or the traced program failed (is ptrace permitted? "
                                  "docker needs --cap-add=SYS_PTRACE)", proc.stderr[-2000:])
    lines = log.read_text().splitlines()
    assert any("+++ exited with 0 +++" in line for line in lines), "strace traced nothing"
    return [line for line in lines if "connect(" in line]


def test_strace_sees_a_connect_when_there_is_one(tmp_path: Path) -> None:
    assert [c for c in _strace_connects(tmp_path, "-c", CONNECTS) if "AF_INET" in c]


@pytest.mark.slow
def test_demo_attempts_no_connection_at_syscall_level(tmp_path: Path) -> None:
    """Native code (onnxruntime, Chroma's Rust core) is invisible to audit hooks: check syscalls."""
    connects = _strace_connects(tmp_path, "-c", LINGER, str(tmp_path / "store"))
    # AF_UNIX connects to a local nscd/syslog are not network; anything AF_INET* is.
    assert not [c for c in connects if "AF_INET" in c], connects
