"""The measuring loop: interleaved order, incremental writes, budget stop, crash safety."""
from __future__ import annotations

import json

import pytest

from training.bench import sweep
from training.bench.catalog import select
from training.bench.shape import BenchShape
from training.bench.suites import run_suite, toggle_configs
from training.bench.sweep import Config

from .fakes import HEADER, FakeRunner, fake_precheck

SHAPE = BenchShape(repeats=3)


def _configs(n: int = 3) -> list[Config]:
    return [Config("default", "ours")] + [Config(f"V{i}", "ours", {"X": str(i)})
                                          for i in range(1, n)]


def test_order_runs_each_config_once_per_repeat_rotated():
    specs = sweep.order(_configs(3), SHAPE)
    assert len(specs) == 9
    by_repeat = [[s.config for s in specs if s.repeat == r] for r in range(3)]
    assert by_repeat == [["default", "V1", "V2"], ["V1", "V2", "default"],
                         ["V2", "default", "V1"]]
    assert [s.index for s in specs] == list(range(9))
    assert len({s.label for s in specs}) == 9
    assert specs[1].env["X"] == "1" and specs[1].env["MBS"] == "1"  # shape + config env


def test_order_skips_configs_that_need_no_run():
    configs = _configs(3)
    configs[1].status, configs[1].message = "refused", "[guard] no"
    specs = sweep.order(configs, SHAPE)
    assert {s.config for s in specs} == {"default", "V2"} and len(specs) == 6


def test_every_point_is_written_before_the_next_runs(tmp_path):
    out = tmp_path / "r.json"
    runner = FakeRunner(json_path=out)
    result = sweep.run(dict(HEADER, kind="toggles"), _configs(3), SHAPE, runner,
                       lambda s: 1.0, out, budget_s=1e9)
    assert runner.on_disk == list(range(9))   # the file held every earlier point
    data = json.loads(out.read_text())
    assert data["complete"] is True and len(data["points"]) == 9 == len(result["points"])
    assert [p["order_index"] for p in data["points"]] == list(range(9))


def test_budget_stops_before_a_point_that_would_overrun(tmp_path):
    out = tmp_path / "r.json"
    now = [0.0]

    def runner(spec):
        now[0] += 10.0
        return FakeRunner()(spec)

    sweep.run(dict(HEADER, kind="toggles"), _configs(3), SHAPE, runner, lambda s: 10.0, out,
              budget_s=45.0, clock=lambda: now[0], log=lambda _m: None)
    data = json.loads(out.read_text())
    assert len(data["points"]) == 4
    assert data["complete"] is False
    assert data["stopped"].startswith("budget") and "V1-r1" not in data["stopped"]
    assert "default-r1" in data["stopped"]


def _toggle_configs(shape=SHAPE):
    levers = select(shape, ["GRAD_REDUCE_IN_BF16", "FUSED_SINGLE_QKV_ROPE"], ["none"])
    return toggle_configs(shape, levers, fake_precheck())


def test_a_crash_keeps_the_points_done(tmp_path):
    out = tmp_path / "r.json"
    fake = FakeRunner()

    def runner(spec):
        if spec.index == 5:
            raise RuntimeError("machine went away")
        return fake(spec)

    configs, values = _toggle_configs()
    with pytest.raises(RuntimeError, match="machine went away"):
        sweep.run(dict(HEADER, kind="toggles", default_resolved=values), configs, SHAPE,
                  runner, lambda s: 1.0, out, budget_s=1e9, log=lambda _m: None)
    data = json.loads(out.read_text())
    assert len(data["points"]) == 5 and data["complete"] is False
    assert [p["config"] for p in data["points"]] == [
        "default", "GRAD_REDUCE_IN_BF16", "FUSED_SINGLE_QKV_ROPE",
        "GRAD_REDUCE_IN_BF16", "FUSED_SINGLE_QKV_ROPE"]
    # results are recomputed from the points on every write: the default ran once so far
    assert {r["key"]: r["repeats"] for r in data["results"]} == {
        "GRAD_REDUCE_IN_BF16": 1, "FUSED_SINGLE_QKV_ROPE": 1}
    assert all(r["verdict"] != "not measured" for r in data["results"])


