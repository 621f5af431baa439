"""Transformer Engine's modules keep fp8 metadata as `_extra_state`, which Megatron's
sharded_state_dict asks a checkpoint for (issue 26 with issue 19). On the CPU, a GPTModel whose
norms carry TE's extra-state hooks (helpers.give_extra_state) stands in for TE's spec: the
import holds what its final norm asks for, so Megatron's default (strict) load takes it, and
load_weights leaves an absent `_extra_state` but refuses an absent weight."""
from __future__ import annotations

import pytest
import torch

from training.checkpoint import megatron
from training.launch.presets import PRESETS

from .helpers import give_extra_state, safetensors_tensors


def _model():
    from tests.model.parity import gpt_model, init_single_rank

    init_single_rank("cpu")
    return gpt_model(PRESETS["tiny"], 2, "native", "torch", torch.bfloat16)


def test_megatrons_strict_load_finds_the_te_final_norms_extra_state(tiny_hf, tiny_ckpt):
    """What megatron.training's load does with --dist-ckpt-strictness' default
    (assume_ok_unexpected): a key the model asks for and the import lacks raised inside
    torch DCP ("Missing key in checkpoint state_dict: decoder.final_layernorm._extra_state
    /shard_0_1", TE 2.20 on an H200)."""
    from megatron.core import dist_checkpointing

    model = _model()
    norm = give_extra_state(model.decoder.final_layernorm)
    folder = megatron.iteration_dir(tiny_ckpt)
    sharded = {"model": model.sharded_state_dict(metadata=dict(megatron.CONTENT_METADATA))}
    model.load_state_dict(dist_checkpointing.load(sharded, str(folder))["model"])  # strict
    assert norm.extra_states_set == [None]          # TE's set_extra_state skips None
    assert torch.equal(norm.weight, safetensors_tensors(tiny_hf)["model.norm.weight"])


def test_load_weights_leaves_an_absent_extra_state_and_names_it(tiny_hf, tiny_ckpt):
    """Norms with extra state the import does not write (the layers' own input norms: the TE
    spec fuses them into linear_qkv, so no import has their fp8 metadata): their weights load,
    their `_extra_state` stays as built and is returned."""
    model = _model()
    norms = [give_extra_state(layer.input_layernorm) for layer in model.decoder.layers]
    dropped = megatron.load_weights(model, tiny_ckpt)
    assert dropped == [f"decoder.layers.{i}.input_layernorm._extra_state" for i in range(2)]
    hf = safetensors_tensors(tiny_hf)
    for i, norm in enumerate(norms):
        assert torch.equal(norm.weight, hf[f"model.layers.{i}.input_layernorm.weight"])
        assert "extra_states_set" not in norm.__dict__


def test_load_weights_refuses_a_missing_weight(tiny_ckpt):
    model = _model()
    norm = model.decoder.final_layernorm
    norm.register_parameter("bias", torch.nn.Parameter(torch.zeros_like(norm.weight)))
    with pytest.raises(megatron.CheckpointFormatError) as err:
        megatron.load_weights(model, tiny_ckpt)
    assert str(err.value) == (f"{tiny_ckpt} lacks: decoder.final_layernorm.bias (a checkpoint "
                              "of another model or layout)")


def test_only_extra_state_keys_count_as_extra_state():
    assert megatron.is_extra_state("decoder.final_layernorm._extra_state")
    assert megatron.is_extra_state("decoder.layers.mlp.experts.linear_fc1._extra_state3")
    assert megatron.is_extra_state("decoder.layers.self_attention.linear_qkv.layer_norm__extra_state")
    assert not megatron.is_extra_state("decoder.final_layernorm.weight")
    assert not megatron.is_extra_state("decoder.layers.mlp.linear_fc1._extra_state.weight")
