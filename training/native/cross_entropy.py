"""Fused linear cross-entropy: loss from the last hidden states without the logits tensor.

At vocab 128256 and seq 8192 the logits of one micro-batch are 2 GB in bf16 (4 GB in fp32 for
the loss); the fused version walks the tokens in chunks, computing each chunk's logits, loss
and gradients (w.r.t. hidden states and the output weight) in the forward pass, so the
backward pass only scales them. On GPUs each chunk's loss and logit gradient come from
Liger-Kernel's Triton kernel, in a loop of ours that never reads the GPU from the host;
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


def liger_chunk_rows(tokens: int, vocab: int, hidden: int, chunk_mem: int) -> int:
    """Rows per chunk as Liger sizes them for chunk_mem_const `chunk_mem`: each chunk's logits
    stay under chunk_mem x tokens x hidden elements, in a power of two of rows."""
    per_chunk = -(-vocab // (chunk_mem * hidden))          # chunks needed, at least one
    rows = -(-tokens // per_chunk)
    return min(1 << max(rows - 1, 0).bit_length(), tokens)


class SyncFreeLigerLinearCrossEntropy(torch.autograd.Function):
    """Liger-Kernel's fused linear cross-entropy algorithm in our own chunk loop, with Liger's
    Triton kernel for each chunk's loss and logit gradient, and no host read.

    Liger's own entry (liger_fused_linear_cross_entropy) counts the unmasked tokens with
    `.item()` in every forward (its mean reduction divides by it) and compares the incoming
    gradient to 1.0 on the host in every backward: two waits for the GPU per micro-batch, which
    stall a launch-bound step and forbid a CUDA graph of it. The summed loss needs neither: the
    kernel runs with reduction "sum" (the count is never read), and the backward always scales
    the two gradients by the incoming one on the GPU. Same chunking (liger_chunk_rows), same
    bf16 accumulation of the output weight's gradient as Liger's default."""

    @staticmethod
    def forward(ctx, hidden, weight, target, chunk_mem: int):
        from liger_kernel.ops.cross_entropy import MAX_FUSED_SIZE, liger_cross_entropy_kernel
        from liger_kernel.ops.utils import is_hip

        tokens, width = hidden.shape
        vocab = weight.shape[0]
        rows = liger_chunk_rows(tokens, vocab, width, chunk_mem)
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros_like(weight)
        # zeros: the kernel returns early on an ignored token without writing its loss
        loss_rows = torch.zeros(tokens, dtype=torch.float32, device=hidden.device)
        logits = torch.empty((rows, vocab), dtype=hidden.dtype, device=hidden.device)
        target = target.contiguous()
        block = min(MAX_FUSED_SIZE, 1 << (vocab - 1).bit_length())   # Liger's launch settings
        for start in range(0, tokens, rows):
            end = min(start + rows, tokens)
            chunk, h = logits[:end - start], hidden[start:end]
            torch.mm(h, weight.t(), out=chunk)
            liger_cross_entropy_kernel[(end - start,)](
                X_ptr=chunk, X_stride=chunk.stride(0), Y_ptr=target[start:end], Y_stride=1,
                weight_ptr=None, loss_ptr=loss_rows[start:end], z_loss_ptr=None, loss_stride=1,
                token_accuracy_ptr=None, token_accuracy_stride=0, predicted_tokens_ptr=None,
                predicted_tokens_stride=0, n_cols=vocab, n_non_ignore=1.0,
                sum_non_ignore_weight=1.0, weight_sum=0.0, ignore_index=IGNORE_INDEX,
                lse_square_scale=0.0, label_smoothing=0.0, reduction="sum", softcap=None,
                RETURN_Z_LOSS=False, RETURN_TOKEN_ACCURACY=False, RETURN_PREDICTED_TOKENS=False,
                BLOCK_SIZE=block, HAS_WEIGHT=False, HAS_SOFTCAPPING=False, HAS_GRADIENTS=True,
                num_warps=16 if is_hip() else 32)
            # the kernel left d(summed loss)/d(logits) in the chunk's buffer
            torch.mm(chunk, weight, out=grad_hidden[start:end])
            torch.addmm(grad_weight, chunk.t(), h, out=grad_weight)
        # kept on ctx, not saved tensors: the backward scales them in place, once
        ctx.grads = (grad_hidden, grad_weight)
        return loss_rows.sum()

    @staticmethod
    def backward(ctx, grad_output):
        grad_hidden, grad_weight = ctx.grads
        del ctx.grads
        scale = grad_output.to(grad_hidden.dtype)
        return grad_hidden.mul_(scale), grad_weight.mul_(scale), None, None


def liger_linear_cross_entropy_sum(hidden: torch.Tensor, weight: torch.Tensor,
                                   target: torch.Tensor, chunk_mem: int = 1) -> torch.Tensor:
    """Liger's fused linear cross-entropy, summed, without a host read
    (SyncFreeLigerLinearCrossEntropy). `chunk_mem` is Liger's chunk_mem_const: chunks of
    next_pow2(N / ceil(V / (chunk_mem * H))) tokens (CE_CHUNK_MEM)."""
    return SyncFreeLigerLinearCrossEntropy.apply(hidden, weight, target, chunk_mem)


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
        f"Liger fused linear cross-entropy (chunk_mem_const {chunk_mem}), sync-free "
        f"({SyncFreeLigerLinearCrossEntropy.__module__}."
        f"{SyncFreeLigerLinearCrossEntropy.__qualname__}: Liger's Triton kernel per chunk)"
        if kernels == "liger" else
        f"chunked torch fused linear cross-entropy ({ChunkedLinearCrossEntropy.__module__}."
        f"{ChunkedLinearCrossEntropy.__qualname__})")
    return output_processor
