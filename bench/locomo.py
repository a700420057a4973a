#!/usr/bin/env python
"""LoCoMo retrieval benchmark: how often hybridmem's ranking holds the evidence turns of a question.

Every turn of a LoCoMo conversation becomes one memory of a per-conversation user ("Speaker: text",
an image caption appended as " [shares: <caption>]"), stored through the public API
(``Memory.add_many``) with the session's date as ``created_at`` and the turn's ``dia_id`` in
metadata. Then, for every question with evidence, ``Memory.search(user, question, limit=100)`` is
scored with:

- R@k (k = 5, 10, 20): fraction of the evidence dia_ids among the top k;
- R@1000tok, R@2000tok: fraction of the evidence inside the longest prefix of the ranking whose
  memory texts fit in that many tokens (tiktoken cl100k_base, counted offline);
- MRR: 1 / rank of the first evidence id in the top 100 (0 when none is there).

Categories 1-4 are reported together ("overall") and one by one; category 5 (adversarial) apart.
Several hybridmem configurations (ablations, decay, weighted fusion) are read from the *same*
ingested data, beside plain baselines computed here: BM25 (``bm25s``), dense cosine with the same
embedder, their reciprocal-rank fusion (k = 60) and "most recent turns".

Usage::

    python bench/locomo.py [--data PATH] [--out results.json] [--configs NAME ...]
                           [--extra NAME:key=value,...] [--limit-conversations N]

The data (CC BY-NC 4.0) is read from where it lies and never copied; the JSON written holds only
aggregate figures and sample ids.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import json
import logging
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
import _provenance  # noqa: E402  (bench/ is not a package)
from _provenance import git_info  # noqa: E402
DEFAULT_DATA = REPO.parent / "shared" / "bench" / "locomo" / "locomo_dev.json"
DEFAULT_OUT = REPO / "bench" / "results" / "locomo.json"

KS = (5, 10, 20)
BUDGETS = (1000, 2000)
MAX_RANK = 100
RRF_K = 60.0
TOKEN_ENCODING = "cl100k_base"
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
METRICS = tuple(f"R@{k}" for k in KS) + tuple(f"R@{b}tok" for b in BUDGETS) + ("MRR",)
#: Settings fields that shape ranking; they are passed explicitly so HYBRIDMEM_* variables in the
#: environment cannot change what "default" means in a run.
RANKING_FIELDS = (
    "candidates",
    "vector_weight",
    "lexical_weight",
    "graph_weight",
    "recency_weight",
    "half_life_days",
    "importance_weight",
    "frequency_weight",
    "rrf_k",
    "graph_hops",
    "graph_seeds",
    "graph_episodic",
    "graph_focus",
    "graph_session",
    "graph_topic",
    "graph_link",
    "fusion",
)

log = logging.getLogger("bench.locomo")


# -- data ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Turn:
    dia_id: str
    session: int
    text: str
    speaker: str
    when: datetime


@dataclass(frozen=True)
class QA:
    question: str
    evidence: tuple[str, ...]
    category: int


@dataclass
class Conversation:
    sample_id: str
    turns: list[Turn]
    qas: list[QA]
    sessions: int

    @property
    def user(self) -> str:
        return f"locomo-{self.sample_id}"


@dataclass
class DataStats:
    conversations: int = 0
    sessions: int = 0
    turns: int = 0
    turns_with_caption: int = 0
    sessions_without_date: int = 0
    qa_total: int = 0
    qa_skipped_no_evidence: int = 0
    evidence_ids_dropped: int = 0
    qa_by_category: dict[str, int] = field(default_factory=dict)


_MONTHS = {
    m: i
    for i, names in enumerate(
        [("january", "jan"), ("february", "feb"), ("march", "mar"), ("april", "apr"), ("may",),
         ("june", "jun"), ("july", "jul"), ("august", "aug"), ("september", "sep", "sept"),
         ("october", "oct"), ("november", "nov"), ("december", "dec")],
        start=1,
    )
    for m in names
}
_DATE = re.compile(
    r"(?P<h>\d{1,2}):(?P<m>\d{2})\s*(?P<ampm>am|pm)\s+on\s+(?P<d>\d{1,2})\s+(?P<mon>[A-Za-z]+),?\s+"
    r"(?P<y>\d{4})",
    re.IGNORECASE,
)


def parse_session_date(value: str) -> datetime | None:
    """``"1:56 pm on 8 May, 2023"`` -> 2023-05-08 13:56 UTC; None when it does not parse."""
    match = _DATE.search(value or "")
    if not match:
        return None
    month = _MONTHS.get(match["mon"].lower())
    if month is None:
        return None
    hour = int(match["h"]) % 12 + (12 if match["ampm"].lower() == "pm" else 0)
    return datetime(
        int(match["y"]), month, int(match["d"]), hour, int(match["m"]), tzinfo=timezone.utc
    )


def turn_text(turn: dict[str, Any]) -> str:
    """``"Speaker: text"``, with a shared image's caption appended as ``" [shares: <caption>]"``."""
    text = f"{turn.get('speaker', '?')}: {str(turn.get('text', '')).strip()}"
    caption = str(turn.get("blip_caption") or "").strip()
    return f"{text} [shares: {caption}]" if caption else text


