"""The advisor's flow on recorded manifests and runs: memory-bound, throughput-bound, and a
run where every lever that applies is already on."""
from __future__ import annotations

import json

import pytest

from .helpers import (DRY_70B, DRY_ALL_ON, DRY_SEQ32K, FIXTURE, FULL_32L, LOCAL, MOE_CORE,
                      MOE_LEAN, NATIVE, PROFILED, REPO, advise, copy_run, edit_manifest, fixture_levers, run_cli,
                      write_levers)

PERF = ("GRADIENT_ACCUMULATION_FUSION", "GRAD_REDUCE_IN_BF16", "DDP_AVERAGE_IN_COLLECTIVE",
        "CROSS_ENTROPY_LOSS_FUSION", "FUSED_SINGLE_QKV_ROPE")


def _entry(set_text: str) -> dict:
    return next(e for e in fixture_levers()["levers"] if e["set"] == set_text)


# -- memory-bound -----------------------------------------------------------------------------

def test_memory_bound_long_sequence_dry_run(tmp_path, capsys):
    out_json = tmp_path / "opt.json"
    code, out, err = run_cli(capsys, DRY_SEQ32K, "--levers", FIXTURE, "--platform", "h200",
                             "--json", out_json)
    print(out)
    assert code == 0, err
    report = json.loads(out_json.read_text())
    assert report["dry_run"] is True
    assert report["bottleneck"]["kind"] == "memory-bound"
    assert any("above 90%" in r for r in report["bottleneck"]["memory_reasons"])
    assert report["shape"]["long_sequence"] is True
    recs = report["recommendations"]
    assert [r["set"] for r in recs] == ["MBS=1", "TP=2"]
    # cumulative estimates fall, and the last one fits under 90% of the H200
    peaks = [r["estimate"]["peak_gib"] for r in recs]
    assert peaks == sorted(peaks, reverse=True)
    assert recs[-1]["estimate"]["fits"] is True
    assert report["memory"]["estimate"]["fits"] is False
    assert report["verdict"].startswith("fits with the levers below")
    # the MBS entry of the levers file compares 2 vs 1, not 1 vs 4: quoted, and marked so
    mbs = recs[0]
    assert mbs["status"] == "measured" and mbs["measured"]["exact"] is False
    assert "different comparison" in mbs["measured_text"]
    assert recs[1]["status"] == "not measured yet"
    assert report["command"].endswith("MBS=1 GPUS_PER_NODE=8 TP=2")
    assert "1. MBS=1" in out and "2. TP=2" in out and "(not measured yet)" in out


def test_memory_bound_70b_on_one_gpu_needs_more_gpus():
    report = advise(DRY_70B)
    json.dumps(report)                                  # plain JSON, no objects left in it
    assert report["shape"]["platform"] == "h200"        # PLATFORM=h200 in the manifest
    assert report["bottleneck"]["kind"] == "memory-bound"
    est = report["memory"]["estimate"]
    assert est["peak_phase"] == "optimizer step"
    rec = report["recommendations"][-1]
    assert rec["id"] == "more_gpus"
    assert int(rec["sets"]["NNODES"]) * int(rec["sets"]["GPUS_PER_NODE"]) > 1
    assert rec["estimate"]["fits"] is True


def test_out_of_memory_in_the_log_makes_a_run_memory_bound(tmp_path):
    run = copy_run(NATIVE, tmp_path / "run")
    (run / "train.log").write_text(
        "iteration 1\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.91 GiB.\n")
    report = advise(run)
    assert report["bottleneck"]["kind"] == "memory-bound"
    assert "CUDA out of memory" in report["bottleneck"]["memory_reasons"][0]
    # the estimate fits: the advisor says the formula misses it, and proposes no lever
    # that costs speed before the peak is measured
    assert report["verdict"].startswith("the run ran out of memory although the estimate fits")
    assert all(not r["costs_throughput"] for r in report["recommendations"])


