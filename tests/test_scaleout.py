"""Scale-out under load, with real processes: two ``hybridmem serve`` workers against one real
``chroma run``, ten users, mixed add/context/forget traffic from concurrent clients, one worker
SIGKILLed and restarted midway (bench/scaleout.py runs the same harness at 4 workers and 200
users). Nothing acknowledged is lost, no user sees another's memory, and after the documented
refresh interval every worker gives the same answers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import scaleout_harness as harness

ROOT = Path(__file__).resolve().parents[1]
#: Settings.lease_ttl of the workers: a worker killed mid-write stalls its user this long.
LEASE_TTL = "3"
#: The documented refresh interval (docs/server-mode.md#consistency), plus a request's time.
REFRESH = 1.0 + 0.5


@pytest.fixture()
def cluster(chroma_server: str, tmp_path: Path) -> Iterator[list[harness.Worker]]:
    found = harness.workers(2, tmp_path, chroma_server, pythonpath=str(ROOT))
    for w in found:
        w.env["HYBRIDMEM_LEASE_TTL"] = LEASE_TTL
        w.start()
    yield found
    for w in found:
        w.stop()


def test_workers_lose_nothing_leak_nothing_and_agree_after_a_kill(
    cluster: list[harness.Worker], unique_user: str
) -> None:
    load = harness.Load(cluster, users=10, clients=4, prefix=unique_user)
    report = load.run(12.0, kill=0, kill_at=0.4, down_for=0.5, at_least=15)
    summary = report.summary()
    assert report.requests >= 60 and summary["ms"]["add"]["n"] > 10, summary
    assert report.restart_seconds is not None  # the killed worker came back and served again
    assert report.leaks == [], report.leaks
    assert report.failed == 0, report.errors  # every request was answered by some worker
    assert sum(len(t.live) for t in load.truth.values()) > 10
    time.sleep(REFRESH)  # listings, like searches, show other workers' last writes by then
    assert {url: bad for url, bad in load.lost().items() if bad} == {}
    assert load.disagreements() == []
