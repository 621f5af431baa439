"""training/checkpoint/gpt_oss.py: Hugging Face GptOss <-> ours, both ways. The round trip of
every tensor is bit for bit; our model exported to a Hugging Face folder loads into
transformers' GptOssForCausalLM with the original's tensors and gives our model's logits."""
from __future__ import annotations

import pytest
import torch

from training.checkpoint import gpt_oss as table
from training.moe.gpt_oss import TINY_GPT_OSS, hf_config

from tests.moe.gpt_oss_model import build_gpt_oss, hf_gpt_oss
from tests.moe.model import compare_logits


def test_round_trip_is_bit_for_bit():
    hf_model = hf_gpt_oss(TINY_GPT_OSS, 2)
    theirs = hf_model.state_dict()
    ours = table.hf_to_megatron(theirs, hf_model.config)
    assert ours["decoder.layers.0.mlp.experts.linear_fc1.weight"].shape == (8, 256, 256)
    back = table.megatron_to_hf(ours, hf_model.config)
    assert set(back) == set(theirs)
    for name, tensor in theirs.items():
        assert torch.equal(back[name], tensor), name
    # the interleaving is undone, not carried: gate rows of ours are HF's even columns
    gate_up = theirs["model.layers.1.mlp.experts.gate_up_proj"]
    assert torch.equal(ours["decoder.layers.1.mlp.experts.linear_fc1.weight"][3, :128],
                       gate_up[3][:, 0::2].T)


def test_each_view_is_declared_once_and_inverted():
    """The experts' views are declared one way (stored -> read), as steps; the way back and
    the stored shape follow from them: read then written back is the stored tensor, and the
    read tensor has the table's shape for the stored one."""
    hf_model = hf_gpt_oss(TINY_GPT_OSS, 1)
    theirs = hf_model.state_dict()
    reads = {name: shape for *_, r in table.table(hf_model.config) for name, shape in r.items()}
    viewed = [n for n in theirs if table._steps(n)]
    assert len(viewed) == 3
    for name in viewed:
        read = table._view(name, theirs[name], 0)
        assert tuple(read.shape) == reads[name], name
        assert table.stored_shape(name, reads[name]) == tuple(theirs[name].shape), name
        assert torch.equal(table._view(name, read, 1), theirs[name]), name
        assert not torch.equal(read.flatten(), theirs[name].flatten()), name   # it rearranges


def test_export_loads_in_transformers_and_gives_our_logits(tmp_path):
    from transformers import GptOssForCausalLM

    hf_model = hf_gpt_oss(TINY_GPT_OSS, 2)
    gpt, _ = build_gpt_oss(TINY_GPT_OSS, 2)
    table.copy_hf_gpt_oss_weights(hf_model, gpt)
    folder = table.export_hf(gpt, hf_config(TINY_GPT_OSS, 2), tmp_path / "hf")
    loaded = GptOssForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                               attn_implementation="eager").eval()
    original = hf_model.state_dict()
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, original[name]), name
    result = compare_logits(loaded, gpt, TINY_GPT_OSS.vocab_size, 2, 48, "cpu")
    assert result["max_abs_err"] < 1e-4 * max(result["logit_scale"], 1.0), result


def test_a_mismatched_shape_is_refused_in_words():
    hf_model = hf_gpt_oss(TINY_GPT_OSS, 1)
    config = hf_config(TINY_GPT_OSS, 1).to_dict()
    config["num_key_value_heads"] = 4
    with pytest.raises(table.GptOssShapeError, match="linear_qkv is"):
        table.hf_to_megatron(hf_model.state_dict(), config)


def test_the_te_specs_fused_input_norm_takes_the_input_norm():
    """Under Transformer Engine's spec the attention's input norm is linear_qkv's
    layer_norm_weight (the GPU parity test copies into that model)."""
    te = {"decoder.layers.1.self_attention.linear_qkv.layer_norm_weight": None}
    assert table._te_name("decoder.layers.1.input_layernorm.weight", te) == next(iter(te))
    native = {"decoder.layers.1.input_layernorm.weight": None}
    assert table._te_name("decoder.layers.1.input_layernorm.weight", native) == next(iter(native))


def test_megatrons_sharded_state_dict_holds_the_sinks_and_the_expert_biases():
    """What a Megatron distributed checkpoint of our gpt-oss saves: the sinks under the key
    Megatron's attentions use (core_attention.softmax_offset; the layers stacked along a leading
    axis, as Megatron saves every layer tensor), the experts' biases as global [experts, out]
    tensors beside their weights."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    gpt, _ = build_gpt_oss(TINY_GPT_OSS, 2)
    sharded = gpt.sharded_state_dict()
    sinks = sharded["decoder.layers.1.self_attention.core_attention.softmax_offset"]
    assert isinstance(sinks, ShardedTensor) and tuple(sinks.global_shape) == (2, 4)
    assert sinks.key == "decoder.layers.self_attention.core_attention.softmax_offset"
    bias = sharded["decoder.layers.0.mlp.experts.linear_fc2.bias"]
    assert isinstance(bias, ShardedTensor) and tuple(bias.global_shape) == (2, 8, 256)
    assert bias.key == "decoder.layers.mlp.experts.experts.linear_fc2.bias"   # SequentialMLP's
    assert isinstance(sharded["decoder.layers.0.mlp.experts.linear_fc1.bias"],
                      ShardedTensorFactory)
