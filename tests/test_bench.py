"""The benchmark scripts run end to end on tiny inputs, so they cannot rot unnoticed.

Real runs, real stores, no timing asserts: the LoCoMo script on a six-turn conversation written here
(never the licensed data), the latency and proxy scripts on a 50-memory user.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
METRICS = ("R@5", "R@10", "R@20", "R@1000tok", "R@2000tok", "MRR")
#: The BM25 baselines need bm25s (a benchmark-only dependency); the script skips them without it.
BM25 = ("bm25", "rrf(bm25,dense)") if importlib.util.find_spec("bm25s") else ()

TINY_LOCOMO: list[dict[str, Any]] = [
    {
        "sample_id": "tiny-1",
        "conversation": {
            "speaker_a": "Zephyrine",
            "speaker_b": "Bartholomew",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Zephyrine", "dia_id": "D1:1", "text": "Hi Bart, how was your week?"},
                {"speaker": "Bartholomew", "dia_id": "D1:2",
                 "text": "Great! I adopted a greyhound called Pickles from the Lisbon shelter."},
                {"speaker": "Zephyrine", "dia_id": "D1:3",
                 "text": "Lovely. My kayak is bright orange, I painted it myself.",
                 "img_url": ["https://example.invalid/kayak.jpg"],
                 "blip_caption": "a photo of an orange kayak on a lake"},
            ],
            "session_2_date_time": "7:10 pm on 20 June, 2023",
            "session_2": [
                {"speaker": "Bartholomew", "dia_id": "D2:1",
                 "text": "Pickles won a ribbon at the dog show in Porto yesterday."},
                {"speaker": "Zephyrine", "dia_id": "D2:2", "text": "Congratulations to him!"},
                {"speaker": "Bartholomew", "dia_id": "D2:3", "text": "Thanks, see you soon."},
            ],
        },
        "qa": [
            {"question": "What colour is Zephyrine's kayak?", "answer": "bright orange",
             "evidence": ["D1:3"], "category": 4},
            {"question": "Where did the dog that Bartholomew adopted win a ribbon?",
             "answer": "Porto", "evidence": ["D1:2; D2:1", "D7:7"], "category": 1},
            {"question": "What colour is Bartholomew's kayak?",
             "adversarial_answer": "bright orange", "evidence": ["D1:3"], "category": 5},
        ],
        "observation": {}, "session_summary": {}, "event_summary": {},
    }
]


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *args, "-q"],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _in_unit(value: float) -> bool:
    return 0.0 <= value <= 1.0


def test_locomo_runs_on_a_tiny_conversation(tmp_path: Path) -> None:
    data = tmp_path / "tiny_locomo.json"
    data.write_text(json.dumps(TINY_LOCOMO), encoding="utf-8")
    out = tmp_path / "locomo.json"
    proc = _run("locomo.py", "--data", str(data), "--out", str(out))
    result = json.loads(out.read_text(encoding="utf-8"))

    assert {"git", "timestamp", "machine", "data", "configs", "ingest_seconds"} <= result.keys()
    assert result["machine"]["cpu_count"] >= 1 and result["machine"]["python"]
    assert result["data"]["sessions"] == 2 and result["data"]["turns"] == 6
    assert result["data"]["turns_with_caption"] == 1
    assert result["data"]["evidence_ids_dropped"] == 1  # "D7:7" names no turn
    assert result["data"]["qa_by_category"] == {"1": 1, "4": 1, "5": 1}
    assert result["data"]["memories"] == 6 and result["data"]["superseded_memories"] >= 0

    names = [c["name"] for c in result["configs"]]
    for expected in ("hybridmem", "vector-only", "lexical-only", "no-graph", "decay",
                     "decay-shifted", "dense", "recent", *BM25):
        assert expected in names
    # The fusion the defaults do not use is measured beside them.
    (other,) = [n for n in names if n.endswith("-fusion")]
    fusions = {c["name"]: c["fusion"] for c in result["configs"]}
    assert fusions[other] in {"rrf", "weighted"} and fusions[other] != fusions["hybridmem"]
    for config in result["configs"]:
        assert config["latency_ms"]["n"] == 3
        assert set(config["metrics"]) == {"overall", "cat1", "cat2", "cat3", "cat4", "cat5"}
        for group in config["metrics"].values():
            assert all(_in_unit(group[m]) for m in METRICS), (config["name"], group)
        if config["kind"] == "hybridmem":
            assert config["settings"]["vector_weight"] >= 0
    by_name = {c["name"]: c for c in result["configs"]}
    # The obvious question (category 4: the kayak's colour) is answered by the first hit.
    for name in ("hybridmem", "no-graph", "lexical-only", "dense", *BM25):
        assert by_name[name]["metrics"]["cat4"]["MRR"] == 1.0, name
        assert by_name[name]["metrics"]["cat4"]["R@5"] == 1.0, name
    # Six short turns fit any token budget: everything retrieved is inside 1,000 tokens.
    assert by_name["hybridmem"]["metrics"]["overall"]["R@1000tok"] == pytest.approx(
        by_name["hybridmem"]["metrics"]["overall"]["R@20"]
    )
    assert "| hybridmem |" in proc.stdout and "R@2000tok" in proc.stdout


@pytest.mark.slow
def test_latency_runs_on_a_small_user(tmp_path: Path) -> None:
    out = tmp_path / "latency.json"
    proc = _run("latency.py", "--sizes", "50", "--queries", "5", "--single", "5", "--out", str(out),
                "--cold-runs", "1", "--rest-seconds", "2")
    result = json.loads(out.read_text(encoding="utf-8"))

    assert {"git", "timestamp", "machine", "settings", "sizes"} <= result.keys()
    (row,) = result["sizes"]
    assert row["size"] == 50
    assert row["add"]["stored"] >= 45  # generated sentences are (nearly) all distinct
    assert row["add"]["stored_after_single"] >= row["add"]["stored"]
    for key in ("batched_per_s", "embed_only_batched_per_s", "single_per_s"):
        assert row["add"][key] > 0
    for key in ("search_ms", "context_ms", "floor_ms", "floor_embed_ms", "floor_chroma_ms"):
        assert row["search"][key]["n"] == 5 and row["search"][key]["p50"] > 0
    assert row["search"]["context_tokens_mean"] <= row["search"]["context_max_tokens"]
    assert {"activation_ms", "load_ms"} <= row["graph"].keys()
    assert row["graph"]["activation_ms"]["n"] == 5  # the real graph step, once per timed query
    assert row["disk"]["total"] > 0 and row["disk"]["bytes_per_memory"] > 0
    assert row["memory"]["peak_rss_mb"] > 0
    cold = row["cold"]  # subprocesses: Memory(), the CLI, a bare process, a real uvicorn
    assert cold["memory_init_s"] > 0 and cold["cli_search_s"] > 0 and cold["bare_process_s"] > 0
    assert cold["rest"]["clients"] == 8 and cold["rest"]["errors"] == 0
    assert cold["rest"]["requests"] > 0 and cold["rest"]["distinct_questions"] > 100
    assert cold["rest"]["health_floor"]["requests"] > 0  # the server's own floor beside it
    assert "| 50 |" in proc.stdout and "requests/s" in proc.stdout


def test_storage_runs_on_tiny_sizes(tmp_path: Path) -> None:
    out = tmp_path / "storage.json"
    done = subprocess.run(
        [sys.executable, str(BENCH / "storage.py"), "--sizes", "20,40", "--singles", "3",
         "--users", "5,10", "--trials", "1", "--out", str(out), "-q"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text(encoding="utf-8"))
    assert [row["memories"] for row in result["add"]["single"]] == [23, 43]
    # below Chroma's 1,000-record persist every record written is still in its log
    assert all(row["chroma_log_pending"] >= row["memories"] - 3
               and row["raw_log_pending"] >= row["memories"] - 3 for row in result["add"]["single"])
    many = result["add"]["add_many"]
    assert many["floor_per_s"] > 0 and many["bound"] > 0
    assert all(many["per_batch_ms"][k] > 0
               for k in ("ours", "embed", "add", "add_records", "dedup_query"))
    assert "no store keeping those can pass" in done.stdout
    assert [row["users"] for row in result["users"]] == [5, 10]
    assert all(0 < row["rss_mb"] <= row["max_rss_mb"] + 1 for row in result["users"])
    crash = result["crash"]
    assert (crash["trials"], crash["lost_acknowledged"], crash["store_disagreements"]) == (1, 0, 0)
    assert crash["acknowledged"] >= 0  # how many writes the killed writer had confirmed
    assert "| memories | single add median ms" in done.stdout


def test_storage_raw_records_have_the_stores_keys(tmp_path: Path) -> None:
    """The raw add that prices our metadata sends the keys and value kinds our records have,
    built from public fields only (bench/ uses the public API)."""
    from hybridmem import Memory, Settings
    from hybridmem.chroma.layout import stored, to_record

    spec = importlib.util.spec_from_file_location("bench_storage", BENCH / "storage.py")
    assert spec is not None and spec.loader is not None
    storage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(storage)
    with Memory(Settings(data_dir=tmp_path, embedder="hash", extractor="rules")) as mem:
        (item,) = mem.add_many("u", ["Customer note 1: bought a dock for the desk, order 17"])
    ours, raw = stored(to_record(item)), storage.record_of(item)
    assert raw.keys() == ours.keys() and len(raw) == 16
    assert {k: type(v) for k, v in raw.items()} == {k: type(v) for k, v in ours.items()}


@pytest.mark.slow
def test_latency_ingest_only_then_reuse(tmp_path: Path) -> None:
    """--ingest-only builds a size's stores and times nothing; --reuse then times the read path on
    them without ingesting again (how the 100k row is made: ingest niced, time under the lock)."""
    work, out = tmp_path / "work", tmp_path / "latency.json"
    _run("latency.py", "--sizes", "40", "--single", "3", "--work-dir", str(work), "--ingest-only")
    assert (work / "n40" / "chroma").is_dir() and not out.exists()
    _run("latency.py", "--sizes", "40", "--queries", "5", "--work-dir", str(work), "--reuse",
         "--cold-runs", "0", "--rest-seconds", "0", "--out", str(out))
    (row,) = json.loads(out.read_text(encoding="utf-8"))["sizes"]
    assert row["add"]["reused"] == str(work / "n40") and row["add"]["stored"] >= 40
    assert row["search"]["context_ms"]["n"] == 5


def test_proxy_runs_on_a_small_user(tmp_path: Path) -> None:
    out = tmp_path / "proxy.json"
    proc = _run("proxy.py", "--memories", "50", "--requests", "5", "--batch", "20", "--out",
                str(out))
    result = json.loads(out.read_text(encoding="utf-8"))

    assert {"git", "timestamp", "machine", "settings", "ingest_s", "goal"} <= result.keys()
    assert result["settings"]["stored"] >= 45  # generated sentences are (nearly) all distinct
    for group, key in [("plain", "direct_ms"), ("plain", "service_ms"),
                       ("plain", "no_store_direct_ms"), ("plain", "no_store_service_ms"),
                       ("stream", "ttft_direct_ms"), ("stream", "ttft_service_ms"),
                       ("stream", "tail_service_ms"), ("context_ms", "same_questions"),
                       ("context_ms", "new_questions")]:
        assert result[group][key]["n"] == 5 and result[group][key]["p50"] >= 0, (group, key)
    # every exchange through the service is stored but the store: false ones (5 warm-up ones of
    # each kind, then the timed ones)
    assert result["exchanges"] == {"stored": 2 * 5 + 5 + 5, "store_failures": 0}
    assert isinstance(result["goal"]["met"], bool)
    assert "| completion |" in proc.stdout and "stream: first chunk" in proc.stdout
