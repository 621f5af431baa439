"""FLOPs per token of MoE models: active parameters (router, the top-k experts, shared experts),
against Megatron's own formula (which leaves the router out)."""
from __future__ import annotations

import dataclasses

import pytest

from training.metrics import flops_per_token
from training.moe.presets import MIXTRAL_8X7B, QWEN3_30B_A3B, TINY_MOE
from training.run_description import Model

from tests.moe.model import megatron_moe_args


@pytest.mark.parametrize("preset,seq", [(QWEN3_30B_A3B, 4096), (MIXTRAL_8X7B, 4096),
                                        (TINY_MOE, 256),
                                        (dataclasses.replace(TINY_MOE, name="shared",
                                                             shared_expert_ffn_hidden_size=384),
                                         256)])
def test_moe_flops_are_megatrons_plus_the_router(preset, seq):
    from megatron.training.training import num_floating_point_operations

    args = megatron_moe_args(preset, preset.num_layers, seq)
    args.padded_vocab_size = preset.vocab_size
    megatron = num_floating_point_operations(args, batch_size=2) / (2 * seq)
    ours = flops_per_token(Model.from_megatron_args(args))
    router = 3 * 2 * preset.hidden_size * preset.num_experts * preset.num_layers
    assert ours - router == pytest.approx(megatron, rel=1e-9)
    assert ours == flops_per_token(Model.of(preset, seq_length=seq))  # the launcher's model


def test_only_the_routed_experts_count():
    """Qwen3-30B-A3B routes each token to 8 of 128 experts: 16x as many experts change the
    FLOPs by the router only."""
    shape = Model.of(QWEN3_30B_A3B)
    wider = dataclasses.replace(shape, num_experts=shape.num_experts * 16)
    router = 3 * 2 * shape.hidden_size * shape.num_experts * 15 * shape.num_layers
    assert flops_per_token(wider) - flops_per_token(shape) == pytest.approx(router)
    more_routed = dataclasses.replace(shape, router_topk=16)
    experts = 3 * 6 * shape.hidden_size * shape.moe_ffn_hidden_size * 8 * shape.num_layers
    assert flops_per_token(more_routed) - flops_per_token(shape) == pytest.approx(experts)


def test_the_flops_command_knows_the_moe_presets(capsys):
    """`python -m training.moe flops`: the metrics command with the MoE presets registered."""
    import runpy
    import sys
    from unittest import mock

    argv = ["training.moe", "flops", "--model", "qwen3-30B-A3B", "--num-layers", "8", "--json"]
    with mock.patch.object(sys, "argv", argv), pytest.raises(SystemExit) as done:
        runpy.run_module("training.moe", run_name="__main__", alter_sys=True)
    assert done.value.code == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert out["flops_per_token"] == flops_per_token(Model.of(QWEN3_30B_A3B, num_layers=8))