@pytest.mark.parametrize("seq,fits", [(65536, True), (131072, False)])
def test_asked_longer_sequence_is_estimated(seq, fits):
    report = advise(NATIVE, seq_length=seq)
    assert report["bottleneck"]["kind"] == "memory-bound"
    assert report["asked"]["seq_length"] == seq
    asked = report["memory"]["asked_estimate"]
    assert asked["fits"] is fits
    assert asked["peak_gib"] > report["memory"]["estimate"]["peak_gib"]
    if fits:
        assert report["recommendations"] == []
    else:
        sets = [r["set"] for r in report["recommendations"]]
        # one GPU: no layout to change; the optimizer state's levers come before recompute
        assert sets == ["ADAM_MOMENTS_DTYPE=bf16", "MASTER_WEIGHTS=stochastic",
                        "RECOMPUTE=full"]
        full = report["recommendations"][-1]
        assert full["measured"]["entry"]["effect"]["tokens_per_s_ratio"] == \
            _entry("RECOMPUTE=full")["effect"]["tokens_per_s_ratio"]
        assert "SEQ_LENGTH=131072" in report["command"]


def test_asked_global_batch_is_called_out_as_not_a_memory_lever():
    report = advise(NATIVE, global_batch=64)
    ids = [d["id"] for d in report["dead_ends"]]
    assert "global_batch_for_memory" in ids
    assert report["memory"]["asked_estimate"]["peak_gib"] == pytest.approx(
        report["memory"]["estimate"]["peak_gib"])


# -- throughput-bound ----------------------------------------------------------------------------

def test_throughput_bound_compute_bound_from_the_trace_report(tmp_path, capsys):
    run = copy_run(PROFILED, tmp_path / "run")
    code, out, err = run_cli(capsys, run, "--levers", FIXTURE)
    print(out)
    assert code == 0, err
    report = json.loads((run / "optimize.json").read_text())
    neck = report["bottleneck"]
    assert neck["kind"] == "throughput-bound" and neck["split"] == "compute-bound"
    assert "compute-bound" in neck["split_evidence"]
    recs = report["recommendations"]
    assert [r["set"] for r in recs] == ["MBS=2"]
    mbs = recs[0]
    assert mbs["status"] == "measured" and mbs["measured"]["exact"] is True
    ratio = _entry("MBS=2")["effect"]["tokens_per_s_ratio"]
    assert f"x{ratio:.3f} tokens/s" in mbs["measured_text"]
    assert "source tests/data/levers_fixture.json" in mbs["measured_text"]
    assert mbs["estimate"]["fits"] is True
    dead = {d["id"]: d for d in report["dead_ends"]}
    assert "reduce_overhead" in dead and "4.1% idle" in dead["reduce_overhead"]["why"]
    assert dead["low_precision_compute"]["measured"]["entry"]["effect"]["verdict"] == "refused"
    assert dead["recompute_for_speed"]["measured"]["entry"]["set"] == "RECOMPUTE=full"
    on = {item["toggle"]: item for item in report["already_on"]}
    for name in PERF:
        assert on[name]["status"] == "on by default: no action"
    assert "1. MBS=2" in out and "Dead ends" in out and "Already on" in out


def test_throughput_bound_local_backend_switch_is_measured(capsys, tmp_path):
    report = advise(LOCAL)
    neck = report["bottleneck"]
    assert neck["kind"] == "throughput-bound" and neck["split"] == "unknown"
    assert neck["measure_first"] and "PROFILE=torch" in neck["measure_first"]
    rec = report["recommendations"][0]
    assert rec["set"] == "TRANSFORMER_IMPL=native"
    entry = _entry("TRANSFORMER_IMPL=native")
    assert f"x{entry['effect']['tokens_per_s_ratio']:.3f}" in rec["measured_text"]
    assert "GRADIENT_ACCUMULATION_FUSION" in rec["why"]
    off = {item["toggle"]: item for item in report["turned_off"]}
    assert off["GRADIENT_ACCUMULATION_FUSION"]["source"] == "guard"
    assert "apex" in off["GRADIENT_ACCUMULATION_FUSION"]["status"]
    # no MBS=2 here: the local backend's estimate at MBS=2 does not fit
    assert all(r["id"] != "mbs_up" for r in report["recommendations"])


def test_quotes_come_from_the_levers_file_not_from_the_advisor(tmp_path):
    data = fixture_levers()
    for entry in data["levers"]:
        if entry["set"] == "MBS=2":
            entry["effect"]["tokens_per_s_ratio"] = 1.234
            entry["source"] = "docs/benchmarks/elsewhere.json"
    levers = write_levers(tmp_path / "levers.json", data)
    report = advise(PROFILED, levers=levers)
    text = report["recommendations"][0]["measured_text"]
    assert "x1.234 tokens/s" in text and "source docs/benchmarks/elsewhere.json" in text


