"""Fused RoPE on the packed QKV projection (Megatron's fused_single_qkv_rope).

Megatron's attention, with `fused_single_qkv_rope`, skips splitting the QKV projection and
calls `apply_fused_qkv_rotary_pos_emb(mixed_qkv, q_freqs, k_freqs, split_sizes)`, which only
Transformer Engine provides. This module provides it for the native backend:

  mixed_qkv  [s, b, groups, (q_per_group + 2) * head_dim]  (q heads, then k, then v per group)
  freqs      [s, 1, 1, head_dim] rotation angles (non-interleaved: the two halves repeat)
  returns    q [s, b, heads, head_dim], k and v [s, b, groups, head_dim]

The Triton kernel reads the packed tensor once and writes rotated q, k and a copy of v; its
backward writes the gradient of the packed tensor in one pass (no concatenation of dq/dk/dv).
`rope_torch` is the same function in plain torch (CPU and NATIVE_KERNELS=torch).
"""
from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
    HAVE_TRITON = True
except ImportError:  # pragma: no cover - triton ships with torch on Linux
    HAVE_TRITON = False


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rope_torch(mixed_qkv, q_freqs, k_freqs, q_per_group: int, head_dim: int):
    """Reference implementation (autograd through torch ops)."""
    s, b, groups, _ = mixed_qkv.shape
    q, k, v = torch.split(mixed_qkv, [q_per_group * head_dim, head_dim, head_dim], dim=3)
    half = head_dim // 2
    cq = q_freqs[..., :half].float()
    ck = k_freqs[..., :half].float()
    q = q.reshape(s, b, groups * q_per_group, head_dim).float()
    k = k.float()
    q = _rotate(q, cq.cos(), cq.sin()).to(mixed_qkv.dtype)
    k = _rotate(k, ck.cos(), ck.sin()).to(mixed_qkv.dtype)
    return q, k, v.contiguous()


if HAVE_TRITON:
    @triton.jit
    def _head_row(t, g, GROUPS):
        """Index of (token t, query group g) over s*b*groups, in int64: multiplied by the
        group's width ((R + 2) * head_dim, 768 elements at Llama3-8B), an int32 index passes
        2^31 from about 2.8M tokens per micro-batch (s x b), sooner for wider groups."""
        return t.to(tl.int64) * GROUPS + g

    @triton.jit
    def _qkv_rope_fwd(qkv_ptr, fq_ptr, fk_ptr, q_ptr, k_ptr, v_ptr, B, GROUPS,
                      R: tl.constexpr, HALF: tl.constexpr, BLOCK: tl.constexpr):
        t = tl.program_id(0)          # token index over s*b
        g = tl.program_id(1)          # query group
        pos = t // B
        offs = tl.arange(0, BLOCK)
        mask = offs < HALF
        hd = 2 * HALF
        fq = tl.load(fq_ptr + pos * hd + offs, mask=mask, other=0.0).to(tl.float32)
        fk = tl.load(fk_ptr + pos * hd + offs, mask=mask, other=0.0).to(tl.float32)
        cq, sq = tl.cos(fq), tl.sin(fq)
        ck, sk = tl.cos(fk), tl.sin(fk)
        tg = _head_row(t, g, GROUPS)
        base = qkv_ptr + tg * (R + 2) * hd
        for j in tl.static_range(R):
            x1 = tl.load(base + j * hd + offs, mask=mask).to(tl.float32)
            x2 = tl.load(base + j * hd + HALF + offs, mask=mask).to(tl.float32)
            out = q_ptr + (tg * R + j) * hd
            tl.store(out + offs, (x1 * cq - x2 * sq).to(q_ptr.dtype.element_ty), mask=mask)
            tl.store(out + HALF + offs, (x2 * cq + x1 * sq).to(q_ptr.dtype.element_ty), mask=mask)
        x1 = tl.load(base + R * hd + offs, mask=mask).to(tl.float32)
        x2 = tl.load(base + R * hd + HALF + offs, mask=mask).to(tl.float32)
        out = k_ptr + tg * hd
        tl.store(out + offs, (x1 * ck - x2 * sk).to(k_ptr.dtype.element_ty), mask=mask)
        tl.store(out + HALF + offs, (x2 * ck + x1 * sk).to(k_ptr.dtype.element_ty), mask=mask)
        v1 = tl.load(base + (R + 1) * hd + offs, mask=mask)
        v2 = tl.load(base + (R + 1) * hd + HALF + offs, mask=mask)
        out = v_ptr + tg * hd
        tl.store(out + offs, v1, mask=mask)
        tl.store(out + HALF + offs, v2, mask=mask)

    @triton.jit
    def _qkv_rope_bwd(dqkv_ptr, fq_ptr, fk_ptr, dq_ptr, dk_ptr, dv_ptr, B, GROUPS,
                      R: tl.constexpr, HALF: tl.constexpr, BLOCK: tl.constexpr):
        t = tl.program_id(0)
        g = tl.program_id(1)
        pos = t // B
        offs = tl.arange(0, BLOCK)
        mask = offs < HALF
        hd = 2 * HALF
        fq = tl.load(fq_ptr + pos * hd + offs, mask=mask, other=0.0).to(tl.float32)
        fk = tl.load(fk_ptr + pos * hd + offs, mask=mask, other=0.0).to(tl.float32)
        cq, sq = tl.cos(fq), tl.sin(fq)
        ck, sk = tl.cos(fk), tl.sin(fk)
        tg = _head_row(t, g, GROUPS)
        base = dqkv_ptr + tg * (R + 2) * hd
        for j in tl.static_range(R):
            src = dq_ptr + (tg * R + j) * hd
            y1 = tl.load(src + offs, mask=mask).to(tl.float32)
            y2 = tl.load(src + HALF + offs, mask=mask).to(tl.float32)
            tl.store(base + j * hd + offs, (y1 * cq + y2 * sq).to(dqkv_ptr.dtype.element_ty),
                     mask=mask)
            tl.store(base + j * hd + HALF + offs,
                     (y2 * cq - y1 * sq).to(dqkv_ptr.dtype.element_ty), mask=mask)
        src = dk_ptr + tg * hd
        y1 = tl.load(src + offs, mask=mask).to(tl.float32)
        y2 = tl.load(src + HALF + offs, mask=mask).to(tl.float32)
        tl.store(base + R * hd + offs, (y1 * ck + y2 * sk).to(dqkv_ptr.dtype.element_ty), mask=mask)
        tl.store(base + R * hd + HALF + offs, (y2 * ck - y1 * sk).to(dqkv_ptr.dtype.element_ty),
                 mask=mask)
        src = dv_ptr + tg * hd
        tl.store(base + (R + 1) * hd + offs, tl.load(src + offs, mask=mask), mask=mask)
        tl.store(base + (R + 1) * hd + HALF + offs, tl.load(src + HALF + offs, mask=mask),
                 mask=mask)


