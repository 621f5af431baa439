"""training/native/moe_permute.py: the dispatchers' permute/unpermute as gathers, against
Megatron's own (torch) permute/unpermute, forward and backward, dropless and with tokens
dropped; the all-to-all dispatcher's sort by local expert against Megatron's split-and-cat;
and the whole MoE model with them installed, against Hugging Face."""
from __future__ import annotations

import inspect

import pytest
import torch
from megatron.core.transformer.moe import moe_utils, token_dispatcher

from training.native import moe_permute

TOKENS, EXPERTS, TOPK, HIDDEN = 37, 6, 2, 16


PATCHES = ("native_moe_permute", "native_moe_unpermute", "native_moe_sort_chunks")


def _install(kernels="torch", topk=TOPK):
    """The patch table's entries for the native permute, as a native MoE run applies them."""
    from argparse import Namespace

    from training import megatron_patches
    from training.run import Run

    run = Run(args=Namespace(transformer_backend="native", native_kernels=kernels,
                             num_experts=EXPERTS, native_moe_permute=True,
                             moe_router_topk=topk))
    assert megatron_patches.apply(run, names=PATCHES) == list(PATCHES)


@pytest.fixture
def restore_dispatcher():
    from training import megatron_patches

    yield
    megatron_patches.restore(names=PATCHES)
    assert token_dispatcher.permute is moe_utils.permute
    assert token_dispatcher.sort_chunks_by_idxs is moe_utils.sort_chunks_by_idxs


def _routing(drop: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(TOKENS, EXPERTS, generator=gen)
    top = logits.topk(TOPK, dim=1).indices
    routing_map = torch.zeros(TOKENS, EXPERTS, dtype=torch.bool).scatter_(1, top, True)
    if drop:   # a capacity factor dropped some copies: tokens with 1 or 0 experts
        routing_map[::5, top[::5, 0]] = False
        routing_map[3] = False
    probs = torch.softmax(logits, dim=1) * routing_map
    return routing_map, probs


@pytest.mark.parametrize("drop", [False, True])
def test_permute_and_unpermute_match_megatrons(drop, restore_dispatcher):
    _install()
    routing_map, probs = _routing(drop)
    count = int(routing_map.sum())
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randn(TOKENS, HIDDEN, generator=gen)
    grads = torch.randn(count, HIDDEN, generator=gen), torch.randn(TOKENS, HIDDEN, generator=gen)
    results = []
    for permute, unpermute in ((moe_utils.permute, moe_utils.unpermute),
                               (token_dispatcher.permute, token_dispatcher.unpermute)):
        x = tokens.clone().requires_grad_()
        permuted, permuted_probs, sorted_indices, _, _ = permute(
            x, routing_map, probs=probs, num_out_tokens=count)
        (dx,) = torch.autograd.grad(permuted, x, grads[0])
        y = permuted.detach().clone().requires_grad_()
        out = unpermute(y, sorted_indices, restore_shape=tokens.shape, routing_map=routing_map)
        (dy,) = torch.autograd.grad(out, y, grads[1])
        results.append((permuted, permuted_probs, sorted_indices, dx, out, dy))
    for name, ref, ours in zip(("permuted", "probs", "indices", "dtokens", "unpermuted",
                                "dpermuted"), *results):
        torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6, msg=name)


def test_positions_name_each_copy_of_each_token():
    routing_map, _ = _routing(drop=True)
    positions = moe_permute.token_positions(routing_map, TOPK)
    flat = routing_map.t().reshape(-1).nonzero().squeeze(1)   # expert-major routed pairs
    assert positions.shape == (TOKENS, TOPK)
    for token in range(TOKENS):
        expected = sorted(int(p) for p in (flat % TOKENS == token).nonzero().squeeze(1))
        assert sorted(int(p) for p in positions[token] if p >= 0) == expected


def test_other_cases_go_to_megatrons_functions():
    calls = []

    def original(*a):
        calls.append(a)
        return "megatron"

    routing_map, probs = _routing(False)
    assert moe_permute.permute(torch.zeros(TOKENS, 4), routing_map, fused=True,
                               num_out_tokens=1, original=original) == "megatron"
    assert moe_permute.unpermute(torch.zeros(4, 4), torch.zeros(4, dtype=torch.long),
                                 (TOKENS, 4), probs=probs, routing_map=routing_map,
                                 original=original) == "megatron"
    assert len(calls) == 2


