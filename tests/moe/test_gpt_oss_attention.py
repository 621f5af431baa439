"""training/native/flex_attention.py: attention with sinks and a sliding window.

The plain reference (scores, the sink column, softmax) against Hugging Face's own eager gpt-oss
attention; flex attention with the sink correction against the reference (forward on the CPU:
torch 2.11's flex has no CPU backward); the correction's gradient through a log-sum-exp
checked with a differentiable stand-in for flex's (out, lse); the window and the sinks each
shown to change the result; Megatron's per-layer window rule. The GPU (flex's compiled kernel,
forward and backward, bf16): tests/gpu/test_gpt_oss_gpu.py."""
from __future__ import annotations

import math

import pytest
import torch

from training.native import flex_attention as fa

B, HEADS, GROUPS, SEQ, DIM = 2, 4, 2, 37, 16


def tensors(seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, HEADS, SEQ, DIM, generator=gen, dtype=dtype)
    k = torch.randn(B, GROUPS, SEQ, DIM, generator=gen, dtype=dtype)
    v = torch.randn(B, GROUPS, SEQ, DIM, generator=gen, dtype=dtype)
    sinks = torch.randn(HEADS, generator=gen, dtype=dtype) * 2
    return q, k, v, sinks


@pytest.mark.parametrize("window", [None, 8])
def test_reference_is_hugging_faces_eager_gpt_oss_attention(window):
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    q, k, v, sinks = tensors()
    module = torch.nn.Module()
    module.num_key_value_groups, module.sinks, module.training = HEADS // GROUPS, sinks, False
    allowed = fa.banded_causal_mask(SEQ, window, "cpu")
    mask = torch.zeros(SEQ, SEQ).masked_fill(~allowed, float("-inf"))[None, None]
    theirs, _ = eager_attention_forward(module, q, k, v, mask, scaling=DIM ** -0.5)
    ours = fa.sink_attention_reference(q, k, v, sinks, window, DIM ** -0.5)
    torch.testing.assert_close(ours.transpose(1, 2), theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("window", [None, 1, 8, 64])
@pytest.mark.parametrize("with_sinks", [True, False])
def test_flex_with_the_sink_correction_is_the_reference_forward(window, with_sinks):
    q, k, v, sinks = tensors(1)
    sinks = sinks if with_sinks else None
    ref = fa.sink_attention_reference(q, k, v, sinks, window, 0.3)
    with torch.no_grad():
        ours = fa.sink_attention(q, k, v, sinks, window, 0.3)   # auto: flex, no gradient
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)


def _softmax_with_lse(q, k, v, window, scale):
    """A differentiable stand-in for flex's (out, lse): the softmax over the keys alone."""
    heads, groups = q.shape[1], k.shape[1]
    k = k.repeat_interleave(heads // groups, 1)
    v = v.repeat_interleave(heads // groups, 1)
    scores = (q @ k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~fa.banded_causal_mask(q.shape[2], window, q.device), -math.inf)
    return torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1)


@pytest.mark.parametrize("window", [None, 8])
def test_the_sink_correction_is_exact_forward_and_backward(window):
    """out * sigmoid(lse - s) is the softmax with the sink column: values and the gradients of
    q, k, v and the sinks (through the log-sum-exp, as flex differentiates it on the GPU)."""
    q, k, v, sinks = (t.double().requires_grad_() for t in tensors(2))
    grad = torch.randn(B, HEADS, SEQ, DIM, dtype=torch.double)
    ref = fa.sink_attention_reference(q, k, v, sinks, window, 0.25)
    ref_grads = torch.autograd.grad(ref, (q, k, v, sinks), grad)
    out, lse = _softmax_with_lse(q, k, v, window, 0.25)
    ours = fa.apply_sinks(out, lse, sinks)
    assert ours.dtype == torch.double
    our_grads = torch.autograd.grad(ours, (q, k, v, sinks), grad)
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-8)
    for a, b, name in zip(our_grads, ref_grads, "qkvs"):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8, msg=name)
        assert b.abs().max() > 0, name


def test_reference_backward_runs_on_the_cpu_under_auto():
    q, k, v, sinks = (t.requires_grad_() for t in tensors(3))
    out = fa.sink_attention(q, k, v, sinks, 8, 0.25)            # gradient: the reference
    out.sum().backward()
    assert sinks.grad is not None and sinks.grad.abs().max() > 0


def test_the_window_and_the_sinks_each_change_the_output():
    q, k, v, sinks = tensors(4)
    full = fa.sink_attention_reference(q, k, v, sinks, None, 0.25)
    windowed = fa.sink_attention_reference(q, k, v, sinks, 8, 0.25)
    plain = fa.sink_attention_reference(q, k, v, None, 8, 0.25)
    assert not torch.allclose(full, windowed, atol=1e-3)
    assert not torch.allclose(plain, windowed, atol=1e-3)
    # inside the window nothing differs: the first 8 queries see the same keys
    torch.testing.assert_close(full[:, :, :8], windowed[:, :, :8])


def test_banded_mask_counts_the_query_itself_in_the_window():
    """Hugging Face's sliding_window W: key j visible from query i when i - W < j <= i (W keys);
    Megatron's window_size (W - 1, 0) is the same band."""
    mask = fa.banded_causal_mask(6, 3, "cpu")
    assert mask.sum(1).tolist() == [1, 2, 3, 3, 3, 3]
    assert mask[5].tolist() == [False, False, False, True, True, True]


def _config(**kw):
    from types import SimpleNamespace

    return SimpleNamespace(**{"window_size": (127, 0), "window_attn_skip_freq": 2,
                              "softmax_type": "learnable", **kw})


def test_layers_alternate_as_megatron_and_hugging_face_count_them():
    """Megatron's layer numbers start at 1: window_attn_skip_freq=2 bands layers 1, 3, ...,
    Hugging Face's layer_types band layers 0, 2, ... (the same layers)."""
    from transformers import GptOssConfig

    types = GptOssConfig(num_hidden_layers=6).layer_types
    ours = [fa.window_of(_config(), n) for n in range(1, 7)]
    assert ours == [128 if t == "sliding_attention" else None for t in types]
    assert fa.window_of(_config(window_size=None), 1) is None
    with pytest.raises(ValueError, match="causal windows only"):
        fa.window_of(_config(window_size=(127, 4)), 1)


def test_the_native_spec_picks_flex_only_for_sinks_or_a_window():
    assert fa.core_attention_for(_config()) is fa.FlexSinkAttention
    assert fa.core_attention_for(_config(window_size=None)) is fa.FlexSinkAttention
    plain = fa.core_attention_for(_config(window_size=None, softmax_type="vanilla"))
    assert plain.__name__ == "SDPAttention"
