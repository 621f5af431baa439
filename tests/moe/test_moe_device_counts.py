"""MOE_DEVICE_COUNTS: the tokens per expert left on the device at EP = TP = 1.

The dispatcher's host copy and synchronisation are skipped (patch native_moe_device_counts),
TEGroupedMLP hands the counts object to the native grouped linears, which take grouped_mm's
offsets from it on the device. On the CPU "the device" is the CPU, so what is tested is that
the host path is never taken (no copy, no iteration of the counts) and that the model computes
exactly what it computes with host counts, forward and backward."""
from __future__ import annotations

from argparse import Namespace
from unittest import mock

import pytest
import torch
from megatron.core.transformer.moe import token_dispatcher

from training.native.grouped_experts import DeviceCounts, GroupedLinear, grouped_matmul

PATCH = "native_moe_device_counts"


def test_grouped_matmul_takes_device_counts_as_it_takes_a_list():
    gen = torch.Generator().manual_seed(0)
    counts = [3, 0, 5, 2]
    weight = torch.randn(4, 8, 16, generator=gen, requires_grad=True)   # 16-byte strides
    x = torch.randn(sum(counts), 16, generator=gen, requires_grad=True)
    grad = torch.randn(sum(counts), 8, generator=gen)
    results = []
    for given in (counts, DeviceCounts(torch.tensor(counts))):
        out = grouped_matmul(x, weight, given, impl="grouped_mm")
        results.append((out, *torch.autograd.grad(out, (x, weight), grad)))
    for name, ref, got in zip(("out", "dx", "dweight"), *results):
        torch.testing.assert_close(got, ref, rtol=0, atol=0, msg=name)
    # the loop (no fast grouped_mm here) reads them on the host instead
    loop = grouped_matmul(x, weight, DeviceCounts(torch.tensor(counts)), impl="loop")
    torch.testing.assert_close(loop, results[0][0])


def test_device_counts_refuse_to_be_read_on_the_host():
    counts = DeviceCounts(torch.tensor([1, 2]))
    assert counts.tolist() is counts and len(counts) == 2
    with pytest.raises(TypeError, match="synchronise"):
        list(counts)
    assert counts.ends() is counts.ends()          # one cumulative sum for fc1 and fc2
    assert counts.ends().tolist() == [1, 3] and counts.ends().dtype == torch.int32


@pytest.fixture
def restore():
    from training import megatron_patches

    original = token_dispatcher.MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize
    yield
    megatron_patches.restore(groups=("native",))   # what building the native model put in
    from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker

    get_moe_metrics_tracker().clear()   # the aux losses these forwards recorded
    assert (token_dispatcher.MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize
            is original)


def _install(on: bool) -> list[str]:
    from training import megatron_patches
    from training.run import Run

    run = Run(args=Namespace(transformer_backend="native", num_experts=8,
                             moe_device_counts=on))
    return megatron_patches.apply(run, names=(PATCH,))


def _step(gpt, tokens):
    from tests.moe.model import cpu_dispatcher_streams

    gpt.zero_grad(set_to_none=True)
    with cpu_dispatcher_streams():
        out = gpt(tokens, torch.arange(tokens.shape[1]).unsqueeze(0), None, labels=tokens)
    out.float().sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in gpt.named_parameters()
                          if p.grad is not None}


def test_tiny_moe_with_device_counts_computes_what_it_computes_with_host_counts(restore):
    from training.moe.presets import TINY_MOE

    from tests.moe.model import build_moe_gpt

    gpt, _ = build_moe_gpt(TINY_MOE, 2, "native", "torch", "cpu", seq=32,
                           extra=("--no-bias-swiglu-fusion", "--native-moe-permute"))
    linears = [m for m in gpt.modules() if isinstance(m, GroupedLinear)]
    assert len(linears) == 4
    for linear in linears:       # grouped_mm, as on an H200 (the CPU's default is the loop)
        linear.impl = "grouped_mm"
    gpt.train()
    tokens = torch.randint(0, TINY_MOE.vocab_size, (1, 32), generator=torch.Generator()
                           .manual_seed(1))
    assert _install(False) == []
    host_out, host_grads = _step(gpt, tokens)

    assert _install(True) == [PATCH]
    seen = []
    forward = GroupedLinear.forward

    def spy(self, x, tokens_per_expert):
        seen.append(type(tokens_per_expert))
        return forward(self, x, tokens_per_expert)

    with mock.patch.object(GroupedLinear, "forward", spy), \
            mock.patch.object(token_dispatcher, "maybe_move_tensor_to_cpu",
                              side_effect=AssertionError("copied to the host")):
        out, grads = _step(gpt, tokens)
    assert seen == [DeviceCounts] * 4
    torch.testing.assert_close(out, host_out, rtol=0, atol=0)
    assert grads.keys() == host_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], host_grads[name], rtol=0, atol=0, msg=name)


def test_other_layouts_keep_megatrons_synchronisation(restore):
    assert _install(True) == [PATCH]
    dispatcher = Namespace(ep_size=2, tp_size=1, drop_and_pad=False)
    original = mock.Mock(return_value="megatron")
    from training.native.moe_permute import device_counts_replacement

    replacement = device_counts_replacement(original, None)
    assert replacement(dispatcher, "before_finish", torch.tensor([1])) == "megatron"
    dispatcher.ep_size, dispatcher.drop_and_pad = 1, True
    assert replacement(dispatcher, "before_finish", torch.tensor([1])) == "megatron"
    dispatcher.drop_and_pad = False
    counts = replacement(dispatcher, "before_permutation_1", torch.tensor([1, 2]))
    assert isinstance(counts, DeviceCounts)
    assert replacement(dispatcher, "before_finish", counts) is counts
    assert replacement(dispatcher, "before_permutation_2") is None
    assert original.call_count == 2


def test_sort_by_local_expert_at_one_rank_needs_no_host_sizes():
    from megatron.core.transformer.moe import moe_utils

    from training.native import moe_permute

    tokens = torch.randn(6, 4)
    sizes = mock.Mock(is_cuda=True)          # on the GPU: must not be read
    out, probs = moe_permute.sort_chunks(tokens, sizes, torch.arange(4), probs=None,
                                         original=moe_utils.sort_chunks_by_idxs)
    assert out is tokens and probs is None
