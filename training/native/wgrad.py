"""Gradient-accumulation fusion without apex or Transformer Engine.

Megatron's ColumnParallelLinear/RowParallelLinear, with gradient_accumulation_fusion, hand the
weight gradient to `fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32/fp16(input,
grad_output, main_grad)`, apex's extension. The same operation is one cuBLAS GEMM with beta=1:
main_grad += grad_output^T @ input, written in place, bf16 operands, fp32 or bf16
accumulator. torch exposes it as addmm with out_dtype (fp32 main_grad) or addmm_ (bf16).
The patch table (training.megatron_patches, native backend) gives Megatron this
implementation where apex's is absent.
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
