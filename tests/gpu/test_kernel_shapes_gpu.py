"""The native Triton kernels (and Liger-Kernel's Megatron integration, the alternative for two
of them) on the GPU: forward and backward over odd shapes in bf16 and fp32, and tensors past
2^31 elements (where an int32 offset wraps), against float64 references with the tolerances
stated in tests/native/kernel_refs.py. The same small shapes run on the CPU through Triton's
interpreter (tests/native/test_kernels_interpreted.py)."""
from __future__ import annotations

import gc

import pytest
import torch

from tests.native import kernel_refs as refs

pytestmark = pytest.mark.gpu
DTYPES = [torch.bfloat16, torch.float32]
PAST_INT32 = 2 ** 31
NORM_SHAPES = [(1, 7), (3, 1000), (5, 4097), (129, 4096)]
LLAMA3_8B = {"hidden": 4096, "ffn": 14336, "groups": 8, "per_group": 4, "head_dim": 128}


@pytest.fixture(autouse=True)
def _free_memory():
    yield
    gc.collect()
    torch.cuda.empty_cache()


def _swiglu_impls():
    from liger_kernel.megatron import LigerMegatronSwiGLU

    from training.native.swiglu import _SwiGLU

    liger = LigerMegatronSwiGLU()
    return {"ours": _SwiGLU.apply, "liger_megatron": lambda x: liger(x)}


def _check_swiglu(fn, x: torch.Tensor, rows: slice | None = None) -> None:
    """fn's forward and backward against float64 on x's rows (all, or a slice of them)."""
    dtype = x.dtype
    y = fn(x)
    dy = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x, dy)
    rows = rows or slice(None)
    x64 = x.detach()[rows].double().requires_grad_()
    y64 = refs.swiglu_ref(x64)
    refs.assert_close(y[rows], y64, dtype)
    (dx64,) = torch.autograd.grad(y64, x64, dy[rows].double())
    refs.assert_close(dx[rows], dx64, dtype)


# Liger's kernels compile per width (a constexpr): its own tests cover its shapes; here the
# Llama shape and one odd width, where it would replace ours.
SWIGLU_CASES = ([("ours", shape) for shape in refs.SWIGLU_SHAPES + [(8192, LLAMA3_8B["ffn"])]]
                + [("liger_megatron", shape) for shape in [(7, 1000), (8192, LLAMA3_8B["ffn"])]])
NORM_CASES = ([("ours", shape) for shape in NORM_SHAPES + [(8192, LLAMA3_8B["hidden"])]]
              + [("liger_megatron", shape) for shape in [(5, 4097), (8192, LLAMA3_8B["hidden"])]])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl,shape", SWIGLU_CASES, ids=str)
def test_swiglu_shapes(impl, shape, dtype):
    rows, f = shape
    torch.manual_seed(rows + f)
    x = (torch.randn(rows, 2 * f, device="cuda") * 3).to(dtype).requires_grad_()
    _check_swiglu(_swiglu_impls()[impl], x)


@pytest.mark.parametrize("impl", ["ours", "liger_megatron"])
def test_swiglu_past_int32_elements(impl):
    """x [rows, 2F] bf16 with rows * 2F > 2^31 (F = Llama3-8B's 14336): the last rows, whose
    offsets pass 2^31, against float64. Tensors of about 13 GB."""
    f = LLAMA3_8B["ffn"]
    rows = PAST_INT32 // (2 * f) + 64
    assert rows * 2 * f > PAST_INT32
    torch.manual_seed(5)
    x = torch.randn(rows, 2 * f, device="cuda", dtype=torch.bfloat16).requires_grad_()
    _check_swiglu(_swiglu_impls()[impl], x, slice(rows - 64, rows))


