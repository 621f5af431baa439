"""Gradient-accumulation fusion in the native grouped experts (GroupedMatmulAccumulate,
training/native/grouped_experts.py) under megatron-core 0.19.2's own DDP on the CPU (one gloo
rank, tests/native/megatron_cpu.py), with grouped_mm's CPU kernel and the torch stand-in of
the Triton accumulation (the kernel itself: tests/native/test_kernels_interpreted.py; on the
GPU: tests/gpu/test_grouped_wgrad_gpu.py). Against the autograd path: dX the same, main_grad
over two micro-batches the same and equal to the float64 sum (nothing counted twice), DDP's
`grad_added_to_main_grad` contract kept. And (slow) the kernel compiled for sm_90 without a
GPU."""
from __future__ import annotations

import types

import pytest
import torch

from training.native import grouped_wgrad
from training.native.grouped_experts import ColumnGroupedLinear, DeviceCounts

from tests.moe.experts import expert_config
from tests.native.megatron_cpu import on_cpu

COUNTS = [[3, 0, 7, 0, 1, 9], [0, 4, 2, 0, 11, 1]]   # per micro-batch; expert 3 gets none


@pytest.fixture(autouse=True)
def _wgrad_fusion_on(monkeypatch):
    """MOE_WGRAD_FUSION for these tests (the run sets it: training.specs.moe_parts)."""
    from training.native import grouped_experts

    monkeypatch.setitem(grouped_experts.WGRAD_FUSION, "on", True)


@pytest.fixture(autouse=True)
def _no_cuda_stream(monkeypatch):
    """DDP's gradient reduce asks for the current CUDA stream (to wait on CUDA-graph events,
    none here)."""
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda *a: types.SimpleNamespace(wait_event=None))


def _experts(fusion: bool):
    """fc1 of 6 experts (16 -> 24) in bf16 on grouped_mm, GRADIENT_ACCUMULATION_FUSION on or
    off."""
    from megatron.core.transformer.module import MegatronModule

    config = expert_config(6, 16, 12, torch.bfloat16)
    config.gradient_accumulation_fusion = fusion

    class Experts(MegatronModule):
        def __init__(self):
            super().__init__(config)
            self.fc1 = ColumnGroupedLinear(6, 16, 24, config=config,
                                           init_method=torch.nn.init.normal_, bias=False,
                                           skip_bias_add=False, impl="grouped_mm")

        def forward(self, x, counts):
            return self.fc1(x, counts)[0]

    torch.manual_seed(0)
    return Experts()


def _ddp_linear(fusion: bool, grad_dtype: torch.dtype, overlap: bool):
    """The experts inside Megatron's DDP: main_grad in grad_dtype."""
    from megatron.core.distributed import (DistributedDataParallel,
                                           DistributedDataParallelConfig)

    experts = _experts(fusion)
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=grad_dtype == torch.float32, overlap_grad_reduce=overlap)
    return DistributedDataParallel(experts.config, ddp_config, experts)


def _micro_batches(ddp, device_counts: bool):
    """Two micro-batches' forward and backward as Megatron's schedule runs them: (dX of each,
    main_grad after both, float64 sum of the weight gradients, the flags DDP's hook saw)."""
    weight = ddp.module.fc1.weight
    gen = torch.Generator().manual_seed(1)
    ddp.zero_grad_buffer()
    dxs, flags = [], []
    expected = torch.zeros(weight.shape, dtype=torch.float64)
    for i, counts in enumerate(COUNTS):
        rows = sum(counts)
        x = torch.randn(rows, 16, generator=gen).bfloat16().requires_grad_()
        grad = torch.randn(rows, 24, generator=gen).bfloat16()
        tokens = DeviceCounts(torch.tensor(counts)) if device_counts else counts
        if i == len(COUNTS) - 1:
            ddp(x, tokens).backward(grad)
        else:
            with ddp.no_sync():
                ddp(x, tokens).backward(grad)
        dxs.append(x.grad)
        flags.append((weight.grad_added_to_main_grad, weight.grad))
        start = 0
        for e, n in enumerate(counts):
            expected[e] += grad[start:start + n].double().t() @ x[start:start + n].double()
            start += n
    ddp.finish_grad_sync()
    return dxs, weight.main_grad.clone(), expected, flags


@pytest.mark.parametrize("device_counts", [False, True], ids=["host-counts", "device-counts"])
@pytest.mark.parametrize("overlap", [False, True], ids=["", "overlap"])
@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.bfloat16])
def test_fused_main_grad_and_dx_match_the_autograd_path(grad_dtype, overlap, device_counts):
    with on_cpu():
        fused = _micro_batches(_ddp_linear(True, grad_dtype, overlap), device_counts)
        plain = _micro_batches(_ddp_linear(False, grad_dtype, overlap), device_counts)
    (dx_f, grad_f, expected, flags_f), (dx_p, grad_p, _, flags_p) = fused, plain
    for a, b in zip(dx_f, dx_p):
        torch.testing.assert_close(a, b, rtol=0, atol=0)   # grouped_mm's dX either way
    assert grad_f.dtype == grad_p.dtype == grad_dtype
    # the fused sum is rounded once to main_grad's dtype; the autograd path rounds each
    # micro-batch's gradient to bf16 (the weight's dtype) before adding it
    exact = {"rtol": 1e-5, "atol": 1e-5} if grad_dtype == torch.float32 else \
        {"rtol": 2 ** -8, "atol": 1e-2}
    torch.testing.assert_close(grad_f.double(), expected, **exact)   # counted once
    torch.testing.assert_close(grad_f, grad_p, rtol=2 ** -7, atol=5e-2)
    assert grad_f[3].abs().max() == 0 and grad_f[0].abs().max() > 0   # expert 3: no rows in either
    # DDP's hook saw the flag and dropped the placeholder; the autograd path's was added
    assert flags_f == [(True, None)] * 2 and flags_p == [(False, None)] * 2


