"""torch's grouped GEMM (CUTLASS, bf16) in the native grouped experts, on the GPU: against the
loop over experts in fp32 and against Megatron's SequentialMLP, at odd token counts, with
experts that get no token, and at Qwen3-30B-A3B's expert shape."""
from __future__ import annotations

import pytest
import torch

from training.native.grouped_experts import grouped_matmul, has_fast_grouped_mm

from tests.moe.experts import expert_config, expert_pair, run_both

pytestmark = pytest.mark.gpu


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


def test_hopper_or_blackwell_has_the_fast_grouped_gemm():
    major = torch.cuda.get_device_capability()[0]
    assert has_fast_grouped_mm(torch.device("cuda"), torch.bfloat16) == (major in (9, 10))
    assert not has_fast_grouped_mm(torch.device("cuda"), torch.float32)


@pytest.mark.parametrize("experts,hidden,out,tokens", [
    (8, 256, 384, 1000),        # small, odd total
    (128, 2048, 1536, 32768),   # Qwen3-30B-A3B fc1 (2 x 768) at seq 4096, top-8
    (128, 768, 2048, 32768),    # Qwen3-30B-A3B fc2
])
def test_grouped_mm_forward_and_backward_match_the_fp32_loop(experts, hidden, out, tokens):
    if not has_fast_grouped_mm(torch.device("cuda"), torch.bfloat16):
        pytest.skip("grouped_mm's fast kernel needs SM90/SM100")
    gen = torch.Generator(device="cuda").manual_seed(0)
    weights = torch.rand(experts, generator=gen, device="cuda") ** 3   # uneven routing
    weights[experts // 2] = 0                                          # an empty expert
    counts = torch.distributions.Multinomial(tokens, weights).sample().long().tolist()
    assert counts[experts // 2] == 0 and sum(counts) == tokens
    x = torch.randn(tokens, hidden, device="cuda", generator=gen).bfloat16().requires_grad_()
    w = (torch.randn(experts, out, hidden, device="cuda", generator=gen) * hidden ** -0.5
         ).bfloat16().requires_grad_()
    y = grouped_matmul(x, w, counts, "grouped_mm")
    g = torch.randn_like(y)
    dx, dw = torch.autograd.grad(y, (x, w), g)
    x32, w32 = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    y32 = grouped_matmul(x32, w32, counts, "loop")
    dx32, dw32 = torch.autograd.grad(y32, (x32, w32), g.float())
    assert rel(y, y32) < 1e-2 and rel(dx, dx32) < 1e-2 and rel(dw, dw32) < 1e-2
    assert dw[experts // 2].abs().max() == 0
    torch.cuda.synchronize()


@pytest.mark.parametrize("impl", ["grouped_mm", "auto"])
def test_grouped_experts_match_sequential_mlp_in_bf16(impl):
    if not has_fast_grouped_mm(torch.device("cuda"), torch.bfloat16):
        pytest.skip("grouped_mm's fast kernel needs SM90/SM100")
    counts = [37, 0, 129, 5, 1, 300, 64, 0]
    sequential, grouped = expert_pair(expert_config(len(counts), 512, 256, torch.bfloat16),
                                      device="cuda", impl=impl)
    ref, ours = run_both(sequential, grouped, counts)
    for name in ("out", "dx", "dprobs", "dfc1", "dfc2"):
        assert rel(ours[name], ref[name]) < 2e-2, name


@pytest.mark.parametrize("tokens,k,hidden", [(4096, 8, 2048), (1000, 2, 4096), (17, 3, 100)])
def test_triton_gather_sum_matches_torch(tokens, k, hidden):
    """The native permute's gather-sum kernel (one pass, fp32 sum) against index_select + sum,
    with missing copies (-1) as token dropping leaves them."""
    from training.native import moe_permute

    gen = torch.Generator(device="cuda").manual_seed(0)
    src = torch.randn(tokens * k, hidden, device="cuda", generator=gen).bfloat16()
    index = torch.randperm(tokens * k, device="cuda", generator=gen).view(tokens, k)
    index[::7, 0] = -1
    reference = moe_permute.gather_sum_torch(src, index)
    ours = moe_permute.gather_sum(src, index, "liger")
    assert rel(ours, reference) < 1e-2
    assert rel(ours[::7], reference[::7]) < 1e-2   # the rows with a missing copy
