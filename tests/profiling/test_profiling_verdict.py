from __future__ import annotations

from training.profiling import kernel_groups as kg
from training.profiling import verdict as v

GROUPS = {kg.GEMM: 55.0, kg.ATTENTION: 10.0, kg.COMMUNICATION: 30.0, kg.MEMCPY: 5.0}


def test_thresholds():
    assert v.EXPOSED_COMM_BOUND_PCT == 20.0
    assert v.IDLE_BOUND_PCT == 20.0


def test_communication_bound_at_threshold():
    out = v.verdict(60.0, 20.0, 10.0, GROUPS)
    assert out == {"kind": v.COMMUNICATION_BOUND, "line": "communication-bound: 20% exposed communication"}


def test_communication_bound_example_from_issue():
    assert v.verdict(50.0, 31.0, 5.0, GROUPS)["line"] == "communication-bound: 31% exposed communication"


def test_just_below_threshold_is_not_communication_bound():
    assert v.verdict(70.0, 19.9, 10.0, GROUPS)["kind"] == v.COMPUTE_BOUND


def test_idle_bound():
    out = v.verdict(60.0, 5.0, 25.0, GROUPS)
    assert out["kind"] == v.IDLE_BOUND
    assert out["line"] == "idle/launch-bound (host overhead): 25% idle"


def test_both_larger_leads():
    a = v.verdict(30.0, 40.0, 25.0, GROUPS)
    assert a["kind"] == v.COMMUNICATION_BOUND and a["line"].endswith("(also 25% idle)")
    b = v.verdict(30.0, 25.0, 40.0, GROUPS)
    assert b["kind"] == v.IDLE_BOUND and b["line"].endswith("(also 25% exposed communication)")


def test_compute_bound_names_top_compute_group_not_communication():
    groups = {kg.COMMUNICATION: 60.0, kg.ATTENTION: 25.0, kg.GEMM: 15.0}
    out = v.verdict(80.0, 5.0, 5.0, groups)
    assert out["kind"] == v.COMPUTE_BOUND
    assert out["line"] == "compute-bound: 80% compute, top group attention (25% of kernel time)"


def test_rules_text_names_thresholds():
    assert "20%" in v.RULES and v.COMMUNICATION_BOUND in v.RULES and v.IDLE_BOUND in v.RULES
