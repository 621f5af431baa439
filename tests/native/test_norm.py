"""training/native/norm.py on the CPU: the fused-torch RMSNorm computes the reference's
function (fp32 statistics, cast back, times the weight), forward and backward. The CUDA
kernels themselves are compared in tests/gpu/test_native_kernels_gpu.py."""
from __future__ import annotations

import pytest
import torch

from training.native.norm import rms_norm_fused, rms_norm_torch


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_fused_rms_norm_is_the_reference_function(dtype, tol):
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(6, 4, 32, generator=gen) * 3).to(dtype)
    w = torch.rand(32, generator=gen).to(dtype)
    grad = torch.randn(6, 4, 32, generator=gen).to(dtype)
    outs = []
    for fn in (rms_norm_torch, rms_norm_fused):
        xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = fn(xi, wi, 1e-6)
        y.backward(grad)
        outs.append((y, xi.grad, wi.grad))
    for name, ref, ours in zip(("out", "dx", "dw"), *outs):
        assert ours.dtype == dtype
        torch.testing.assert_close(ours.float(), ref.float(), rtol=tol, atol=tol, msg=name)
