"""RMSNorm for the native backend, usable in Megatron's norm slots (input/pre-MLP/final).

Computes like Llama's reference (fp32 statistics, normalised value cast back to the input
dtype, then scaled by the weight). Supports sequence parallel: the weight is marked so that
Megatron all-reduces its gradient over the tensor-parallel group.
"""
from __future__ import annotations

import functools

import torch


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def rms_norm_fused(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """torch's rms_norm: one fused kernel each way on CUDA (aten::_fused_rms_norm), fp32
    statistics; on the CPU torch's composite of the reference's steps."""
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)


def rms_norm_liger(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    from liger_kernel.transformers.functional import liger_rms_norm

    shape = x.shape
    out = liger_rms_norm(x.reshape(-1, shape[-1]), weight, eps, 0.0, "llama", False)
    return out.view(shape)


class NativeRMSNorm(torch.nn.Module):
    """Megatron norm-slot signature: (config, hidden_size, eps, ...); torch's rms_norm."""

    kernels = "torch"

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, persist_layer_norm=False,
                 zero_centered_gamma: bool = False, normalization: str = "RMSNorm"):
        super().__init__()
        if normalization != "RMSNorm" or getattr(config, "normalization", "RMSNorm") != "RMSNorm":
            raise ValueError("the native backend implements RMSNorm only (Llama); "
                             f"got normalization={config.normalization!r}")
        if zero_centered_gamma or getattr(config, "layernorm_zero_centered_gamma", False):
            raise ValueError("the native RMSNorm does not implement zero-centred gamma")
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
        # Megatron all-reduces grads of params marked sequence_parallel over the TP group.
        setattr(self.weight, "sequence_parallel", bool(config.sequence_parallel))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernels == "liger" and x.is_cuda:  # Triton runs on GPUs only (CPU: tests)
            return rms_norm_liger(x, self.weight, self.eps)
        if self.kernels == "torch_fused":
            return rms_norm_fused(x, self.weight, self.eps)
        return rms_norm_torch(x, self.weight, self.eps)


class LigerRMSNorm(NativeRMSNorm):
    """NativeRMSNorm through Liger-Kernel's Triton RMSNorm (NATIVE_KERNELS=liger)."""

    kernels = "liger"


class FusedTorchRMSNorm(NativeRMSNorm):
    """NativeRMSNorm through torch's fused rms_norm kernel (NATIVE_KERNELS=liger with
    IMPLEMENTATION["rmsnorm"] = "torch_fused"): on the H200 its forward+backward costs the
    host a quarter of Liger's Triton launch (dev/gpu/norm_host_timing.py), which matters where
    the step is launch-bound (the MoE layers' many small operators)."""

    kernels = "torch_fused"


@functools.cache
def liger_megatron_rms_norm():
    """Liger-Kernel's own Megatron RMSNorm (liger_kernel.megatron), the alternative to
    LigerRMSNorm (the same Triton kernel; training.native.IMPLEMENTATION picks one), with
    torch's rms_norm for CPU tensors (tests) where Triton cannot run."""
    from liger_kernel.megatron import LigerMegatronRMSNorm

    class LigerMegatronNorm(LigerMegatronRMSNorm):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if not x.is_cuda:
                return rms_norm_torch(x, self.weight, self.eps)
            return super().forward(x)

    return LigerMegatronNorm
