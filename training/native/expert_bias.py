"""Each row's expert bias added to the grouped experts' output: x + bias[expert of the row]
(times the row's routing probability, fc2), the rows sorted by expert.

Autograd's own backward of the gather `bias[rows]` is index_put with accumulate, whose
sort-based kernel took ~8 ms a call at gpt-oss-20b's 32,768 rows x 5,760 (about 0.9 s of a
3.06 s step, session 15's H200 profile). Written as torch ops the rest costs too: with the
probabilities the forward gathered, multiplied and added in fp32 (five passes over the rows),
the backward copied the gradient to fp32 for the probabilities' gradient (about 0.16 s of a
1.83 s step in session 16's profile). Here, on the GPU:

- forward: one Triton pass, out = x + bias[e] (* prob), computed in fp32, stored in x's dtype;
- the bias gradient: each expert's rows summed by one GEMM, an [experts, rows] matrix of ones
  (or the probabilities) times the gradient (fp32 accumulation);
- the probabilities' gradient: one Triton pass, dot(grad row, bias[e]) in fp32.

On the CPU the same formulas run as torch ops (the tests compare them with autograd through the
gather; tests/gpu/ compares the kernels).
"""
from __future__ import annotations

import torch

from .rope import HAVE_TRITON

if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _bias_fwd(x_ptr, b_ptr, e_ptr, p_ptr, y_ptr, H, HAS_P: tl.constexpr,
                  BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = col < H
        e = tl.load(e_ptr + row).to(tl.int64)
        b = tl.load(b_ptr + e * H + col, mask=mask).to(tl.float32)
        if HAS_P:
            b = b * tl.load(p_ptr + row).to(tl.float32)
        x = tl.load(x_ptr + row * H + col, mask=mask).to(tl.float32)
        tl.store(y_ptr + row * H + col, (x + b).to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _bias_dprob(g_ptr, b_ptr, e_ptr, out_ptr, H, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        e = tl.load(e_ptr + row).to(tl.int64)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, H, BLOCK):
            col = start + tl.arange(0, BLOCK)
            mask = col < H
            g = tl.load(g_ptr + row * H + col, mask=mask, other=0.0).to(tl.float32)
            b = tl.load(b_ptr + e * H + col, mask=mask, other=0.0).to(tl.float32)
            acc += g * b
        tl.store(out_ptr + row, tl.sum(acc, axis=0))

_BLOCK = 1024


def _forward(x, bias, experts, probs):
    if x.is_cuda and HAVE_TRITON and x.numel():   # (no rows: a grid of 0 cannot launch)
        out = torch.empty_like(x)
        rows, width = x.shape
        _bias_fwd[(rows, triton.cdiv(width, _BLOCK))](
            x, bias, experts, probs if probs is not None else x, out, width,
            HAS_P=probs is not None, BLOCK=_BLOCK)
        return out
    gathered = bias.index_select(0, experts)
    if probs is None:
        return x + gathered
    return (x + gathered * probs.reshape(-1, 1)).to(x.dtype)


def _probs_grad(grad, bias, experts):
    """dot(grad[r], bias[expert of r]) in fp32, [rows]."""
    if grad.is_cuda and HAVE_TRITON and grad.numel():
        out = torch.empty(grad.shape[0], dtype=torch.float32, device=grad.device)
        _bias_dprob[(grad.shape[0],)](grad, bias, experts, out, grad.shape[1], BLOCK=_BLOCK)
        return out
    return (grad.float() * bias.index_select(0, experts).float()).sum(-1)


class ExpertBias(torch.autograd.Function):
    """x [rows, out] + bias[experts] [rows, out] (times probs [rows] or [rows, 1]); see the
    module's docstring. Without probabilities the output has x's dtype (an add in it); with
    them it is computed in fp32 and cast back, as Megatron's _apply_bias does."""

    @staticmethod
    def forward(ctx, x, bias, experts, probs):
        x, bias = x.contiguous(), bias.contiguous()
        probs_flat = probs.reshape(-1).contiguous() if probs is not None else None
        ctx.save_for_backward(bias, experts, probs)
        return _forward(x, bias, experts, probs_flat)

    @staticmethod
    def backward(ctx, grad):
        bias, experts, probs = ctx.saved_tensors
        grad = grad.contiguous()
        grad_x = grad if ctx.needs_input_grad[0] else None
        grad_bias = grad_probs = None
        if ctx.needs_input_grad[1]:
            values = (torch.ones_like(experts, dtype=grad.dtype) if probs is None
                      else probs.reshape(-1).to(grad.dtype))
            rows = torch.zeros(bias.shape[0], grad.shape[0], dtype=grad.dtype,
                               device=grad.device)
            rows.scatter_(0, experts.view(1, -1), values.view(1, -1))
            grad_bias = torch.mm(rows, grad).to(bias.dtype)
        if probs is not None and ctx.needs_input_grad[3]:
            grad_probs = _probs_grad(grad, bias, experts).reshape(probs.shape).to(probs.dtype)
        return grad_x, grad_bias, None, grad_probs
