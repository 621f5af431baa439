"""Hugging Face Llama weights -> Megatron GPTModel layout (the seed of HF checkpoint import).

Megatron's layout differs from Hugging Face's in two places:
  linear_qkv  one matrix, rows interleaved per query group: [q heads of group g, k_g, v_g]
  linear_fc1  gate and up projections stacked (gate first: SwiGLU is silu(gate) * up)
Everything else is a one-to-one copy. Tested against HF's own forward (tests/model).
"""
from __future__ import annotations

import torch


def _norm_weight(norm, next_linear):
    """An RMSNorm's weight: the norm module's own, or under Megatron's TE spec (where the norm
    slot is an identity) the one fused into the next linear (TELayerNormColumnParallelLinear)."""
    weight = getattr(norm, "weight", None)
    return weight if weight is not None else next_linear.layer_norm_weight


@torch.no_grad()
def copy_hf_llama_weights(hf_model, gpt_model, heads: int, groups: int) -> None:
    hf = hf_model.model
    hidden = hf.config.hidden_size
    head_dim = hidden // heads
    per_group = heads // groups
    gpt_model.embedding.word_embeddings.weight.copy_(hf.embed_tokens.weight)
    gpt_model.output_layer.weight.copy_(hf_model.lm_head.weight)
    gpt_model.decoder.final_layernorm.weight.copy_(hf.norm.weight)
    for ours, theirs in zip(gpt_model.decoder.layers, hf.layers):
        attn = theirs.self_attn
        q = attn.q_proj.weight.view(groups, per_group * head_dim, hidden)
        k = attn.k_proj.weight.view(groups, head_dim, hidden)
        v = attn.v_proj.weight.view(groups, head_dim, hidden)
        ours.self_attention.linear_qkv.weight.copy_(torch.cat([q, k, v], dim=1).view(-1, hidden))
        ours.self_attention.linear_proj.weight.copy_(attn.o_proj.weight)
        _norm_weight(ours.input_layernorm, ours.self_attention.linear_qkv).copy_(
            theirs.input_layernorm.weight)
        _norm_weight(ours.pre_mlp_layernorm, ours.mlp.linear_fc1).copy_(
            theirs.post_attention_layernorm.weight)
        mlp = theirs.mlp
        ours.mlp.linear_fc1.weight.copy_(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
        ours.mlp.linear_fc2.weight.copy_(mlp.down_proj.weight)