def test_same_signature_as_megatrons():
    for ours, theirs in ((moe_permute.permute, moe_utils.permute),
                         (moe_permute.unpermute, moe_utils.unpermute),
                         (moe_permute.sort_chunks, moe_utils.sort_chunks_by_idxs)):
        names = [p for p in inspect.signature(ours).parameters
                 if p not in ("original", "kernels", "topk")]
        assert names == list(inspect.signature(theirs).parameters)


def test_tiny_moe_with_the_native_permute_matches_hf(restore_dispatcher):
    from training.moe.presets import TINY_MOE

    from tests.moe.model import moe_parity

    def prepare(gpt):
        assert token_dispatcher.permute.__wrapped__ is moe_permute.permute
        assert token_dispatcher.unpermute.__wrapped__ is moe_permute.unpermute
        assert token_dispatcher.sort_chunks_by_idxs.__wrapped__ is moe_permute.sort_chunks

    result = moe_parity(TINY_MOE, 2, "native", "torch", "cpu", prepare=prepare,
                        extra=("--no-bias-swiglu-fusion", "--native-moe-permute"))
    assert result["max_abs_err"] < 1e-4 * max(result["logit_scale"], 1.0)


def _dispatcher_orders(ranks: int, local: int):
    """The two chunk orders of Megatron's all-to-all dispatcher (token_dispatcher.py:
    sort_input_by_local_experts, restore_output_by_local_experts) for `ranks` source ranks."""
    chunks = torch.arange(ranks * local)
    return chunks.reshape(ranks, local).T.ravel(), chunks.reshape(local, ranks).T.ravel()


@pytest.mark.parametrize("ranks", [2, 3])
def test_sort_by_local_expert_matches_megatrons_split_and_cat(ranks):
    local = 4
    gen = torch.Generator().manual_seed(ranks)
    sizes = torch.randint(0, 6, (ranks * local,), generator=gen)   # empty chunks included
    sizes[0] = 0
    rows = int(sizes.sum())
    sort, restore = _dispatcher_orders(ranks, local)
    tokens = torch.randn(rows, HIDDEN, generator=gen)
    probs = torch.rand(rows, generator=gen)
    grad = torch.randn(rows, HIDDEN, generator=gen)
    results = []
    for sort_chunks in (moe_utils.sort_chunks_by_idxs,
                        lambda *a, **kw: moe_permute.sort_chunks(
                            *a, original=moe_utils.sort_chunks_by_idxs, **kw)):
        x = tokens.clone().requires_grad_()
        out, out_probs = sort_chunks(x, sizes, sort, probs=probs)
        (dx,) = torch.autograd.grad(out, x, grad)
        # and back: the combine's order, over the sizes as the experts hold them
        back, _ = sort_chunks(out.detach(), sizes.reshape(ranks, local).T.ravel(), restore)
        results.append((out, out_probs, dx, back))
    for name, ref, ours in zip(("sorted", "probs", "dtokens", "restored"), *results):
        torch.testing.assert_close(ours, ref, rtol=0, atol=0, msg=name)
    torch.testing.assert_close(results[1][3], tokens, rtol=0, atol=0)


def test_sort_by_local_expert_from_one_rank_is_no_copy():
    sizes = torch.tensor([3, 0, 2, 5])
    sort, _ = _dispatcher_orders(1, 4)
    tokens, probs = torch.randn(10, HIDDEN), torch.rand(10)
    out, out_probs = moe_permute.sort_chunks(tokens, sizes, sort, probs=probs,
                                             original=moe_utils.sort_chunks_by_idxs)
    assert out is tokens and out_probs is probs


def test_sort_by_local_expert_leaves_the_fused_one_to_megatron():
    calls = []

    def original(*a, **kw):
        calls.append(kw)
        return "megatron"

    assert moe_permute.sort_chunks(torch.zeros(2, 2), torch.tensor([1, 1]),
                                   torch.tensor([1, 0]), fused=True,
                                   original=original) == "megatron"
    assert calls == [{"probs": None, "fused": True}]


def test_positions_are_computed_once_per_routing_map():
    routing_map, _ = _routing(drop=False)
    first = moe_permute.positions_of(routing_map, TOPK)
    assert moe_permute.positions_of(routing_map, TOPK) is first        # the unpermute's call
    torch.testing.assert_close(first, moe_permute.token_positions(routing_map, TOPK))
    other, _ = _routing(drop=False, seed=5)
    assert not torch.equal(moe_permute.positions_of(other, TOPK), first)   # another map
    other[0] = ~other[0]                                                  # changed in place
    torch.testing.assert_close(moe_permute.positions_of(other, TOPK),
                               moe_permute.token_positions(other, TOPK))
