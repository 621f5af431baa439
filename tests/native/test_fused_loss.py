"""The native backend's loss on the CPU: ChunkedLinearCrossEntropy's hand-written gradients
against autograd, and the fused linear cross-entropy (GPTModel's output_processor) with
pretrain_gpt.loss_func at micro-batch 3 against Megatron's unfused loss.

The run shapes meet here: GPTModel's hidden states are [s, b, h], labels and loss_mask [b, s],
the unfused per-token loss [b, s]. At micro-batch 1 an [s, b] / [b, s] slip changes nothing;
at 3, with a loss mask that differs per row, it moves the loss.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from training.launch.presets import PRESETS
from training.native.cross_entropy import (IGNORE_INDEX, ChunkedLinearCrossEntropy,
                                           make_output_processor)


def _inputs(dtype, n=10, h=8, v=32):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, h, generator=gen, dtype=dtype, requires_grad=True)
    weight = torch.randn(v, h, generator=gen, dtype=dtype, requires_grad=True)
    target = torch.randint(0, v, (n,), generator=gen)
    target[[2, n - 3]] = IGNORE_INDEX
    return hidden, weight, target


@pytest.mark.parametrize("chunk", [3, 64])   # several chunks (the last one short), one chunk
def test_chunked_linear_cross_entropy_gradients_match_autograd(chunk):
    """Forward and both gradients against F.cross_entropy's autograd in float64 (ours computes
    its logits in fp32, as on the GPU: fp32 tolerances), with ignored targets and an upstream
    gradient that is not 1 (Megatron scales the loss before backward).

    Mutation caught: ChunkedLinearCrossEntropy.backward returning the saved gradients without
    `* grad_output`; also `grad_logits *= valid.unsqueeze(1)` dropped (ignored tokens then
    pull on the weights)."""
    hidden, weight, target = _inputs(torch.float32)
    ours = ChunkedLinearCrossEntropy.apply(hidden, weight, target, chunk)
    (ours * 1.7).backward()
    h64 = hidden.detach().double().requires_grad_()
    w64 = weight.detach().double().requires_grad_()
    ref = F.cross_entropy(h64 @ w64.t(), target, ignore_index=IGNORE_INDEX, reduction="sum")
    (ref * 1.7).backward()
    torch.testing.assert_close(ours.double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hidden.grad.double(), h64.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weight.grad.double(), w64.grad, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def tiny_gpt():
    """Our GPTModel at the tiny preset's width, one layer, fp32 on the CPU (native backend,
    torch kernels), in training mode's autograd (dropout is 0)."""
    from tests.model.parity import build_pair

    preset = dataclasses.replace(PRESETS["tiny"], num_layers=1)
    _, gpt = build_pair(preset, 1, "native", "torch", "cpu", torch.float32)
    return gpt, preset.vocab_size


def _batch(vocab: int, b: int = 3, s: int = 16):
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab, (b, s), generator=gen)
    labels = torch.randint(0, vocab, (b, s), generator=gen)
    positions = torch.arange(s).unsqueeze(0).expand(b, s)
    loss_mask = torch.ones(b, s)
    loss_mask[0, :5] = 0          # every row masked differently
    loss_mask[1, -3:] = 0
    loss_mask[2, ::2] = 0
    return tokens, labels, positions, loss_mask


def test_fused_loss_and_loss_func_at_micro_batch_3_match_the_unfused_loss(tiny_gpt):
    """pretrain_gpt.loss_func on the fused output (a summed scalar) and on Megatron's unfused
    per-token loss ([b, s]) both give the masked sum of the token losses computed from the
    logits, the same token count, and the same gradients.

    Mutation caught: make_output_processor's `target = labels.t().reshape(-1)` as
    `labels.reshape(-1)` (labels read as [s, b]); also loss_func's
    `loss_mask.reshape(-1)` as `loss_mask.t().reshape(-1)` (the mask read as [s, b] against
    the [b, s] unfused loss)."""
    from training.pretrain_gpt import loss_func

    gpt, vocab = tiny_gpt
    tokens, labels, positions, loss_mask = _batch(vocab)
    with torch.no_grad():
        logits = gpt(tokens, positions, None)                        # [b, s, V]
    token_loss = F.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1), reduction="none")
    expected = (token_loss.view_as(loss_mask) * loss_mask).sum()

    results, grads = {}, {}
    for name, processor in (("unfused", None), ("fused", make_output_processor("torch"))):
        gpt.zero_grad(set_to_none=True)
        output = gpt(tokens, positions, None, labels=labels, loss_mask=loss_mask,
                     output_processor=processor)
        loss, num_tokens, report = loss_func(loss_mask, output)
        loss.backward()
        results[name] = (loss.detach(), num_tokens, report["lm loss"])
        grads[name] = {n: p.grad.clone() for n, p in gpt.named_parameters() if p.grad is not None}
    for name, (loss, num_tokens, report) in results.items():
        torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-4, msg=name)
        assert int(num_tokens) == int(loss_mask.sum()), name
        torch.testing.assert_close(report, torch.stack([loss, num_tokens.float()]), msg=name)
    assert grads["fused"].keys() == grads["unfused"].keys() and grads["fused"]
    for param, grad in grads["unfused"].items():
        torch.testing.assert_close(grads["fused"][param], grad, rtol=1e-4, atol=1e-6, msg=param)
