"""gpt-oss's expert activation, weighted by the routing probabilities, one pass each way.

Megatron's grouped experts compute it as `weighted_bias_quick_geglu_impl(x, None, probs, ...,
linear_offset, clamp_value)`: on fc1's output x = [gate | linear] (each half F wide),

    g = min(gate, limit);  u = clamp(linear, -limit, limit)
    y = g * sigmoid(1.702 g) * (u + offset) * prob            (computed in fp32, stored in x's dtype)

megatron-core 0.19.2 clamps outside its compiled function (chunk, two clamps and a cat, each a
pass over the [rows, 2F] tensor, and their backwards), and keeps two copies of it for the
backward (the clamp's input and the cat). Session 15's H200 profile of gpt-oss-20b (8 layers,
seq 8192) put ~0.15 s of a 3.06 s step there. Here one Triton kernel reads x and the probabilities
and writes y; the backward reads x, the probabilities and dy once and writes dx and the
probabilities' gradient (the clamps' gradients are zero outside [-limit, limit], as torch's
clamp: the bounds themselves pass). Only x is kept for the backward.

On a CPU tensor the same formulas run in torch (the tests compare them with Megatron's own
function through autograd; tests/gpu/ compares the kernel).
"""
from __future__ import annotations

import torch

from .rope import HAVE_TRITON

ALPHA = 1.702                      # quick_gelu's: x sigmoid(1.702 x)

if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _geglu_fwd(x_ptr, w_ptr, y_ptr, F, limit, offset, alpha, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = col < F
        w = tl.load(w_ptr + row).to(tl.float32)
        gate = tl.minimum(tl.load(x_ptr + row * 2 * F + col, mask=mask).to(tl.float32), limit)
        lin = tl.load(x_ptr + row * 2 * F + F + col, mask=mask).to(tl.float32)
        lin = tl.minimum(tl.maximum(lin, -limit), limit)
        y = gate * tl.sigmoid(alpha * gate) * (lin + offset) * w
        tl.store(y_ptr + row * F + col, y.to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _geglu_bwd(x_ptr, w_ptr, dy_ptr, dx_ptr, dw_ptr, F, limit, offset, alpha,
                   BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        w = tl.load(w_ptr + row).to(tl.float32)
        dw = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, F, BLOCK):
            col = start + tl.arange(0, BLOCK)
            mask = col < F
            gate = tl.load(x_ptr + row * 2 * F + col, mask=mask).to(tl.float32)
            lin = tl.load(x_ptr + row * 2 * F + F + col, mask=mask).to(tl.float32)
            dy = tl.load(dy_ptr + row * F + col, mask=mask).to(tl.float32)
            g = tl.minimum(gate, limit)
            u = tl.minimum(tl.maximum(lin, -limit), limit) + offset
            sig = tl.sigmoid(alpha * g)
            act = g * sig
            dgate = dy * w * u * (sig + alpha * act * (1.0 - sig))
            dgate = tl.where(gate <= limit, dgate, 0.0)
            dlin = tl.where((lin >= -limit) & (lin <= limit), dy * w * act, 0.0)
            dw += tl.where(mask, dy * act * u, 0.0)
            tl.store(dx_ptr + row * 2 * F + col, dgate.to(dx_ptr.dtype.element_ty), mask=mask)
            tl.store(dx_ptr + row * 2 * F + F + col, dlin.to(dx_ptr.dtype.element_ty),
                     mask=mask)
        tl.store(dw_ptr + row, tl.sum(dw, axis=0))

_BLOCK = 1024


def _forward_torch(x, w, limit, offset, alpha):
    gate, lin = x.float().chunk(2, dim=-1)
    g = gate.clamp(max=limit)
    u = lin.clamp(-limit, limit)
    return (g * torch.sigmoid(alpha * g) * (u + offset) * w.float()).to(x.dtype)


def _backward_torch(x, w, dy, limit, offset, alpha):
    gate, lin = x.float().chunk(2, dim=-1)
    dy, w = dy.float(), w.float()
    g = gate.clamp(max=limit)
    u = lin.clamp(-limit, limit) + offset
    sig = torch.sigmoid(alpha * g)
    act = g * sig
    dgate = torch.where(gate <= limit, dy * w * u * (sig + alpha * act * (1 - sig)), 0.0)
    dlin = torch.where((lin >= -limit) & (lin <= limit), dy * w * act, 0.0)
    dw = (dy * act * u).sum(-1, keepdim=True)
    return torch.cat((dgate, dlin), -1).to(x.dtype), dw


class WeightedClampedQuickGeGLU(torch.autograd.Function):
    """x [rows, 2F], weights [rows, 1] -> [rows, F] (see the module's docstring)."""

    @staticmethod
    def forward(ctx, x, weights, limit: float, offset: float, alpha: float):
        x = x.contiguous()
        rows, width = x.shape
        f = width // 2
        ctx.save_for_backward(x, weights)
        ctx.constants = (limit, offset, alpha)
        if not x.is_cuda or not x.numel():     # (no rows: a grid of 0 cannot launch)
            return _forward_torch(x, weights, limit, offset, alpha)
        y = x.new_empty(rows, f)
        _geglu_fwd[(rows, triton.cdiv(f, _BLOCK))](x, weights.contiguous(), y, f, limit, offset,
                                                   alpha, BLOCK=_BLOCK)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weights = ctx.saved_tensors
        limit, offset, alpha = ctx.constants
        if not x.is_cuda or not x.numel():
            dx, dw = _backward_torch(x, weights, dy, limit, offset, alpha)
        else:
            rows, width = x.shape
            dx = torch.empty_like(x)
            dw = torch.empty(rows, 1, dtype=torch.float32, device=x.device)
            _geglu_bwd[(rows,)](x, weights.contiguous(), dy.contiguous(), dx, dw, width // 2,
                                limit, offset, alpha, BLOCK=_BLOCK)
        return dx, dw.to(weights.dtype), None, None, None


def clamped_geglu_replacement(original, run):
    """The patch table's factory (training.megatron_patches, native_clamped_geglu): Megatron's
    weighted_bias_quick_geglu_impl with the clamped, bias-free case in one pass each way; a
    bias, fp8 input storage or no clamp goes to `original`."""

    def weighted_bias_quick_geglu_impl(input, bias, weights, fp8_input_store=False,
                                       linear_offset=0.0, clamp_value=None):
        if bias is not None or fp8_input_store or clamp_value is None:
            return original(input, bias, weights, fp8_input_store, linear_offset, clamp_value)
        shape = input.shape
        out = WeightedClampedQuickGeGLU.apply(
            input.reshape(-1, shape[-1]), weights.reshape(-1, 1), float(clamp_value),
            float(linear_offset), ALPHA)
        return out if input.dim() == 2 else out.view(*shape[:-1], shape[-1] // 2)

    weighted_bias_quick_geglu_impl.description = (
        "native clamped quick-GeGLU x routing probability, one Triton pass each way")
    return weighted_bias_quick_geglu_impl
