"""The Hugging Face peer: LlamaForCausalLM (SDPA) at the same shape, each given its best setup
(bf16 parameters, fused AdamW, optionally Liger-Kernel's RMSNorm/RoPE/SwiGLU and fused linear
cross-entropy, or each decoder layer under torch.compile: --compile), the same micro-batch and global batch through gradient accumulation.
An MoE preset runs as Qwen3MoeForCausalLM (q/k norms; Mixtral-like presets as
MixtralForCausalLM): its experts on torch's grouped_mm (transformers' default experts
implementation), with Liger its fused MoE kernel (LigerExperts); the router's aux loss is
computed every step, as ours is (output_router_logits, the preset's coefficient).

Run as a subprocess: `python -m training.bench.hf_peer --json-out F ...`, so each peer gets
a fresh CUDA context and its own peak-memory figure.
"""
from __future__ import annotations

import time

from training.cli import ArgumentParser

from .peer_common import (add_peer_arguments, check_profile_steps, preset_named,
                          start_profiler, write_result)


def hf_model_config(preset, num_layers: int, seq_length: int):
    """The transformers class and config of a preset's shape at num_layers."""
    if hasattr(preset, "attention_sinks"):     # gpt-oss (training/moe/gpt_oss.py)
        from transformers import GptOssForCausalLM

        from training.moe.gpt_oss import hf_config

        config = hf_config(preset, num_layers, seq_length)
        config.output_router_logits = True      # its router's aux loss each step, as ours
        return GptOssForCausalLM, config
    common = dict(vocab_size=preset.vocab_size, hidden_size=preset.hidden_size,
                  num_hidden_layers=num_layers, num_attention_heads=preset.num_attention_heads,
                  num_key_value_heads=preset.num_query_groups,
                  max_position_embeddings=max(preset.max_position_embeddings, seq_length),
                  rms_norm_eps=preset.norm_epsilon, tie_word_embeddings=False)
    rope = {"rope_type": "default", "rope_theta": float(preset.rotary_base)}
    if not getattr(preset, "num_experts", None):
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaForCausalLM, LlamaConfig(
            intermediate_size=preset.ffn_hidden_size, rope_theta=float(preset.rotary_base),
            attention_bias=False, mlp_bias=False, **common)
    moe = dict(num_experts_per_tok=preset.router_topk, output_router_logits=True,
               router_aux_loss_coef=preset.aux_loss_coeff, rope_parameters=rope)
    if preset.qk_layernorm:
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

        return Qwen3MoeForCausalLM, Qwen3MoeConfig(
            intermediate_size=preset.ffn_hidden_size, head_dim=preset.head_dim,
            num_experts=preset.num_experts, moe_intermediate_size=preset.moe_ffn_hidden_size,
            norm_topk_prob=True, decoder_sparse_step=1, attention_bias=False, **moe, **common)
    from transformers import MixtralConfig, MixtralForCausalLM

    return MixtralForCausalLM, MixtralConfig(
        intermediate_size=preset.moe_ffn_hidden_size, num_local_experts=preset.num_experts,
        head_dim=preset.head_dim, **moe, **common)


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser()
    add_peer_arguments(p, steps=20, warmup=5)
    p.add_argument("--liger", action="store_true")
    p.add_argument("--compile", action="store_true",
                   help="each decoder layer under torch.compile (layer.compile()): the HF MoE "
                        "model's fastest known setup on one H200 (stack notes, 2026-12-03)")
    args = p.parse_args(argv)
    check_profile_steps(p, args)

    import torch

    preset = preset_named(args.model)
    torch.manual_seed(1234)
    model_class, config = hf_model_config(preset, args.num_layers, args.seq_length)
    gpt_oss = model_class.__name__ == "GptOssForCausalLM"
    # gpt-oss has no SDPA path in transformers (sinks): its flex attention, which applies the
    # sinks through flex's log-sum-exp
    config._attn_implementation = "flex_attention" if gpt_oss else "sdpa"
    with torch.device("cuda"):
        model = model_class(config).to(torch.bfloat16)
    if args.liger:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance

        _apply_liger_kernel_to_instance(model=model)
    if args.compile:   # per layer: one graph reused by every layer, the loss and head eager
        for layer in model.model.layers:
            layer.compile()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                                  weight_decay=0.1, fused=True)
    accum = args.global_batch // args.mbs
    tokens = torch.randint(0, preset.vocab_size, (accum, args.mbs, args.seq_length),
                           device="cuda")
    times, losses = [], []
    profiler = start_profiler(args.profile_dir, args.warmup + args.steps)
    for step in range(args.warmup + args.steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        total = 0.0
        for micro in range(accum):
            out = model(input_ids=tokens[micro], labels=tokens[micro])
            (out.loss / accum).backward()
            total += out.loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        losses.append(float(total) / accum)
        if profiler is not None:
            profiler.step()
    if profiler is not None:
        profiler.stop()
    write_result(args, times, losses,
                 "bf16 params, bf16 AdamW moments (torch fused AdamW), no fp32 master",
                 liger=args.liger, compiled=args.compile,
                 **({"attention": "flex_attention"} if gpt_oss else {}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
