"""Every parallel layout on CPU ranks against the one-process run (tests/distributed/ranks.py).

A tiny Llama-shaped GPTModel on the launcher's default (native) backend with its torch
kernels, fp32, trained 3 steps by forked gloo ranks with megatron.core's own parallel state,
schedules, DDP and optimizer, from the same weights at every layout. Each layout's loss and
global gradient norm at every step must equal the one-process run's within RTOL: fp32 sums
taken in another order differ by up to ~6e-6 relative; a layout whose wiring is broken (a
shard in the wrong place, a gradient not reduced, a pipeline message crossed, an expert's
tokens sent to another) differs by far more (docs/scale.md: the mutations tried). Where
megatron-core cannot run a layout on CPU ranks the test pins where it stops.
"""
from __future__ import annotations

import pytest

from .ranks import Layout, RankError, run_layout

pytestmark = pytest.mark.slow

RTOL = 5e-5


@pytest.fixture(scope="module")
def dense_reference():
    return run_layout(Layout())


@pytest.fixture(scope="module")
def moe_reference():
    return run_layout(Layout(moe=True))


def assert_same(got, reference):
    """Loss, gradient norm and the norm weights' gradient norm of every step within RTOL of
    the one-process run's (the last not with the distributed optimizer: its grads are shards)."""
    assert len(got) == len(reference)
    for step, (mine, want) in enumerate(zip(got, reference), 1):
        for what, value, expected in zip(("loss", "grad norm", "norm weights' grad"), mine, want):
            if value is not None:
                assert value == pytest.approx(expected, rel=RTOL), (step, what, got, reference)


def test_the_reference_trains(dense_reference):
    """Three finite steps whose gradient norms change: the optimizer moves the weights (a frozen
    model would repeat its first norm's scale on every batch)."""
    assert len(dense_reference) == 3
    assert all(0 < loss < 10 and 0 < norm and 0 < norms for loss, norm, norms in dense_reference)
    assert len({round(norm, 6) for _, norm, _ in dense_reference}) == 3


@pytest.mark.parametrize("layout", [
    pytest.param(Layout(dp=2), id="dp2"),
    pytest.param(Layout(dp=2, dist_opt=True), id="dp2-distributed-optimizer"),
    pytest.param(Layout(tp=2, sp=True), id="tp2-sequence-parallel"),
    pytest.param(Layout(pp=2), id="pp2"),
    pytest.param(Layout(pp=2, vpp=2), id="pp2-interleaved-vpp2"),
])
def test_dense_layout_matches_one_process(layout, dense_reference):
    assert_same(run_layout(layout), dense_reference)


@pytest.mark.parametrize("dispatcher", ["alltoall", "allgather"])
def test_expert_parallel_matches_one_process(dispatcher, moe_reference):
    """4 experts, top-2, EP=2 over the 2 data-parallel ranks, each token dispatcher."""
    assert_same(run_layout(Layout(moe=True, ep=2, dp=2, dispatcher=dispatcher)), moe_reference)


def test_context_parallel_stops_at_attention_on_cpu_ranks():
    """CP=2 needs Transformer Engine's attention (its ring exchange of K/V); the native SDPA
    attention, like megatron's local DotProductAttention ('Context parallelism is only supported
    by TEDotProductAttention!'), refuses it when the layer is built: pinned here so the day it
    runs, this test says so."""
    with pytest.raises(RankError, match="does not implement context parallelism"):
        run_layout(Layout(cp=2, steps=1))


def test_resume_across_layouts(tmp_path, dense_reference):
    """Two steps at TP=2 with sequence parallel, saved with megatron's dist_checkpointing; the
    third step at PP=2 interleaved, loaded from it: its loss and gradient norms are the
    one-process run's third step. The model's weights are resharded by megatron's loader; the
    optimizer state is not carried (the compared figures come before the third update)."""
    run_layout(Layout(tp=2, sp=True, steps=2, save_to=str(tmp_path / "tp2")))
    resumed = run_layout(Layout(pp=2, vpp=2, steps=1, first_step=2,
                                load_from=str(tmp_path / "tp2")))
    assert_same(resumed, dense_reference[2:])
