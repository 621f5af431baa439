"""Our model against a reference nobody here wrote: Hugging Face's LlamaForCausalLM.

A randomly initialised HF Llama (same RoPE theta, GQA, RMSNorm eps, SwiGLU, untied
embeddings) has its weights copied into our GPTModel on each backend present; logits and
loss must agree. CPU (fp32, torch kernels) here; the GPU versions (bf16, Liger/Triton
kernels) are in tests/gpu/.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from training.launch.presets import PRESETS

from tests.model.parity import build_pair, compare

BACKENDS = ["native", "local"]


def _report(name, result):
    print(f"\n{name}: max abs err {result['max_abs_err']:.2e}, mean abs err "
          f"{result['mean_abs_err']:.2e} (mean |logit| {result['logit_scale']:.2f}), loss HF "
          f"{result['loss_hf']:.5f} ours {result['loss_ours']:.5f}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fused_qkv_rope", [True, False])
def test_tiny_preset_matches_hf_llama_fp32(backend, fused_qkv_rope):
    if backend == "local":
        pytest.skip("Megatron's local attention builds its causal mask on CUDA "
                    "(megatron/core/transformer/utils.py get_default_causal_mask): "
                    "compared on the GPU in tests/gpu/test_parity_gpu.py")
    preset = PRESETS["tiny"]
    hf_model, gpt = build_pair(preset, preset.num_layers, backend, "torch", "cpu",
                               torch.float32, fused_qkv_rope)
    result = compare(hf_model, gpt, preset.vocab_size, batch=2, seq=64, device="cpu")
    _report(f"tiny/{backend}", result)
    assert result["max_abs_err"] < 1e-3
    assert result["loss_rel_err"] < 1e-5


@pytest.mark.slow
def test_two_layer_llama3_8b_width_matches_hf_llama():
    """Llama3-8B width (hidden 4096, FFN 14336, 32 heads / 8 KV groups, vocab 128256), 2 layers,
    bf16 weights on the CPU: bf16 tolerance."""
    preset = dataclasses.replace(PRESETS["llama3-8B"], num_layers=2)
    hf_model, gpt = build_pair(preset, 2, "native", "torch", "cpu", torch.bfloat16)
    result = compare(hf_model, gpt, preset.vocab_size, batch=1, seq=32, device="cpu")
    _report("llama3-8B-width/native", result)
    assert result["mean_abs_err"] < 0.05 * max(result["logit_scale"], 1.0)
    assert result["loss_rel_err"] < 1e-3
