"""One table that sorts kernel (and, for --device cpu, operator) names into report groups.

The groups are what a performance engineer asks about first: how much of the device time is
matrix multiplication, attention, normalisation/elementwise work, communication and memory
copies. The table is ordered and the first match wins; every pattern is a case-insensitive
regular expression searched anywhere in the full (unshortened) kernel name.

Order matters:
- communication first: NCCL/RCCL kernel names contain words like "Reduce" or "Sum";
- memcpy next: "Memcpy DtoD (Device -> Device)" must not fall into a compute group;
- attention before GEMM: fused attention kernels often carry GEMM library words
  (e.g. "fmha_cutlassF_..."), and attention is the more specific fact;
- GEMM before norm+elementwise: "triton_tem_fused_mm" style names stay GEMM when they say so.

Names that match nothing land in OTHER, and the report shows the top OTHER kernels so the
table can be extended from real traces.
"""

from __future__ import annotations

import re
from typing import Final

GEMM: Final = "GEMM"
ATTENTION: Final = "attention"
NORM_ELEMENTWISE: Final = "norm+elementwise"
COMMUNICATION: Final = "communication"
MEMCPY: Final = "memcpy"
OTHER: Final = "other"

# Report order of the groups (tables, chart colours, JSON).
GROUPS: Final[tuple[str, ...]] = (GEMM, ATTENTION, NORM_ELEMENTWISE, COMMUNICATION, MEMCPY, OTHER)

# (group, pattern, what it catches). First match wins.
GROUP_PATTERNS: Final[tuple[tuple[str, str, str], ...]] = (
    # --- communication ---
    (COMMUNICATION, r"^nccl|nccl.*kernel", "NCCL/RCCL device kernels (ncclDevKernel_*, ncclKernel_*)"),
    (COMMUNICATION, r"^gloo:", "gloo collectives as recorded by torch.distributed (CPU)"),
    (COMMUNICATION, r"^c10d::|^record_param_comms$", "c10d collective ops on the host"),
    (COMMUNICATION, r"userbuffers", "Transformer Engine userbuffers comm-overlap kernels"),
    # --- memcpy / memset ---
    (MEMCPY, r"^memcpy|^memset|^dma", "CUDA/HIP memcpy and memset activities"),
    # --- attention ---
    (ATTENTION, r"flash|fmha|sdpa|scaled_dot_product", "flash-attention, FMHA, SDPA kernels/ops"),
    (
        ATTENTION,
        r"cudnn_generated_fort",
        "cuDNN frontend-generated fused attention (SDPA cuDNN backend, TE fused attn)",
    ),
    (ATTENTION, r"cudnn::fusion::", "cuDNN fused-attention helper kernels (dot(dO, O), dQ conversion)"),
    (ATTENTION, r"attention|attn", "other kernels that name attention"),
    (ATTENTION, r"scaled_(upper_triang_)?masked_softmax", "Megatron fused masked softmax (unfused attention)"),
    # --- GEMM ---
    (GEMM, r"gemm|cutlass|cublas|xmma|nvjet|wgmma|hgmma", "cuBLAS/cuBLASLt/CUTLASS/nvjet GEMM kernels"),
    (GEMM, r"^cijk_", "rocBLAS/hipBLASLt Tensile GEMM kernels"),
    (
        GEMM,
        r"^aten::(mm|addmm|bmm|baddbmm|addbmm|_addmm_activation|matmul|linear)$",
        "matmul ops (CPU timeline)",
    ),
    # --- norm + elementwise ---
    (
        NORM_ELEMENTWISE,
        r"norm|gammabeta",
        "layer/RMS norm kernels (_rms_norm_forward_kernel, layer_norm, GammaBetaBackward)",
    ),
    (
        NORM_ELEMENTWISE,
        r"elementwise|vectorized|triton|reduce_kernel|unrolled",
        "PyTorch/Triton elementwise and reduction kernels",
    ),
    (
        NORM_ELEMENTWISE,
        r"softmax|gelu|silu|swiglu|geglu|relu|dropout|rotary|rope|cross_entropy|nll_loss",
        "activation/softmax/RoPE/loss kernels",
    ),
    (
        NORM_ELEMENTWISE,
        r"multi_tensor|adam|cast_transpose|transpose|cast|fill|copy|cat_array|catarray",
        "optimizer, cast/transpose, fill and copy kernels",
    ),
    (
        NORM_ELEMENTWISE,
        r"^aten::_?(foreach_)?(add|sub|mul|div|pow|sqrt|rsqrt|exp|log|tanh|sigmoid|neg|abs|clamp|where|fill|zero|"
        r"copy|sum|mean|var|gelu|silu|relu|softmax|_softmax|lerp|addcmul|addcdiv|maximum|minimum|mse_loss|"
        r"threshold_backward|gelu_backward|silu_backward|native_dropout)(_|$)",
        "elementwise/reduction ops (CPU timeline)",
    ),
)

_COMPILED: Final = tuple((group, re.compile(pattern, re.IGNORECASE)) for group, pattern, _ in GROUP_PATTERNS)


def classify(name: str) -> str:
    """The report group of one kernel or operator name."""
    for group, regex in _COMPILED:
        if regex.search(name):
            return group
    return OTHER
