"""Each native kernel against its plain-torch twin, forward and backward, on random inputs."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("groups,per_group,head_dim,seq,batch", [(8, 4, 128, 512, 2),
                                                                 (2, 2, 64, 256, 1)])
def test_fused_qkv_rope_triton_matches_torch(groups, per_group, head_dim, seq, batch):
    from training.native import rope

    torch.manual_seed(1)
    mixed = torch.randn(seq, batch, groups, (per_group + 2) * head_dim, device="cuda",
                        dtype=torch.bfloat16, requires_grad=True)
    inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, device="cuda").float() / head_dim))
    freqs = torch.outer(torch.arange(seq, device="cuda").float(), inv)
    emb = torch.cat([freqs, freqs], -1)[:, None, None, :]
    split = [per_group * head_dim, head_dim, head_dim]
    fused = rope.fused_qkv_rope("liger")(mixed, emb, emb, split)
    reference = rope.rope_torch(mixed, emb, emb, per_group, head_dim)
    grads = [torch.randn_like(t) for t in reference]
    for ours, ref in zip(fused, reference):
        assert ours.shape == ref.shape
        assert rel(ours, ref) < 1e-2
    g_fused = torch.autograd.grad(fused, mixed, grads)[0]
    g_ref = torch.autograd.grad(reference, mixed, grads)[0]
    assert rel(g_fused, g_ref) < 1e-2


@pytest.mark.parametrize("chunk_mem", [1, 8])  # CE_CHUNK_MEM: Liger's default, 8x larger chunks
def test_liger_fused_linear_ce_matches_chunked_torch(chunk_mem):
    from training.native.cross_entropy import IGNORE_INDEX, linear_cross_entropy_sum

    torch.manual_seed(2)
    hidden = torch.randn(2048, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = (torch.randn(8192, 512, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_()
    target = torch.randint(0, 8192, (2048,), device="cuda")
    target[::7] = IGNORE_INDEX
    out = {}
    for kernels in ("liger", "torch"):
        loss = linear_cross_entropy_sum(hidden, weight, target, kernels, chunk_mem=chunk_mem)
        gh, gw = torch.autograd.grad(loss * 0.5, (hidden, weight))
        out[kernels] = (loss.detach(), gh, gw)
    assert abs(out["liger"][0].item() - out["torch"][0].item()) / out["torch"][0].item() < 1e-3
    assert rel(out["liger"][1], out["torch"][1]) < 2e-2
    assert rel(out["liger"][2], out["torch"][2]) < 2e-2
    full = torch.nn.functional.cross_entropy((hidden @ weight.t()).float(), target,
                                             ignore_index=IGNORE_INDEX, reduction="sum")
    assert abs(out["torch"][0].item() - full.item()) / full.item() < 1e-3


def test_liger_fused_linear_ce_never_reads_the_gpu_from_the_host():
    """Forward and backward under CUDA's sync debug mode set to error: a host read (Liger's
    own entry does two per micro-batch) raises."""
    from training.native.cross_entropy import IGNORE_INDEX, linear_cross_entropy_sum

    hidden = torch.randn(1024, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = (torch.randn(4096, 256, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_()
    target = torch.randint(0, 4096, (1024,), device="cuda")
    target[::3] = IGNORE_INDEX
    scale = torch.tensor(0.25, device="cuda")
    linear_cross_entropy_sum(hidden, weight, target, "liger", chunk_mem=1)   # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss = linear_cross_entropy_sum(hidden, weight, target, "liger", chunk_mem=1)
        torch.autograd.grad(loss * scale, (hidden, weight))
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("impl", ["liger", "fused"])
def test_rmsnorm_kernels_match_torch(impl):
    from training.native import norm

    fn = {"liger": norm.rms_norm_liger, "fused": norm.rms_norm_fused}[impl]
    x = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (1 + 0.1 * torch.randn(1024, device="cuda", dtype=torch.bfloat16)).requires_grad_()
    a, b = fn(x, w, 1e-5), norm.rms_norm_torch(x, w, 1e-5)
    assert rel(a, b) < 1e-2
    g = torch.randn_like(a)
    ga = torch.autograd.grad(a, (x, w), g)
    gb = torch.autograd.grad(b, (x, w), g)
    assert rel(ga[0], gb[0]) < 1e-2 and rel(ga[1], gb[1]) < 2e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_wgrad_accumulates_into_main_grad(dtype):
    from training.native.wgrad import TorchWgradAccum

    x = torch.randn(1024, 512, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(1024, 256, device="cuda", dtype=torch.bfloat16)
    main = torch.randn(256, 512, device="cuda", dtype=dtype)
    expected = main.float() + g.float().t() @ x.float()
    if dtype == torch.float32:
        TorchWgradAccum.wgrad_gemm_accum_fp32(x, g, main)
    else:
        TorchWgradAccum.wgrad_gemm_accum_fp16(x, g, main)
    assert rel(main, expected) < (1e-3 if dtype == torch.float32 else 1e-2)


def test_sdpa_attention_matches_math_and_reports_backend():
    from megatron.core.transformer.enums import AttnMaskType

    from training.native.attention import SDPAttention, describe_backend

    class Cfg:
        context_parallel_size = 1
        attention_dropout = 0.0

    attn = SDPAttention(Cfg(), 1, AttnMaskType.causal, "self")
    s, b, h, g, d = 1024, 1, 32, 8, 128
    q = torch.randn(s, b, h, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(s, b, g, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(s, b, g, d, device="cuda", dtype=torch.bfloat16)
    out = attn(q, k, v)
    kk = k.repeat_interleave(h // g, dim=2)
    vv = v.repeat_interleave(h // g, dim=2)
    scores = torch.einsum("sbhd,tbhd->bhst", q.float(), kk.float()) / d ** 0.5
    scores = scores.masked_fill(torch.ones(s, s, device="cuda").triu(1).bool(), float("-inf"))
    ref = torch.einsum("bhst,tbhd->sbhd", scores.softmax(-1), vv.float()).reshape(s, b, h * d)
    assert out.shape == (s, b, h * d)
    assert rel(out, ref) < 2e-2
    backend = describe_backend(torch.device("cuda"), h, g, d)
    print("SDPA backend:", backend)
    assert backend in ("cudnn_attention", "flash_attention", "efficient_attention")


def test_swiglu_triton_matches_torch():
    from training.native.swiglu import _SwiGLU, swiglu_torch

    x = torch.randn(4096, 2 * 1408, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    a, b = _SwiGLU.apply(x), swiglu_torch(x)
    assert rel(a, b) < 1e-2
    g = torch.randn_like(a)
    assert rel(torch.autograd.grad(a, x, g)[0], torch.autograd.grad(b, x, g)[0]) < 1e-2


def test_fused_adamw_matches_foreach_adamw():
    from training.native.optimizer import FusedTorchAdamW

    torch.manual_seed(3)
    p1 = [torch.randn(1000, 64, device="cuda", requires_grad=True) for _ in range(3)]
    p2 = [p.detach().clone().requires_grad_() for p in p1]
    o1 = FusedTorchAdamW(p1, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    o2 = torch.optim.AdamW(p2, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                           foreach=True)
    assert o1.defaults["fused"] is True
    for _ in range(5):
        for a, b in zip(p1, p2):
            g = torch.randn_like(a)
            a.grad, b.grad = g.clone(), g.clone()
        o1.step()
        o2.step()
    for a, b in zip(p1, p2):
        assert rel(a.detach(), b.detach()) < 1e-5


def test_megatron_gradient_clipping_with_foreach_ops_makes_no_gradient_copy():
    """Megatron's get_grad_norm_fp32 and clip_grad_by_total_norm_fp32 with the native backend's
    multi-tensor ops: the right norm and clipped gradients, and no temporary of the largest
    gradient (which Megatron's local scale allocates: the measured step peak at 8 layers)."""
    import torch.distributed as dist
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads
    from megatron.core.optimizer import optimizer as megatron_optimizer

    from tests.model.parity import native_run
    from training import megatron_patches

    own_group = not dist.is_initialized()
    if own_group:
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    saved = (clip_grads.l2_norm_impl, clip_grads.multi_tensor_scale_impl,
             megatron_optimizer.multi_tensor_scale_impl)
    try:
        clip_grads.l2_norm_impl = utils.local_multi_tensor_l2_norm
        clip_grads.multi_tensor_scale_impl = utils.local_multi_tensor_scale
        torch.manual_seed(4)
        largest = 64 << 20  # fp32 elements: a 256 MiB gradient

        def clip_peak(ops: str):
            params = [torch.nn.Parameter(torch.empty(n, device="cuda"))
                      for n in (largest, 1000, 3 * 4096)]
            for p in params:
                p.grad = torch.randn_like(p)
            ref = [p.grad.clone() for p in params]
            norm = clip_grads.get_grad_norm_fp32([p.grad for p in params])
            expected = torch.linalg.vector_norm(torch.cat([g.flatten() for g in ref])).item()
            assert norm == pytest.approx(expected, rel=1e-5), ops
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            clip_grads.clip_grad_by_total_norm_fp32(params, max_norm=1.0, total_norm=norm)
            torch.cuda.synchronize()
            extra = torch.cuda.max_memory_allocated() - before
            for p, g in zip(params, ref):
                torch.testing.assert_close(p.grad, g * (1.0 / (norm + 1.0e-6)), rtol=1e-6, atol=0)
            return extra

        local_extra = clip_peak("Megatron's local ops")
        megatron_patches.apply(native_run("liger"), names=("native_l2_norm",
                                                           "native_clip_scale"))
        assert "foreach" in megatron_patches.in_place("native_l2_norm")
        foreach_extra = clip_peak("foreach ops")
        assert local_extra >= largest * 4  # the temporary this replaces
        assert foreach_extra < 1 << 20, f"{foreach_extra} bytes beyond the gradients"
    finally:
        (clip_grads.l2_norm_impl, clip_grads.multi_tensor_scale_impl,
         megatron_optimizer.multi_tensor_scale_impl) = saved
        if own_group:
            dist.destroy_process_group()
