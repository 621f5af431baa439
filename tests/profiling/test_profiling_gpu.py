"""The GPU path on real CUDA traces (run with `python -m pytest -m gpu tests/profiling`).

A tiny transformer (bf16 linears, SDPA attention, LayerNorm) trains a few steps under
torch.profiler with CUDA activity and DDP over NCCL; the report runs WITHOUT --device cpu.
"""

from __future__ import annotations

import json

import pytest
import torch
from profiling_testlib import check_toy_gpu_report, make_traces

from training.profiling import trace_report, verdict

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]


def _report(run, capsys):
    assert trace_report.main([str(run)]) == 0, capsys.readouterr().err
    return json.loads((run / "profile" / "trace_report.json").read_text())


def test_single_gpu_trace(tmp_path, capsys):
    """Bounds: check_toy_gpu_report (tests/profiling/profiling_testlib.py, with their recorded
    basis: the committed H200 sample, where the same check runs on the CPU, and this test's
    earlier single-H200 log, 92% idle).

    Mutation caught (on the sample, by test_profiling_h200_sample.py's run of the same check):
    training/profiling/analysis.py _gpu_breakdowns counting the idle time as compute
    (compute_us = compute + idle, idle_us = 0): compute 98% of the span. The old checks (every
    share > 0, the shares summing to 100) passed it."""
    make_traces(tmp_path / "profile", "cuda", world=1)
    report = _report(tmp_path, capsys)
    check_toy_gpu_report(report, world=1)
    assert len(report["ranks"][0]["steps"]["analysed"]) == 2
    assert report["overall"]["verdict"]["kind"] == verdict.IDLE_BOUND  # one rank: no NCCL wait


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs for NCCL communication")
def test_two_gpu_trace_has_nccl_communication(tmp_path, capsys):
    """Bounds: check_toy_gpu_report, as for one GPU, with the 2-H200 sample's communication
    (two gradient all-reduces a step). Mutation caught: as for one GPU."""
    make_traces(tmp_path / "profile", "cuda", world=2)
    report = _report(tmp_path, capsys)
    check_toy_gpu_report(report, world=2)
    for r in report["ranks"]:
        assert r["breakdown"]["comm_total_us"] > 0