def load_locomo(path: Path, limit: int | None = None) -> tuple[list[Conversation], DataStats]:
    """Conversations with their turns and the QAs whose evidence names at least one turn."""
    samples = json.loads(path.read_text(encoding="utf-8"))
    if limit is not None:
        samples = samples[:limit]
    stats = DataStats()
    cats: dict[str, int] = {}
    out = []
    for sample in samples:
        conv = sample["conversation"]
        numbers = sorted(
            int(m.group(1))
            for key, value in conv.items()
            if (m := re.fullmatch(r"session_(\d+)", key)) and isinstance(value, list)
        )
        turns: list[Turn] = []
        previous = datetime(2000, 1, 1, tzinfo=timezone.utc)
        for n in numbers:
            when = parse_session_date(str(conv.get(f"session_{n}_date_time", "")))
            if when is None:
                stats.sessions_without_date += 1
                when = previous
            previous = when
            for raw in conv[f"session_{n}"]:
                if raw.get("blip_caption"):
                    stats.turns_with_caption += 1
                speaker = str(raw.get("speaker", ""))
                turns.append(Turn(str(raw["dia_id"]), n, turn_text(raw), speaker, when))
        known = {t.dia_id for t in turns}
        qas = []
        for qa in sample.get("qa", []):
            stats.qa_total += 1
            evidence: list[str] = []
            for entry in qa.get("evidence") or []:
                for part in str(entry).split(";"):
                    dia = part.strip()
                    if dia in known:
                        if dia not in evidence:
                            evidence.append(dia)
                    elif dia:
                        stats.evidence_ids_dropped += 1
            if not evidence:
                stats.qa_skipped_no_evidence += 1
                continue
            category = int(qa["category"])
            cats[str(category)] = cats.get(str(category), 0) + 1
            qas.append(QA(str(qa["question"]), tuple(evidence), category))
        out.append(Conversation(str(sample["sample_id"]), turns, qas, len(numbers)))
        stats.conversations += 1
        stats.sessions += len(numbers)
        stats.turns += len(turns)
    stats.qa_by_category = dict(sorted(cats.items()))
    return out, stats


# -- ingest ----------------------------------------------------------------------------------------
@dataclass
class Ingested:
    """What one conversation became: memory ids in turn order, their texts, tokens and times."""

    memory_of_dia: dict[str, str]
    texts: dict[str, str]
    tokens: dict[str, int]
    order: dict[str, int]  # memory id -> index of its first turn (for "most recent")
    when: dict[str, datetime]
    superseded: set[str] = field(default_factory=set)  # hidden from search by hybridmem's policy


def save_ingested(path: Path, per_conv: dict[str, Ingested]) -> None:
    """What an ingest made, beside its stores (in the work dir, never in the repository)."""
    path.write_text(json.dumps({
        sid: {**dataclasses.asdict(ing), "when": {m: t.isoformat() for m, t in ing.when.items()},
              "superseded": sorted(ing.superseded)}
        for sid, ing in per_conv.items()
    }), encoding="utf-8")


def load_ingested(path: Path) -> dict[str, Ingested]:
    raw = json.loads(path.read_text(encoding="utf-8"))
    return {
        sid: Ingested(d["memory_of_dia"], d["texts"], d["tokens"], d["order"],
                      {m: datetime.fromisoformat(t) for m, t in d["when"].items()},
                      set(d["superseded"]))
        for sid, d in raw.items()
    }