def _check_rope(mixed: torch.Tensor, per_group: int, head_dim: int, tail: int | None = None):
    """Our fused QKV RoPE's forward and backward against float64: every token, or the last
    `tail` sequence positions (every batch entry at those positions)."""
    from training.native import rope

    s = mixed.shape[0]
    dtype = mixed.dtype
    fq = refs.rope_freqs(s, head_dim, device="cuda")
    fk = fq * 0.5 + 0.1
    fused = rope._FusedQKVRope.apply(mixed, fq, fk, per_group, head_dim)
    grads = [torch.randn_like(t) for t in fused]
    (dqkv,) = torch.autograd.grad(fused, mixed, grads)
    pos = slice(s - tail, s) if tail else slice(None)
    mixed64 = mixed.detach()[pos].double().requires_grad_()
    expected = refs.rope_ref(mixed64, fq[pos], fk[pos], per_group, head_dim)
    for ours, ref in zip(fused, expected):
        refs.assert_close(ours[pos], ref, dtype)
    (dqkv64,) = torch.autograd.grad(expected, mixed64, [g[pos].double() for g in grads])
    refs.assert_close(dqkv[pos], dqkv64, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", refs.ROPE_SHAPES + [(8192, 1, 8, 4, 128)])
def test_fused_qkv_rope_shapes(dtype, shape):
    s, b, groups, per_group, head_dim = shape
    torch.manual_seed(sum(shape))
    mixed = torch.randn(s, b, groups, (per_group + 2) * head_dim, device="cuda", dtype=dtype)
    _check_rope(mixed.requires_grad_(), per_group, head_dim)


def test_fused_qkv_rope_past_int32_elements():
    """The packed QKV tensor at Llama3-8B's head layout with s * b * groups * 6 * 128 > 2^31
    (seq 8192, b 43): the last position's q, k, v and gradient against float64. Tensors of
    about 17 GB."""
    c = LLAMA3_8B
    width = c["groups"] * (c["per_group"] + 2) * c["head_dim"]
    s, b = 8192, PAST_INT32 // (8192 * width) + 1
    assert s * b * width > PAST_INT32 and (s - 1) * b * width > PAST_INT32
    torch.manual_seed(6)
    mixed = torch.randn(s, b, c["groups"], width // c["groups"], device="cuda",
                        dtype=torch.bfloat16)
    _check_rope(mixed.requires_grad_(), c["per_group"], c["head_dim"], tail=1)


def _norm_impls(hidden: int, dtype):
    from liger_kernel.megatron import LigerMegatronRMSNorm

    from training.native.norm import rms_norm_liger

    class Cfg:
        normalization, sequence_parallel, layernorm_zero_centered_gamma = "RMSNorm", False, False

    liger = LigerMegatronRMSNorm(Cfg(), hidden, eps=1e-5).to("cuda", dtype)
    return {"ours": lambda x, w: rms_norm_liger(x, w, 1e-5),
            "liger_megatron": lambda x, w: (liger.weight.data.copy_(w), liger(x))[1]}


def _check_norm(fn, x: torch.Tensor, w: torch.Tensor, rows: slice | None = None) -> None:
    dtype = x.dtype
    y = fn(x, w)
    dy = torch.randn_like(y)
    rows = rows or slice(None)
    x64 = x.detach()[rows].double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    y64 = refs.rms_norm_ref(x64, w64, 1e-5)
    refs.assert_close(y[rows], y64, dtype)
    (dx,) = torch.autograd.grad(y, x, dy)
    (dx64,) = torch.autograd.grad(y64, x64, dy[rows].double())
    refs.assert_close(dx[rows], dx64, dtype, scale="row")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl,shape", NORM_CASES, ids=str)
def test_rms_norm_shapes(impl, shape, dtype):
    rows, hidden = shape
    torch.manual_seed(rows + hidden)
    x = torch.randn(rows, hidden, device="cuda", dtype=dtype, requires_grad=True)
    w = (1 + 0.1 * torch.randn(hidden, device="cuda")).to(dtype)
    _check_norm(_norm_impls(hidden, dtype)[impl], x, w)


def test_rms_norm_past_int32_elements():
    """x [rows, 4096] bf16 with rows * 4096 > 2^31 (Liger's kernel, which both our norm and
    Liger's Megatron norm run): the last rows against float64. Tensors of about 17 GB."""
    hidden = LLAMA3_8B["hidden"]
    rows = PAST_INT32 // hidden + 64
    torch.manual_seed(7)
    x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (1 + 0.1 * torch.randn(hidden, device="cuda")).to(torch.bfloat16)
    _check_norm(_norm_impls(hidden, torch.bfloat16)["ours"], x, w, slice(rows - 64, rows))
