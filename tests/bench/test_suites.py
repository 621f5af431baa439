"""Before any GPU work: which levers run, which a guard refuses or corrects, which peers
cannot run here."""
from __future__ import annotations

import pytest

from training.bench.catalog import PARTS_DP1, PARTS_DP2, all_levers, select
from training.bench.ours import clean_environ, precheck
from training.bench.shape import BenchShape
from training.bench.suites import SuiteError, peer_configs, toggle_configs
from training.launch.toggles import PERF_TOGGLES

from .fakes import fake_precheck

SHAPE = BenchShape()


def _by_id(configs):
    return {c.id: c for c in configs}


def test_refused_and_corrected_levers_are_recorded_not_run():
    levers = select(SHAPE, ["GRAD_REDUCE_IN_BF16"], ["recompute"])
    pre = fake_precheck(refuse={"RECOMPUTE=full": "[some_guard] full recompute refused here"},
                        correct={"GRAD_REDUCE_IN_BF16": ("1", "some_guard: needs bf16 grads")})
    configs, values = toggle_configs(SHAPE, levers, pre)
    c = _by_id(configs)
    assert c["default"].runnable and values["TRANSFORMER_IMPL"] == "native"
    assert c["RECOMPUTE=full"].status == "refused"
    assert "full recompute refused" in c["RECOMPUTE=full"].message
    assert c["GRAD_REDUCE_IN_BF16"].status == "refused"
    assert c["GRAD_REDUCE_IN_BF16"].message.startswith("corrected by a guard")
    assert c["RECOMPUTE=selective"].runnable


def test_lever_that_is_already_the_default_or_off_backend_is_not_applicable():
    levers = select(SHAPE, None, None, ["NATIVE_KERNELS=torch", "TRANSFORMER_IMPL=transformer_engine"])
    configs, _ = toggle_configs(SHAPE, levers,
                                fake_precheck(defaults={"TRANSFORMER_IMPL": "transformer_engine"}))
    c = _by_id(configs)
    assert c["NATIVE_KERNELS=torch"].status == "not applicable"
    assert "native backend" in c["NATIVE_KERNELS=torch"].message
    assert c["TRANSFORMER_IMPL=transformer_engine"].status == "not applicable"


def test_a_refused_default_stops_the_suite():
    with pytest.raises(SuiteError, match="default run itself"):
        toggle_configs(SHAPE, [], fake_precheck(refuse={"MBS=1": "[x] no"}))


def test_real_guards_on_a_named_platform(base_env):
    """The launcher's own resolve: on an H200 (as this project's image has it, with TE) the
    Blackwell/MI355X recipes are refused by precision_needs_hardware, fp8 is not, and turning
    the distributed optimizer off makes the optimizer_overlap guard switch param-gather
    overlap off, which is recorded with the variant."""
    env = dict(base_env, PLATFORM="h200")

    def pre(toggles):
        return precheck(toggles, environ=env)

    levers = select(SHAPE, ["GRAD_REDUCE_IN_BF16"], ["precision", "dist_opt"])
    configs, values = toggle_configs(SHAPE, levers, pre)
    c = _by_id(configs)
    assert values["TRANSFORMER_IMPL"] == "transformer_engine"
    assert c["PRECISION=fp8"].runnable
    assert c["PRECISION=mxfp8"].status == "refused"
    assert "[precision_needs_hardware]" in c["PRECISION=mxfp8"].message
    assert c["PRECISION=nvfp4"].status == "refused"
    dist = c["DISTRIBUTED_OPTIMIZER"]
    assert dist.runnable
    assert [x["toggle"] for x in dist.corrections] == ["OVERLAP_PARAM_GATHER"]
    assert "optimizer_overlap" in dist.corrections[0]["reason"]


def test_precheck_ignores_stray_toggles_in_the_callers_environment(base_env):
    env = dict(base_env, PLATFORM="h200", GRAD_REDUCE_IN_BF16="0", MASTER_PORT="29999")
    cleaned, dropped = clean_environ(env)
    assert "GRAD_REDUCE_IN_BF16" in dropped and "GRAD_REDUCE_IN_BF16" not in cleaned
    assert cleaned["MASTER_PORT"] == "29999" and cleaned["PLATFORM"] == "h200"
    assert precheck(SHAPE.env(), environ=env)["values"]["GRAD_REDUCE_IN_BF16"] == "1"


def test_peers_that_cannot_run_here_are_recorded():
    configs = peer_configs(SHAPE, ["native", "hf", "torchtitan"], fake_precheck(),
                           lambda side: "ImportError: no torchtitan" if side == "torchtitan"
                           else None)
    c = _by_id(configs)
    assert c["native"].env == {"TRANSFORMER_IMPL": "native"} and c["hf"].runnable
    assert c["torchtitan"].status == "not runnable"
    assert "no torchtitan" in c["torchtitan"].message
    with pytest.raises(SuiteError, match="first side"):
        peer_configs(SHAPE, ["hf", "native"], fake_precheck(), lambda s: None)
    with pytest.raises(SuiteError, match="one GPU"):
        peer_configs(BenchShape(gpus=2), ["native", "hf"], fake_precheck(), lambda s: None)


def test_ours_is_not_run_when_no_peer_can_run():
    """No GPU time for a comparison with nobody: ours says why instead of 'failed'."""
    configs = peer_configs(SHAPE, ["native", "torchtitan"], fake_precheck(),
                           lambda side: "ImportError: no torchtitan")
    c = _by_id(configs)
    assert c["native"].status == "not run" and not c["native"].runnable
    assert c["native"].message == "no runnable peer to compare with: torchtitan: not runnable"
    both = _by_id(peer_configs(SHAPE, ["native", "local"], fake_precheck(), lambda s: None))
    assert both["native"].runnable  # ours vs ours (local) still runs


def test_parts_name_known_levers_and_dp_levers_sit_in_the_two_gpu_parts():
    keys = {lv.key for lv in all_levers(SHAPE)}
    for _name, part in PARTS_DP1 + PARTS_DP2:
        assert set(part) <= keys
    dp_only = {lv.key for lv in all_levers(SHAPE) if lv.needs_dp}
    assert dp_only <= {k for _n, part in PARTS_DP2 for k in part}


def test_select_rejects_unknown_names():
    with pytest.raises(ValueError, match="--only"):
        select(SHAPE, ["RECOMPUTE"], None)
    with pytest.raises(ValueError, match="lever group"):
        select(SHAPE, None, ["warp_speed"])
    assert [lv.key for lv in select(SHAPE, [], ["mbs"])] == ["MBS"]
    assert select(SHAPE, [], ["mbs"])[0].env == {"MBS": "2"}


def test_default_alone_is_a_headline_run_and_full_node_parts_take_the_dp_toggles():
    from training.bench import sweep
    from training.bench.__main__ import parts_for

    assert select(SHAPE, None, None, ["default"]) == []
    configs, _ = toggle_configs(SHAPE, [], fake_precheck())
    specs = sweep.order(configs, BenchShape(repeats=2))
    assert [s.label for s in specs] == ["default-r0", "default-r1"]
    node = {key for _kind, _name, keys in parts_for(8) for key in keys}
    assert {"GRAD_REDUCE_IN_BF16", "DDP_AVERAGE_IN_COLLECTIVE", "DISTRIBUTED_OPTIMIZER",
            "OVERLAP_GRAD_REDUCE", "OVERLAP_PARAM_GATHER"} <= node   # the DP toggles at 8 GPUs
    assert {t.name for t in PERF_TOGGLES} <= node
    assert parts_for(2)[0][1] == "dp2-comm"
