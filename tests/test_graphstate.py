"""Removing memories from a user's in-memory graph keeps its indexes exactly what a rebuild from
the graph gives (they are maintained incrementally, not rebuilt, since a rebuild walks the whole
graph on every supersession and deletion). Real extractions: the rule extractor on the demo data."""

from __future__ import annotations

import copy
import json
import random
from datetime import datetime, timezone
from pathlib import Path

from hybridmem.graph.state import UserGraph
from hybridmem.extract import RuleExtractor

ROOT = Path(__file__).resolve().parent.parent


def _indexes(st: UserGraph) -> tuple[object, ...]:
    keep = (lambda table: {k: set(v) for k, v in table.items() if v})
    return (keep(st.aliases), keep(st.words), keep(st.forms), keep(st.by_form),
            keep(st.mem_nodes), keep(st.mem_edges), dict(st.prevs), dict(st.nexts))


def test_removals_keep_the_indexes_equal_to_a_rebuild() -> None:
    rules, now = RuleExtractor(), datetime.now(timezone.utc)
    records = [json.loads(line) for line in
               (ROOT / "hybridmem" / "demo_data" / "memories.jsonl").read_text(encoding="utf-8").splitlines()]
    rnd = random.Random(4)
    for trial in range(5):
        st = UserGraph("u", None)
        ids = []
        for i, r in enumerate(records):
            ids.append(f"m{i}")
            st.add([(f"m{i}", rules.extract(r["text"], speaker=r["user_id"]))], now,
                   links=rnd.random() < 0.5)
        nodes_before = st.graph.number_of_nodes()
        rnd.shuffle(ids)
        removed = 0
        while ids:
            k = rnd.randint(1, 4)
            batch, ids = ids[:k], ids[k:]
            st.remove(batch)
            removed += len(batch)
            rebuilt = copy.deepcopy(st)
            rebuilt.index()
            assert _indexes(st) == _indexes(rebuilt), (trial, removed)
        assert nodes_before > 20 and st.graph.number_of_nodes() == 0