def test_effects_from_a_fake_sweep(tmp_path):
    """Turning a toggle off costs 3%: with 0.5% process noise the toggle is 'faster'; the same
    3% with 5% noise is 'within noise'."""
    configs, values = _toggle_configs()
    speeds = {"default": 35000.0, "GRAD_REDUCE_IN_BF16": 35000.0 / 1.03,
              "FUSED_SINGLE_QKV_ROPE": 35000.0 / 1.03}
    factors = {"default": [1.005, 0.995, 1.0], "GRAD_REDUCE_IN_BF16": [0.995, 1.0, 1.005],
               "FUSED_SINGLE_QKV_ROPE": [1.05, 0.95, 1.0]}
    result = run_suite("toggles", HEADER, SHAPE, configs, FakeRunner(speed=speeds,
                                                                     factors=factors),
                       lambda s: 1.0, tmp_path / "t.json", 1e9,
                       {"default_resolved": values}, log=lambda _m: None)
    rows = {r["key"]: r for r in result["results"]}
    assert rows["GRAD_REDUCE_IN_BF16"]["verdict"] == "faster"
    assert rows["GRAD_REDUCE_IN_BF16"]["tokens_per_s_ratio"] == pytest.approx(1.03, abs=0.005)
    assert rows["GRAD_REDUCE_IN_BF16"]["set"] == "GRAD_REDUCE_IN_BF16=1"
    assert rows["GRAD_REDUCE_IN_BF16"]["baseline"] == "GRAD_REDUCE_IN_BF16=0"
    assert rows["FUSED_SINGLE_QKV_ROPE"]["tokens_per_s_ratio"] == pytest.approx(1.03, abs=0.01)
    assert rows["FUSED_SINGLE_QKV_ROPE"]["verdict"] == "within noise"


def test_runs_slower_than_estimated_stretch_the_remaining_estimates(tmp_path):
    out = tmp_path / "r.json"
    now = [0.0]

    def runner(spec):
        now[0] += 20.0          # every run takes twice its 10 s estimate
        return FakeRunner()(spec)

    sweep.run(dict(HEADER, kind="toggles"), _configs(3), SHAPE, runner, lambda s: 10.0, out,
              budget_s=75.0, clock=lambda: now[0], log=lambda _m: None)
    data = json.loads(out.read_text())
    # unscaled, a 4th run (60 s + 10 s <= 75 s) would start; scaled (60 s + 20 s) it does not
    assert len(data["points"]) == 3 and data["stopped"].startswith("budget")


def test_a_refusal_by_the_launcher_at_run_time_is_a_refused_row(tmp_path):
    """Mutation caught: training/bench/stats.py effect() without its 'within noise' branch
    (`if False:`): the equal-speed GRAD_REDUCE_IN_BF16 row becomes 'faster' or 'slower', which
    the old membership test in all three verdicts accepted."""
    configs, values = _toggle_configs()

    class Refusing(FakeRunner):
        def __call__(self, spec):
            if spec.config == "FUSED_SINGLE_QKV_ROPE":
                return {"side": "ours", "returncode": 2,
                        "refusal": "error: [fused_qkv_rope_kernel] no kernel here",
                        "error": "error: [fused_qkv_rope_kernel] no kernel here"}
            return super().__call__(spec)

    result = run_suite("toggles", HEADER, SHAPE, configs, Refusing(), lambda s: 1.0,
                       tmp_path / "t.json", 1e9, {"default_resolved": values},
                       log=lambda _m: None)
    rows = {r["key"]: r for r in result["results"]}
    assert rows["FUSED_SINGLE_QKV_ROPE"]["verdict"] == "refused"
    assert "[fused_qkv_rope_kernel]" in rows["FUSED_SINGLE_QKV_ROPE"]["notes"][-1]
    # the fake runner gives every config the same speed: the other lever is measured as such
    assert rows["GRAD_REDUCE_IN_BF16"]["verdict"] == "within noise"


OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a "
       "total capacity of 139.81 GiB")


def test_a_side_out_of_memory_is_not_repeated_and_is_the_verdict(tmp_path):
    configs, values = _toggle_configs()
    fake = FakeRunner(fail={"FUSED_SINGLE_QKV_ROPE": OOM,            # the variant side
                            "GRAD_REDUCE_IN_BF16": "RuntimeError: NCCL error"})
    result = run_suite("toggles", HEADER, SHAPE, configs, fake, lambda s: 1.0,
                       tmp_path / "t.json", 1e9, {"default_resolved": values},
                       log=lambda _m: None)
    ran = [s.config for s in fake.calls]
    assert ran.count("FUSED_SINGLE_QKV_ROPE") == 1          # repeats 1 and 2 not run
    assert ran.count("GRAD_REDUCE_IN_BF16") == 3             # another failure may not repeat
    skipped = [p for p in result["points"] if p.get("skipped")]
    assert len(skipped) == 2 and all("ran out of GPU memory" in p["error"] for p in skipped)
    assert result["complete"] and len(result["points"]) == 9
    rows = {r["key"]: r for r in result["results"]}
    # FUSED_SINGLE_QKV_ROPE's lever sets the default (=1) over the variant (=0): the variant
    # is the baseline side here
    assert rows["FUSED_SINGLE_QKV_ROPE"]["verdict"] == "baseline out of memory"
    assert rows["FUSED_SINGLE_QKV_ROPE"]["tokens_per_s_ratio"] is None
    assert "CUDA out of memory" in " ".join(rows["FUSED_SINGLE_QKV_ROPE"]["notes"])
    assert rows["GRAD_REDUCE_IN_BF16"]["verdict"] == "not measured"
