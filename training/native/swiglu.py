"""SwiGLU on the packed fc1 output, one Triton pass each way.

Megatron's MLP computes fc1 into [.., 2f] (gate half, then up half) and calls
`bias_swiglu_impl(x, bias, ...)`: silu(gate) * up. Its torch-compiled backward re-derives the
sigmoid in several passes; this kernel reads x and dy once and writes dx once (the
bandwidth floor for the operation). Used for the bias-free Llama MLP; with a bias, or with
fp8 input storage / activation offloading, Megatron's own function runs.
"""
from __future__ import annotations

import torch

from .rope import HAVE_TRITON

if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _row_starts(row, F):
        """Element offsets of a row's start in x [rows, 2F] and in y [rows, F], in int64.
        In int32, row * 2F passes 2^31 at Llama3-8B's F=14336 from row 74,899 (MBS 10 at
        seq 8192, TP=1) and wraps to a negative offset."""
        row = row.to(tl.int64)
        return row * 2 * F, row * F

    @triton.jit
    def _swiglu_fwd(x_ptr, y_ptr, F, BLOCK: tl.constexpr):
        x_row, y_row = _row_starts(tl.program_id(0), F)
        col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = col < F
        gate = tl.load(x_ptr + x_row + col, mask=mask).to(tl.float32)
        up = tl.load(x_ptr + x_row + F + col, mask=mask).to(tl.float32)
        y = gate * tl.sigmoid(gate) * up
        tl.store(y_ptr + y_row + col, y.to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _swiglu_bwd(x_ptr, dy_ptr, dx_ptr, F, BLOCK: tl.constexpr):
        x_row, y_row = _row_starts(tl.program_id(0), F)
        col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = col < F
        gate = tl.load(x_ptr + x_row + col, mask=mask).to(tl.float32)
        up = tl.load(x_ptr + x_row + F + col, mask=mask).to(tl.float32)
        dy = tl.load(dy_ptr + y_row + col, mask=mask).to(tl.float32)
        sig = tl.sigmoid(gate)
        silu = gate * sig
        dgate = dy * up * sig * (1.0 + gate * (1.0 - sig))
        dup = dy * silu
        tl.store(dx_ptr + x_row + col, dgate.to(dx_ptr.dtype.element_ty), mask=mask)
        tl.store(dx_ptr + x_row + F + col, dup.to(dx_ptr.dtype.element_ty), mask=mask)

_BLOCK = 1024


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        rows, width = x.shape
        f = width // 2
        y = x.new_empty(rows, f)
        _swiglu_fwd[(rows, triton.cdiv(f, _BLOCK))](x, y, f, BLOCK=_BLOCK)
        ctx.save_for_backward(x)
        return y

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        rows, width = x.shape
        f = width // 2
        dx = torch.empty_like(x)
        _swiglu_bwd[(rows, triton.cdiv(f, _BLOCK))](x, dy.contiguous(), dx, f, BLOCK=_BLOCK)
        return dx


def swiglu_torch(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate.float()).mul(up.float()).to(x.dtype)


def bias_swiglu(original):
    """Megatron's bias_swiglu_impl (mlp.py's copy) with the Triton kernel for the bias-free
    case; with a bias, fp8 input storage, activation offloading or a CPU tensor, `original`."""

    def bias_swiglu_impl(input, bias, fp8_input_store=False, cpu_offload_input=False):
        if bias is not None or fp8_input_store or cpu_offload_input or not input.is_cuda:
            return original(input, bias, fp8_input_store, cpu_offload_input)
        shape = input.shape
        out = _SwiGLU.apply(input.reshape(-1, shape[-1]))
        return out.view(*shape[:-1], shape[-1] // 2)

    bias_swiglu_impl.description = "native SwiGLU, one Triton pass each way over fc1's output"
    return bias_swiglu_impl


def liger_megatron_bias_swiglu(original):
    """The same slot filled by Liger-Kernel's own Megatron SwiGLU (liger_kernel.megatron,
    its fused gate-up kernel), the alternative training.native.IMPLEMENTATION can pick; it
    defers to `original` where Liger has no kernel (bias, fp8 input store, offloading) and
    here also on CPU tensors (tests)."""
    from liger_kernel.megatron import LigerMegatronSwiGLU

    liger = LigerMegatronSwiGLU(fallback_impl=original)

    def bias_swiglu_impl(input, bias, fp8_input_store=False, cpu_offload_input=False):
        if not input.is_cuda:
            return original(input, bias, fp8_input_store, cpu_offload_input)
        return liger(input, bias, fp8_input_store, cpu_offload_input)

    bias_swiglu_impl.description = ("Liger-Kernel's Megatron SwiGLU "
                                    "(liger_kernel.megatron.LigerMegatronSwiGLU, fused gate-up)")
    return bias_swiglu_impl


def swiglu_replacement(original, run):
    """The patch table's factory (training.megatron_patches, native_swiglu): ours or Liger's
    Megatron SwiGLU, as training.native.IMPLEMENTATION says."""
    from training.native import IMPLEMENTATION

    if IMPLEMENTATION["swiglu"] == "liger_megatron":
        return liger_megatron_bias_swiglu(original)
    return bias_swiglu(original)
