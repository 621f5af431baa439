"""Fused linear cross-entropy: loss from the last hidden states without the logits tensor.

At vocab 128256 and seq 8192 the logits of one micro-batch are 2 GB in bf16 (4 GB in fp32 for
the loss); the fused version walks the tokens in chunks, computing each chunk's logits, loss
and gradients (w.r.t. hidden states and the output weight) in the forward pass, so the
backward pass only scales them. Liger-Kernel's Triton implementation is used on GPUs;
`ChunkedLinearCrossEntropy` is the same algorithm in torch (CPU tests, NATIVE_KERNELS=torch).

Used as GPTModel's `output_processor`: it returns the summed loss over unmasked tokens of
the micro-batch (a scalar), which forward_step's loss function normalises like Megatron's.
"""
from __future__ import annotations

import torch

IGNORE_INDEX = -100


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """sum over tokens of CE(hidden @ weight^T, target), ignoring IGNORE_INDEX targets."""

    @staticmethod
    def forward(ctx, hidden, weight, target, chunk_size: int):
        grad_hidden = torch.zeros_like(hidden)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk_size):
            h = hidden[start:start + chunk_size]
            t = target[start:start + chunk_size]
            logits = (h @ weight.t()).float()
            valid = t != IGNORE_INDEX
            safe_t = torch.where(valid, t, torch.zeros_like(t))
            lse = torch.logsumexp(logits, dim=-1)
            picked = logits.gather(1, safe_t.unsqueeze(1)).squeeze(1)
            total += torch.where(valid, lse - picked, torch.zeros_like(lse)).sum()
            grad_logits = torch.softmax(logits, dim=-1)
            grad_logits[torch.arange(len(t), device=t.device), safe_t] -= 1.0
            grad_logits *= valid.unsqueeze(1)
            grad_hidden[start:start + chunk_size] = (grad_logits.to(h.dtype) @ weight)
            grad_weight += grad_logits.t() @ h.float()
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype))
        return total

    @staticmethod
    def backward(ctx, grad_output):
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_output, grad_weight * grad_output, None, None


def liger_linear_cross_entropy_sum(hidden: torch.Tensor, weight: torch.Tensor,
                                   target: torch.Tensor, chunk_mem: int = 1) -> torch.Tensor:
    """Liger's Triton fused linear cross-entropy, summed. `chunk_mem` is its chunk_mem_const:
    chunks of next_pow2(N / ceil(V / (chunk_mem * H))) tokens (CE_CHUNK_MEM)."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    return liger_fused_linear_cross_entropy(hidden, weight, target, ignore_index=IGNORE_INDEX,
                                            reduction="sum", chunk_mem_const=chunk_mem)


def linear_cross_entropy_sum(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                             kernels: str, chunk_size: int = 4096,
                             chunk_mem: int = 1) -> torch.Tensor:
    """hidden [N, H], weight [V, H], target [N] (IGNORE_INDEX to skip) -> summed loss."""
    if kernels == "liger" and hidden.is_cuda:  # Triton runs on GPUs only (CPU: tests)
        return liger_linear_cross_entropy_sum(hidden, weight, target, chunk_mem)
    return ChunkedLinearCrossEntropy.apply(hidden, weight, target, chunk_size)


def make_output_processor(kernels: str, chunk_mem: int = 1):
    """GPTModel output_processor computing the summed fused linear cross-entropy."""

    def output_processor(*, hidden_states, output_layer, output_weight, labels, loss_mask,
                         **_unused):
        if labels is None:  # inference / no loss requested: plain logits
            logits, _ = output_layer(hidden_states, weight=output_weight)
            return logits.transpose(0, 1).contiguous()
        # The output layer's forward is skipped, so run its forward pre-hooks by hand: with
        # an overlapped param all-gather, Megatron's DDP waits for the layer's bucket there.
        for hook in list(output_layer._forward_pre_hooks.values()):
            hook(output_layer, (hidden_states,))
        # The whole vocabulary is on this rank: the run uses this processor at TP=1 only.
        weight = output_weight if output_weight is not None else output_layer.weight
        s, b, h = hidden_states.shape
        # hidden is [s, b, h]; labels and loss_mask are [b, s]
        target = labels.t().reshape(-1)
        if loss_mask is not None:
            target = target.masked_fill(loss_mask.t().reshape(-1) == 0, IGNORE_INDEX)
        return linear_cross_entropy_sum(hidden_states.reshape(s * b, h), weight, target, kernels,
                                        chunk_mem=chunk_mem)

    output_processor.description = (
        f"Liger fused linear cross-entropy (chunk_mem_const {chunk_mem}) "
        "(liger_kernel.transformers.functional.liger_fused_linear_cross_entropy)"
        if kernels == "liger" else
        f"chunked torch fused linear cross-entropy ({ChunkedLinearCrossEntropy.__module__}."
        f"{ChunkedLinearCrossEntropy.__qualname__})")
    return output_processor