def test_a_user_switched_off_perf_toggle_is_recommended_back_or_flagged(tmp_path):
    run = copy_run(NATIVE, tmp_path / "run")

    def switch_off(m):
        for row in m["toggles"]:
            if row["toggle"] in ("CROSS_ENTROPY_LOSS_FUSION", "GRAD_REDUCE_IN_BF16"):
                row.update(value="0", source="env")
        m["values"]["CROSS_ENTROPY_LOSS_FUSION"] = False
        m["values"]["GRAD_REDUCE_IN_BF16"] = False
    edit_manifest(run, switch_off)
    report = advise(run)
    sets = [r["set"] for r in report["recommendations"]]
    # measured faster in the levers file -> recommended
    assert "CROSS_ENTROPY_LOSS_FUSION=1" in sets
    # measured within noise at the closest shape -> a dead end with its quote
    dead = {d["id"]: d for d in report["dead_ends"]}
    assert "GRAD_REDUCE_IN_BF16=1" not in sets
    assert "within noise" in dead["on:GRAD_REDUCE_IN_BF16"]["why"]
    off = {i["toggle"]: i for i in report["turned_off"]}
    assert off["GRAD_REDUCE_IN_BF16"]["status"].startswith("off: you set")


def _switch_off(*names):
    def edit(m):
        for row in m["toggles"]:
            if row["toggle"] in names:
                row.update(value="0", source="env")
        for name in names:
            m["values"][name] = False
        if "DISTRIBUTED_OPTIMIZER" in names:
            m["layout"]["distributed_optimizer"] = False
    return edit


def test_the_distributed_optimizer_switched_off_at_dp2_is_recommended_back(tmp_path):
    run = copy_run(FULL_32L, tmp_path / "run")           # DP=2
    edit_manifest(run, _switch_off("DISTRIBUTED_OPTIMIZER"))
    data = fixture_levers()
    entry = json.loads(json.dumps(_entry("GRAD_REDUCE_IN_BF16=1")))
    entry.update(id="DISTRIBUTED_OPTIMIZER", key="DISTRIBUTED_OPTIMIZER",
                 set="DISTRIBUTED_OPTIMIZER=1", baseline="DISTRIBUTED_OPTIMIZER=0")
    entry["effect"].update(tokens_per_s_ratio=1.02, ratio_spread=0.001, verdict="faster")
    entry["shape"].update(gpus=2, dp=2)
    data["levers"].append(entry)
    report = advise(run, levers=write_levers(tmp_path / "levers.json", data))
    rec = next(r for r in report["recommendations"] if r["set"] == "DISTRIBUTED_OPTIMIZER=1")
    assert rec["status"] == "measured" and "x1.020 tokens/s" in rec["measured_text"]
    # sharding the fp32 state over two ranks lowers the estimated peak
    assert rec["estimate"]["peak_gib"] < report["memory"]["estimate"]["peak_gib"]


def test_data_parallel_toggles_switched_off_at_dp1_stay_off_with_the_reason(tmp_path):
    run = copy_run(NATIVE, tmp_path / "run")              # one GPU
    edit_manifest(run, _switch_off("DISTRIBUTED_OPTIMIZER", "OVERLAP_GRAD_REDUCE"))
    report = advise(run)
    sets = [r["set"] for r in report["recommendations"]]
    assert "DISTRIBUTED_OPTIMIZER=1" not in sets and "OVERLAP_GRAD_REDUCE=1" not in sets
    said = [c for c in report["considered"] if "DP x CP = 1" in c]
    assert [c.split("=")[0] for c in said] == ["DISTRIBUTED_OPTIMIZER", "OVERLAP_GRAD_REDUCE"]


def test_a_lever_measured_only_at_batch_1_is_not_chased(tmp_path):
    data = fixture_levers()
    for entry in data["levers"]:
        if entry["set"] == "MBS=2":
            entry["shape"]["global_batch"] = 1
    report = advise(PROFILED, levers=write_levers(tmp_path / "levers.json", data))
    assert report["recommendations"] == []
    dead = {d["id"]: d for d in report["dead_ends"]}
    assert "batch 1" in dead["mbs_up"]["why"]


def test_without_a_levers_file_every_lever_is_mechanism_only():
    report = advise(PROFILED, levers=None)
    assert report["levers_file"]["path"] is None
    rec = report["recommendations"][0]
    assert rec["status"] == "not measured yet" and rec["measured"] is None
    assert "recommended on mechanism only" in rec["measured_text"]


