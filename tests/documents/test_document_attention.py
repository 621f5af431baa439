"""training/native/document_attention.py: block-causal attention over packed documents.

Each implementation against a dense reference written here from first principles (a query sees
the keys of its own document at or before it; the window; the sink column), in fp64 with the
gradients of q, k, v and the sinks; flex (forward: torch 2.11's flex has no CPU backward)
against the loop. Dropping the documents, or moving one boundary by a token, changes the
result: the tests can see the mask."""
from __future__ import annotations

import math

import pytest
import torch

from training.documents import cu_seqlens_of, packed_seq_params
from training.native import document_attention as da

HEADS, GROUPS, DIM = 4, 2, 8
EOD = 0
LENGTHS = (5, 9, 1, 7, 10)   # one packed row of 32 tokens: five documents (one a lone token)


def row(lengths=LENGTHS):
    """[1, t] tokens whose EODs end the given documents (the last ends with the row)."""
    gen = torch.Generator().manual_seed(3)
    parts = []
    for n in lengths:
        doc = torch.randint(1, 50, (n,), generator=gen)
        doc[-1] = EOD
        parts.append(doc)
    return torch.cat(parts).unsqueeze(0)


def qkv(t, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(t, HEADS, DIM, generator=gen, dtype=dtype)
    k = torch.randn(t, GROUPS, DIM, generator=gen, dtype=dtype)
    v = torch.randn(t, GROUPS, DIM, generator=gen, dtype=dtype)
    sinks = torch.randn(HEADS, generator=gen, dtype=dtype)
    return q, k, v, sinks


def dense_reference(q, k, v, lengths, scale, window=None, sinks=None):
    """Scores over the whole row, -inf outside (same document, causal, window), softmax with an
    optional sink column: the definition, with a mask built by a Python loop over documents."""
    t = q.shape[0]
    doc = []
    for i, n in enumerate(lengths):
        doc += [i] * n
    allowed = torch.zeros(t, t, dtype=torch.bool)
    for i in range(t):
        for j in range(i + 1):
            allowed[i, j] = doc[i] == doc[j] and (window is None or i - j < window)
    rep = HEADS // GROUPS
    kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = torch.einsum("qhd,khd->hqk", q, kk) * scale
    scores = scores.masked_fill(~allowed, -math.inf)
    if sinks is not None:
        col = sinks.view(HEADS, 1, 1).expand(HEADS, t, 1)
        probs = torch.softmax(torch.cat([scores, col], -1), -1)[..., :-1]
    else:
        probs = torch.softmax(scores, -1)
    return torch.einsum("hqk,khd->qhd", probs, vv)


def test_cu_seqlens_end_after_each_eod_and_at_each_sample_end():
    tokens = torch.tensor([[5, 0, 7, 8, 0, 9], [0, 3, 4, 5, 6, 0]])
    cu, longest = cu_seqlens_of(tokens, eod=0)
    assert cu.dtype == torch.int32
    assert cu.tolist() == [0, 2, 5, 6, 7, 12]     # sample 0 ends mid-document at 6
    assert longest == 5


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_loop_is_the_definition_forward_and_backward(window, with_sinks):
    tokens = row()
    params = packed_seq_params(tokens, EOD)
    q, k, v, sinks = (x.requires_grad_() for x in qkv(tokens.shape[1]))
    sinks_in = sinks if with_sinks else None
    grad = torch.randn(tokens.shape[1], HEADS, DIM, dtype=torch.float64)
    ref = dense_reference(q, k, v, LENGTHS, 0.3, window, sinks_in)
    ours = da.document_attention(q, k, v, params, scale=0.3, window=window, sinks=sinks_in,
                                 impl="loop")
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)
    inputs = (q, k, v, sinks) if with_sinks else (q, k, v)
    for a, b in zip(torch.autograd.grad(ours, inputs, grad),
                    torch.autograd.grad(ref, inputs, grad)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_flex_is_the_loop_forward(window, with_sinks):
    tokens = row()
    params = packed_seq_params(tokens, EOD)
    q, k, v, sinks = qkv(tokens.shape[1], 1, torch.float32)
    sinks = sinks if with_sinks else None
    with torch.no_grad():
        loop = da.document_attention(q, k, v, params, scale=0.3, window=window, sinks=sinks,
                                     impl="loop")
        flex = da.document_attention(q, k, v, params, scale=0.3, window=window, sinks=sinks,
                                     impl="flex")
    torch.testing.assert_close(flex, loop, rtol=1e-5, atol=1e-6)


def test_the_block_mask_is_built_once_per_micro_batch_and_window():
    tokens = row()
    params = packed_seq_params(tokens, EOD)
    q, k, v, _ = qkv(tokens.shape[1], 1, torch.float32)
    with torch.no_grad():
        da.document_attention(q, k, v, params, impl="flex")
        first = params._block_masks[None]
        da.document_attention(q, k, v, params, impl="flex")
        da.document_attention(q, k, v, params, window=3, impl="flex")
    assert params._block_masks[None] is first and set(params._block_masks) == {None, 3}
    # the next micro-batch: other documents, the same mask function (compiled flex and
    # create_block_mask compile once, not once per batch), and its own result
    other = packed_seq_params(row((16, 16)), EOD)
    with torch.no_grad():
        out = da.document_attention(q, k, v, other, impl="flex")
        loop = da.document_attention(q, k, v, other, impl="loop")
    assert other._block_masks[None].mask_mod is first.mask_mod
    torch.testing.assert_close(out, loop, rtol=1e-5, atol=1e-6)
    # the first micro-batch again (a recomputed forward): its own documents, not the last ones
    with torch.no_grad():
        again = da.document_attention(q, k, v, params, impl="flex")
        loop = da.document_attention(q, k, v, params, impl="loop")
    torch.testing.assert_close(again, loop, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl", ["loop", "flex"])
def test_a_boundary_moved_by_one_token_or_dropped_changes_the_result(impl):
    """The mutations the parity tests must catch, seen at the module: the EOD one token later
    (a document keeps its neighbour's first token), and no documents (plain causal)."""
    tokens = row()
    t = tokens.shape[1]
    q, k, v, _ = qkv(t, 2, torch.float32)
    shifted = tokens.clone()
    first_end = LENGTHS[0] - 1
    shifted[0, first_end], shifted[0, first_end + 1] = 7, EOD
    whole = torch.tensor([[1] * t])        # no EOD: one document, plain causal
    with torch.no_grad():
        outs = [da.document_attention(q, k, v, packed_seq_params(x, EOD), impl=impl)
                for x in (tokens, shifted, whole)]
    for other in outs[1:]:
        assert not torch.allclose(outs[0], other, atol=1e-3)
    # the rows before the first boundary do not depend on it
    torch.testing.assert_close(outs[0][:first_end], outs[1][:first_end])


def test_varlen_refuses_sinks_and_unknown_impls():
    with pytest.raises(ValueError, match="no sinks"):
        da.resolve_impl("varlen", torch.device("cpu"), sinks=True)
    with pytest.raises(ValueError, match="unknown"):
        da.resolve_impl("dense", torch.device("cpu"), sinks=False)
    assert da.resolve_impl("auto", torch.device("cpu"), False) == "loop"