def current_ids(mem: Any, user: str) -> set[str]:
    """Ids of the user's current memories (``Memory.list`` leaves superseded ones out)."""
    out: set[str] = set()
    while True:
        page = mem.list(user, limit=1000, offset=len(out))
        out.update(item.id for item in page)
        if len(page) < 1000:
            return out


def ingest(mem: Any, conv: Conversation, *, shift: timedelta = timedelta(0)) -> Ingested:
    """Store the conversation session by session with ``Memory.add_many`` (one batch a session)."""
    memory_of_dia: dict[str, str] = {}
    texts: dict[str, str] = {}
    order: dict[str, int] = {}
    when: dict[str, datetime] = {}
    by_session: dict[int, list[Turn]] = {}
    for turn in conv.turns:
        by_session.setdefault(turn.session, []).append(turn)
    index = 0
    for session in sorted(by_session):
        turns = by_session[session]
        items = [
            {
                "text": t.text,
                "kind": "turn",
                "source": (t.speaker or "user")[:64],
                "created_at": t.when + shift,
                "metadata": {"dia_id": t.dia_id, "session": t.session},
            }
            for t in turns
        ]
        stored = mem.add_many(conv.user, items)
        if len(stored) != len(turns):
            raise RuntimeError(f"add_many returned {len(stored)} items for {len(turns)} turns")
        for turn, item in zip(turns, stored):
            memory_of_dia[turn.dia_id] = item.id
            if item.id not in texts:
                texts[item.id] = item.text
                order[item.id] = index
                when[item.id] = turn.when
            index += 1
    return Ingested(memory_of_dia, texts, {}, order, when)


# -- scoring ---------------------------------------------------------------------------------------
def score_ranking(
    ranking: Sequence[str], evidence: Sequence[str], memory_of_dia: dict[str, str],
    tokens: dict[str, int],
) -> dict[str, float]:
    """The metrics of one ranking (memory ids, best first) against evidence dia_ids."""
    ranking = list(ranking)[:MAX_RANK]
    position: dict[str, int] = {}
    for i, memory_id in enumerate(ranking):
        position.setdefault(memory_id, i)
    ranks = [position.get(memory_of_dia[d]) for d in evidence]
    found = [r for r in ranks if r is not None]
    out = {f"R@{k}": sum(r < k for r in found) / len(ranks) for k in KS}
    for budget in BUDGETS:
        used, fits = 0, 0
        for memory_id in ranking:
            used += tokens[memory_id]
            if used > budget:
                break
            fits += 1
        out[f"R@{budget}tok"] = sum(r < fits for r in found) / len(ranks)
    out["MRR"] = 1.0 / (min(found) + 1) if found else 0.0
    return out


def group_of(category: int) -> list[str]:
    return ["overall", f"cat{category}"] if category in (1, 2, 3, 4) else [f"cat{category}"]


