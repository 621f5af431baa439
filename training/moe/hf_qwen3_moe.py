"""Hugging Face Qwen3-MoE weights -> Megatron GPTModel with MoE layers (transformers >= 5).

Where the layouts differ:
  linear_qkv     one matrix, rows grouped per KV group: [q heads of group g, k_g, v_g], with
                 Qwen3's head dim (128) apart from hidden / heads
  q/k norms      q_norm / k_norm -> q_layernorm / k_layernorm (one weight of the head dim)
  router         mlp.gate.weight [experts, hidden] -> mlp.router.weight (same layout)
  experts        mlp.experts.gate_up_proj [experts, 2 x ffn, hidden] (gate rows first, the
                 order Megatron's SwiGLU splits fc1 in) and down_proj [experts, hidden, ffn]
                 -> each expert's linear_fc1 / linear_fc2, whichever experts module the
                 backend built: the native grouped experts (one [experts, out, in] tensor),
                 TE's grouped linear (weight0..weightN) or SequentialMLP (one MLP each)
The routing itself matches without conversion: Megatron's default top-k (softmax over the
chosen logits) is Qwen3's softmax, top-k and renormalisation (norm_topk_prob=True).
Tested against HF's own forward (tests/moe/test_qwen3_moe_parity.py). Kept in its own module
to join the checkpoint import package (training/checkpoint) as its Qwen3-MoE mapping.
"""
from __future__ import annotations

import torch


def expert_weights(experts, name: str) -> list[torch.Tensor]:
    """Each local expert's weight of projection `name` (linear_fc1 | linear_fc2), as views
    that can be copied into, for the three experts modules Megatron can build."""
    if hasattr(experts, "local_experts"):                        # SequentialMLP
        return [getattr(e, name).weight for e in experts.local_experts]
    linear = getattr(experts, name)
    weight = getattr(linear, "weight", None)
    if weight is not None and weight.dim() == 3:                 # native grouped experts
        return list(weight.unbind(0))
    return [getattr(linear, f"weight{i}") for i in range(linear.num_gemms)]   # TE grouped


@torch.no_grad()
def copy_hf_qwen3_moe_weights(hf_model, gpt_model) -> None:
    cfg = hf_model.config
    if not getattr(cfg, "norm_topk_prob", True):
        raise ValueError("norm_topk_prob=False routes with unnormalised top-k weights: set "
                         "Megatron's --moe-router-pre-softmax to match (not mapped here)")
    if getattr(cfg, "mlp_only_layers", None):
        raise ValueError("dense layers among the MoE layers (mlp_only_layers) are not mapped")
    heads, groups, hidden = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    per_group = heads // groups
    hf = hf_model.model
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
        ours.self_attention.q_layernorm.weight.copy_(attn.q_norm.weight)
        ours.self_attention.k_layernorm.weight.copy_(attn.k_norm.weight)
        qkv_norm = getattr(ours.self_attention.linear_qkv, "layer_norm_weight", None)
        # TE's spec fuses the input norm into the QKV projection (input_layernorm: IdentityOp)
        (qkv_norm if qkv_norm is not None else ours.input_layernorm.weight).copy_(
            theirs.input_layernorm.weight)
        ours.pre_mlp_layernorm.weight.copy_(theirs.post_attention_layernorm.weight)
        moe = theirs.mlp
        ours.mlp.router.weight.copy_(moe.gate.weight)
        experts = ours.mlp.experts
        for target, source in zip(expert_weights(experts, "linear_fc1"), moe.experts.gate_up_proj):
            target.copy_(source)
        for target, source in zip(expert_weights(experts, "linear_fc2"), moe.experts.down_proj):
            target.copy_(source)
