"""apex's multi-tensor ops (l2 norm, scale) for Megatron, as torch foreach ops.

Without Transformer Engine or apex, Megatron 0.19.2 falls back to its local versions, used by
gradient clipping (every step) and the non-distributed optimizer's param copies:

- the l2 norm takes `torch.norm` of every gradient and builds a tensor from the list of
  results: one device-to-host copy per parameter, each waiting for the GPU;
- the scale computes `dst.copy_(src * scale)`: a temporary of each tensor's size. Clipping
  scales the fp32 main gradients in place, so when it clips (global norm above
  CLIP_GRAD, the common case early in training) the optimizer step peaks with one extra
  copy of the largest gradient (Llama3's 128k x 4096 embedding in fp32), on top of the
  step's fp32 gradient copy. On an H200 that copy is what the 8-layer Llama3-8B step's
  measured peak holds beyond its live tensors (dev/stack_notes.md, session 5).

Here the norm is one `_foreach_norm` and a norm of the norms, left on the device, and the
scale multiplies in place when source and destination are the same tensors. Like Megatron's
local versions (and unlike apex's), they do not set the overflow flag.
"""
from __future__ import annotations

import torch


def foreach_l2_norm(chunk_size, noop_flag, tensor_lists, per_tensor, *args):
    """Drop-in for amp_C.multi_tensor_l2norm through multi_tensor_applier: (global l2 norm as
    a 1-element fp32 tensor, per-tensor norms or None). No host synchronisation."""
    tensors = tensor_lists[0]
    if not tensors:
        return torch.zeros(1, dtype=torch.float32, device=noop_flag.device), None
    norms = torch.stack(torch._foreach_norm(tensors, 2, dtype=torch.float32))
    return torch.linalg.vector_norm(norms).reshape(1), (norms if per_tensor else None)


def foreach_scale(chunk_size, noop_flag, tensor_lists, scale):
    """Drop-in for amp_C.multi_tensor_scale: dst = src * scale. In place, without a temporary,
    when each dst is its src (gradient clipping); a copy when scale is 1 (param copies)."""
    src, dst = tensor_lists
    if all(s is d for s, d in zip(src, dst)):
        if scale != 1.0:
            torch._foreach_mul_(dst, scale)
    else:  # src's dtype does the multiply, as in Megatron's local version
        torch._foreach_copy_(dst, src if scale == 1.0 else torch._foreach_mul(src, scale))
