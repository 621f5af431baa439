"""float64 references of the native kernels, the tolerances they are held to, and the shapes
they are tested over (shared by the CPU interpreter tests and the GPU tests).

Tolerances (torch.testing.assert_close's rtol/atol, per output dtype): the kernels compute in
float32 and round once to the output dtype, so a bf16 output is within one bf16 rounding
(2^-9 relative) of the exact value; 2^-7 leaves room for the bf16 inputs' float32 products.
float32 outputs: 1e-5 relative (several float32 operations, transcendental functions).
The input gradient of a normalisation subtracts a row mean from each element, so an element
near zero carries the error of its row's larger terms: that check's absolute tolerance is the
relative one times the row's mean magnitude (`scale="row"`).
"""
from __future__ import annotations

import torch

TOLERANCE = {torch.bfloat16: {"rtol": 2 ** -7, "atol": 1e-5},
             torch.float32: {"rtol": 1e-5, "atol": 1e-6}}

# (rows, F): one row, one element, F across the kernel's 1024-column block, odd and prime sizes
SWIGLU_SHAPES = [(1, 1), (7, 1000), (3, 1025), (5, 2049), (13, 14336 // 8 + 1)]
# (s, b, groups, q heads per group, head_dim): head_dim/2 not a power of two, one head, GQA, MHA
ROPE_SHAPES = [(5, 3, 2, 3, 64), (1, 1, 1, 1, 2), (3, 2, 3, 1, 10), (4, 1, 1, 5, 36),
               (2, 5, 4, 2, 128)]


def swiglu_ref(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.double().chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rope_ref(mixed_qkv, q_freqs, k_freqs, q_per_group: int, head_dim: int):
    """q, k, v of the packed QKV tensor, RoPE applied to q and k, in float64."""
    s, b, groups, _ = mixed_qkv.shape
    x = mixed_qkv.double()
    q, k, v = torch.split(x, [q_per_group * head_dim, head_dim, head_dim], dim=3)
    half = head_dim // 2
    fq, fk = q_freqs[..., :half].double(), k_freqs[..., :half].double()
    q = _rotate(q.reshape(s, b, groups * q_per_group, head_dim), fq.cos(), fq.sin())
    k = _rotate(k, fk.cos(), fk.sin())
    return q, k, v


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return weight.double() * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rope_freqs(seq: int, head_dim: int, device="cpu", base: float = 10000.0) -> torch.Tensor:
    """Megatron's RoPE angles for positions 0..seq-1: [s, 1, 1, head_dim], halves repeated."""
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    freqs = torch.outer(torch.arange(seq, device=device).float(), inv)
    return torch.cat([freqs, freqs], -1)[:, None, None, :]


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype,
                 scale: str = "element") -> None:
    """actual (the kernel's output, in `dtype`) against a float64 reference."""
    tol = dict(TOLERANCE[dtype])
    expected = expected.double()
    if scale == "row":
        tol["atol"] = max(tol["atol"], tol["rtol"] * expected.abs().mean().item())
    torch.testing.assert_close(actual.double(), expected, **tol)
