"""Gradient-accumulation fusion for the native grouped experts: every expert's weight gradient
added straight into Megatron's gradient buffer, one Triton kernel per projection.

Megatron's dense linears, with GRADIENT_ACCUMULATION_FUSION, accumulate their weight gradient
into `main_grad` with a beta=1 GEMM (training/native/wgrad.py). torch's grouped_mm cannot
accumulate, so without this the grouped experts' backward writes a new [experts, out, in]
gradient per micro-batch and Megatron's DDP hook reads it back to add it to main_grad: one write
and one read of a whole [experts, out, in] tensor per projection and micro-batch that the fused
kernel does not do. Here, for every expert e,

    main_grad[e] += dY_e^T @ X_e    (rows offsets[e-1]:offsets[e] of grouped_mm's X and dY)

with the product summed in fp32 registers and each main_grad tile read, added and written once
in its own dtype (bf16 or fp32). The offsets are grouped_mm's int32 end rows on the GPU, read
by the kernel only: nothing is copied to the host, so the lean MoE step stays sync-free. An
expert without rows leaves its main_grad untouched.

One tile configuration (128 x 128 output tile, 64 rows a step), no autotuning: autotuning would
run the accumulating kernel several times on the live buffer and synchronise on its first
call. The row loop is a `for` over the loaded bounds, which Triton software-pipelines (a
`while` it does not; the interpreter test patches the interpreter to take such bounds). Off
the GPU a torch loop does the same arithmetic (CPU tests only).

Two kernels do this arithmetic. `_grouped_wgrad_accum` loads the rows through masked pointers
(cp.async). `_grouped_wgrad_accum_tma` loads every whole step of BLOCK_K rows through the
Hopper tensor-memory accelerator (host-side tensor descriptors over X and dY: no masks, the
loads straight into the shared memory the wgmma reads) and only an expert's last, partial step
through masked pointers (rows past the expert's end belong to the next expert, which a TMA
load cannot mask). Session 17's timing (training/native/wgrad_timing.py) measured the pointer
kernel at ~390-410 TFLOP/s at Mixtral's and gpt-oss's widths, slower there than torch's grouped
GEMM plus an add; which kernel runs is `KERNEL` below, set from that timing's JSON.
"""
from __future__ import annotations

import torch

from .rope import HAVE_TRITON

BLOCKS = (128, 128, 64)   # (out, in) tile of main_grad, rows per step
LAUNCH = {"num_warps": 8, "num_stages": 3}   # the row loop's loads three steps ahead
# "pointer" | "tma" (TMA_BLOCKS / TMA_LAUNCH): the TMA kernel at 128 x 128 x 64, 8 warps, 3
# stages was the fastest of ten configurations at five of the six MoE expert shapes on an H200
# and level with the best at the sixth (session 17, docs/benchmarks/kernels-moe-wgrad_h200.json):
# 1.34x the pointer kernel at Mixtral's fc1, 1.16x at gpt-oss's, 1.06x at Qwen3-30B-A3B's
KERNEL = "tma"
TMA_BLOCKS = (128, 128, 64)
TMA_LAUNCH = {"num_warps": 8, "num_stages": 3}

