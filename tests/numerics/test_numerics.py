"""The comparison rules and the parts' run lists, with a fake runner (no GPU)."""
from __future__ import annotations

import math
from pathlib import Path

from training import numerics


def fake_runner(curves: dict[str, list[float]]):
    def run(label, toggles, experiment_dir, log_dir):
        losses = curves.get(label)
        if losses is None:
            return {"returncode": 1, "error": "boom"}
        return {"returncode": 0, "samples": {"iteration": list(range(1, len(losses) + 1)),
                                             "loss": losses}}
    return run


def curve(start=10.0, drift=0.0):
    return [start - 0.1 * i + drift * i for i in range(numerics.ITERS)]


def test_layout_parts_compare_the_right_runs(tmp_path):
    part = numerics.parts(None, tmp_path / "ckpt")["layouts"]
    labels = {s.label: s.toggles for s in part.runs}
    assert labels["dp1"]["GPUS_PER_NODE"] == "1" and labels["dp2"]["GPUS_PER_NODE"] == "2"
    assert labels["tp2"]["TP"] == "2" and labels["tp2"]["SAVE"].endswith("ckpt")
    assert labels["dp2_resumed_from_tp2"]["EXTRA_MEGATRON_ARGS"] == "--ckpt-step 25"
    same = {k: v for k, v in labels["dp1"].items() if k != "GPUS_PER_NODE"}
    assert all(labels["dp2"][k] == v for k, v in same.items())  # same batch, seed, data


def test_agree_within_tolerance_and_differ_beyond(tmp_path):
    part = numerics.parts(None, tmp_path / "c")["layouts"]
    close = {"dp1": curve(), "dp2": [x * 1.001 for x in curve()], "tp2": curve(),
             "dp2_fp32_reduce": curve(), "dp2_resumed_from_tp2": curve()}
    result = numerics.run_part(part, tmp_path, fake_runner(close))
    verdicts = {c["name"]: c for c in result["comparisons"]}
    assert verdicts["DP=2 vs DP=1"]["verdict"] == "agree"
    assert verdicts["TP=2 (+SP) vs TP=1"]["bitwise"] is True
    assert verdicts["resume at DP=2 from a TP=2 checkpoint"]["iterations"] == [26, 50]
    far = dict(close, dp2=[x * 1.05 for x in curve()])
    result = numerics.run_part(part, tmp_path, fake_runner(far))
    dp = next(c for c in result["comparisons"] if c["name"] == "DP=2 vs DP=1")
    assert dp["verdict"] == "differ" and not dp["ok"] and dp["max_rel_diff"] > 0.04


def test_missing_runs_and_non_finite_losses_fail(tmp_path):
    part = numerics.parts(None, tmp_path / "c")["toggles"]
    curves = {s.label: curve() for s in part.runs}
    curves["dp2_grad_reduce_in_bf16_off"] = curve()[:-1] + [math.nan]
    del curves["tp2_fused_single_qkv_rope_off"]
    result = numerics.run_part(part, tmp_path, fake_runner(curves))
    by_name = {c["name"]: c for c in result["comparisons"]}
    assert by_name["dp2: GRAD_REDUCE_IN_BF16=0"]["verdict"] == "non-finite loss"
    assert by_name["tp2: FUSED_SINGLE_QKV_ROPE=0"]["verdict"].startswith("incomplete")
    assert by_name["dp2: all toggles on"]["ok"] and len(result["comparisons"]) == 12


def test_table_is_generated_from_results(tmp_path):
    part = numerics.parts(None, tmp_path / "c")["layouts"]
    curves = {s.label: curve() for s in part.runs}
    result = numerics.run_part(part, tmp_path, fake_runner(curves))
    result["source"] = "numerics_layouts.json"
    text = numerics.table([result])
    assert "| layouts | DP=2 vs DP=1 | agree | 0.00e+00 | 1% |" in text
    assert "`numerics_layouts.json`" in text


def test_budget_stops_starting_runs_and_says_which_were_not_run(tmp_path):
    part = numerics.parts(None, tmp_path / "c")["layouts"]
    ticks = iter(range(0, 1000, 100))  # each clock read advances 100 s
    result = numerics.run_part(part, tmp_path, fake_runner({s.label: curve() for s in part.runs}),
                               budget_s=350, clock=lambda: next(ticks))
    assert list(result["runs"]) == ["dp1", "dp2", "tp2"]
    assert result["not_run"] == ["dp2_fp32_reduce", "dp2_resumed_from_tp2"]
    by_name = {c["name"]: c for c in result["comparisons"]}
    assert by_name["DP=2 vs DP=1"]["ok"]
    assert by_name["resume at DP=2 from a TP=2 checkpoint"]["verdict"] == \
        "incomplete: dp2_resumed_from_tp2"


def test_table_tells_not_run_from_failed(tmp_path):
    part = numerics.parts(None, tmp_path / "c")["layouts"]
    curves = {s.label: curve() for s in part.runs if s.label != "dp2"}
    ticks = iter(range(0, 1000, 100))
    result = numerics.run_part(part, tmp_path, fake_runner(curves), budget_s=350,
                               clock=lambda: next(ticks))
    result["source"] = "x.json"
    text = numerics.table([result])
    assert "| DP=2 vs DP=1 | incomplete: dp2 (exit code 1) |" in text
    assert "| resume at DP=2 from a TP=2 checkpoint | not run yet (time budget of the call) |" \
        in text


def test_docs_table_is_generated_from_the_committed_jsons():
    repo = Path(__file__).resolve().parents[2]
    jsons = sorted((repo / "docs" / "benchmarks").glob("numerics_*.json"))
    assert jsons, "no numerics JSON committed"
    assert numerics.table(numerics.load_results(jsons)) in \
        (repo / "docs" / "numerics.md").read_text(), \
        "docs/numerics.md is stale: paste `python -m training.numerics table docs/benchmarks/numerics_*.json`"


def test_reuse_keeps_completed_runs_and_reruns_checkpoint_runs_and_failures(tmp_path):
    import json

    part = numerics.parts(None, tmp_path / "c")["layouts"]
    first = numerics.run_part(part, tmp_path, fake_runner(
        {s.label: curve() for s in part.runs if s.label != "dp2_resumed_from_tp2"}))
    first.update(git_sha="abc", created="earlier")
    previous = json.loads(json.dumps(first))  # as read back from disk: string iteration keys
    reuse = numerics.reusable_runs(part, previous)
    assert sorted(reuse) == ["dp1", "dp2", "dp2_fp32_reduce"]  # tp2 saves: rerun
    ran = []

    def runner(label, toggles, experiment_dir, log_dir):
        ran.append(label)
        return fake_runner({label: curve()})(label, toggles, experiment_dir, log_dir)

    second = numerics.run_part(part, tmp_path, runner, reuse=reuse)
    assert ran == ["tp2", "dp2_resumed_from_tp2"]
    assert second["runs"]["dp1"]["reused_from"] == {"git_sha": "abc", "created": "earlier"}
    assert "reused_from" not in second["runs"]["tp2"]
    assert all(c["ok"] for c in second["comparisons"])
    changed = json.loads(json.dumps(first))
    changed["runs"]["dp1"]["toggles"]["LR"] = "1e-3"  # other toggles: not the same run
    assert "dp1" not in numerics.reusable_runs(part, changed)
