"""training/native/grouped_experts.py: TEGroupedMLP on torch's grouped GEMM (no TE) against
Megatron's SequentialMLP, the loop over experts it replaces. CPU, float32: both the loop
fallback and torch's grouped_mm (its CPU kernel) must give SequentialMLP's outputs and
gradients. The CUDA kernel in bf16: tests/gpu/test_grouped_experts_gpu.py."""
from __future__ import annotations

import pytest
import torch

from training.native import grouped_experts
from training.native.grouped_experts import grouped_matmul

from tests.moe.experts import expert_config, expert_pair, run_both

# odd counts, an expert without tokens, the last one heavy
COUNTS = [3, 0, 7, 5, 1, 9]


@pytest.mark.parametrize("impl", ["loop", "grouped_mm"])
@pytest.mark.parametrize("fusion", [True, False])
def test_grouped_experts_match_sequential_mlp_forward_and_backward(impl, fusion):
    sequential, grouped = expert_pair(expert_config(len(COUNTS), 16, 8, fusion=fusion),
                                      impl=impl)
    assert grouped.linear_fc1.impl == grouped.linear_fc2.impl == impl
    ref, ours = run_both(sequential, grouped, COUNTS)
    for name in ("out", "dx", "dprobs", "dfc1", "dfc2"):
        torch.testing.assert_close(ours[name], ref[name], rtol=1e-5, atol=1e-6, msg=name)
    # the expert without tokens gets a zero gradient, not None (DDP's overlapped reduce
    # asserts every parameter has a gradient)
    assert ours["dfc1"][1].abs().max() == 0 and ours["dfc2"][1].abs().max() == 0


def test_grouped_mm_and_the_loop_agree_on_every_expert_count():
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(5, 12, 8, generator=gen)
    for counts in ([0, 0, 0, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 4], [2, 3, 0, 1, 7]):
        x = torch.randn(sum(counts), 8, generator=gen)
        loop = grouped_matmul(x, weight, counts, "loop")
        grouped = grouped_matmul(x, weight, counts, "grouped_mm")
        assert loop.shape == grouped.shape == (sum(counts), 12)
        torch.testing.assert_close(grouped, loop, rtol=1e-5, atol=1e-6)
        begin = 0
        for expert, n in enumerate(counts):
            torch.testing.assert_close(loop[begin:begin + n], x[begin:begin + n] @ weight[expert].T)
            begin += n


def test_token_counts_must_match_the_experts_and_the_rows():
    weight = torch.zeros(3, 4, 4)
    with pytest.raises(ValueError, match="3 experts"):
        grouped_matmul(torch.zeros(2, 4), weight, [1, 1])
    with pytest.raises(ValueError, match="add up to 3"):
        grouped_matmul(torch.zeros(2, 4), weight, [1, 1, 1])


def test_auto_uses_the_loop_off_the_gpu():
    assert not grouped_experts.has_fast_grouped_mm(torch.device("cpu"), torch.bfloat16)
    assert grouped_experts.grouped_mm_available()  # torch 2.11: F.grouped_mm


def test_parameters_are_one_tensor_per_projection_marked_as_experts():
    _, grouped = expert_pair(expert_config(4, 16, 8))
    fc1, fc2 = grouped.linear_fc1.weight, grouped.linear_fc2.weight
    assert fc1.shape == (4, 16, 16) and fc2.shape == (4, 16, 8)   # [experts, out, in]
    assert [name for name, _ in grouped.named_parameters()] == ["linear_fc1.weight",
                                                                 "linear_fc2.weight"]
    # EP=1 and ETP=TP: reduced with the dense parameters, as TE's grouped linear is
    assert fc1.allreduce and fc2.allreduce
    assert (fc1.partition_dim, fc2.partition_dim) == (1, 2)


def _dense(sharded: dict) -> dict:
    """Each checkpoint key's global tensor, assembled from the shards as dist-checkpointing
    would write them."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    shards = []
    for value in sharded.values():
        if isinstance(value, ShardedTensorFactory):
            built = value.build()
            shards += built if isinstance(built, list) else [built]
        elif isinstance(value, ShardedTensor):
            shards.append(value)
    tensors = {}
    for shard in shards:
        full = tensors.setdefault(shard.key, torch.full(shard.global_shape, float("nan")))
        local = (1,) * shard.prepend_axis_num + tuple(shard.local_shape)
        region = tuple(slice(o, o + n) for o, n in zip(shard.global_offset, local))
        full[region] = shard.data.reshape(local)
    return tensors


def test_checkpoint_holds_the_tensors_sequential_mlp_saves():
    """Same keys, global shapes and values at the same coordinates as SequentialMLP's
    checkpoint (the gated fc1 split into its gate and up halves as Megatron's factory does):
    checkpoints move between the sequential and the grouped experts."""
    sequential, grouped = expert_pair(expert_config(4, 16, 8))
    prefix = "decoder.layers.0.mlp.experts."
    ref = _dense(sequential.sharded_state_dict(prefix=prefix))
    ours = _dense(grouped.sharded_state_dict(prefix=prefix))
    weights = {k: v for k, v in ref.items() if k.endswith("weight")}
    assert set(ours) == set(weights) == {f"{prefix}experts.linear_fc1.weight",
                                         f"{prefix}experts.linear_fc2.weight"}
    for key, tensor in weights.items():
        assert not tensor.isnan().any() and not ours[key].isnan().any(), key
        torch.testing.assert_close(ours[key], tensor, rtol=0, atol=0)
