from __future__ import annotations

import pandas as pd
import pytest
import profiling_synthetic as synthetic
from hta.utils.utils import KernelType, get_kernel_type

from training.profiling import loading
from training.profiling.timeline import Breakdown, breakdown, intersection_length, self_times, union_length


def iv(*pairs):
    return pd.DataFrame({"ts": [a for a, _ in pairs], "dur": [b - a for a, b in pairs]})


def test_union_and_intersection():
    a = iv((0, 10), (5, 20), (30, 40))
    b = iv((15, 35))
    assert union_length(a) == 30
    assert union_length(iv()) == 0
    assert intersection_length(a, b) == 10  # [15,20) and [30,35)
    assert intersection_length(a, iv()) == 0


def test_breakdown_by_hand():
    ev = pd.DataFrame(
        [
            (0, 60, "compute"),
            (50, 30, "comm"),  # 10 hidden under compute, 20 exposed
            (80, 5, "other"),
            (100, 10, "compute"),  # idle 85..100
        ],
        columns=["ts", "dur", "kind"],
    )
    b = breakdown(ev)
    assert (b.span_us, b.compute_us, b.exposed_comm_us, b.other_us, b.idle_us) == (110, 70, 20, 5, 15)
    assert (b.comm_total_us, b.comm_overlapped_us) == (30, 10)
    d = b.as_dict()
    assert d["compute_pct"] + d["exposed_comm_pct"] + d["other_pct"] + d["idle_pct"] == pytest.approx(100)
    assert d["comm_overlap_pct"] == pytest.approx(100 / 3)


def test_breakdown_refuses_nothing():
    with pytest.raises(ValueError):
        breakdown(pd.DataFrame(columns=["ts", "dur", "kind"]))


def test_combine_sums():
    a = Breakdown(10, 5, 2, 1, 2, 4, 2)
    c = Breakdown.combine([a, a])
    assert c == Breakdown(20, 10, 4, 2, 4, 8, 4)


def test_self_times_nesting_per_thread():
    ops = pd.DataFrame(
        {
            "pid": [1, 1, 1, 1, 1],
            "tid": [1, 1, 1, 1, 2],
            "ts": [0, 2, 3, 20, 2],
            "dur": [30, 10, 4, 5, 50],  # 0-30 holds 2-12 (holds 3-7) and 20-25; tid 2 is separate
        },
        index=[10, 11, 12, 13, 14],
    )
    assert self_times(ops).to_dict() == {10: 15.0, 11: 6.0, 12: 4.0, 13: 5.0, 14: 50.0}


def test_breakdown_reproduces_hta_on_gpu_trace(tmp_path):
    """The CPU timeline uses breakdown(); on GPU events it must give HTA's own numbers."""
    synthetic.write(tmp_path / "rank-0.json", synthetic.COMM_HEAVY, rank=0)
    synthetic.write(tmp_path / "rank-1.json", synthetic.IDLE_HEAVY, rank=1)
    ta = loading.load(loading.find_trace_files(tmp_path))
    with loading.quiet_hta():
        temporal = ta.get_temporal_breakdown(visualize=False).set_index("rank")
        overlap = ta.get_comm_comp_overlap(visualize=False).set_index("rank")
    table = ta.t.symbol_table.get_sym_table()
    for rank, df in ta.t.traces.items():
        gpu = df[df["stream"].ne(-1)].copy()
        kinds = gpu["name"].map(lambda i: get_kernel_type(table[i]))
        gpu["kind"] = kinds.map(
            {KernelType.COMPUTATION.name: "compute", KernelType.COMMUNICATION.name: "comm"}
        ).fillna("other")
        b = breakdown(gpu)
        row = temporal.loc[rank]
        assert b.span_us == row["kernel_time(us)"]
        assert b.idle_us == row["idle_time(us)"]
        assert b.compute_us == row["compute_time(us)"]
        assert b.exposed_comm_us + b.other_us == row["non_compute_time(us)"]
        if b.comm_total_us:
            assert 100 * b.comm_overlapped_us / b.comm_total_us == pytest.approx(
                overlap.loc[rank, "comp_comm_overlap_pctg"], abs=0.01
            )
    assert ta.t.traces[0]["stream"].ne(-1).any()  # the comparison ran on GPU events