def aggregate(rows: list[tuple[int, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Means per group: overall (categories 1-4), cat1 ... cat5."""
    groups: dict[str, list[dict[str, float]]] = {}
    for category, scores in rows:
        for name in group_of(category):
            groups.setdefault(name, []).append(scores)
    out = {}
    for name in ["overall"] + [f"cat{c}" for c in sorted(CATEGORIES)]:
        members = groups.get(name, [])
        out[name] = {"n": len(members)} | {
            m: (sum(s[m] for s in members) / len(members) if members else 0.0) for m in METRICS
        }
    return out


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else 0.0


# -- configurations --------------------------------------------------------------------------------
@dataclass
class Config:
    name: str
    kind: str  # "hybridmem" or "baseline"
    overrides: dict[str, Any] = field(default_factory=dict)
    # "real": session dates as they are; "shifted": last session = now; "no-speakers": real dates,
    # ingested with graph_speakers=False (turns not linked to their speaker)
    data: str = "real"
    fusion: str | None = None  # None: the Settings default
    note: str = ""


def default_fusion() -> str:
    from hybridmem import Settings

    field_ = Settings.model_fields.get("fusion")
    return str(field_.default) if field_ is not None else "rrf"


def default_configs() -> list[Config]:
    decay = {"recency_weight": 0.3, "half_life_days": 30.0}
    # The fusion the defaults do not use, so both are always measured side by side.
    other = "rrf" if default_fusion() == "weighted" else "weighted"
    return [
        Config("hybridmem", "hybridmem", note="Settings defaults"),
        Config("vector-only", "hybridmem", {"lexical_weight": 0.0, "graph_weight": 0.0}),
        Config("lexical-only", "hybridmem", {"vector_weight": 0.0, "graph_weight": 0.0}),
        Config("no-graph", "hybridmem", {"graph_weight": 0.0}),
        Config("no-focus", "hybridmem", {"graph_focus": 0.0},
               note="graph without query focus (see hybridmem.graph.activation)"),
        Config("decay", "hybridmem", dict(decay),
               note="real clock: every LoCoMo memory is years old, so decay is ~0 for all"),
        Config("decay-shifted", "hybridmem", dict(decay), data="shifted",
               note="dates shifted so each conversation's last session is 'now'"),
        Config(f"{other}-fusion", "hybridmem", fusion=other,
               note="defaults but the other fusion (see hybridmem.read.ranking)"),
        Config("bm25", "baseline", note="bm25s"),
        Config("dense", "baseline", note="cosine, same embedder, numpy"),
        Config("rrf(bm25,dense)", "baseline", note=f"k={RRF_K:g}"),
        Config("recent", "baseline", note="most recent turns first"),
    ]


def parse_extra(spec: str) -> Config:
    """``NAME:key=value,key=value`` -> a hybridmem config (keys: Settings fields, data, fusion)."""
    name, _, body = spec.partition(":")
    if not name or not body:
        raise SystemExit(f"--extra wants NAME:key=value,...; got {spec!r}")
    cfg = Config(name.strip(), "hybridmem", note=f"extra: {body}")
    for pair in body.split(","):
        key, _, value = pair.partition("=")
        key, value = key.strip(), value.strip()
        if key == "data":
            cfg.data = value
        elif key == "fusion":
            cfg.fusion = value
        elif key in RANKING_FIELDS:
            integer = key in ("candidates", "graph_hops", "graph_seeds")
            cfg.overrides[key] = int(value) if integer else float(value)
        else:
            raise SystemExit(
                f"--extra: unknown key {key!r} (use one of {RANKING_FIELDS}, data, fusion)"
            )
    return cfg


def settings_for(cfg: Config, data_dir: Path) -> tuple[Any, str]:
    """The Settings of a configuration, and how weighted fusion was reached (if asked)."""
    from hybridmem import Settings

    fields = Settings.model_fields
    values = {name: fields[name].default for name in RANKING_FIELDS if name in fields}
    values.update(cfg.overrides)
    how = ""
    if cfg.fusion is not None:
        values["fusion"] = cfg.fusion
        how = "Settings.fusion"
    if cfg.data == "no-speakers":
        values["graph_speakers"] = False
    settings = Settings(data_dir=data_dir, embedder="local", extractor="rules", **values)
    return settings, how


def open_memory(cfg: Config, data_dir: Path, embedder: Any) -> tuple[Any, str]:
    from hybridmem import Memory

    settings, how = settings_for(cfg, data_dir)
    return Memory(settings, embedder=embedder), how


# -- baselines -------------------------------------------------------------------------------------
class Baselines:
    """BM25 (bm25s), dense cosine and their RRF over one conversation's memories."""

    def __init__(
        self, ids: list[str], texts: list[str], embedder: Any, stemmer: Any, *, lexical: bool
    ) -> None:
        self.ids = ids
        self._stemmer = stemmer
        if lexical:
            import bm25s

            self._bm25s = bm25s
            corpus = bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False)
            self._bm25 = bm25s.BM25()
            self._bm25.index(corpus, show_progress=False)
        self._embedder = embedder
        self._matrix = np.asarray(embedder.embed_batch(texts), dtype=np.float32)

    def bm25(self, question: str) -> list[str]:
        tokens = self._bm25s.tokenize(
            [question], stopwords="en", stemmer=self._stemmer, return_ids=False, show_progress=False
        )[0]
        scores = self._bm25.get_scores(tokens) if tokens else np.zeros(len(self.ids))
        order = np.argsort(-scores, kind="stable")[:MAX_RANK]
        return [self.ids[i] for i in order if scores[i] > 0]  # no term in common: not retrieved

    def dense(self, question: str) -> list[str]:
        query = np.asarray(self._embedder.embed_batch([question])[0], dtype=np.float32)
        sims = self._matrix @ query
        order = np.argsort(-sims, kind="stable")[:MAX_RANK]
        return [self.ids[i] for i in order]

    def rrf(self, question: str) -> list[str]:
        fused: dict[str, float] = {}
        for ranking in (self.bm25(question), self.dense(question)):
            for rank, memory_id in enumerate(ranking, 1):
                fused[memory_id] = fused.get(memory_id, 0.0) + 1.0 / (RRF_K + rank)
        return sorted(fused, key=lambda m: -fused[m])[:MAX_RANK]


def make_stemmer() -> tuple[Any, bool]:
    try:
        import Stemmer  # PyStemmer
    except ImportError:
        return None, False
    return Stemmer.Stemmer("english"), True


# -- run -------------------------------------------------------------------------------------------
def machine_info() -> dict[str, Any]:
    return _provenance.machine_info(
        ("chromadb", "onnxruntime", "numpy", "bm25s", "networkx", "tiktoken", "PyStemmer")
    )


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_hybridmem(
    cfg: Config, data_dir: Path, embedder: Any, convs: list[Conversation]
) -> tuple[dict[str, list[str]], list[float], dict[str, Any]]:
    """Rankings (keyed by conversation/question index), search latencies (ms), the settings."""
    mem, how = open_memory(cfg, data_dir, embedder)
    rankings: dict[str, list[str]] = {}
    latencies: list[float] = []
    try:
        for conv in convs:
            if conv.qas:  # warm-up: opens the user's collection, index and graph
                mem.search(conv.user, conv.qas[0].question, limit=MAX_RANK)
            for i, qa in enumerate(conv.qas):
                start = time.perf_counter()
                hits = mem.search(conv.user, qa.question, limit=MAX_RANK)
                latencies.append((time.perf_counter() - start) * 1000.0)
                rankings[f"{conv.sample_id}/{i}"] = [h.item.id for h in hits]
        settings = {name: getattr(mem.settings, name, None) for name in RANKING_FIELDS}
        weights = {name.removesuffix("_weight"): value for name, value in settings.items()
                   if name.endswith("_weight") or name in ("fusion", "rrf_k", "half_life_days")}
    finally:
        mem.close()
    return rankings, latencies, {
        "settings": settings, "weights": weights, "fusion_via": how or None
    }


def run_baseline(
    cfg: Config, convs: list[Conversation], ingested: dict[str, Ingested],
    baselines: dict[str, Baselines],
) -> tuple[dict[str, list[str]], list[float]]:
    rankings: dict[str, list[str]] = {}
    latencies: list[float] = []
    for conv in convs:
        ing = ingested[conv.sample_id]
        base = baselines[conv.sample_id]
        method: Callable[[str], list[str]]
        if cfg.name == "bm25":
            method = base.bm25
        elif cfg.name == "dense":
            method = base.dense
        elif cfg.name.startswith("rrf"):
            method = base.rrf
        else:
            newest = sorted(ing.texts, key=lambda m: (ing.when[m], ing.order[m]), reverse=True)
            method = lambda _q, newest=newest: newest[:MAX_RANK]  # noqa: E731
        for i, qa in enumerate(conv.qas):
            start = time.perf_counter()
            ranking = method(qa.question)
            latencies.append((time.perf_counter() - start) * 1000.0)
            rankings[f"{conv.sample_id}/{i}"] = ranking
    return rankings, latencies


def evaluate(
    rankings: dict[str, list[str]], convs: list[Conversation], ingested: dict[str, Ingested]
) -> dict[str, dict[str, float]]:
    rows = []
    for conv in convs:
        ing = ingested[conv.sample_id]
        for i, qa in enumerate(conv.qas):
            ranking = rankings[f"{conv.sample_id}/{i}"]
            rows.append((qa.category, score_ranking(ranking, qa.evidence, ing.memory_of_dia,
                                                    ing.tokens)))
    return aggregate(rows)


def write_per_question(
    path: Path, all_rankings: dict[str, dict[str, list[str]]], convs: list[Conversation],
    ingested: dict[str, Ingested],
) -> None:
    """One JSON line per question: its key, category, evidence count and, per config, the rank
    (1-based, None beyond the top 100) of each evidence turn. Never any LoCoMo text."""
    with open(path, "w", encoding="utf-8") as out:
        for conv in convs:
            ing = ingested[conv.sample_id]
            for i, qa in enumerate(conv.qas):
                key = f"{conv.sample_id}/{i}"
                wanted = [ing.memory_of_dia[d] for d in qa.evidence if d in ing.memory_of_dia]
                ranks = {}
                for name, rankings in all_rankings.items():
                    pos = {m: r for r, m in enumerate(rankings[key], 1)}
                    ranks[name] = [pos.get(m) for m in wanted]
                out.write(json.dumps({"q": key, "category": qa.category, "ranks": ranks}) + "\n")


def top_agreement(
    a: dict[str, list[str]], b: dict[str, list[str]], k: int = 10
) -> dict[str, float]:
    """How alike two configurations rank: share of questions with the identical top k, and the mean
    share of top-k memories in common."""
    keys = [key for key in a if key in b]
    if not keys:
        return {"identical": 0.0, "overlap": 0.0}
    return {
        "identical": sum(a[key][:k] == b[key][:k] for key in keys) / len(keys),
        "overlap": sum(len(set(a[key][:k]) & set(b[key][:k])) / k for key in keys) / len(keys),
    }


def fmt(value: float) -> str:
    return f"{value:.3f}".lstrip("0") if value < 1 else f"{value:.2f}"


def cell(group: dict[str, float], metric: str) -> str:
    """A metric of a group for the table; a dash when the group has no question."""
    return fmt(group[metric]) if group["n"] else "–"


def markdown_tables(result: dict[str, Any]) -> str:
    lines = []
    n = result["configs"][0]["metrics"]["overall"]["n"] if result["configs"] else 0
    n5 = result["configs"][0]["metrics"]["cat5"]["n"] if result["configs"] else 0
    lines.append(
        f"Categories 1-4 (n = {n}); multi-hop = category 1; cat-5 = adversarial (n = {n5})\n"
    )
    lines.append("| config | R@5 | R@10 | R@20 | R@1000tok | R@2000tok | MRR | multi-hop R@10 "
                 "| cat-5 R@10 | p50 ms |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for c in result["configs"]:
        g = c["metrics"]
        lines.append(
            f"| {c['name']} | " + " | ".join(cell(g["overall"], m) for m in METRICS)
            + f" | {cell(g['cat1'], 'R@10')} | {cell(g['cat5'], 'R@10')}"
            + f" | {c['latency_ms']['p50']:.1f} |"
        )
    lines.append("")
    first = result["configs"][0]["metrics"] if result["configs"] else {}
    head = " | ".join(
        f"{CATEGORIES[k]} (n={first[f'cat{k}']['n']})" for k in (1, 2, 3, 4, 5) if first
    )
    lines.append(f"R@10 / MRR by category\n\n| config | {head} |")
    lines.append("|---|" + "---|" * 5)
    for c in result["configs"]:
        cells = [
            f"{cell(c['metrics'][f'cat{k}'], 'R@10')} / {cell(c['metrics'][f'cat{k}'], 'MRR')}"
            for k in (1, 2, 3, 4, 5)
        ]
        lines.append(f"| {c['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo-format JSON")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON")
    parser.add_argument("--configs", nargs="*", default=None,
                        help="config names to run (default: all); comma- or space-separated")
    parser.add_argument("--extra", action="append", default=[],
                        help="extra hybridmem config NAME:key=value,... (Settings ranking fields, "
                             "data=real|shifted|no-speakers, fusion=rrf|weighted); repeatable")
    parser.add_argument("--limit-conversations", type=int, default=None)
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="where to keep the ingested stores (default: a temporary directory)")
    parser.add_argument("--per-question", type=Path, default=None,
                        help="also write, per question, its category and the rank of each evidence "
                             "turn under each config (JSON lines; ids and ranks only, no text)")
    parser.add_argument("--reuse", action="store_true",
                        help="with --work-dir: search the stores an earlier run ingested there "
                             "(same data and --limit-conversations) instead of ingesting again")
    parser.add_argument("-q", "--quiet", action="store_true")
    args = parser.parse_args(argv)
    if args.reuse and args.work_dir is None:
        parser.error("--reuse needs --work-dir")
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s %(message)s", stream=sys.stderr)

    configs = default_configs()
    if args.configs:
        wanted = [n for item in args.configs for n in item.split(",") if n]
        known = {c.name: c for c in configs}
        unknown = [n for n in wanted if n not in known]
        if unknown:
            parser.error(f"unknown configs {unknown}; known: {sorted(known)}")
        configs = [known[n] for n in wanted]
    configs += [parse_extra(spec) for spec in args.extra]
    if not configs:
        parser.error("no configuration to run")

    data_path = args.data if args.data.is_absolute() else (Path.cwd() / args.data)
    if not data_path.is_file():
        parser.error(f"no LoCoMo file at {data_path}")
    started = time.perf_counter()
    provenance = git_info()  # at the start: the code may change while the run goes on
    machine = machine_info()
    convs, stats = load_locomo(data_path, args.limit_conversations)
    log.info("loaded %d conversations, %d turns, %d QAs with evidence", stats.conversations,
             stats.turns, sum(len(c.qas) for c in convs))

    from hybridmem.offline import LocalEmbedder, TiktokenCounter

    from hybridmem import Memory

    embedder = LocalEmbedder()
    counter = TiktokenCounter(TOKEN_ENCODING)
    stemmer, stemmed = make_stemmer()
    have_bm25s = importlib.util.find_spec("bm25s") is not None
    needs_bm25s = [c.name for c in configs
                   if c.kind == "baseline" and (c.name == "bm25" or c.name.startswith("rrf("))]
    if needs_bm25s and not have_bm25s:
        if args.configs:
            parser.error(f"{needs_bm25s} need bm25s: pip install bm25s PyStemmer")
        log.warning("bm25s is not installed: skipping %s (pip install bm25s PyStemmer)",
                    needs_bm25s)
        configs = [c for c in configs if c.name not in needs_bm25s]

    with tempfile.TemporaryDirectory(prefix="hm-locomo-") as tmp:
        root = args.work_dir or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        datasets = sorted({c.data for c in configs if c.kind == "hybridmem"} | {"real"})
        ingested: dict[str, dict[str, Ingested]] = {}
        ingest_seconds: dict[str, float] = {}
        now = datetime.now(timezone.utc)
        for name in datasets:
            data_dir = root / name
            saved = root / f"{name}.ingested.json"  # ids, times, tokens: kept beside the stores
            if args.reuse and saved.is_file():
                ingested[name] = load_ingested(saved)
                if set(ingested[name]) != {c.sample_id for c in convs}:
                    raise SystemExit(f"{saved} holds other conversations; ingest again")
                log.info("reusing the %s ingest in %s", name, data_dir)
                continue
            if data_dir.exists() and any(data_dir.iterdir()):
                raise SystemExit(f"{data_dir} is not empty; pass an empty --work-dir")
            base_settings, _ = settings_for(Config("ingest", "hybridmem", data=name), data_dir)
            t0 = time.perf_counter()
            with Memory(base_settings, embedder=embedder) as mem:
                ingested[name] = {}
                for conv in convs:
                    last = max((t.when for t in conv.turns), default=now)
                    shift = (now - last) if name == "shifted" else timedelta(0)
                    ing = ingest(mem, conv, shift=shift)
                    ing.tokens = {m: counter.count(t) for m, t in ing.texts.items()}
                    ing.superseded = set(ing.texts) - current_ids(mem, conv.user)
                    ingested[name][conv.sample_id] = ing
            ingest_seconds[name] = time.perf_counter() - t0
            if args.work_dir is not None:
                save_ingested(saved, ingested[name])
            log.info("ingested %s data: %d turns in %.1f s", name, stats.turns,
                     ingest_seconds[name])
        real = ingested["real"]
        # Maps from the shifted ingest's memory ids to the real ingest's (same dia_ids).
        translate: dict[str, dict[str, dict[str, str]]] = {}
        for name, per_conv in ingested.items():
            translate[name] = {
                sid: {ing.memory_of_dia[d]: real[sid].memory_of_dia[d] for d in ing.memory_of_dia}
                for sid, ing in per_conv.items()
            }

        baselines: dict[str, Baselines] = {}
        baseline_build_s = 0.0
        if any(c.kind == "baseline" for c in configs):
            t0 = time.perf_counter()
            for conv in convs:
                ing = real[conv.sample_id]
                ids = list(ing.texts)
                texts = [ing.texts[m] for m in ids]
                baselines[conv.sample_id] = Baselines(ids, texts, embedder, stemmer,
                                                      lexical=have_bm25s)
            baseline_build_s = time.perf_counter() - t0
            log.info("built baselines (bm25s %s, dense) in %.1f s",
                     "stemmed" if stemmed else "unstemmed", baseline_build_s)

        results = []
        all_rankings: dict[str, dict[str, list[str]]] = {}
        for cfg in configs:
            t0 = time.perf_counter()
            extra: dict[str, Any] = {}
            if cfg.kind == "hybridmem":
                rankings, latencies, extra = run_hybridmem(cfg, root / cfg.data, embedder, convs)
                rankings = {
                    key: [translate[cfg.data][key.split("/")[0]].get(m, m) for m in ranking]
                    for key, ranking in rankings.items()
                }
            else:
                rankings, latencies = run_baseline(cfg, convs, real, baselines)
            metrics = evaluate(rankings, convs, real)
            all_rankings[cfg.name] = rankings
            entry: dict[str, Any] = {
                "name": cfg.name,
                "kind": cfg.kind,
                "data": cfg.data,
                "fusion": extra.get("weights", {}).get("fusion", cfg.fusion),
                "overrides": cfg.overrides,
                "note": cfg.note,
                **extra,
                "metrics": metrics,
                "latency_ms": {
                    "p50": percentile(latencies, 50),
                    "p95": percentile(latencies, 95),
                    "mean": statistics.fmean(latencies) if latencies else 0.0,
                    "n": len(latencies),
                },
                "seconds": time.perf_counter() - t0,
            }
            results.append(entry)
            o = metrics["overall"]
            log.info("%-18s R@10 %.3f MRR %.3f p50 %.1f ms (%.0f s)", cfg.name, o["R@10"], o["MRR"],
                     entry["latency_ms"]["p50"], entry["seconds"])
        if args.per_question is not None:
            write_per_question(args.per_question, all_rankings, convs, real)
        if "hybridmem" in all_rankings:
            for entry in results:
                entry["top10_vs_hybridmem"] = top_agreement(
                    all_rankings[entry["name"]], all_rankings["hybridmem"]
                )

    ages = [
        (datetime.now(timezone.utc) - t.when).total_seconds() / 86400.0
        for c in convs
        for t in c.turns
    ]
    result = {
        "benchmark": "locomo-retrieval",
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git": provenance,
        "machine": {**machine, "loadavg_at_end": list(os.getloadavg())
                    if hasattr(os, "getloadavg") else None},
        "data": {
            "path": str(data_path),
            "sha256": sha256_of(data_path),
            "sample_ids": [c.sample_id for c in convs],
            **dataclasses.asdict(stats),
            "memories": sum(len(real[c.sample_id].texts) for c in convs),
            # hybridmem marks a turn superseded when a later one states a conflicting functional
            # relation (lives_in, works_at ...); search leaves superseded memories out.
            "superseded_memories": sum(len(real[c.sample_id].superseded) for c in convs),
            "evidence_in_superseded": {
                group: sum(
                    real[c.sample_id].memory_of_dia[d] in real[c.sample_id].superseded
                    for c in convs for qa in c.qas for d in qa.evidence
                    if (qa.category == 5) == (group == "cat5")
                )
                for group in ("overall", "cat5")
            },
        },
        "measure": {
            "ks": list(KS),
            "token_budgets": list(BUDGETS),
            "token_encoding": TOKEN_ENCODING,
            "max_rank": MAX_RANK,
            "overall": "categories 1-4",
        },
        "embedder": embedder.name,
        "bm25": {"package": "bm25s" if have_bm25s else None, "stemmed": stemmed,
                 "stopwords": "en", "zero_score_docs": "dropped"},
        "ingest_seconds": ingest_seconds,
        "baseline_build_seconds": baseline_build_s,
        "decay_note": {
            "memory_age_days_min": min(ages) if ages else None,
            "memory_age_days_max": max(ages) if ages else None,
            "text": "With the real clock every LoCoMo memory is hundreds of days old, so "
                    "0.5**(age/half_life) is ~0 for all and the decay factor (1 - w_r + w_r*d) is "
                    "the same constant for every memory: ranking is unchanged. 'decay-shifted' "
                    "moves each conversation so that its last session is now.",
        },
        "configs": results,
        "elapsed_seconds": time.perf_counter() - started,
    }
    out = args.out if args.out.is_absolute() else Path.cwd() / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    print(markdown_tables(result))
    flavour = "stemmed (PyStemmer)" if stemmed else "unstemmed (PyStemmer not installed)"
    print(f"\nbm25s {flavour if have_bm25s else 'not installed'}; "
          f"tokens: tiktoken {TOKEN_ENCODING}; ingest {ingest_seconds.get('real', 0):.1f} s; "
          f"total {result['elapsed_seconds']:.0f} s; JSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