if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _masked_step(x_ptr, dy_ptr, row, end, o, i, OUT, IN, acc, BLOCK_K: tl.constexpr):
        """acc += dY[row:row+BLOCK_K, o]^T @ X[row:row+BLOCK_K, i], rows from `end` on (the
        next expert's) and columns past the edge read as zero."""
        r = row + tl.arange(0, BLOCK_K)
        dy = tl.load(dy_ptr + r[:, None] * OUT + o[None, :],
                     mask=(r[:, None] < end) & (o[None, :] < OUT), other=0.0)
        x = tl.load(x_ptr + r[:, None] * IN + i[None, :],
                    mask=(r[:, None] < end) & (i[None, :] < IN), other=0.0)
        return tl.dot(tl.trans(dy), x, acc)

    @triton.jit
    def _add_into(grad_ptr, e, o, i, OUT, IN, acc):
        """main_grad[e, o, i] += acc: the tile read, added in fp32 and written once in its
        own dtype."""
        tile = grad_ptr + e.to(tl.int64) * OUT * IN + o[:, None] * IN + i[None, :]
        mask = (o[:, None] < OUT) & (i[None, :] < IN)
        grad = tl.load(tile, mask=mask, other=0.0).to(tl.float32)
        tl.store(tile, (grad + acc).to(grad_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _grouped_wgrad_accum(x_ptr, dy_ptr, ends_ptr, grad_ptr, OUT, IN, TILES_OUT, TILES_IN,
                             BLOCK_OUT: tl.constexpr, BLOCK_IN: tl.constexpr,
                             BLOCK_K: tl.constexpr):
        """One (expert, out tile, in tile) per program, experts slowest (neighbouring programs
        read the same expert's rows). Offsets in int64: rows * IN and e * OUT * IN pass 2^31
        at large token counts and expert widths."""
        pid = tl.program_id(0)
        tiles = TILES_OUT * TILES_IN
        e = pid // tiles
        o = (pid % tiles) // TILES_IN * BLOCK_OUT + tl.arange(0, BLOCK_OUT)
        i = (pid % TILES_IN) * BLOCK_IN + tl.arange(0, BLOCK_IN)
        start = tl.where(e > 0, tl.load(ends_ptr + tl.maximum(e - 1, 0)), 0).to(tl.int64)
        end = tl.load(ends_ptr + e).to(tl.int64)
        if end > start:
            acc = tl.zeros((BLOCK_OUT, BLOCK_IN), dtype=tl.float32)
            for row in range(start, end, BLOCK_K):
                acc = _masked_step(x_ptr, dy_ptr, row, end, o, i, OUT, IN, acc, BLOCK_K)
            _add_into(grad_ptr, e, o, i, OUT, IN, acc)

    @triton.jit
    def _grouped_wgrad_accum_tma(x_desc, dy_desc, x_ptr, dy_ptr, ends_ptr, grad_ptr, OUT, IN,
                                 TILES_OUT, TILES_IN, BLOCK_OUT: tl.constexpr,
                                 BLOCK_IN: tl.constexpr, BLOCK_K: tl.constexpr,
                                 WARP_SPECIALIZE: tl.constexpr):
        """The same tiles and order as _grouped_wgrad_accum; the whole row steps through the
        descriptors (row coordinates stay int32: TMA takes 32-bit coordinates, and the rows
        of one micro-batch are far below 2^31), the last partial one masked."""
        pid = tl.program_id(0)
        tiles = TILES_OUT * TILES_IN
        e = pid // tiles
        o0 = (pid % tiles) // TILES_IN * BLOCK_OUT
        i0 = (pid % TILES_IN) * BLOCK_IN
        start = tl.where(e > 0, tl.load(ends_ptr + tl.maximum(e - 1, 0)), 0)
        end = tl.load(ends_ptr + e)
        if end > start:
            acc = tl.zeros((BLOCK_OUT, BLOCK_IN), dtype=tl.float32)
            whole = (end - start) // BLOCK_K
            for step in tl.range(0, whole, warp_specialize=WARP_SPECIALIZE):
                row = start + step * BLOCK_K
                acc = tl.dot(tl.trans(dy_desc.load([row, o0])), x_desc.load([row, i0]), acc)
            o = o0 + tl.arange(0, BLOCK_OUT)
            i = i0 + tl.arange(0, BLOCK_IN)
            tail = start + whole * BLOCK_K
            if tail < end:
                acc = _masked_step(x_ptr, dy_ptr, tail.to(tl.int64), end, o, i, OUT, IN, acc,
                                   BLOCK_K)
            _add_into(grad_ptr, e, o, i, OUT, IN, acc)


def tma_fits(*tensors: torch.Tensor) -> bool:
    """A TMA descriptor needs a 16-byte aligned base and 16-byte aligned row strides, and at
    least one row."""
    return all(t.dim() == 2 and t.shape[0] > 0 and t.is_contiguous()
               and t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0
               for t in tensors)


def triton_accumulate_(main_grad: torch.Tensor, x: torch.Tensor, dy: torch.Tensor,
                       ends: torch.Tensor, blocks: tuple[int, int, int] | None = None,
                       launch: dict | None = None, kernel: str | None = None,
                       warp_specialize: bool = False) -> None:
    """main_grad [experts, out, in] += each expert's dY^T @ X, in place (the Triton kernel
    `kernel`, KERNEL by default; `blocks` and `launch` other than the kernel's own: the
    interpreter's tests, to cut tiles at small sizes, and the tile timing,
    training/native/wgrad_timing.py). The TMA kernel falls back to the pointer one where
    X or dY cannot take a descriptor (tma_fits)."""
    experts, out, inp = main_grad.shape
    if not main_grad.is_contiguous():
        raise ValueError("main_grad must be contiguous (Megatron's gradient buffer is)")
    if ends.numel() != experts or x.shape[1] != inp or dy.shape[1] != out:
        raise ValueError(f"shapes do not match: main_grad {tuple(main_grad.shape)}, x "
                         f"{tuple(x.shape)}, dy {tuple(dy.shape)}, {ends.numel()} offsets")
    kernel = kernel or KERNEL
    x, dy = x.contiguous(), dy.contiguous()
    if kernel == "tma" and not tma_fits(x, dy):
        kernel = "pointer"
    default_blocks, default_launch = ((TMA_BLOCKS, TMA_LAUNCH) if kernel == "tma"
                                      else (BLOCKS, LAUNCH))
    block_out, block_in, block_k = blocks or default_blocks
    tiles_out, tiles_in = triton.cdiv(out, block_out), triton.cdiv(inp, block_in)
    grid = (experts * tiles_out * tiles_in,)
    sizes = dict(BLOCK_OUT=block_out, BLOCK_IN=block_in, BLOCK_K=block_k,
                 **(launch or default_launch))
    if kernel == "tma":
        from triton.tools.tensor_descriptor import TensorDescriptor

        x_desc = TensorDescriptor.from_tensor(x, [block_k, block_in])
        dy_desc = TensorDescriptor.from_tensor(dy, [block_k, block_out])
        _grouped_wgrad_accum_tma[grid](x_desc, dy_desc, x, dy, ends, main_grad, out, inp,
                                       tiles_out, tiles_in, WARP_SPECIALIZE=warp_specialize,
                                       **sizes)
    elif kernel == "pointer":
        _grouped_wgrad_accum[grid](x, dy, ends, main_grad, out, inp, tiles_out, tiles_in,
                                   **sizes)
    else:
        raise ValueError(f"kernel {kernel!r}: 'pointer' or 'tma'")


def torch_accumulate_(main_grad: torch.Tensor, x: torch.Tensor, dy: torch.Tensor,
                      ends: torch.Tensor) -> None:
    """The same arithmetic as a loop over the experts (the CPU; reads the offsets)."""
    start = 0
    for e, end in enumerate(ends.tolist()):
        if end > start:
            part = dy[start:end].t().float() @ x[start:end].float()
            main_grad[e].copy_(main_grad[e].float() + part)
        start = end


def accumulate_(main_grad: torch.Tensor, x: torch.Tensor, dy: torch.Tensor,
                ends: torch.Tensor) -> None:
    """main_grad[e] += dY_e^T @ X_e for every expert: the kernel on the GPU, torch elsewhere."""
    if main_grad.is_cuda and HAVE_TRITON:
        triton_accumulate_(main_grad, x, dy, ends)
    else:
        torch_accumulate_(main_grad, x, dy, ends)

