"""The native Triton kernels (SwiGLU, fused QKV RoPE, the grouped experts' wgrad accumulation)
on the CPU, through Triton's interpreter:
their int64 offset helpers with indices whose int32 products wrap, and forward and backward
over odd shapes in bf16 and fp32 against float64 references (tests/native/kernel_refs.py).
The same shapes, and tensors past 2^31 elements, run compiled on a GPU: tests/gpu. The offsets
and one odd shape per kernel run in the default (fast) selection; every shape is `slow`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.native import kernel_refs as refs

REPO = Path(__file__).resolve().parents[2]


def _run(*words: str) -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("interpreted_kernels.py")),
                           *words], env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def interpreted():
    return _run()


@pytest.fixture(scope="module")
def quick():
    return _run("--quick")


def test_offsets_and_one_odd_shape_per_kernel(quick):
    """The default run's check (seconds): int64 offsets, SwiGLU cut mid-block, GQA RoPE with
    an odd half head_dim, both dtypes, forward and backward."""
    got = quick
    assert got["offsets"]["swiglu"] == got["offsets"]["swiglu_expected"]
    assert got["offsets"]["rope"] == got["offsets"]["rope_expected"]
    checks = {k: v for k, v in got.items() if k.startswith(("swiglu", "rope"))}
    assert len(checks) == 4 and all(v == "ok" for v in checks.values()), checks


def test_grouped_wgrad_accumulates_into_main_grad_like_float64(quick):
    """main_grad[e] += dY_e^T @ X_e (training/native/grouped_wgrad.py) onto a nonzero fp32 and
    bf16 main_grad, by the pointer kernel and the TMA one: odd sizes cut mid-tile, experts
    without rows left bit for bit."""
    checks = {k: v for k, v in quick.items() if k.startswith("grouped_wgrad")}
    assert len(checks) == 6 and all(v == "ok" for v in checks.values()), checks
    assert sum(k.startswith("grouped_wgrad tma") for k in checks) == 2


@pytest.mark.slow
def test_offsets_are_int64_where_int32_wraps(interpreted):
    got = interpreted["offsets"]
    assert got["swiglu"] == got["swiglu_expected"] and got["swiglu_expected"][0] > 2 ** 31
    assert got["rope"] == got["rope_expected"] and got["rope_expected"] > 2 ** 31


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["torch.bfloat16", "torch.float32"])
@pytest.mark.parametrize("rows,f", refs.SWIGLU_SHAPES)
def test_swiglu_matches_float64(interpreted, rows, f, dtype):
    assert interpreted[f"swiglu {rows}x{f} {dtype}"] == "ok"


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["torch.bfloat16", "torch.float32"])
@pytest.mark.parametrize("shape", refs.ROPE_SHAPES)
def test_fused_qkv_rope_matches_float64(interpreted, shape, dtype):
    assert interpreted[f"rope {shape} {dtype}"] == "ok"
