"""The GPU path end to end (HTA analyses, groups, ranges, verdict, files) on synthetic GPU traces."""

from __future__ import annotations

import json

import pytest
import profiling_synthetic as synthetic

from training.profiling import kernel_groups as kg
from training.profiling import trace_report
from training.profiling.ranges import RANGE_FORWARD, RANGE_OPTIMIZER


@pytest.fixture
def gpu_run(tmp_path):
    run = tmp_path / "run"
    synthetic.write(run / "profile" / "rank-0.json.gz", synthetic.COMM_HEAVY, rank=0, gz=True)
    synthetic.write(run / "profile" / "rank-1.json.gz", synthetic.IDLE_HEAVY, rank=1, gz=True)
    return run


@pytest.mark.slow
def test_cli_writes_the_report_into_profile(gpu_run, capsys):
    assert trace_report.main([str(gpu_run)]) == 0
    out = capsys.readouterr().out
    assert "rank 0: communication-bound: 22% exposed communication" in out
    assert "rank 1: idle/launch-bound (host overhead): 33% idle" in out
    profile = gpu_run / "profile"
    for name in ("trace_report.md", "trace_report.json", "trace_breakdown.png"):
        assert (profile / name).stat().st_size > 0
    assert (profile / "trace_breakdown.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (profile / "trace_report.md").read_text()
    assert "**Verdict (overall): compute-bound: 66% compute, top group GEMM" in md
    assert "`train/forward`" in md
    # A second run in the same folder must not take its own outputs for traces.
    assert trace_report.main([str(gpu_run), "--top", "2"]) == 0
    report = json.loads((profile / "trace_report.json").read_text())
    assert sorted(report["source"]["trace_files"]) == ["0", "1"]
    assert len(report["overall"]["top_kernels"]) == 2


def test_numbers_match_the_layout(gpu_run):
    report = trace_report.build_report(gpu_run)
    assert report["device"] == "gpu"
    assert report["profiled_steps"] == [10, 11, 12] and report["dropped_steps"] == [12]
    r0, r1 = report["ranks"]
    assert (r0["rank"], r1["rank"]) == (0, 1)
    step = synthetic.COMM_HEAVY_STEP
    b = r0["breakdown"]
    # Two analysed steps; the span runs from the first kernel to the end of the second step's last.
    span = synthetic.STEP_US + step["busy"]
    exposed = 2 * (step["comm_total"] - step["comm_overlapped"])
    assert b["span_us"] == span
    assert b["compute_us"] == 2 * step["compute"]
    assert b["exposed_comm_us"] == pytest.approx(exposed, abs=0.01)
    assert b["other_us"] == pytest.approx(2 * step["memcpy"], abs=0.01)
    assert b["idle_us"] == span - 2 * step["busy"]
    assert b["comm_total_us"] == 2 * step["comm_total"]
    assert b["comm_overlap_pct"] == pytest.approx(100 / 3, abs=0.01)
    for r in (r0, r1, report["overall"]):
        d = r["breakdown"]
        assert d["compute_pct"] + d["exposed_comm_pct"] + d["other_pct"] + d["idle_pct"] == pytest.approx(100)
    assert r1["breakdown"]["comm_overlap_pct"] is None  # no communication on rank 1
    assert r0["verdict"]["kind"] == "communication-bound"
    assert r1["verdict"]["kind"] == "idle/launch-bound"
    assert report["overall"]["verdict"]["kind"] == "compute-bound"


def test_kernel_groups_and_top_kernels(gpu_run):
    r0 = trace_report.build_report(gpu_run, top_n=3)["ranks"][0]
    g = r0["kernel_groups"]
    assert g[kg.GEMM]["time_us"] == 70 and g[kg.GEMM]["count"] == 2
    assert g[kg.ATTENTION]["time_us"] == 40
    assert g[kg.NORM_ELEMENTWISE]["time_us"] == 10
    assert g[kg.COMMUNICATION]["time_us"] == 60
    assert g[kg.MEMCPY]["time_us"] == 10
    assert g[kg.OTHER]["time_us"] == 0
    assert sum(v["pct"] for v in g.values()) == pytest.approx(100)
    top = r0["top_kernels"]
    assert [k["name"] for k in top] == [synthetic.GEMM, synthetic.NCCL, synthetic.FLASH]
    assert top[0] == {
        "name": synthetic.GEMM, "short_name": synthetic.GEMM, "group": kg.GEMM,
        "time_us": 70.0, "count": 2, "mean_us": 35.0, "pct": pytest.approx(100 * 70 / 190),
    }


def test_ranges_host_and_kernel_time(gpu_run):
    report = trace_report.build_report(gpu_run)
    ranges = report["ranks"][0]["ranges"]
    assert list(ranges) == [RANGE_FORWARD, RANGE_OPTIMIZER]  # report order, only those present
    fwd = ranges[RANGE_FORWARD]
    assert fwd["count"] == 2 and fwd["host_us"] == 120
    # Every kernel of a step is launched inside train/forward: GEMM 35 + norm 5 + flash 20 + NCCL 30 + memcpy 5.
    assert fwd["kernel_us"] == 2 * 95
    assert fwd["pct_of_steps"] == pytest.approx(100 * 120 / (2 * (synthetic.STEP_US - 1)))
    assert ranges[RANGE_OPTIMIZER]["kernel_us"] == 0  # nothing launched while it was open
    assert report["ranks"][1]["ranges"][RANGE_FORWARD]["kernel_us"] == 2 * 50
    assert report["overall"]["ranges"][RANGE_FORWARD] == {
        "count": 4, "host_us": 240, "kernel_us": 290, "pct_of_steps": pytest.approx(100 * 240 / (4 * 99))
    }


def test_json_schema_keys(gpu_run):
    report = trace_report.build_report(gpu_run)
    json.dumps(report)  # serialisable as is
    assert {
        "schema_version", "tool", "hta_version", "source", "device", "timeline", "definitions", "thresholds",
        "verdict_rules", "kernel_group_patterns", "range_names", "notes", "ranks", "overall",
        "profiled_steps", "dropped_steps",
    } <= set(report)
    assert report["thresholds"] == {"exposed_comm_pct": 20.0, "idle_pct": 20.0}
    section_keys = {"steps", "breakdown", "kernel_groups", "top_kernels", "ranges", "verdict"}
    assert set(report["overall"]) == section_keys
    assert set(report["ranks"][0]) == section_keys | {"rank"}
    assert set(report["overall"]["breakdown"]) == {
        "span_us", "compute_us", "exposed_comm_us", "other_us", "idle_us", "comm_total_us", "comm_overlapped_us",
        "compute_pct", "exposed_comm_pct", "other_pct", "idle_pct", "comm_total_pct", "comm_overlap_pct",
    }
    assert set(report["overall"]["kernel_groups"]) == set(kg.GROUPS)
    assert set(report["overall"]["verdict"]) == {"kind", "line"}


def test_out_folder_and_single_trace_file(gpu_run, tmp_path):
    out = tmp_path / "elsewhere"
    assert trace_report.main([str(gpu_run / "profile" / "rank-0.json.gz"), "--out", str(out)]) == 0
    report = json.loads((out / "trace_report.json").read_text())
    assert [r["rank"] for r in report["ranks"]] == [0]
    assert not (gpu_run / "profile" / "trace_report.json").exists()
