"""The min_score and backup benchmark scripts run end to end on tiny inputs (real stores, no
timing asserts), so they cannot rot unnoticed. LoCoMo input is the tiny conversation written in
tests/test_bench.py, never the licensed data."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from test_bench import TINY_LOCOMO

REPO = Path(__file__).resolve().parent.parent


def _run(*args: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=900,
                          cwd=cwd, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO),
                                        "HOME": str(cwd)})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_min_score_script_reports_each_threshold(tmp_path: Path) -> None:
    data = tmp_path / "tiny.json"
    data.write_text(json.dumps(TINY_LOCOMO), encoding="utf-8")
    out = tmp_path / "min_score.json"
    printed = _run(str(REPO / "bench" / "min_score.py"), "--data", str(data), "--out", str(out),
                   cwd=tmp_path)
    assert "threshold on the fused score" in printed and "raw floor" in printed
    result = json.loads(out.read_text())
    for name in ("demo", "locomo"):
        rows = result["datasets"][name]["fused"]
        assert rows[0]["threshold"] == 0 and rows[0]["evidence_kept"] == 1.0
        kept = [r["evidence_kept"] for r in rows]
        assert kept == sorted(kept, reverse=True)  # a higher threshold never keeps more


def test_backup_script_measures_both_datasets(tmp_path: Path) -> None:
    out = tmp_path / "backup.json"
    printed = _run(str(REPO / "bench" / "backup.py"), "--memories", "60", "--embedder", "hash",
                   "--repeats", "1", "--out", str(out), cwd=tmp_path)
    assert "| demo |" in printed and "| user-60 | 60 |" in printed
    result = json.loads(out.read_text())
    assert [r["dataset"] for r in result["results"]] == ["demo", "user-60"]
    assert all(r["snapshot_bytes"] > 0 for r in result["results"])
