"""docs/levers.json and docs/levers.md generated from benchmark JSONs (fixtures made by fake
sweeps, plus the real H200 peers JSON)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from training.bench import levers
from training.bench.catalog import KINDS, select
from training.bench.shape import BenchShape
from training.bench.suites import run_suite, toggle_configs

from .fakes import HEADER, FakeRunner, fake_precheck

REPO_BENCH = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
# The first H200 peers run (1 repeat), kept under docs/benchmarks/earlier/: fixed figures.
REAL_PEERS = (REPO_BENCH / "earlier"
              / "peers_h200_llama3-8B-8L_seq8192_1repeat.json")
PEERS_NAME = "peers_h200_llama3-8B-8L_seq8192.json"
AGREED = {"id", "kind", "set", "baseline", "effect", "shape", "hardware", "source", "repeats",
          "notes"}
EFFECT = {"tokens_per_s_ratio", "ratio_spread", "verdict", "peak_memory_gib"}
SHAPE_KEYS = {"model", "num_layers", "seq_length", "mbs", "global_batch", "gpus", "tp", "pp",
              "dp", "precision", "backend"}


def make_toggles_json(bench: Path, name: str, created: str, shape: BenchShape,
                      speeds: dict, keys: list[str], refuse: dict | None = None) -> Path:
    levers_ = select(shape, None, None, keys)
    configs, values = toggle_configs(shape, levers_, fake_precheck(refuse=refuse))
    header = dict(HEADER, name=name, created=created)
    out = bench / f"{name}.json"
    run_suite("toggles", header, shape, configs,
              FakeRunner(speed=speeds, noise=0.002, memory={"MBS": 70.0}), lambda s: 1.0,
              out, 1e9, {"default_resolved": values}, log=lambda _m: None)
    return out


@pytest.fixture
def bench(tmp_path) -> Path:
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    shutil.copy(REAL_PEERS, bench / PEERS_NAME)
    (bench / "data_prepare_cpu.json").write_text('{"benchmark": "other kind"}')
    make_toggles_json(bench, "toggles_old", "2026-11-01T00:00:00", BenchShape(),
                      {"default": 35000, "GRAD_REDUCE_IN_BF16": 30000}, ["GRAD_REDUCE_IN_BF16"])
    make_toggles_json(bench, "toggles_new", "2026-11-30T00:00:00", BenchShape(),
                      {"default": 35000, "GRAD_REDUCE_IN_BF16": 34000, "MBS": 36400,
                       "DDP_AVERAGE_IN_COLLECTIVE": 35000},
                      ["GRAD_REDUCE_IN_BF16", "MBS", "DDP_AVERAGE_IN_COLLECTIVE",
                       "PRECISION=mxfp8"],
                      refuse={"PRECISION=mxfp8": "[precision_needs_hardware] PRECISION=mxfp8 "
                                                 "does not run on h200"})
    make_toggles_json(bench, "toggles_dp2", "2026-11-30T01:00:00", BenchShape(gpus=2),
                      {"default": 34000, "OVERLAP_GRAD_REDUCE": 32000}, ["OVERLAP_GRAD_REDUCE"])
    return bench


def rows(doc: dict, key: str) -> list[dict]:
    return [e for e in doc["levers"] if e["key"] == key]


def test_schema_keys_and_kinds(bench):
    doc = levers.build(bench)
    assert doc["schema"] == 1 and doc["generated"] and "verdict_rule" in doc
    assert len(doc["sources"]) == 4            # the other-kind JSON is not a source
    for entry in doc["levers"]:
        assert AGREED <= set(entry), entry["key"]
        assert EFFECT <= set(entry["effect"])
        assert entry["kind"] in KINDS
        assert entry["effect"]["verdict"] in ("faster", "slower", "within noise",
                                              "not measured", "refused")
        if entry["shape"] is not None:
            assert SHAPE_KEYS <= set(entry["shape"])
    json.dumps(doc)


def test_real_peers_json_gives_the_backend_lever_and_peer_rows(bench):
    doc = levers.build(bench)
    (local,) = rows(doc, "TRANSFORMER_IMPL=local")
    assert local["kind"] == "backend" and local["set"].startswith("TRANSFORMER_IMPL=native")
    assert local["effect"]["tokens_per_s_ratio"] == pytest.approx(34967.19 / 14526.16, rel=1e-4)
    assert local["effect"]["verdict"] == "faster"
    assert local["effect"]["peak_memory_gib"]["baseline"] == pytest.approx(98.76, abs=0.01)
    assert local["source"].endswith("peers_h200_llama3-8B-8L_seq8192.json")
    assert local["shape"]["model"] == "llama3-8B" and local["hardware"] == "NVIDIA H200"
    (liger,) = rows(doc, "peer:hf_liger")
    assert liger["effect"]["tokens_per_s_ratio"] == pytest.approx(34967.19 / 35157.22, rel=1e-4)
    assert liger["effect"]["verdict"] == "within noise"
    assert liger["repeats"] == 1 and "1 repeat" in liger["notes"]
    assert "bf16 AdamW moments" in liger["optimizer_state"]["baseline"]
    (titan,) = rows(doc, "peer:torchtitan")
    assert titan["effect"]["verdict"] == "not measured" and titan["source"] is None


def test_newest_wins_refusals_and_not_measured(bench):
    doc = levers.build(bench)
    (grb,) = rows(doc, "GRAD_REDUCE_IN_BF16")
    assert grb["source"].endswith("toggles_new.json")
    assert grb["effect"]["tokens_per_s_ratio"] == pytest.approx(35000 / 34000, abs=0.01)
    assert grb["set"] == "GRAD_REDUCE_IN_BF16=1" and grb["effect"]["verdict"] == "faster"
    (mbs,) = rows(doc, "MBS")
    assert mbs["set"] == "MBS=2" and mbs["baseline"] == "MBS=1"
    assert mbs["effect"]["peak_memory_gib"] == {"baseline": 54.0, "with": 70.0}
    (mx,) = rows(doc, "PRECISION=mxfp8")
    assert mx["effect"]["verdict"] == "refused" and "precision_needs_hardware" in mx["notes"]
    (ddp,) = rows(doc, "DDP_AVERAGE_IN_COLLECTIVE")
    assert ddp["needs_dp_gt_1"] and "needs DP>1" in ddp["notes"]
    assert ddp["effect"]["verdict"] == "within noise"      # the default's speed in the fixture
    (ogr,) = rows(doc, "OVERLAP_GRAD_REDUCE")
    assert ogr["shape"]["gpus"] == 2 and ogr["shape"]["dp"] == 2
    assert "needs DP>1" not in ogr["notes"]
    (full,) = rows(doc, "RECOMPUTE=full")
    assert full["effect"]["verdict"] == "not measured" and full["effect"]["tokens_per_s_ratio"] is None


def test_markdown_has_one_row_per_entry(bench, tmp_path):
    """Mutation caught: training/bench/stats.py effect() without its 'within noise' branch
    (`if False:` for `if abs(ratio - 1) <= noise or not agree:`), which calls the fixture's
    equal-speed DDP_AVERAGE_IN_COLLECTIVE 'slower'; the old assertion accepted any of the
    three verdicts in front of "(needs DP>1)"."""
    docs = tmp_path / "docs"
    doc = levers.write_docs(bench, docs)
    md = (docs / "levers.md").read_text()
    table_rows = [l for l in md.splitlines() if l.startswith("| ") and not l.startswith("| lever")]
    assert len(table_rows) == len(doc["levers"])
    assert "| GRAD_REDUCE_IN_BF16 | `GRAD_REDUCE_IN_BF16=1` | `GRAD_REDUCE_IN_BF16=0` |" in md
    # the fixture gives DDP_AVERAGE_IN_COLLECTIVE the default's speed (35000), measured at DP=1
    (ddp,) = [l for l in table_rows if l.startswith("| DDP_AVERAGE_IN_COLLECTIVE |")]
    assert "| within noise (needs DP>1) |" in ddp
    assert "| refused |" in md and "not measured" in md
    assert json.loads((docs / "levers.json").read_text())["levers"] == doc["levers"]
    bm = (docs / "benchmarks.md").read_text()
    assert bm.count("\n## ") == 4 and "peers_h200_llama3-8B-8L_seq8192" in bm


def test_the_committed_docs_match_the_committed_jsons():
    """docs/levers.json (but its timestamp), docs/levers.md, docs/benchmarks.md and the table
    block of docs/results.md are what `python -m training.bench levers` and `... readme` write
    from docs/benchmarks/*.json, not edited (results.md once stayed stale after a change to
    the analysis, and this test checked levers.json only)."""
    from training.bench.readme import perf_table, replace_block

    root = Path(__file__).resolve().parents[2]
    docs, bench = root / "docs", root / "docs" / "benchmarks"
    fresh = levers.build(bench)
    committed = json.loads((docs / "levers.json").read_text())
    fix = "run `python -m training.bench levers` and `python -m training.bench readme`"
    assert committed["levers"] == json.loads(json.dumps(fresh["levers"])), fix
    assert committed["sources"] == fresh["sources"], fix
    assert (docs / "levers.md").read_text() == levers.markdown(fresh), fix
    assert (docs / "benchmarks.md").read_text() == levers.benchmarks_markdown(bench), fix
    results = (docs / "results.md").read_text()
    assert replace_block(results, perf_table(fresh, bench)) == results, fix


def test_rows_measured_at_an_older_default_say_so():
    def data(resolved, corrections=()):
        return {"points": [{"side": "peer", "config": "hf"},
                           {"side": "ours", "config": "default", "toggles_resolved": resolved,
                            "corrections": [{"toggle": t} for t in corrections]}]}

    today = {t.name: levers.fmt_value(t.default) for t in levers.REGISTRY
             if t.group == "performance"}
    assert levers.older_defaults(data(today)) == []
    assert levers.older_defaults(data({**today, "CE_CHUNK_MEM": "1"})) == [
        f"measured at CE_CHUNK_MEM=1, the default then (now {today['CE_CHUNK_MEM']})"]
    without = {k: v for k, v in today.items() if k != "CE_CHUNK_MEM"}
    assert levers.older_defaults(data(without)) == [
        f"measured before CE_CHUNK_MEM existed (default now {today['CE_CHUNK_MEM']})"]
    # a toggle a guard corrected at that run is the guard's value, not an older default
    assert levers.older_defaults(data({**today, "FUSED_SINGLE_QKV_ROPE": "0"},
                                      ["FUSED_SINGLE_QKV_ROPE"])) == []
    assert levers.older_defaults({"points": [{"side": "peer"}]}) == []
    # nor is a family layer's own default (the MoE launch's lean step turns the fused CE off)
    lean = data({**today, "CROSS_ENTROPY_LOSS_FUSION": "0"})
    assert levers.older_defaults(lean) == [
        "measured at CROSS_ENTROPY_LOSS_FUSION=0, the default then (now 1)"]
    lean["points"][1]["layer_values"] = [{"toggle": "CROSS_ENTROPY_LOSS_FUSION", "value": "0"}]
    assert levers.older_defaults(lean) == []
    lean["points"][1]["layer_values"] = ["CROSS_ENTROPY_LOSS_FUSION"]   # hand-edited: ignored
    assert len(levers.older_defaults(lean)) == 1


def test_a_comparison_measured_under_an_older_key_is_not_listed_as_unmeasured(tmp_path):
    # session 4: CE_CHUNK_MEM=8 measured against 1 while 1 was the default; the catalogue's
    # key for that comparison is now CE_CHUNK_MEM=1 (<default> over 1)
    shutil.copy(REPO_BENCH / "earlier"
                / "levers-ce-chunk_h200_llama3-8B-8L_seq8192_ce-chunk-default-1.json", tmp_path)
    doc = levers.build(tmp_path)
    assert not rows(doc, "CE_CHUNK_MEM=1")
    keys = [e["key"] for e in doc["levers"]]
    (eight,) = rows(doc, "CE_CHUNK_MEM=8")
    assert eight["set"] == "CE_CHUNK_MEM=8" and eight["baseline"] == "CE_CHUNK_MEM=1"
    assert eight["effect"]["verdict"] == "faster"
    assert keys.index("CE_CHUNK_MEM=8") < keys.index("CE_CHUNK_MEM=32")   # in catalogue order


def test_a_lever_that_changes_flops_per_token_shows_its_tflops_ratio(tmp_path):
    path = make_toggles_json(tmp_path, "seq", "2026-11-30T00:00:00", BenchShape(),
                             {"default": 35000, "SEQ_LENGTH": 35000, "MBS": 35500},
                             ["SEQ_LENGTH", "MBS"])
    data = json.loads(path.read_text())
    for point in data["points"]:          # half the sequence: fewer FLOPs per token
        if point["config"] == "SEQ_LENGTH":
            point["model_tflops_per_gpu"] *= 0.95
    path.write_text(json.dumps(data))
    doc = levers.build(tmp_path)
    (seq,) = rows(doc, "SEQ_LENGTH")
    assert seq["tflops_ratio"] == pytest.approx(0.95 * seq["effect"]["tokens_per_s_ratio"])
    assert seq["notes"].startswith(f"model TFLOP/s ratio {seq['tflops_ratio']:.3f}x; ")
    (mbs,) = rows(doc, "MBS")           # same FLOPs per token: no such note
    assert "TFLOP/s ratio" not in mbs["notes"]
