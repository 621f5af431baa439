"""The MoE parts of the benchmark harness: their own shape (Qwen3-30B-A3B cut to 8 layers, seq
4096), ours through the MoE family's script, the peers at that shape, the grouped-experts and
permute levers, planned and run with the fake runner (the launcher's real precheck)."""
from __future__ import annotations

import functools
import json
from pathlib import Path

from training.bench import __main__ as cli
from training.bench import catalog, plan
from training.bench.ours import precheck
from training.launch.presets import SCRIPTS

from tests.bench.fakes import FakeRunner

BENCH = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
TAG = "qwen3-30B-A3B-8L_seq4096"


def _tools(monkeypatch, tmp_path, runner):
    def tools(_args, family="llama3"):
        return (functools.partial(precheck, family=family), lambda side: None, runner,
                plan.calibrate(BENCH))

    monkeypatch.setattr(cli, "_tools", tools)
    monkeypatch.setattr(cli.record, "BENCH_DIR", tmp_path / "committed")
    monkeypatch.setattr(cli.record, "gpu_info", lambda: {"name": "NVIDIA H200", "count": 1,
                                                         "driver": "580.0"})


def test_moe_parts_come_last_at_one_gpu_with_their_own_shape():
    names = [part for _kind, part, _keys in cli.parts_for(1)]
    assert names[-17:] == ["moe-peers", "moe-levers", "moe-peers-torchtitan",
                           "moe-levers-permute", "moe-levers-host", "moe-levers-sync",
                           "moe-levers-syncfree", "moe-levers-lean", "moe-levers-graph",
                           "moe-levers-lean-mixtral", "moe-peers-compile", "moe-levers-ce",
                           "moe-levers-wgrad", "moe-peers-compile-mixtral", "gpt-oss-peers",
                           "gpt-oss-levers-mbs", "moe-levers-mbs-mixtral"]
    assert catalog.PART_SHAPES["moe-peers-compile-mixtral"] == catalog.MIXTRAL_SHAPE
    # the micro-batch rows the pre-flight's choice needs, at each family's own bench shape
    assert catalog.PART_SHAPES["moe-levers-mbs-mixtral"] == catalog.MIXTRAL_SHAPE
    assert catalog.PART_SHAPES["gpt-oss-levers-mbs"] == catalog.GPT_OSS_SHAPE
    assert "moe-peers" not in [part for _k, part, _ks in cli.parts_for(2)]
    shape = catalog.MOE_SHAPE
    assert shape.preset == "qwen3-30B-A3B" and shape.tag() == TAG
    assert (shape.seq_length, shape.global_batch, shape.repeats) == (4096, 8, 2)
    # the lean step's default CUDA graph is captured at iteration 4: measured after it
    assert shape.warmup >= 4
    assert SCRIPTS[shape.family] == "examples/moe/train_qwen3_moe.sh"
    mixtral = catalog.PART_SHAPES["moe-levers-lean-mixtral"]
    assert mixtral.tag() == "mixtral-8x7B-4L_seq4096" and mixtral.backend == "native"
    assert SCRIPTS[mixtral.family] == "examples/moe/train_mixtral.sh"


def test_the_wgrad_part_measures_the_fusion_against_it_off_now_it_is_the_default():
    """MOE_WGRAD_FUSION is on by default on SM90: the part's baseline sets it to 0, so its
    configurations stay "default" (off) and "MOE_WGRAD_FUSION=1", as recorded."""
    shape = catalog.PART_SHAPES["moe-levers-wgrad"]
    assert dict(shape.toggles) == {"MOE_WGRAD_FUSION": "0"} and shape.tag() == TAG
    lever = next(lever for lever in catalog.moe_levers() if lever.key == "MOE_WGRAD_FUSION=1")
    assert lever.env == {"MOE_WGRAD_FUSION": "1"} and lever.baseline == "MOE_WGRAD_FUSION=0"


def test_moe_parts_plan_and_run(monkeypatch, tmp_path, capsys):
    runner = FakeRunner(speed={"default": 9000.0, "native": 9000.0, "hf": 7000.0,
                               "hf_liger": 8000.0, "torchtitan": 8500.0,
                               "MOE_GROUPED_GEMM": 3000.0, "MOE_PERMUTE_FUSION": 8700.0,
                               "MBS": 9900.0,
                               "BIAS_DROPOUT_FUSION=0": 8900.0,
                               "MANUAL_GC_INTERVAL=100": 9000.0})
    _tools(monkeypatch, tmp_path, runner)
    out = tmp_path / "out"
    assert cli.main(["all", "--gpus", "1", "--parts",
                     "moe-peers,moe-levers,moe-peers-torchtitan,moe-levers-permute,"
                     "moe-levers-host",
                     "--out-dir", str(out), "--budget-s", "100000"]) == 0
    text = capsys.readouterr().out
    assert f"moe-peers_h200_{TAG}: 6 runs" in text and f"moe-levers_h200_{TAG}: 4 runs" in text
    levers = json.loads((out / f"moe-levers_h200_{TAG}.json").read_text())
    assert levers["shape"]["model"] == "qwen3-30B-A3B" and levers["shape"]["num_layers"] == 8
    assert levers["default_resolved"]["MOE_GROUPED_GEMM"] == "1"
    rows = {r["key"]: r for r in levers["results"]}
    assert rows["MOE_GROUPED_GEMM"]["verdict"] == "faster"      # grouped vs the loop
    assert rows["MOE_GROUPED_GEMM"]["tokens_per_s_ratio"] > 2
    peers = json.loads((out / f"moe-peers_h200_{TAG}.json").read_text())
    assert {c["id"] for c in peers["configs"]} == {"native", "hf", "hf_liger"}
    titan = json.loads((out / f"moe-peers-torchtitan_h200_{TAG}.json").read_text())
    assert {c["id"] for c in titan["configs"]} == {"native", "torchtitan"}
    permute = json.loads((out / f"moe-levers-permute_h200_{TAG}.json").read_text())
    assert [r["key"] for r in permute["results"]] == ["MOE_PERMUTE_FUSION"]
    host = json.loads((out / f"moe-levers-host_h200_{TAG}.json").read_text())
    assert [r["key"] for r in host["results"]] == ["MBS", "BIAS_DROPOUT_FUSION=0",
                                                   "MANUAL_GC_INTERVAL=100"]
    gc = next(c for c in host["configs"] if c["id"] == "MANUAL_GC_INTERVAL=100")
    assert gc["env"]["MANUAL_GC_INTERVAL"] == "100"
    assert host["shape"]["model"] == "qwen3-30B-A3B"
    mbs = next(c for c in host["configs"] if c["id"] == "MBS")
    assert mbs["env"]["MBS"] == "2"
    ours = [s for s in runner.calls if s.side == "ours"]
    assert ours and all(s.shape.family == "qwen3_moe" for s in ours)
    assert all(s.env["MODEL_SIZE"] == "30B-A3B" and s.env["NUM_LAYERS"] == "8" for s in ours)
