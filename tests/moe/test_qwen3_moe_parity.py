"""Our MoE model against a reference nobody here wrote: Hugging Face's Qwen3MoeForCausalLM.

A randomly initialised HF Qwen3-MoE (GQA with Qwen3's separate head dim, q/k RMSNorm, 8
experts top-2 with the top-k renormalised, untied embeddings) has its weights copied into our
GPTModel (training/moe/hf_qwen3_moe.py), built from the preset's own Megatron flags; logits
and loss must agree, for every experts implementation and token dispatcher the native
backend runs on the CPU. fp32 here; bf16 at Qwen3-30B-A3B's width on the GPU in
tests/gpu/test_moe_gpu.py."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from training.moe.hf_qwen3_moe import copy_hf_qwen3_moe_weights
from training.moe.presets import QWEN3_30B_A3B, TINY_MOE
from training.native import grouped_experts

from tests.model.parity import check_bf16_parity, report
from tests.moe.model import hf_qwen3_moe, moe_parity

NO_COMPILE = ("--no-bias-swiglu-fusion",)


@pytest.mark.parametrize("experts,dispatcher,permute", [
    ("loop", "alltoall", "native"), ("grouped_mm", "alltoall", "native"),
    ("sequential", "alltoall", "megatron"), ("loop", "allgather", "megatron")])
def test_tiny_moe_matches_hf_qwen3_moe_fp32(experts, dispatcher, permute):
    grouped = experts != "sequential"
    extra = NO_COMPILE + (("--no-native-moe-permute",) if permute == "megatron" else ())

    def prepare(gpt):
        assert type(gpt.decoder.layers[0].mlp.experts).__name__ == (
            "TEGroupedMLP" if grouped else "SequentialMLP")
        if grouped:
            assert grouped_experts.set_impl(gpt, experts) == 2 * TINY_MOE.num_layers

    result = moe_parity(TINY_MOE, 2, "native", "torch", "cpu", grouped=grouped,
                        dispatcher=dispatcher, extra=extra, prepare=prepare)
    report(f"tiny-moe/{experts}/{dispatcher}/{permute} permute", result)
    assert result["max_abs_err"] < 1e-4 * max(result["logit_scale"], 1.0)
    assert result["loss_rel_err"] < 1e-5


def test_tiny_moe_matches_hf_qwen3_moe_bf16():
    """bf16 weights on the CPU: within the parity tests' yardstick (3x HF's own bf16 rounding
    error, measured in the same call on the same tokens)."""
    result = moe_parity(TINY_MOE, 2, "native", "torch", "cpu", torch.bfloat16,
                        extra=NO_COMPILE)
    report("tiny-moe/native/bf16", result)
    check_bf16_parity(result)


def test_mismatched_routing_is_not_mapped_silently():
    hf_model = hf_qwen3_moe(TINY_MOE, 1, "cpu")
    hf_model.config.norm_topk_prob = False
    with pytest.raises(ValueError, match="moe-router-pre-softmax"):
        copy_hf_qwen3_moe_weights(hf_model, None)


@pytest.mark.slow
def test_one_layer_of_qwen3_30b_a3b_width_matches_hf_in_bf16():
    """Qwen3-30B-A3B's layer (hidden 2048, 32/4 heads of dim 128, 128 experts of 768, top-8),
    one layer, vocabulary cut to 8192 to spare the CPU's memory, bf16 weights: within the
    parity tests' bf16 yardstick (HF's own bf16 rounding error, measured in the same call)."""
    preset = dataclasses.replace(QWEN3_30B_A3B, vocab_size=8192, num_layers=1)
    result = moe_parity(preset, 1, "native", "torch", "cpu", torch.bfloat16, batch=1, seq=32,
                        extra=NO_COMPILE)
    report("qwen3-30B-A3B-width/native/bf16", result)
    check_bf16_parity(result)   # within 3x HF's own bf16 error (tests/model/parity.py)
