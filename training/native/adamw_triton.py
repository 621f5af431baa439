"""The Triton kernel of training/native/adamw.py: one AdamW step over many tensors per launch.

Each program takes BLOCK elements of one tensor: its tensor index and start come from a block
table, the tensor's place (parameter, gradient, two moments, master storage) from tables of
element offsets (the layout of apex's multi_tensor_apply and of Triton's grouped-GEMM
tutorial) from an anchor tensor per operand, which is a typed kernel argument: Triton knows an
argument's alignment, so with every tensor 16-byte aligned the accesses are 16-byte vectors
(session 8's kernel read absolute addresses from its tables and cast them to pointers: its
PTX had only 2-byte loads and stores). Everything is loaded once, computed in fp32, stored
once.

The kernel body is a plain function, compiled by `kernel()` on first use, so the CPU tests can
build it under TRITON_INTERPRET=1 (Triton's interpreter) as well.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl


@triton.jit
def _offset(offsets, t, BYTES: tl.constexpr, ALIGNED: tl.constexpr):
    """Tensor t's first element, counted in elements from its operand's anchor (the typed
    kernel argument the accesses are based on). Triton knows a kernel argument's alignment
    (it specializes on 16 bytes) but not that of an address read from memory, through which
    it moves one element per access; based on the argument, with the offset declared a
    multiple of 16 bytes (ALIGNED: pointer_tables checked every tensor), loads and stores are
    16-byte vectors."""
    offset = tl.load(offsets + t)
    if ALIGNED:
        offset = tl.multiple_of(offset, 16 // BYTES)
    return offset


def _adamw_body(p0, g0, m0, v0, x0, p_offs, g_offs, m_offs, v_offs, x_offs, numels,
                block_tensor, block_start, lr, beta1, beta2, eps, wd, bc1, bc2_sqrt, seed,
                P_BYTES: tl.constexpr, G_BYTES: tl.constexpr, M_BYTES: tl.constexpr,
                V_BYTES: tl.constexpr, X_BYTES: tl.constexpr, M_BF16: tl.constexpr,
                V_BF16: tl.constexpr, MODE: tl.constexpr, BLOCK: tl.constexpr,
                ALIGNED: tl.constexpr):
    # p0..x0: each operand's anchor (its first non-empty tensor; x0 is p0 where no master is
    # kept), typed as stored: p0 fp32 (MODE 0), int16 (MODE 2: the bf16 bits), else bf16; x0
    # fp32 (MODE 1) or int16 (MODE 2), unused otherwise
    pid = tl.program_id(0)
    t = tl.load(block_tensor + pid)
    start = tl.load(block_start + pid)
    n = tl.load(numels + t)
    if ALIGNED:  # blocks start at multiples of BLOCK (pointer_tables builds them so), and
        # every tensor's size is a multiple of 8 (checked): the mask is constant over a vector
        start = tl.multiple_of(start, BLOCK)
        n = tl.multiple_of(n, 8)
    offs = start + tl.arange(0, BLOCK).to(tl.int64)
    mask = offs < n

    g_ptr = g0 + _offset(g_offs, t, G_BYTES, ALIGNED) + offs
    m_ptr = m0 + _offset(m_offs, t, M_BYTES, ALIGNED) + offs
    v_ptr = v0 + _offset(v_offs, t, V_BYTES, ALIGNED) + offs
    p_ptr = p0 + _offset(p_offs, t, P_BYTES, ALIGNED) + offs
    g = tl.load(g_ptr, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(m_ptr, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr, mask=mask, other=0.0).to(tl.float32)

    if MODE == 0:    # fp32 parameter, no master
        p = tl.load(p_ptr, mask=mask, other=0.0)
    elif MODE == 1:  # bf16 parameter, fp32 master
        x_ptr = x0 + _offset(x_offs, t, X_BYTES, ALIGNED) + offs
        p = tl.load(x_ptr, mask=mask, other=0.0)
    elif MODE == 2:  # bf16 parameter = high half (rounded), int16 remainder = low half
        x_ptr = x0 + _offset(x_offs, t, X_BYTES, ALIGNED) + offs
        high = tl.load(p_ptr, mask=mask, other=0).to(tl.int32)
        low = tl.load(x_ptr, mask=mask, other=0).to(tl.int32)
        high = tl.where(low < 0, high - 1, high)
        p = ((high << 16) | (low & 0xFFFF)).to(tl.float32, bitcast=True)
    else:            # bf16 parameter is the master (stochastic rounding)
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
    tl.store(m_ptr, m.to(m0.dtype.element_ty), mask=mask)
    tl.store(v_ptr, v.to(v0.dtype.element_ty), mask=mask)
    if MODE == 0:
        tl.store(p_ptr, p, mask=mask)
    elif MODE == 1:
        tl.store(x_ptr, p, mask=mask)
        bits = p.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        q = tl.where(p != p, p, bits.to(tl.float32, bitcast=True))
        tl.store(p_ptr, q.to(p0.dtype.element_ty), mask=mask)
    elif MODE == 2:
        bits = p.to(tl.int32, bitcast=True)
        low = (bits << 16) >> 16
        high = (bits >> 16) + (low < 0).to(tl.int32)
        tl.store(p_ptr, high.to(tl.int16), mask=mask)
        tl.store(x_ptr, low.to(tl.int16), mask=mask)
    else:
        bits = p.to(tl.int32, bitcast=True)
        noise = (tl.randint(seed + t, offs.to(tl.int32)) & 0xFFFF).to(tl.int32)
        bits = (bits + noise) & -65536
        tl.store(p_ptr, bits.to(tl.float32, bitcast=True).to(p0.dtype.element_ty), mask=mask)


# No fused multiply-adds: every product and sum rounds on its own (.rn), so the vector and the
# element path of one step agree bit for bit (LLVM contracts a*b+c where it sees fit, and saw
# fit differently in the two: session 9's GPU test found fp32 states differing) and match the
# interpreter's arithmetic. The kernel is memory-bound; the extra instructions cost nothing.
LAUNCH_OPTIONS = {"num_warps": 8, "enable_fp_fusion": False}


@functools.cache
def kernel():
    return triton.jit(_adamw_body, do_not_specialize=["seed"])


def launch(tables: dict, mode: int, hyper: dict, block: int, fn=None,
           aligned: bool | None = None) -> None:
    """One step over the tables' tensors (pointer_tables). `aligned` (default: what
    pointer_tables found) declares every tensor 16-byte aligned to the compiler; the
    benchmark sets it both ways."""
    fn = fn or kernel()
    aligned = tables["aligned"] if aligned is None else aligned
    anchors = list(tables["anchors"])
    if mode == 2:   # the remainder mode reads and writes the bf16 parameter's bits as int16
        anchors[0] = anchors[0].view(torch.int16)
    fn[(tables["programs"],)](
        *anchors, tables["p"], tables["g"], tables["m"], tables["v"], tables["x"],
        tables["numel"], tables["block_tensor"], tables["block_start"],
        hyper["lr"], hyper["beta1"], hyper["beta2"], hyper["eps"], hyper["wd"], hyper["bc1"],
        hyper["bc2_sqrt"], hyper["seed"],
        P_BYTES=anchors[0].element_size(), G_BYTES=anchors[1].element_size(),
        M_BYTES=anchors[2].element_size(), V_BYTES=anchors[3].element_size(),
        X_BYTES=anchors[4].element_size(), M_BF16=anchors[2].dtype == torch.bfloat16,
        V_BF16=anchors[3].dtype == torch.bfloat16, MODE=mode, BLOCK=block, ALIGNED=aligned,
        **LAUNCH_OPTIONS)
