"""The GPU path on real CUDA traces (run with `python -m pytest -m gpu tests/profiling`).

A tiny transformer (bf16 linears, SDPA attention, LayerNorm) trains a few steps under
torch.profiler with CUDA activity and DDP over NCCL; the report runs WITHOUT --device cpu.
"""

from __future__ import annotations

import json

import pytest
import torch
from profiling_testlib import make_traces

from training.profiling import kernel_groups as kg
from training.profiling import ranges as rg
from training.profiling import trace_report

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]


def _report(run, capsys):
    assert trace_report.main([str(run)]) == 0, capsys.readouterr().err
    return json.loads((run / "profile" / "trace_report.json").read_text())


def _check_common(report, ranks):
    assert report["device"] == "gpu"
    assert [r["rank"] for r in report["ranks"]] == list(range(ranks))
    groups = report["overall"]["kernel_groups"]
    assert groups[kg.GEMM]["time_us"] > 0, report["overall"]["top_kernels"]
    assert groups[kg.ATTENTION]["time_us"] > 0, report["overall"]["top_kernels"]
    assert groups[kg.NORM_ELEMENTWISE]["time_us"] > 0
    for section in [*report["ranks"], report["overall"]]:
        b = section["breakdown"]
        assert b["span_us"] > 0 and b["compute_us"] > 0
        assert b["compute_pct"] + b["exposed_comm_pct"] + b["other_pct"] + b["idle_pct"] == pytest.approx(100.0)
    for r in report["ranks"]:
        for name in (rg.RANGE_FORWARD, rg.RANGE_BACKWARD, rg.RANGE_OPTIMIZER):
            assert r["ranges"][name]["host_us"] > 0, name
            # backward kernels come from autograd's thread: they must still be counted
            assert r["ranges"][name]["kernel_us"] > 0, name


def test_single_gpu_trace(tmp_path, capsys):
    make_traces(tmp_path / "profile", "cuda", world=1)
    report = _report(tmp_path, capsys)
    _check_common(report, 1)
    assert len(report["ranks"][0]["steps"]["analysed"]) == 2


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs for NCCL communication")
def test_two_gpu_trace_has_nccl_communication(tmp_path, capsys):
    make_traces(tmp_path / "profile", "cuda", world=2)
    report = _report(tmp_path, capsys)
    _check_common(report, 2)
    for r in report["ranks"]:
        assert r["kernel_groups"][kg.COMMUNICATION]["time_us"] > 0
        assert r["breakdown"]["comm_total_us"] > 0