def test_without_fusion_or_main_grad_the_autograd_path_runs(monkeypatch):
    """GRADIENT_ACCUMULATION_FUSION=0, no DDP (no main_grad), or MOE_WGRAD_FUSION off (the
    default): the kernel is not called and the weight gets autograd's gradient, as before."""
    from training.native import grouped_experts

    called = []
    monkeypatch.setattr(grouped_wgrad, "accumulate_", lambda *a: called.append(a))
    with on_cpu():
        _micro_batches(_ddp_linear(False, torch.float32, False), False)
        experts = _experts(True)
        x = torch.randn(sum(COUNTS[0]), 16).bfloat16()
        experts(x, COUNTS[0]).backward(torch.randn(sum(COUNTS[0]), 24).bfloat16())
        monkeypatch.setitem(grouped_experts.WGRAD_FUSION, "on", False)
        _micro_batches(_ddp_linear(True, torch.float32, False), False)
    assert called == [] and experts.fc1.weight.grad is not None


def test_the_run_switch_follows_the_flag_and_ga_fusion(monkeypatch):
    """--moe-wgrad-fusion (MOE_WGRAD_FUSION) turns the kernel on for the run, with
    --gradient-accumulation-fusion; training.specs.moe_parts sets it and names it."""
    from types import SimpleNamespace

    from training import specs
    from training.native import grouped_experts

    def args(wgrad, ga):
        return SimpleNamespace(num_experts=8, moe_grouped_gemm=True, moe_expert_impl="native",
                               moe_wgrad_fusion=wgrad, gradient_accumulation_fusion=ga,
                               moe_device_counts=False)
    for wgrad, ga in ((True, True), (True, False), (False, True)):
        parts = specs.moe_parts(args(wgrad, ga))
        assert grouped_experts.WGRAD_FUSION["on"] is (wgrad and ga)
        assert ("Triton kernel" in parts["experts"]) is (wgrad and ga)


@pytest.mark.slow
@pytest.mark.parametrize("grad_dtype", ["*fp32", "*bf16"])
def test_the_kernel_compiles_for_sm90_pipelined_on_tensor_cores(grad_dtype):
    """The compiled path the interpreter does not see: Triton builds the kernel for an
    H100/H200 (sm_90, no GPU needed) with bf16 rows and the launch's options, its pointers and
    sizes 16-divisible as the launcher specializes them at Qwen3's shape: the product on
    wgmma, the row loop's loads pipelined in three shared-memory stages."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    out, inp, k = grouped_wgrad.BLOCKS
    signature = {"x_ptr": "*bf16", "dy_ptr": "*bf16", "ends_ptr": "*i32", "grad_ptr": grad_dtype,
                 **{n: "i32" for n in ("OUT", "IN", "TILES_OUT", "TILES_IN")},
                 **{n: "constexpr" for n in ("BLOCK_OUT", "BLOCK_IN", "BLOCK_K")}}
    source = ASTSource(fn=grouped_wgrad._grouped_wgrad_accum, signature=signature,
                       constexprs={"BLOCK_OUT": out, "BLOCK_IN": inp, "BLOCK_K": k},
                       attrs={(i,): [["tt.divisibility", 16]] for i in range(6)})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options=grouped_wgrad.LAUNCH)
    assert "wgmma.mma_async" in compiled.asm["ptx"]
    stages = grouped_wgrad.LAUNCH["num_stages"]
    assert f"memdesc<{stages}x{k}x{out}xbf16" in compiled.asm["ttgir"]


@pytest.mark.parametrize("warp_specialize", [False, True], ids=["plain", "warp-specialized"])
def test_the_tma_kernel_compiles_for_sm90_with_tensor_memory_loads(warp_specialize):
    """The TMA kernel built for sm_90 (no GPU needed): its whole row steps come through the
    tensor-memory accelerator (cp.async.bulk.tensor) into the shared memory the wgmma reads,
    pipelined; with warp specialization Triton splits the loads and the products into warp
    groups."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    out, inp, k = grouped_wgrad.TMA_BLOCKS
    signature = {"x_desc": f"tensordesc<bf16[{k},{inp}]>", "dy_desc": f"tensordesc<bf16[{k},{out}]>",
                 "x_ptr": "*bf16", "dy_ptr": "*bf16", "ends_ptr": "*i32", "grad_ptr": "*bf16",
                 **{n: "i32" for n in ("OUT", "IN", "TILES_OUT", "TILES_IN")},
                 **{n: "constexpr" for n in ("BLOCK_OUT", "BLOCK_IN", "BLOCK_K",
                                             "WARP_SPECIALIZE")}}
    source = ASTSource(fn=grouped_wgrad._grouped_wgrad_accum_tma, signature=signature,
                       constexprs={"BLOCK_OUT": out, "BLOCK_IN": inp, "BLOCK_K": k,
                                   "WARP_SPECIALIZE": warp_specialize},
                       attrs={(i,): [["tt.divisibility", 16]] for i in range(2, 8)})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options=grouped_wgrad.TMA_LAUNCH)
    ptx, ttgir = compiled.asm["ptx"], compiled.asm["ttgir"]
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    assert "async_tma_copy_global_to_local" in ttgir
    assert ("warp_specialize" in ttgir) is warp_specialize
