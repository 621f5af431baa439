"""Megatron's SequentialMLP and the native grouped experts with the same weights (shared by the
CPU tests and the GPU tests)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.model.parity import init_single_rank


def expert_config(experts: int, hidden: int, ffn: int, dtype=torch.float32, fusion=True,
                  **kw):
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(
        num_layers=1, hidden_size=hidden, ffn_hidden_size=2 * ffn, num_attention_heads=4,
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
        bias_activation_fusion=fusion, use_cpu_initialization=True,
        gradient_accumulation_fusion=False, num_moe_experts=experts, moe_router_topk=2,
        moe_ffn_hidden_size=ffn, params_dtype=dtype, bf16=dtype == torch.bfloat16, **kw)


def expert_pair(config, device: str = "cpu", impl: str = "auto"):
    """SequentialMLP (Megatron's loop over MLPs) and TEGroupedMLP on the native grouped
    linears, holding the same weights."""
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.mlp import MLPSubmodules
    from megatron.core.transformer.moe.experts import SequentialMLP

    from training.native.grouped_experts import grouped_experts_builder

    init_single_rank(device)
    torch.manual_seed(0)
    groups = ProcessGroupCollection.use_mpu_process_groups()
    experts = config.num_moe_experts
    sequential = SequentialMLP(experts, config, MLPSubmodules(
        linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear), pg_collection=groups)
    grouped = grouped_experts_builder(impl)(experts, config, pg_collection=groups)
    with torch.no_grad():
        for i, expert in enumerate(sequential.local_experts):
            grouped.linear_fc1.weight[i].copy_(expert.linear_fc1.weight)
            grouped.linear_fc2.weight[i].copy_(expert.linear_fc2.weight)
    return sequential.to(device), grouped.to(device)


def run_both(sequential, grouped, counts: list[int], seed: int = 0):
    """Forward and backward of both on the same permuted tokens and routing weights."""
    device = grouped.linear_fc1.weight.device
    dtype = grouped.linear_fc1.weight.dtype
    gen = torch.Generator().manual_seed(seed)
    hidden = grouped.linear_fc1.in_features
    x = torch.randn(sum(counts), hidden, generator=gen).to(device, dtype)
    probs = torch.rand(sum(counts), generator=gen).to(device, torch.float32)
    grad = torch.randn(sum(counts), hidden, generator=gen).to(device, dtype)
    tokens = torch.tensor(counts)
    results = []
    for module in (sequential, grouped):
        module.zero_grad(set_to_none=True)
        xi, pi = x.clone().requires_grad_(), probs.clone().requires_grad_()
        out, bias = module(xi, tokens, pi)
        assert bias is None
        out.backward(grad)
        results.append({"out": out.detach(), "dx": xi.grad, "dprobs": pi.grad})
    fc1 = [e.linear_fc1.weight.grad for e in sequential.local_experts]
    fc2 = [e.linear_fc2.weight.grad for e in sequential.local_experts]
    results[0]["dfc1"], results[0]["dfc2"] = torch.stack(fc1), torch.stack(fc2)
    results[1]["dfc1"] = grouped.linear_fc1.weight.grad
    results[1]["dfc2"] = grouped.linear_fc2.weight.grad
    return results
