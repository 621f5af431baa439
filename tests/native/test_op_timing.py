"""training.native.op_timing end to end on the CPU at toy sizes: every implementation of each
op runs forward and backward (the Liger paths fall back to torch on CPU tensors, as in the
model), and the JSON carries the harness's header, every sample, and the comparison with ours.
Its numbers are CPU times of toy shapes: only the structure is checked here."""
from __future__ import annotations

import json

import pytest

from training.native import op_timing

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = op_timing.run(["--device", "cpu", "--dtype", "fp32", "--tokens", "6", "--hidden",
                         "10", "--ffn", "7", "--repeats", "2", "--iters", "1", "--warmup", "1",
                         "--out-dir", str(tmp_path_factory.mktemp("bench"))])
    assert out.name == "kernels-liger-megatron_cpu.json"
    return json.loads(out.read_text())


def test_header_and_rule(result):
    assert result["name"] == "kernels-liger-megatron"
    assert result["command"].startswith("python -m training.native.op_timing --device cpu")
    assert {"git_sha", "gpu", "versions", "verdict_rule"} <= set(result)
    from training.native import IMPLEMENTATION

    assert result["implementation_in_use"] == IMPLEMENTATION


@pytest.mark.parametrize("op,impls,shape", [
    ("rmsnorm", {"ours", "liger_megatron", "torch_fused", "torch"}, [6, 10]),
    ("swiglu", {"ours", "liger_megatron", "megatron"}, [6, 14])])
def test_every_implementation_sampled_and_compared_with_ours(result, op, impls, shape):
    entry = result["ops"][op]
    assert entry["shape"] == shape and entry["dtype"] == "float32"
    assert set(entry["ms"]) == impls and all(len(v) == 2 for v in entry["ms"].values())
    assert set(entry["vs_baseline"]) == impls - {"ours"}
    for comparison in entry["vs_baseline"].values():
        assert comparison["repeats"] == 2 and comparison["verdict"] in (
            "faster", "slower", "within noise")
