"""The Triton kernel of training/native/adamw.py: one AdamW step over many tensors per launch.

Each program takes BLOCK elements of one tensor: its tensor index and start come from a block
table, the tensor's data pointers (parameter, gradient, two moments, master storage) from
tables of int64 addresses cast to typed pointers (the layout of apex's multi_tensor_apply and
of Triton's grouped-GEMM tutorial). Everything is loaded once, computed in fp32, stored once.

The kernel body is a plain function, compiled by `kernel()` on first use, so the CPU tests can
build it under TRITON_INTERPRET=1 (Triton's interpreter) as well.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl


@triton.jit
def _base(table, t, ALIGNED: tl.constexpr):
    """Tensor t's address from a pointer table; with ALIGNED, declared a multiple of 16 bytes
    (pointer_tables checked every tensor), so the loads and stores can be 16-byte vectors: an
    address read from memory is otherwise of unknown alignment to the compiler, which then
    moves one element per access."""
    address = tl.load(table + t)
    if ALIGNED:
        address = tl.multiple_of(address, 16)
    return address


def _adamw_body(p_ptrs, g_ptrs, m_ptrs, v_ptrs, x_ptrs, numels, block_tensor, block_start,
                lr, beta1, beta2, eps, wd, bc1, bc2_sqrt, seed,
                P_DTYPE: tl.constexpr, G_DTYPE: tl.constexpr, M_DTYPE: tl.constexpr,
                V_DTYPE: tl.constexpr, M_BF16: tl.constexpr, V_BF16: tl.constexpr,
                MODE: tl.constexpr, BLOCK: tl.constexpr, ALIGNED: tl.constexpr):
    pid = tl.program_id(0)
    t = tl.load(block_tensor + pid)
    start = tl.load(block_start + pid)
    if ALIGNED:  # every block starts at a multiple of BLOCK (pointer_tables builds it so)
        start = tl.multiple_of(start, BLOCK)
    n = tl.load(numels + t)
    offs = start + tl.arange(0, BLOCK).to(tl.int64)
    mask = offs < n

    g_ptr = _base(g_ptrs, t, ALIGNED).to(tl.pointer_type(G_DTYPE)) + offs
    m_ptr = _base(m_ptrs, t, ALIGNED).to(tl.pointer_type(M_DTYPE)) + offs
    v_ptr = _base(v_ptrs, t, ALIGNED).to(tl.pointer_type(V_DTYPE)) + offs
    g = tl.load(g_ptr, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(m_ptr, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr, mask=mask, other=0.0).to(tl.float32)

    if MODE == 0:    # fp32 parameter, no master
        p_ptr = _base(p_ptrs, t, ALIGNED).to(tl.pointer_type(tl.float32)) + offs
        p = tl.load(p_ptr, mask=mask, other=0.0)
    elif MODE == 1:  # bf16 parameter, fp32 master
        x_ptr = _base(x_ptrs, t, ALIGNED).to(tl.pointer_type(tl.float32)) + offs
        p = tl.load(x_ptr, mask=mask, other=0.0)
    elif MODE == 2:  # bf16 parameter = high half (rounded), int16 remainder = low half
        h_ptr = _base(p_ptrs, t, ALIGNED).to(tl.pointer_type(tl.int16)) + offs
        x_ptr = _base(x_ptrs, t, ALIGNED).to(tl.pointer_type(tl.int16)) + offs
        high = tl.load(h_ptr, mask=mask, other=0).to(tl.int32)
        low = tl.load(x_ptr, mask=mask, other=0).to(tl.int32)
        high = tl.where(low < 0, high - 1, high)
        p = ((high << 16) | (low & 0xFFFF)).to(tl.float32, bitcast=True)
    else:            # bf16 parameter is the master (stochastic rounding)
        p_ptr = _base(p_ptrs, t, ALIGNED).to(tl.pointer_type(P_DTYPE)) + offs
        p = tl.load(p_ptr, mask=mask, other=0.0).to(tl.float32)

    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * g * g
    denom = tl.sqrt(v) / bc2_sqrt + eps
    p = p * (1.0 - lr * wd) - (lr / bc1) * (m / denom)

    # fp32 -> bf16 rounds to nearest, ties to even, spelled out in bits (the interpreter's
    # own conversion truncates); the rounded fp32 then converts exactly.
    if M_BF16:
        bits = m.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        m = tl.where(m != m, m, bits.to(tl.float32, bitcast=True))
    if V_BF16:
        bits = v.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        v = tl.where(v != v, v, bits.to(tl.float32, bitcast=True))
    tl.store(m_ptr, m.to(M_DTYPE), mask=mask)
    tl.store(v_ptr, v.to(V_DTYPE), mask=mask)
    if MODE == 0:
        tl.store(p_ptr, p, mask=mask)
    elif MODE == 1:
        tl.store(x_ptr, p, mask=mask)
        q_ptr = _base(p_ptrs, t, ALIGNED).to(tl.pointer_type(P_DTYPE)) + offs
        bits = p.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        q = tl.where(p != p, p, bits.to(tl.float32, bitcast=True))
        tl.store(q_ptr, q.to(P_DTYPE), mask=mask)
    elif MODE == 2:
        bits = p.to(tl.int32, bitcast=True)
        low = (bits << 16) >> 16
        high = (bits >> 16) + (low < 0).to(tl.int32)
        tl.store(h_ptr, high.to(tl.int16), mask=mask)
        tl.store(x_ptr, low.to(tl.int16), mask=mask)
    else:
        bits = p.to(tl.int32, bitcast=True)
        noise = (tl.randint(seed + t, offs.to(tl.int32)) & 0xFFFF).to(tl.int32)
        bits = (bits + noise) & -65536
        tl.store(p_ptr, bits.to(tl.float32, bitcast=True).to(P_DTYPE), mask=mask)


@functools.cache
def kernel():
    return triton.jit(_adamw_body, do_not_specialize=["seed"])


_TL = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def launch(tables: dict, p_dtype, g_dtype, m_dtype, v_dtype, mode: int, hyper: dict,
           block: int, fn=None, aligned: bool | None = None) -> None:
    """One step over the tables' tensors. `aligned` (default: what pointer_tables found)
    declares every tensor 16-byte aligned to the compiler; the benchmark sets it both ways."""
    fn = fn or kernel()
    aligned = tables["aligned"] if aligned is None else aligned
    fn[(tables["programs"],)](
        tables["p"], tables["g"], tables["m"], tables["v"], tables["x"], tables["numel"],
        tables["block_tensor"], tables["block_start"],
        hyper["lr"], hyper["beta1"], hyper["beta2"], hyper["eps"], hyper["wd"], hyper["bc1"],
        hyper["bc2_sqrt"], hyper["seed"],
        P_DTYPE=_TL[p_dtype], G_DTYPE=_TL[g_dtype], M_DTYPE=_TL[m_dtype], V_DTYPE=_TL[v_dtype],
        M_BF16=m_dtype == torch.bfloat16, V_BF16=v_dtype == torch.bfloat16, MODE=mode,
        BLOCK=block, ALIGNED=aligned, num_warps=8)
