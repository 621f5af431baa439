"""Run the native Triton kernels under Triton's interpreter (TRITON_INTERPRET=1) on the CPU.

Started by test_kernels_interpreted.py in a fresh process: the interpreter is chosen when
triton is first imported, so it cannot be switched on inside the test process. Prints one JSON
object: for each check its name and either "ok" or the failure text. With --quick: the offsets
and one odd shape per kernel (the default test run's seconds-long check); the grouped wgrad
cases (small) run in both.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from pathlib import Path

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tests.native import kernel_refs as refs  # noqa: E402
from training.native import grouped_wgrad, rope, swiglu  # noqa: E402

DTYPES = (torch.bfloat16, torch.float32)


@triton.jit
def _swiglu_row_starts(row_ptr, out_ptr, F):
    x_row, y_row = swiglu._row_starts(tl.load(row_ptr), F)   # row as the int32 program id
    tl.store(out_ptr, x_row)
    tl.store(out_ptr + 1, y_row)


@triton.jit
def _rope_row_start(t_ptr, out_ptr, g, GROUPS, WIDTH):
    tl.store(out_ptr, rope._head_row(tl.load(t_ptr), g, GROUPS) * WIDTH)


def offsets() -> dict:
    """The int64 offset helpers with an index whose int32 product wraps: exact values."""
    out = torch.zeros(2, dtype=torch.int64)
    row, f = 100_000, 14_336                        # row * 2F = 2,867,200,000 > 2^31
    _swiglu_row_starts[(1,)](torch.tensor([row], dtype=torch.int32), out, f)
    t, g, groups, width = 3_000_000, 5, 8, 6 * 128  # (t * 8 + 5) * 768 > 2^34
    rope_out = torch.zeros(1, dtype=torch.int64)
    _rope_row_start[(1,)](torch.tensor([t], dtype=torch.int32), rope_out, g, groups, width)
    return {"swiglu": out.tolist(), "swiglu_expected": [row * 2 * f, row * f],
            "rope": rope_out.item(), "rope_expected": (t * groups + g) * width}


def swiglu_case(rows: int, f: int, dtype) -> None:
    gen = torch.Generator().manual_seed(rows * 7919 + f)
    x = (torch.randn(rows, 2 * f, generator=gen) * 3).to(dtype).requires_grad_()
    y = swiglu._SwiGLU.apply(x)
    refs.assert_close(y, refs.swiglu_ref(x), dtype)
    dy = torch.randn(rows, f, generator=gen).to(dtype)
    x64 = x.detach().double().requires_grad_()
    (dx_ref,) = torch.autograd.grad(refs.swiglu_ref(x64), x64, dy.double())
    (dx,) = torch.autograd.grad(y, x, dy)
    refs.assert_close(dx, dx_ref, dtype)


def rope_case(s: int, b: int, groups: int, per_group: int, head_dim: int, dtype) -> None:
    gen = torch.Generator().manual_seed(s * 31 + b * 7 + groups + head_dim)
    mixed = torch.randn(s, b, groups, (per_group + 2) * head_dim, generator=gen).to(dtype)
    mixed.requires_grad_()
    fq = refs.rope_freqs(s, head_dim)
    fk = fq * 0.5 + 0.1                             # q and k angles may differ (Megatron's API)
    split = [per_group * head_dim, head_dim, head_dim]
    fused = rope._FusedQKVRope.apply(mixed, fq, fk, per_group, head_dim)
    mixed64 = mixed.detach().double().requires_grad_()
    expected = refs.rope_ref(mixed64, fq, fk, per_group, head_dim)
    for ours, ref in zip(fused, expected):
        assert ours.shape == ref.shape, (ours.shape, ref.shape)
        refs.assert_close(ours, ref, dtype)
    grads = [torch.randn(t.shape, generator=gen).to(dtype) for t in fused]
    (dqkv,) = torch.autograd.grad(fused, mixed, grads)
    (dqkv_ref,) = torch.autograd.grad(expected, mixed64, [g.double() for g in grads])
    refs.assert_close(dqkv, dqkv_ref, dtype)
    assert split == [per_group * head_dim, head_dim, head_dim]


# (out, in, rows per expert, tiles, kernel): experts without rows (first, middle, last), tiles
# and row steps cut mid-block at small blocks, and the default blocks (BLOCKS) crossed by one.
# The TMA kernel's rows need 16-byte strides (68 fp32 = 272 bytes): experts whose rows end
# mid-step (70 = 4 x 16 + 6, the masked tail), on a whole step (32) and below one (3, 1).
WGRAD_CASES = [(40, 70, [0, 3, 0, 70, 1, 0], (16, 32, 16), "pointer"),
               (33, 130, [65, 0, 7], grouped_wgrad.BLOCKS, "pointer"),
               (40, 68, [0, 3, 0, 70, 1, 32, 0], (16, 32, 16), "tma")]


@contextlib.contextmanager
def loaded_loop_bounds():
    """range() over bounds a kernel loaded: Triton 3.6's interpreter takes int() of the loaded
    value, a one-element array, which NumPy 2 refuses; its one element is the bound."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor

    def patch(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patch
    try:
        yield
    finally:
        interpreter._patch_lang_tensor = original


def grouped_wgrad_case(out: int, inp: int, counts: list[int], blocks, kernel: str,
                       grad_dtype) -> None:
    """main_grad (nonzero, fp32 or bf16) += each expert's dY^T @ X, against float64; experts
    without rows keep their main_grad bit for bit. The rows hold bf16 values in float32:
    Triton 3.6's interpreter multiplies bf16 operands of tl.dot as their raw 16-bit patterns
    (the compiled bf16 path: tests/gpu/test_grouped_wgrad_gpu.py)."""
    gen = torch.Generator().manual_seed(out * 131 + inp)
    rows = sum(counts)
    x = torch.randn(rows, inp, generator=gen).bfloat16().float()
    dy = torch.randn(rows, out, generator=gen).bfloat16().float()
    before = torch.randn(len(counts), out, inp, generator=gen).to(grad_dtype)
    ends = torch.cumsum(torch.tensor(counts), 0).to(torch.int32)
    expected = before.double().clone()
    for e, (end, n) in enumerate(zip(ends.tolist(), counts)):
        expected[e] += dy[end - n:end].double().t() @ x[end - n:end].double()
    main_grad = before.clone()
    assert kernel != "tma" or grouped_wgrad.tma_fits(x, dy), "the TMA case would fall back"
    with loaded_loop_bounds():
        grouped_wgrad.triton_accumulate_(main_grad, x, dy, ends, blocks, kernel=kernel)
    refs.assert_close(main_grad, expected, grad_dtype, scale="row")
    for e, n in enumerate(counts):
        assert n or torch.equal(main_grad[e], before[e]), f"expert {e} (no rows) was written"


QUICK_SWIGLU, QUICK_ROPE = [(3, 1025)], [(3, 2, 3, 1, 10)]   # cut mid-block; GQA, odd head_dim/2


def main(quick: bool = False) -> None:
    results: dict = {}

    def check(name, fn, *a):
        try:
            value = fn(*a)
            results[name] = value if value is not None else "ok"
        except Exception:  # noqa: BLE001 - reported to the test, which fails with it
            results[name] = "FAILED: " + traceback.format_exc(limit=3)

    check("offsets", offsets)
    for dtype in DTYPES:
        for rows, f in QUICK_SWIGLU if quick else refs.SWIGLU_SHAPES:
            check(f"swiglu {rows}x{f} {dtype}", swiglu_case, rows, f, dtype)
        for shape in QUICK_ROPE if quick else refs.ROPE_SHAPES:
            check(f"rope {shape} {dtype}", rope_case, *shape, dtype)
        for out, inp, counts, blocks, kernel in WGRAD_CASES:
            check(f"grouped_wgrad {kernel} {out}x{inp} {counts} {blocks} {dtype}",
                  grouped_wgrad_case, out, inp, counts, blocks, kernel, dtype)
    print(json.dumps(results))


if __name__ == "__main__":
    main(quick="--quick" in sys.argv[1:])
