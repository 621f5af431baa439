"""The tiny MoE preset trains on the CPU through Megatron's pieces: GPTModel with MoE layers
(router with its aux loss, all-to-all dispatcher, the native grouped experts and permute),
torch's AdamW, Megatron's MoE metrics tracker, and the router statistics that go to
metrics.jsonl. The loss falls and the statistics stay within their bounds. (Balance on real
text, through the launcher on Shakespeare: tests/gpu/test_moe_gpu.py; 12 steps of this
synthetic stream move the routing too erratically to show the aux loss's effect.)"""
from __future__ import annotations

import pytest
import torch

from training.moe.presets import TINY_MOE
from training.router_stats import RouterStats

from tests.moe.model import build_moe_gpt, cpu_dispatcher_streams

SEQ, BATCH, STEPS, WORDS = 64, 4, 12, 256


def _batches(seed: int = 0):
    """A learnable stream: each token determines the next (a fixed random permutation of the
    first WORDS tokens), each sequence from a random start."""
    gen = torch.Generator().manual_seed(seed)
    nxt = torch.randperm(WORDS, generator=gen)
    while True:
        tokens = torch.empty(BATCH, SEQ + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, WORDS, (BATCH,), generator=gen)
        for i in range(SEQ):
            tokens[:, i + 1] = nxt[tokens[:, i]]
        yield tokens[:, :-1], tokens[:, 1:]


def _train(aux_loss_coeff: float):
    from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker

    from argparse import Namespace

    from training import megatron_patches
    from training.run import Run

    gpt, _ = build_moe_gpt(TINY_MOE, TINY_MOE.num_layers, "native", "torch", "cpu", seq=SEQ,
                           extra=("--no-bias-swiglu-fusion", "--moe-aux-loss-coeff",
                                  str(aux_loss_coeff)))
    stats = RouterStats()
    assert stats.attach(gpt) == TINY_MOE.num_layers
    # Megatron's aux losses reach the stats through the patch table's entry, as in a run
    run = Run(args=Namespace(num_experts=TINY_MOE.num_experts),
              loop=Namespace(router=stats))
    assert megatron_patches.apply(run, names=("moe_router_losses",)) == ["moe_router_losses"]
    gpt.train()
    # Megatron's tracker is process-global: what an earlier test recorded and did not report
    # would be averaged in (the suite's order, and its parallel workers, decide what ran before)
    get_moe_metrics_tracker().clear()
    optimizer = torch.optim.AdamW(gpt.parameters(), lr=3e-3)
    positions = torch.arange(SEQ).unsqueeze(0).expand(BATCH, SEQ)
    losses, records = [], []
    data = _batches()
    for step in range(1, STEPS + 1):
        tokens, labels = next(data)
        with cpu_dispatcher_streams():
            loss = gpt(tokens, positions, None, labels=labels).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        get_moe_metrics_tracker().report(loss_scale=1.0, iteration=step,
                                         num_layers=TINY_MOE.num_layers, moe_layer_freq=1,
                                         track_names=["load_balancing_loss"])
        losses.append(loss.item())
        records.append(stats.summary())
    # summary() starts the next iteration afresh, in the same buffers (zeroed in place)
    assert len(stats.counts) == TINY_MOE.num_layers
    assert not any(counts.any() for counts in stats.counts.values())
    megatron_patches.restore(names=("moe_router_losses",))
    return losses, records


@pytest.mark.slow
def test_tiny_moe_trains_with_falling_loss_and_router_statistics():
    losses, records = _train(TINY_MOE.aux_loss_coeff)
    print(f"\nloss {losses[0]:.3f} -> {losses[-1]:.3f}; load imbalance "
          f"{[round(r['moe_load_imbalance'], 2) for r in records]}")
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 1.0
    bound = TINY_MOE.num_experts / TINY_MOE.router_topk     # every token on the same experts
    for record in records:
        assert set(record) == {"moe_load_balancing_loss", "moe_load_imbalance",
                               "moe_load_imbalance_mean"}
        assert 1.0 <= record["moe_load_imbalance_mean"] <= record["moe_load_imbalance"] <= bound
        assert 0.9 < record["moe_load_balancing_loss"] < 2.0   # 1.0: a uniform router
    # with the coefficient at 0 Megatron still reports the loss's entry, as 0
    _, without = _train(0.0)
    assert without[-1]["moe_load_balancing_loss"] == 0.0


def test_evaluation_forwards_are_not_counted():
    gpt, _ = build_moe_gpt(TINY_MOE, 1, "native", "torch", "cpu", seq=SEQ,
                           extra=("--no-bias-swiglu-fusion",))
    stats = RouterStats()
    stats.attach(gpt)
    tokens, _ = next(_batches())
    positions = torch.arange(SEQ).unsqueeze(0).expand(BATCH, SEQ)
    with cpu_dispatcher_streams(), torch.no_grad():
        gpt.train()
        gpt(tokens, positions, None)
        gpt.eval()
        gpt(tokens, positions, None)
    assert stats.counts == {}
    with cpu_dispatcher_streams():
        gpt.train()
        gpt(tokens, positions, None)
    assert list(stats.counts) == [1]
    assert stats.counts[1].sum().item() == BATCH * SEQ * TINY_MOE.router_topk
    # the buffer outlives the summary and is added to in place: the add a full-iteration CUDA
    # graph captured at its capture writes the counts of every replay into it
    buffer = stats.counts[1]
    first = stats.summary()
    assert stats.counts[1] is buffer and not buffer.any()
    with cpu_dispatcher_streams():
        gpt(tokens, positions, None)
    assert stats.counts[1] is buffer and buffer.sum().item() == BATCH * SEQ * TINY_MOE.router_topk
    assert stats.summary()["moe_load_imbalance"] == first["moe_load_imbalance"]