class _FusedQKVRope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, mixed_qkv, q_freqs, k_freqs, q_per_group, head_dim):
        s, b, groups, _ = mixed_qkv.shape
        mixed_qkv = mixed_qkv.contiguous()
        fq = q_freqs.reshape(s, head_dim).float().contiguous()
        fk = k_freqs.reshape(s, head_dim).float().contiguous()
        q = mixed_qkv.new_empty(s, b, groups * q_per_group, head_dim)
        k = mixed_qkv.new_empty(s, b, groups, head_dim)
        v = mixed_qkv.new_empty(s, b, groups, head_dim)
        half = head_dim // 2
        grid = (s * b, groups)
        _qkv_rope_fwd[grid](mixed_qkv, fq, fk, q, k, v, b, groups, R=q_per_group, HALF=half,
                            BLOCK=triton.next_power_of_2(half))
        ctx.save_for_backward(fq, fk)
        ctx.shape = (s, b, groups, q_per_group, head_dim)
        return q, k, v

    @staticmethod
    def backward(ctx, dq, dk, dv):
        fq, fk = ctx.saved_tensors
        s, b, groups, q_per_group, head_dim = ctx.shape
        dq, dk, dv = dq.contiguous(), dk.contiguous(), dv.contiguous()
        dqkv = dq.new_empty(s, b, groups, (q_per_group + 2) * head_dim)
        half = head_dim // 2
        _qkv_rope_bwd[(s * b, groups)](dqkv, fq, fk, dq, dk, dv, b, groups, R=q_per_group,
                                       HALF=half, BLOCK=triton.next_power_of_2(half))
        return dqkv, None, None, None, None


def fused_qkv_rope(kernels: str):
    """Megatron's apply_fused_qkv_rotary_pos_emb (TE's function of that name and signature)
    with the native kernels: the Triton kernel on GPUs with NATIVE_KERNELS=liger, torch ops
    otherwise (and on CPU tensors: tests)."""
    if kernels == "liger" and not HAVE_TRITON:
        raise RuntimeError("NATIVE_KERNELS=liger needs Triton for the fused QKV RoPE kernel")

    def apply_fused_qkv_rotary_pos_emb(mixed_qkv, q_pos_emb, k_pos_emb, qkv_split_arg_list):
        q_size, head_dim, v_size = qkv_split_arg_list
        if v_size != head_dim or q_size % head_dim or head_dim % 2:
            raise ValueError(f"unexpected QKV split {qkv_split_arg_list}")
        q_per_group = q_size // head_dim
        if q_pos_emb.shape[-1] != head_dim:
            raise ValueError("fused QKV RoPE needs rotary_percent=1 (RoPE over the whole head)")
        if kernels == "liger" and mixed_qkv.is_cuda:
            return _FusedQKVRope.apply(mixed_qkv, q_pos_emb, k_pos_emb, q_per_group, head_dim)
        return rope_torch(mixed_qkv, q_pos_emb, k_pos_emb, q_per_group, head_dim)

    apply_fused_qkv_rotary_pos_emb.description = (
        "native fused QKV RoPE, one Triton kernel over the packed QKV" if kernels == "liger"
        else "native fused QKV RoPE, torch ops over the packed QKV")
    return apply_fused_qkv_rotary_pos_emb


def qkv_rope_replacement(original, run):
    """The patch table's factory (training.megatron_patches, native_qkv_rope)."""
    return fused_qkv_rope(run.args.native_kernels)
