"""Gradient-accumulation fusion of the native grouped experts on the GPU (the Triton kernel of
training/native/grouped_wgrad.py, compiled, bf16 rows): against today's autograd path (grouped_mm's
weight gradient added to main_grad) at Qwen3-30B-A3B's expert shapes over two micro-batches,
and the experts' forward and backward with the counts on the GPU under CUDA's sync debug mode
set to error (nothing read on the host)."""
from __future__ import annotations

import pytest
import torch

from training.native.grouped_experts import DeviceCounts, grouped_matmul, has_fast_grouped_mm

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _wgrad_fusion_on(monkeypatch):
    """MOE_WGRAD_FUSION for these tests (the run sets it: training.specs.moe_parts)."""
    from training.native import grouped_experts

    monkeypatch.setitem(grouped_experts.WGRAD_FUSION, "on", True)

EXPERTS, TOKENS = 128, 32768   # Qwen3-30B-A3B: 128 experts, 4096 tokens x top-8


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


def _counts(gen) -> torch.Tensor:
    weights = torch.rand(EXPERTS, generator=gen, device="cuda") ** 3   # uneven routing
    weights[EXPERTS // 2] = 0                                          # an empty expert
    return torch.distributions.Multinomial(TOKENS, weights).sample().long()


@pytest.mark.parametrize("device_counts", [False, True], ids=["host-counts", "device-counts"])
@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("inp,out", [(2048, 1536), (768, 2048)], ids=["fc1", "fc2"])
def test_fused_wgrad_matches_the_autograd_path(inp, out, grad_dtype, device_counts):
    if not has_fast_grouped_mm(torch.device("cuda"), torch.bfloat16):
        pytest.skip("grouped_mm's fast kernel needs SM90/SM100")
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(EXPERTS, out, inp, device="cuda", generator=gen) * inp ** -0.5
         ).bfloat16().requires_grad_()
    w.grad_added_to_main_grad = False                       # as Megatron's DDP sets it
    start = torch.randn(w.shape, device="cuda", generator=gen).to(grad_dtype) * 1e-2
    fused_grad, plain_grad = start.clone(), start.clone()
    reference = start.float()
    for _micro_batch in range(2):
        counts = _counts(gen)
        given = DeviceCounts(counts) if device_counts else counts.tolist()
        x = torch.randn(TOKENS, inp, device="cuda", generator=gen).bfloat16().requires_grad_()
        g = torch.randn(TOKENS, out, device="cuda", generator=gen).bfloat16()
        y = grouped_matmul(x, w, given, "grouped_mm", main_grad=fused_grad)
        (dx_fused,) = torch.autograd.grad(y, x, g)   # the placeholder for w is not returned
        assert w.grad_added_to_main_grad
        y = grouped_matmul(x, w, given, "grouped_mm")
        dx, dw = torch.autograd.grad(y, (x, w), g)
        plain_grad.add_(dw)                           # DDP's hook, the autograd path
        torch.testing.assert_close(dx_fused, dx, rtol=0, atol=0)
        ends = torch.cumsum(counts, 0).tolist()
        for e, (begin, end) in enumerate(zip([0] + ends[:-1], ends)):
            reference[e] += g[begin:end].float().t() @ x[begin:end].detach().float()
        w.grad_added_to_main_grad = False
    assert fused_grad.dtype == grad_dtype
    assert torch.equal(fused_grad[EXPERTS // 2], start[EXPERTS // 2])   # the empty expert
    assert rel(fused_grad, reference) < (1e-4 if grad_dtype == torch.float32 else 1e-2)
    assert rel(fused_grad, plain_grad) < 1e-2
    torch.cuda.synchronize()


def test_grouped_experts_accumulate_without_reading_the_gpu_from_the_host():
    """TEGroupedMLP on the native linears at Qwen3-30B-A3B's expert shape, counts on the GPU
    (the lean step), main_grad on both projections: forward and backward under the sync debug
    mode set to error; both main_grads then hold the weight gradients and are flagged."""
    if not has_fast_grouped_mm(torch.device("cuda"), torch.bfloat16):
        pytest.skip("grouped_mm's fast kernel needs SM90/SM100")
    from megatron.core.process_groups_config import ProcessGroupCollection

    from training.native.grouped_experts import grouped_experts_builder

    from tests.model.parity import init_single_rank
    from tests.moe.experts import expert_config

    init_single_rank("cuda")
    config = expert_config(EXPERTS, 2048, 768, torch.bfloat16)
    config.gradient_accumulation_fusion = True
    mlp = grouped_experts_builder()(
        EXPERTS, config, pg_collection=ProcessGroupCollection.use_mpu_process_groups()).cuda()
    weights = [mlp.linear_fc1.weight, mlp.linear_fc2.weight]
    for w in weights:
        w.main_grad = torch.zeros(w.shape, device="cuda", dtype=torch.bfloat16)
    gen = torch.Generator(device="cuda").manual_seed(0)
    counts = _counts(gen)
    x = torch.randn(TOKENS, 2048, device="cuda", generator=gen).bfloat16().requires_grad_()
    probs = torch.rand(TOKENS, device="cuda", generator=gen)
    g = torch.randn(TOKENS, 2048, device="cuda", generator=gen).bfloat16()

    def step():
        for w in weights:
            w.grad_added_to_main_grad, w.grad = False, None
            w.main_grad.zero_()
        out, _bias = mlp(x, DeviceCounts(counts), probs)
        out.backward(g)

    step()                       # compile and warm up first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for w in weights:
        assert w.grad_added_to_main_grad and w.main_grad.abs().amax() > 0
    empty = counts == 0
    assert empty.any() and all(w.main_grad[empty].abs().amax() == 0 for w in weights)
