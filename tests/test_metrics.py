"""FLOPs convention (against Megatron's own formula), steady-state throughput, MFU, CLI."""
from __future__ import annotations

import subprocess
import sys

import pytest

from training.launch.presets import PRESETS
from training.metrics import StepRecord, flops_per_token, peak_tflops, steady_state
from training.run_description import Model
from training.platforms import platform_for_device_name


def shape(name: str, layers: int | None = None, seq: int | None = None) -> Model:
    return Model.of(PRESETS[name], layers, seq)


def test_llama3_8b_flops_per_token():
    assert flops_per_token(shape("llama3-8B")) == pytest.approx(51.47e9, rel=1e-3)
    assert flops_per_token(shape("llama3-8B", layers=8)) == pytest.approx(15.23e9, rel=1e-3)


@pytest.mark.parametrize("name,seq", [("llama3-8B", 8192), ("llama3-70B", 8192),
                                      ("llama2-7B", 4096), ("llama2-13B", 2048), ("tiny", 256)])
def test_flops_match_megatrons_num_floating_point_operations(base_env, name, seq):
    """Our documented formula and Megatron's --log-throughput formula count the same FLOPs."""
    from megatron.training.training import num_floating_point_operations

    from tests.launch.helpers import launch, megatron_args

    family = "llama2" if name.startswith("llama2") else "llama3"
    size = "tiny" if name == "tiny" else name.split("-")[1]
    args = megatron_args(launch(base_env, family=family, MODEL_SIZE=size, SEQ_LENGTH=seq))
    args.padded_vocab_size = PRESETS[name].vocab_size
    megatron = num_floating_point_operations(args, batch_size=4) / (4 * seq)
    assert flops_per_token(Model.from_megatron_args(args)) == pytest.approx(megatron, rel=1e-9)


def test_steady_state_is_the_harmonic_mean_after_warmup():
    records = [StepRecord(1, 10.0, 1000), StepRecord(2, 2.0, 1000), StepRecord(3, 1.0, 1000),
               StepRecord(4, 1.0, 1000)]
    out = steady_state(records, warmup_iters=1, world_size=2, flops_token=1e9, peak=1000.0)
    # 3000 tokens in 4 s over 2 GPUs = 375 tokens/s/GPU (the arithmetic mean would be 416.7)
    assert out["tokens_per_s_per_gpu"] == pytest.approx(375.0)
    assert out["model_tflops_per_gpu"] == pytest.approx(375.0 * 1e9 / 1e12)
    assert out["mfu"] == pytest.approx(out["model_tflops_per_gpu"] / 1000.0)
    assert out["steps"] == 3 and out["iterations"] == [2, 4]


def test_no_steady_state_window_is_reported_not_invented():
    out = steady_state([StepRecord(1, 1.0, 10)], warmup_iters=5, world_size=1, flops_token=1.0,
                       peak=None)
    assert out["measured"] is False and "warm-up" in out["reason"]


@pytest.mark.parametrize("device,bf16,fp8", [("NVIDIA H200", 989, 1978),
                                             ("NVIDIA H100 80GB HBM3", 989, 1978),
                                             ("NVIDIA B300", 2250, 4500),
                                             ("NVIDIA GB200", 2500, 5000),
                                             ("AMD Instinct MI355X", 2500, 5000),
                                             ("AMD Instinct MI300X", 1307, 2614)])
def test_peak_table(device, bf16, fp8):
    assert peak_tflops(device) == bf16 and peak_tflops(device, "mxfp8") == fp8


def test_unknown_gpu_has_no_peak():
    assert peak_tflops("NVIDIA A40") is None and platform_for_device_name("Radeon 7900") is None


def test_flops_cli():
    out = subprocess.run([sys.executable, "-m", "training.metrics", "flops", "--model",
                          "llama3-8b", "--seq-length", "8192"], capture_output=True, text=True,
                         check=True).stdout
    assert "51.47 GFLOP/token" in out and "causal attention counted as half" in out
    bad = subprocess.run([sys.executable, "-m", "training.metrics", "flops", "--model", "gpt5"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "unknown model" in bad.stderr + bad.stdout
