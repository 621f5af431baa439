"""The tensor map and the preset checks, without any file."""
from __future__ import annotations

import dataclasses

import pytest

from training.checkpoint import layout
from training.checkpoint.layout import Architecture, ArchitectureError, match_preset
from training.launch.presets import PRESETS

META_LLAMA31_8B = {  # meta-llama/Llama-3.1-8B's config.json (transformers 4 spelling)
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "bos_token_id": 128000,
    "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "vocab_size": 128256}


def test_meta_config_is_the_llama31_preset_and_v5_spelling_reads_the_same():
    arch = Architecture.from_hf_config(META_LLAMA31_8B)
    assert match_preset(arch, PRESETS).name == "llama3.1-8B"
    v5 = {k: v for k, v in META_LLAMA31_8B.items() if k not in ("rope_theta", "rope_scaling")}
    v5["rope_parameters"] = {**META_LLAMA31_8B["rope_scaling"], "rope_theta": 500000.0}
    assert Architecture.from_hf_config(v5) == arch


@pytest.mark.parametrize("name", sorted(n for n, p in PRESETS.items() if not p.num_experts))
def test_every_preset_round_trips_through_its_hf_config(name):
    arch = Architecture.from_preset(PRESETS[name])
    assert Architecture.from_hf_config(arch.hf_config_fields()) == arch
    assert match_preset(arch, PRESETS).name == name


def test_a_dense_config_named_as_an_moe_preset_names_the_experts():
    """training/moe registers its presets into the same table: a dense config matches the
    dense preset, and naming an MoE one names the expert fields that differ."""
    import training.moe.presets  # noqa: F401
    from training.moe.presets import TINY_MIXTRAL

    arch = Architecture.from_preset(PRESETS["tiny"])
    assert match_preset(arch, PRESETS).name == "tiny"
    with pytest.raises(ArchitectureError, match="num_experts: 8 vs 0"):
        match_preset(arch, PRESETS, TINY_MIXTRAL.name)


def test_mismatch_names_the_differing_fields():
    config = dict(META_LLAMA31_8B, num_key_value_heads=4, rope_scaling=None,
                  tie_word_embeddings=True)
    with pytest.raises(ArchitectureError) as err:
        match_preset(Architecture.from_hf_config(config), PRESETS, "llama3.1-8B")
    text = str(err.value)
    assert "preset llama3.1-8B" in text
    assert "num_query_groups: 8 vs 4" in text and "tied_embeddings: False vs True" in text
    assert "rope_scaling: {factor=8.0" in text and "vs None" in text
    assert "num_layers" not in text   # NUM_LAYERS may differ from the preset's


def test_no_preset_matches_a_foreign_shape_and_names_the_nearest():
    config = dict(META_LLAMA31_8B, hidden_size=3072, intermediate_size=8192,
                  num_attention_heads=24, rope_theta=1e6)
    with pytest.raises(ArchitectureError, match=r"any preset \(nearest: .*\): .*hidden_size"):
        match_preset(Architecture.from_hf_config(config), PRESETS)


def test_a_family_not_converted_is_refused():
    with pytest.raises(ArchitectureError, match="model_type 'gpt2': this converts 'llama'"):
        Architecture.from_hf_config(dict(META_LLAMA31_8B, model_type="gpt2",
                                         architectures=["GPT2LMHeadModel"]))
    with pytest.raises(ArchitectureError, match="lacks hidden_size"):
        Architecture.from_hf_config({"model_type": "llama", "num_hidden_layers": 2})


@pytest.mark.parametrize("name", ["tiny", "llama3-8B", "llama2-7B"])
def test_every_hf_row_lands_in_exactly_one_megatron_row(name):
    arch = Architecture.from_preset(PRESETS[name], num_layers=2)
    shapes = layout.hf_shapes(arch)
    seen = {n: [0] * s[0] for n, s in shapes.items()}
    chunks = layout.megatron_tensors(arch)
    for chunk in chunks:
        assert sum(b.rows for b in chunk.blocks) == chunk.shape[0]
        for block in chunk.blocks:
            assert shapes[block.hf_name][1:] == chunk.shape[1:]
            for r in range(block.row, block.row + block.rows):
                seen[block.hf_name][r] += 1
    assert all(count == 1 for rows in seen.values() for count in rows)
    # every (key, layer) chunk once; layers tile the stacked axis
    assert len({(c.key, c.layer) for c in chunks}) == len(chunks) == 3 + 6 * 2


@pytest.mark.parametrize("max_bytes", [1, 64 << 10, 300 << 10])
def test_row_ranges_tile_every_chunk(max_bytes):
    arch = Architecture.from_preset(PRESETS["tiny"], num_layers=2)
    whole = layout.megatron_tensors(arch)
    pieces = layout.split_rows(whole, max_bytes, 2)
    for t in whole:
        mine = [p for p in pieces if (p.key, p.layer) == (t.key, t.layer)]
        assert [p.row for p in mine] == sorted(p.row for p in mine) and mine[0].row == 0
        assert all(a.row + a.rows == b.row for a, b in zip(mine, mine[1:]))
        assert sum(p.rows for p in mine) == t.rows
        assert all(p.numel() * 2 <= max(max_bytes, p.numel() * 2 // p.rows) for p in mine)
        rows = [(b.hf_name, b.row + i) for p in mine for b in p.blocks for i in range(b.rows)]
        assert rows == [(b.hf_name, b.row + i) for b in t.blocks for i in range(b.rows)]
        assert all(p.global_shape == t.global_shape for p in mine)
    assert len(pieces) > len(whole)


def test_qkv_rows_are_grouped_per_query_group():
    arch = Architecture.from_preset(PRESETS["tiny"], num_layers=1)   # 4 heads, 2 groups, hd 64
    qkv = next(c for c in layout.megatron_tensors(arch) if c.key == layout.QKV)
    names = [(b.hf_name.split(".")[-2], b.row, b.rows) for b in qkv.blocks]
    assert names == [("q_proj", 0, 128), ("k_proj", 0, 64), ("v_proj", 0, 64),
                     ("q_proj", 128, 128), ("k_proj", 64, 64), ("v_proj", 64, 64)]
    fc1 = next(c for c in layout.megatron_tensors(arch) if c.key == layout.FC1)
    assert [b.hf_name.split(".")[-2] for b in fc1.blocks] == ["gate_proj", "up_proj"]
    assert qkv.global_shape == (1, 512, 256) and qkv.offsets == (0, 0, 0)


def test_preset_with_other_layers_still_matches():
    preset = dataclasses.replace(PRESETS["llama3-8B"], num_layers=8)
    assert match_preset(Architecture.from_preset(preset), PRESETS).name == "llama3-8B"