# -- every lever already on ------------------------------------------------------------------------

def test_every_lever_already_on(tmp_path, capsys):
    out_json = tmp_path / "opt.json"
    code, out, err = run_cli(capsys, DRY_ALL_ON, "--levers", FIXTURE, "--platform", "h200",
                             "--json", out_json)
    print(out)
    assert code == 0, err
    report = json.loads(out_json.read_text())
    assert report["bottleneck"]["kind"] == "throughput-bound"
    assert report["memory"]["estimate"]["fits"] is True
    assert report["recommendations"] == []
    assert report["verdict"] == "every lever that applies to this shape is already on"
    assert report["command"] is None
    on = {item["toggle"]: item for item in report["already_on"]}
    for name in PERF + ("DISTRIBUTED_OPTIMIZER", "OVERLAP_GRAD_REDUCE", "OVERLAP_PARAM_GATHER"):
        assert on[name]["value"] == "1" and on[name]["source"] == "default"
    assert report["turned_off"] == []
    # the one lever left for this shape, a bigger micro-batch, does not fit: said so
    assert report["considered"] and report["considered"][0].startswith("MBS=4: estimate")
    assert "above 90%" in report["considered"][0]
    assert "every lever that applies to this shape is already on" in out
    assert "nothing to change" in out


@pytest.mark.parametrize("kind,expected", [
    ("communication-bound", ["MBS=2"]),
    ("idle/launch-bound", ["MBS=2", "NUM_WORKERS=4"]),
])
def test_the_trace_verdict_picks_the_throughput_levers(tmp_path, kind, expected):
    run = copy_run(PROFILED, tmp_path / "run")
    report_path = run / "trace_report.json"
    trace = json.loads(report_path.read_text())
    trace["overall"]["verdict"] = {"kind": kind, "line": f"{kind}: edited for the test"}
    trace["overall"]["ranges"]["train/data"]["pct_of_steps"] = 12.0
    report_path.write_text(json.dumps(trace))
    report = advise(run)
    assert report["bottleneck"]["split"] == kind
    assert [r["set"] for r in report["recommendations"]] == expected
    dead = [d["id"] for d in report["dead_ends"]]
    # launch overhead is the limit on an idle-bound step: CUDA graphs are no dead end there
    assert ("reduce_overhead" in dead) is (kind != "idle/launch-bound")


def test_a_measured_peak_above_90_percent_outranks_the_estimate(tmp_path):
    run = copy_run(NATIVE, tmp_path / "run")
    edit_manifest(run, lambda m: m["run"]["summary"].update(
        peak_allocated_gib_max_over_ranks=130.0))
    report = advise(run)
    assert report["bottleneck"]["kind"] == "memory-bound"
    assert any("measured peak 130.0 GiB" in r and "above 90%" in r
               for r in report["bottleneck"]["memory_reasons"])
    assert report["verdict"].startswith("the run peaked at 130.0 GiB (above 90%) although "
                                        "the estimate fits")
    assert report["memory"]["calibration"]["error_pct"] < -50


def test_recompute_off_is_quoted_from_the_reverse_measurement(tmp_path):
    run = copy_run(NATIVE, tmp_path / "run")

    def full(m):
        for row in m["toggles"]:
            if row["toggle"] == "RECOMPUTE":
                row.update(value="full", source="env")
        m["values"]["RECOMPUTE"] = "full"
    edit_manifest(run, full)
    report = advise(run)
    rec = next(r for r in report["recommendations"] if r["id"] == "recompute_off")
    assert rec["set"] == "RECOMPUTE=none"
    assert rec["measured"]["reverse"] is True
    assert rec["measured"]["entry"]["set"] == "RECOMPUTE=full"
    assert rec["measured"]["verdict_for_this_lever"] == "faster"     # the entry says slower
    assert "x0.748" in rec["measured_text"] and "other way round" in rec["measured_text"]


