"""The pages generated from docs/benchmarks/ are current: docs/levers.json (but its timestamp),
docs/levers.md, docs/benchmarks.md and the table block of docs/results.md are what
`python -m training.bench levers` and `python -m training.bench readme` write from the JSONs
committed today (a JSON added, or the analysis changed, without regenerating them fails here)."""
from __future__ import annotations

import json

from training import REPO_ROOT
from training.bench.levers import benchmarks_markdown, build, markdown
from training.bench.readme import perf_table, replace_block
from training.bench.record import BENCH_DIR

DOCS = REPO_ROOT / "docs"
FIX = "run `python -m training.bench levers` and `python -m training.bench readme`"


def test_generated_benchmark_pages_are_current():
    doc = build(BENCH_DIR)
    committed = json.loads((DOCS / "levers.json").read_text())
    assert {**committed, "generated": None} == {**json.loads(json.dumps(doc)), "generated": None}, FIX
    assert (DOCS / "levers.md").read_text() == markdown(doc), FIX
    assert (DOCS / "benchmarks.md").read_text() == benchmarks_markdown(BENCH_DIR), FIX
    results = (DOCS / "results.md").read_text()
    assert replace_block(results, perf_table(doc, BENCH_DIR)) == results, FIX
