"""Gradient-accumulation fusion without apex or Transformer Engine.

Megatron's ColumnParallelLinear/RowParallelLinear, with gradient_accumulation_fusion, hand the
weight gradient to `fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32/fp16(input,
grad_output, main_grad)`, apex's extension. The same operation is one cuBLAS GEMM with beta=1:
main_grad += grad_output^T @ input, written in place, bf16 operands, fp32 or bf16
accumulator. torch exposes it as addmm with out_dtype (fp32 main_grad) or addmm_ (bf16).
`install()` gives Megatron this implementation in place of apex's.
"""
from __future__ import annotations

import torch


class TorchWgradAccum:
    """Drop-in for apex's fused_weight_gradient_mlp_cuda (the two functions Megatron calls)."""

    @staticmethod
    def wgrad_gemm_accum_fp32(total_input: torch.Tensor, grad_output: torch.Tensor,
                              main_grad: torch.Tensor) -> None:
        if main_grad.is_cuda:
            torch.addmm(main_grad, grad_output.t(), total_input, out_dtype=torch.float32,
                        out=main_grad)
        else:  # CPU (tests): the same arithmetic, unfused
            main_grad.add_(grad_output.t().float() @ total_input.float())

    @staticmethod
    def wgrad_gemm_accum_fp16(total_input: torch.Tensor, grad_output: torch.Tensor,
                              main_grad: torch.Tensor) -> None:
        main_grad.addmm_(grad_output.t(), total_input)


def install() -> str:
    """Make Megatron's tensor-parallel linears use TorchWgradAccum. Returns a description."""
    from megatron.core.tensor_parallel import layers

    if layers._grad_accum_fusion_available and getattr(layers, "fused_weight_gradient_mlp_cuda",
                                                       None) is not None:
        return "apex fused_weight_gradient_mlp_cuda (installed)"
    layers.fused_weight_gradient_mlp_cuda = TorchWgradAccum
    layers._grad_accum_fusion_available = True
    return "native: cuBLAS GEMM accumulating into main_grad (torch.addmm, beta=1)"