def test_a_default_on_toggle_measured_slower_is_flagged_not_waved_through(tmp_path):
    data = fixture_levers()
    for entry in data["levers"]:
        if entry["set"] == "CROSS_ENTROPY_LOSS_FUSION=1":
            entry["effect"].update(tokens_per_s_ratio=0.985, verdict="slower")
    report = advise(NATIVE, levers=write_levers(tmp_path / "levers.json", data))
    on = {i["toggle"]: i for i in report["already_on"]}
    status = on["CROSS_ENTROPY_LOSS_FUSION"]["status"]
    assert status.startswith("on, but measured slower than CROSS_ENTROPY_LOSS_FUSION=0")
    assert "x0.985 tokens/s" in status and "Try CROSS_ENTROPY_LOSS_FUSION=0" in status
    # measured faster (the fixture as it is): no action
    report = advise(NATIVE)
    on = {i["toggle"]: i for i in report["already_on"]}
    assert on["CROSS_ENTROPY_LOSS_FUSION"]["status"] == "on by default: no action"


def test_liger_cross_entropy_chunking_is_recommended_from_its_measurement(tmp_path):
    run = copy_run(NATIVE, tmp_path / "run")

    def liger_chunks(m):
        m["toggles"].append({"toggle": "CE_CHUNK_MEM", "value": "1", "source": "env",
                             "reason": ""})
        m["values"]["CE_CHUNK_MEM"] = 1
    edit_manifest(run, liger_chunks)
    data = fixture_levers()
    committed = json.loads((REPO / "docs" / "levers.json").read_text())
    measured = [e for e in committed["levers"] if e["set"] == "CE_CHUNK_MEM=8"
                and e["baseline"] == "CE_CHUNK_MEM=1"]
    assert measured, "docs/levers.json measures CE_CHUNK_MEM=8 against 1"
    data["levers"] += measured
    report = advise(run, levers=write_levers(tmp_path / "levers.json", data))
    rec = next(r for r in report["recommendations"] if r["id"] == "ce_chunk")
    assert rec["set"] == "CE_CHUNK_MEM=8" and rec["status"] == "measured"
    ratio = measured[0]["effect"]["tokens_per_s_ratio"]
    assert f"x{ratio:.3f} tokens/s" in rec["measured_text"]
    assert "CE_CHUNK_MEM=1 runs the fused linear cross-entropy" in rec["why"]
    # a manifest from before the toggle says nothing about its chunking: no recommendation
    assert all(r["id"] != "ce_chunk" for r in advise(NATIVE)["recommendations"])


def test_a_cuda_graph_is_recommended_only_for_a_step_without_host_reads(tmp_path):
    """CUDA_GRAPH=full_iteration is proposed where the guard cuda_graph would take the run as
    it is (the lean MoE step: counts on the GPU, Megatron's cross-entropy), quoted from its
    measured row; not where the step reads the GPU from the host (the MoE core defaults'
    host counts), not on a dense model (its graph is unmeasured), nor where it is already on."""
    committed = json.loads((REPO / "docs" / "levers.json").read_text())
    measured = [e for e in committed["levers"] if e["set"] == "CUDA_GRAPH=full_iteration"]
    assert measured, "docs/levers.json measures CUDA_GRAPH=full_iteration"
    data = fixture_levers()
    data["levers"] += measured
    levers = write_levers(tmp_path / "levers.json", data)
    rec = next(r for r in advise(MOE_LEAN, levers=levers)["recommendations"]
               if r["id"] == "cuda_graph")
    assert rec["set"] == "CUDA_GRAPH=full_iteration" and rec["status"] == "measured"
    assert f"x{measured[0]['effect']['tokens_per_s_ratio']:.3f} tokens/s" in rec["measured_text"]
    for run in (MOE_CORE, NATIVE):
        assert all(r["id"] != "cuda_graph"
                   for r in advise(run, levers=levers)["recommendations"]), run.name
    graphed = copy_run(MOE_LEAN, tmp_path / "graphed")
    edit_manifest(graphed, lambda m: m["values"].update(CUDA_GRAPH="full_iteration"))
    assert all(r["id"] != "cuda_graph"
               for r in advise(graphed, levers=levers)["recommendations"])


def test_a_lever_that_ran_out_of_memory_is_a_dead_end(tmp_path):
    data = fixture_levers()
    for entry in data["levers"]:
        if entry["set"] == "MBS=2":
            entry["effect"].update(tokens_per_s_ratio=None, ratio_spread=None,
                                   verdict="set out of memory")
    report = advise(PROFILED, levers=write_levers(tmp_path / "levers.json", data))
    assert all(r["set"] != "MBS=2" for r in report["recommendations"])
    dead = {d["id"]: d for d in report["dead_ends"]}
    assert "ran out of GPU memory" in dead["mbs_up"]["why"]
