"""Wall-time estimates: calibrated from the recorded H200 run; every `bench all` part fits
one command under 9 minutes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.bench import plan, sweep
from training.bench.__main__ import parts_for
from training.bench.catalog import select
from training.bench.ours import precheck
from training.bench.shape import BenchShape
from training.bench.suites import peer_configs, toggle_configs


BENCH = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
BUDGET_S = 510  # `bench all`'s default: 9 minutes less start-up and the header/probes


def test_calibration_comes_from_the_recorded_run(tmp_path):
    first = BENCH / "earlier" / "peers_h200_llama3-8B-8L_seq8192_1repeat.json"
    (tmp_path / "peers_h200_llama3-8B-8L_seq8192.json").write_text(first.read_text())
    cal = plan.calibrate(tmp_path)
    peers = json.loads(first.read_text())
    native = next(p for p in peers["points"] if p["name"] == "native")
    assert cal.overhead_s["ours"] == pytest.approx(native["wall_s"]
                                                   - sum(native["samples"]["step_time_s"]))
    assert cal.tflops["ours"] == pytest.approx(native["model_tflops_per_gpu"])
    assert "peers_h200" in cal.sources["overhead_s.ours"]
    assert "fallback" in cal.describe()   # the HF overhead was never recorded: said so


def test_estimate_grows_with_steps_and_slow_variants():
    cal = plan.calibrate(BENCH)
    shape = BenchShape()
    spec = sweep.PointSpec(0, "d", "default", 0, "ours", shape.env(), shape)
    longer = BenchShape(steps=20)
    spec20 = sweep.PointSpec(0, "d", "default", 0, "ours", longer.env(), longer)
    full = sweep.PointSpec(0, "f", "RECOMPUTE=full", 0, "ours",
                           {**shape.env(), "RECOMPUTE": "full"}, shape)
    assert plan.estimate(spec20, cal) > plan.estimate(spec, cal)
    assert plan.step_seconds(full, cal) > plan.step_seconds(spec, cal)
    # one default run: overhead + first-step extra + 7 steps of ~1.9 s at gb 8, seq 8192
    assert 40 < plan.estimate(spec, cal) < 70


def test_our_runs_are_calibrated_per_backend_and_family_where_recorded(tmp_path):
    """Session 10's plans said 47 s for a TE run that took ~70 s and 37 s for an MoE run that took
    ~45 s: one 'ours' figure pooled the native dense runs. Each recorded backend and family now
    has its own, and the side's pooled figure remains for the others."""
    for name in ("te-recipes_h200_llama3-8B-8L_seq8192.json",
                 "moe-levers-sync_h200_qwen3-30B-A3B-8L_seq4096.json",
                 "peers-te_h200_llama3-8B-8L_seq8192.json"):
        (tmp_path / name).write_text((BENCH / name).read_text())
    cal = plan.calibrate(tmp_path)
    te_points = [p for p in json.loads((BENCH / "te-recipes_h200_llama3-8B-8L_seq8192.json")
                                       .read_text())["points"] if p["config"] == "default"]
    te_key = "ours:transformer_engine:llama3"
    assert cal.tflops[te_key] == pytest.approx(
        sorted(p["model_tflops_per_gpu"] for p in te_points)[len(te_points) // 2])
    assert cal.sources[f"overhead_s.{te_key}"] == "te-recipes_h200_llama3-8B-8L_seq8192.json"
    assert {te_key, "ours:native:qwen3_moe", "ours:native:llama3"} <= set(cal.tflops)
    assert cal.tflops["ours:native:qwen3_moe"] < cal.tflops["ours:native:llama3"] / 2

    dense = BenchShape()
    te = BenchShape(backend="transformer_engine")
    moe = BenchShape(family="qwen3_moe", model_size="30B-A3B", num_layers=8, seq_length=4096,
                     steps=3)

    def spec(shape):
        return sweep.PointSpec(0, "d", "default", 0, "ours", shape.env(), shape)
    # the TE run's overhead is its own (a longer build than native's), the MoE step its own speed
    assert plan.estimate(spec(te), cal) > plan.estimate(spec(dense), cal) + 10
    moe_walls = [p["wall_s"] for p in json.loads(
        (BENCH / "moe-levers-sync_h200_qwen3-30B-A3B-8L_seq4096.json").read_text())["points"]]
    assert min(moe_walls) - 5 < plan.estimate(spec(moe), cal) < max(moe_walls) + 5
    # a family never recorded falls back to the side's pooled figure
    mixtral = BenchShape(family="mixtral", model_size="8x7B", num_layers=4)
    assert plan._figure(cal, "overhead_s", spec(mixtral)) == cal.overhead_s["ours"]


def test_peers_are_calibrated_per_family_where_recorded(tmp_path):
    """Session 11's plan said 16 s for HF + Liger's MoE run from its dense runs' overhead; the
    first took 195 s (Liger's MoE kernels' first compiles), the second 48."""
    for name in ("moe-peers_h200_qwen3-30B-A3B-8L_seq4096.json",
                 "peers_h200_llama3-8B-8L_seq8192.json"):
        (tmp_path / name).write_text((BENCH / name).read_text())
    cal = plan.calibrate(tmp_path)
    assert {"hf_liger:qwen3_moe", "hf_liger:llama3", "hf_liger"} <= set(cal.overhead_s)
    moe = BenchShape(family="qwen3_moe", model_size="30B-A3B", num_layers=8, seq_length=4096,
                     steps=3)
    liger = sweep.PointSpec(0, "hf_liger", "hf_liger", 0, "hf_liger", {}, moe)
    walls = [p["wall_s"] for p in json.loads(
        (BENCH / "moe-peers_h200_qwen3-30B-A3B-8L_seq4096.json").read_text())["points"]
        if p["config"] == "hf_liger"]
    assert min(walls) < plan.estimate(liger, cal) < max(walls)
    dense = sweep.PointSpec(0, "hf_liger", "hf_liger", 0, "hf_liger", {}, BenchShape())
    assert plan._figure(cal, "overhead_s", dense) == cal.overhead_s["hf_liger:llama3"]
    assert plan._figure(cal, "overhead_s", liger) == cal.overhead_s["hf_liger:qwen3_moe"]


@pytest.mark.parametrize("gpus", [1, 2])
def test_every_part_of_bench_all_fits_one_command(gpus, base_env):
    """With the real precheck on this node (no Transformer Engine, as the H200 image): the
    levers the launcher refuses are not planned. The MoE parts run on their own shape and
    family, as `bench all` runs them (resolved as llama3, their MOE_* levers were refused); so
    do the full-node parts (catalog.PART_SHAPES)."""
    from training.bench.catalog import PART_SHAPES

    cal = plan.calibrate(BENCH)
    for kind, part, keys in parts_for(gpus):
        shape = PART_SHAPES.get(part, BenchShape(gpus=gpus))

        def pre(toggles, family=shape.family):
            return precheck(toggles, family=family, environ=base_env)
        if kind == "toggles":
            configs, _ = toggle_configs(shape, select(shape, None, None, list(keys)), pre)
        else:
            configs = peer_configs(shape, list(keys), pre, lambda side: None)
        specs = sweep.order(configs, shape)
        total = sum(plan.estimate(s, cal) for s in specs)
        assert total <= BUDGET_S, (part, total)
        assert {s.repeat for s in specs} == set(range(shape.repeats)), part


def test_format_plan_lists_runs_total_and_refusals(base_env):
    cal = plan.calibrate(BENCH)
    shape = BenchShape()
    configs, _ = toggle_configs(shape, select(shape, ["GRAD_REDUCE_IN_BF16"], ["precision"]),
                                lambda toggles: precheck(toggles, environ=base_env))
    specs = sweep.order(configs, shape)
    text = plan.format_plan("[toggles] x", specs, [(c.id, c.status, c.message)
                                                   for c in configs if not c.runnable], cal, 60)
    assert f"{len(specs)} runs, estimated" in text and "over budget" in text
    assert "GRAD_REDUCE_IN_BF16=0" in text and "PRECISION=mxfp8: refused" in text


def test_gpt_oss_plans_flex_attentions_first_compile_until_recorded(tmp_path):
    """gpt-oss-peers (issue 41's bar): both sides compile flex attention at their first step, a
    cost no recorded MoE run had; the plan adds it until a gpt-oss run is recorded, and the part
    still plans inside `bench all`'s budget."""
    from training.bench.catalog import PART_SHAPES

    shape = PART_SHAPES["gpt-oss-peers"]
    specs = [sweep.PointSpec(0, side, side, 0, "ours" if side == "native" else side,
                             {**shape.env(), "TRANSFORMER_IMPL": "native"}
                             if side == "native" else {}, shape)
             for side in ("native", "hf_compile")]
    unrecorded = tmp_path / "unrecorded"   # the records of today, less any gpt-oss run
    unrecorded.mkdir()
    for path in BENCH.glob("*.json"):
        if not path.name.startswith("gpt-oss"):
            (unrecorded / path.name).write_text(path.read_text())
    cal = plan.calibrate(unrecorded)
    assert all(plan._flex_compile_s(s, cal) == plan.FLEX_COMPILE_S for s in specs)
    assert 2 * sum(plan.estimate(s, cal) for s in specs) <= BUDGET_S
    (tmp_path / "gpt-oss-peers_h200_gpt-oss-20b-8L_seq8192.json").write_text(json.dumps({
        "kind": "peers", "shape": {"family": "gpt_oss"}, "points": [
            {"config": "native", "backend": "native", "wall_s": 90.0, "model_tflops_per_gpu": 250,
             "samples": {"step_time_s": [40.0, 3.0, 3.0], "warmup": [True, False, False]}}]}))
    recorded = plan.calibrate(tmp_path)
    assert plan._flex_compile_s(specs[0], recorded) == 0.0   # its own first step now
    assert recorded.first_extra_s["ours:native:gpt_oss"] == pytest.approx(37.0)
    # a model without a window or sinks never had it
    dense = BenchShape()
    assert plan._flex_compile_s(sweep.PointSpec(0, "d", "default", 0, "ours", dense.env(),
                                                dense), cal) == 0.0
