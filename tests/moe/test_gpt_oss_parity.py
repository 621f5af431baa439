"""Our gpt-oss against a reference nobody here wrote: Hugging Face's GptOssForCausalLM.

A randomly initialised HF gpt-oss of the tiny preset's shape (2 layers: the first banded to a
16-key window, the second full; learnable sinks; biased q/k/v/o, router and experts; the clamped
SwiGLU; YaRN RoPE; 8 experts top-2), sinks and biases drawn so that each matters, has its weights
copied into our GPTModel built from the preset's own Megatron flags (training/checkpoint/
gpt_oss.py); logits and loss must agree at fp32 on the CPU, with flex attention (forward) and
with the reference attention, and in bf16 within the parity tests' yardstick. Dropping the window
or the sinks from our model breaks the agreement (the tests below would see either go)."""
from __future__ import annotations

import pytest
import torch

from training.moe.gpt_oss import TINY_GPT_OSS
from training.native.flex_attention import FlexSinkAttention

from tests.model.parity import check_bf16_parity, report
from tests.moe.gpt_oss_model import gpt_oss_parity, layer_errors
from tests.moe.model import compare_logits

SEQ = 64   # four times the tiny window


def _attentions(gpt):
    found = [m for m in gpt.modules() if isinstance(m, FlexSinkAttention)]
    assert len(found) == TINY_GPT_OSS.num_layers
    return found


def _close(result):
    return (result["max_abs_err"] < 1e-4 * max(result["logit_scale"], 1.0)
            and result["loss_rel_err"] < 1e-5)


@pytest.mark.parametrize("impl", ["flex", "reference"])
def test_tiny_gpt_oss_matches_hf_fp32(impl):
    def prepare(gpt):
        attentions = _attentions(gpt)
        assert [a.window for a in attentions] == [16, None]
        for a in attentions:
            a.impl = impl

    result, gpt, hf_model = gpt_oss_parity(TINY_GPT_OSS, 2, seq=SEQ, prepare=prepare)
    report(f"tiny-gpt-oss/{impl}", result)
    assert _close(result), result


def test_dropping_the_window_or_the_sinks_breaks_parity():
    result, gpt, hf_model = gpt_oss_parity(TINY_GPT_OSS, 2, seq=SEQ)
    assert _close(result)
    attentions = _attentions(gpt)
    attentions[0].window = None                                    # the window dropped
    assert not _close(compare_logits(hf_model, gpt, TINY_GPT_OSS.vocab_size, 2, SEQ, "cpu"))
    attentions[0].window = 16
    sinks = [a.softmax_offset for a in attentions]
    for a in attentions:                                           # the sinks dropped
        a.softmax_offset = None
    assert not _close(compare_logits(hf_model, gpt, TINY_GPT_OSS.vocab_size, 2, SEQ, "cpu"))
    for a, s in zip(attentions, sinks):
        a.softmax_offset = s
    assert _close(compare_logits(hf_model, gpt, TINY_GPT_OSS.vocab_size, 2, SEQ, "cpu"))


def test_layer_errors_find_the_first_module_that_parts():
    """The diagnosis behind te_moe_blocker (dev/gpu/gpt_oss_te_diag.py): each layer's attention,
    MLP norm, routing probabilities and MLP output against HF's. In fp32 all match; with layer
    1's sinks dropped, layer 0 still matches and layer 1 parts at its attention."""
    _, gpt, hf_model = gpt_oss_parity(TINY_GPT_OSS, 2, seq=SEQ)
    rows = layer_errors(gpt, hf_model, TINY_GPT_OSS.vocab_size, SEQ, "cpu")
    assert [(r["layer"], r["part"]) for r in rows] == [
        (i, p) for i in (0, 1) for p in ("attn", "norm", "router", "mlp")]
    assert all(r["max_abs_err"] < 1e-4 and r["mean_abs"] > 0 for r in rows), rows
    _attentions(gpt)[1].softmax_offset = None
    parted = {(r["layer"], r["part"]) for r in layer_errors(
        gpt, hf_model, TINY_GPT_OSS.vocab_size, SEQ, "cpu") if r["max_abs_err"] > 1e-3}
    assert parted == {(1, "attn"), (1, "norm"), (1, "router"), (1, "mlp")}, parted


def test_tiny_gpt_oss_matches_hf_bf16():
    """bf16 weights on the CPU: within the parity tests' yardstick (3x HF's own bf16 rounding
    error, measured in the same call on the same tokens)."""
    result, _, _ = gpt_oss_parity(TINY_GPT_OSS, 2, dtype=torch.bfloat16, seq=SEQ)
    report("tiny-gpt-oss/bf16", result)
    check_bf16_parity(result)


def test_every_parameter_learns_in_one_training_step():
    """One forward and backward of our tiny gpt-oss in training mode (the CPU's reference
    attention, the grouped experts with their biases): every parameter gets a gradient, the
    sinks and every bias a nonzero one."""
    from tests.moe.gpt_oss_model import build_gpt_oss
    from tests.moe.model import cpu_dispatcher_streams

    gpt, _ = build_gpt_oss(TINY_GPT_OSS, 2, seq=SEQ)
    gpt.train()
    tokens = torch.randint(0, TINY_GPT_OSS.vocab_size, (2, SEQ),
                           generator=torch.Generator().manual_seed(0))
    positions = torch.arange(SEQ).unsqueeze(0).expand(2, SEQ)
    with cpu_dispatcher_streams():
        loss = gpt(tokens, positions, None, labels=tokens).mean()
    loss.backward()
    grads = {name: p.grad for name, p in gpt.named_parameters()}
    assert all(g is not None for g in grads.values()), [n for n, g in grads.items() if g is None]
    learned = [n for n in grads if n.endswith(("softmax_offset", "bias"))]
    # per layer: the sinks and the biases of linear_qkv, linear_proj, the router, fc1, fc2
    assert len(learned) == 6 * TINY_GPT_OSS.num_layers
    for name in learned:
        assert grads[name].abs().max() > 0, name
