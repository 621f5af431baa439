"""GPU parity with HF Llama in bf16, with the kernels the runs use (Liger/Triton, cuDNN SDPA)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from training.launch.presets import PRESETS

from tests.model.parity import build_pair, compare

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("backend,kernels", [("native", "liger"), ("native", "torch"),
                                             ("local", "torch")])
@pytest.mark.parametrize("preset_name,layers", [("tiny", 2), ("llama3-8B", 2)])
def test_bf16_parity_on_gpu(backend, kernels, preset_name, layers):
    check_bf16_parity(backend, kernels, preset_name, layers)


def check_bf16_parity(backend: str, kernels: str, preset_name: str, layers: int) -> None:
    """Our GPTModel with HF's weights against HF Llama: logits and loss, one tolerance for
    every backend."""
    preset = dataclasses.replace(PRESETS[preset_name], num_layers=layers)
    hf_model, gpt = build_pair(preset, layers, backend, kernels, "cuda", torch.bfloat16)
    result = compare(hf_model, gpt, preset.vocab_size, batch=2, seq=1024, device="cuda")
    print(f"\n{preset_name}/{backend}/{kernels}: max abs err {result['max_abs_err']:.3e}, "
          f"mean abs err {result['mean_abs_err']:.3e} (mean |logit| {result['logit_scale']:.3f}),"
          f" loss HF {result['loss_hf']:.5f} ours {result['loss_ours']:.5f}")
    assert result["mean_abs_err"] < 0.05 * max(result["logit_scale"], 1.0)
    assert result["loss_rel_err"] < 1e-3
