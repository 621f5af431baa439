"""gpt-oss launched from its checkpoint: MODEL_CONFIG=<a gpt-oss config.json or an import of
one> and PRETRAINED_CHECKPOINT=<an import> launch at the checkpoint's shape (source
`checkpoint`), as the other families do; the shape is the launcher's reading of the config
(training/moe/gpt_oss.shape_from_hf_config), which the import checks with too; what Megatron's
gpt-oss cannot express is refused in one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from training.checkpoint.__main__ import main as checkpoint_main
from training.launch.settings import BadInput
from training.moe.gpt_oss import GPT_OSS, GPT_OSS_20B, TINY_GPT_OSS, GptOssPreset
from training.moe.layer import MOE

from tests.launch.helpers import launch, megatron_args
from tests.moe.gpt_oss_model import hf_gpt_oss

REPO = Path(__file__).resolve().parents[2]

# openai/gpt-oss-20b's config.json as the Hub publishes it (transformers 4's spelling:
# rope_theta and rope_scaling), its quantization_config left out (the import reads it)
HUB_20B = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
    "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
    "num_local_experts": 32, "output_router_logits": False, "pad_token_id": 199999,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn",
                     "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
    "swiglu_limit": 7.0, "tie_word_embeddings": False, "use_cache": True, "vocab_size": 201088}


def oss(env, **toggles):
    return launch(env, family="gpt_oss", layers=[MOE, GPT_OSS], **toggles)


def _folder(tmp_path, config, name="gpt-oss-20b") -> Path:
    folder = tmp_path / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def tiny_import(tmp_path_factory):
    """A tiny random GptOssForCausalLM saved by transformers (its own config.json spelling)
    and imported through the CLI."""
    root = tmp_path_factory.mktemp("oss-launch")
    hf_gpt_oss(TINY_GPT_OSS, 2, dtype=torch.bfloat16).save_pretrained(root / "tiny-oss")
    assert checkpoint_main(["import", str(root / "tiny-oss"), str(root / "ckpt"),
                            "--no-progress"]) == 0
    return root / "ckpt"


def test_the_hubs_config_launches_at_the_presets_shape(base_env, tmp_path):
    """MODEL_CONFIG=<gpt-oss-20b's config.json>: the same Megatron words as MODEL_SIZE=20b,
    the shape named by the preset it is, every field's source the checkpoint; the router's
    coefficient is the config's."""
    folder = _folder(tmp_path, HUB_20B)
    from_config = oss(base_env, MODEL_CONFIG=folder, NUM_LAYERS=4)
    from_preset = oss(base_env, MODEL_SIZE="20b", NUM_LAYERS=4)
    assert isinstance(from_config.ctx.preset, GptOssPreset)
    words = [from_config.buckets["GPT_ARGS"], from_preset.buckets["GPT_ARGS"]]
    coeffs = [w[w.index("--moe-aux-loss-coeff") + 1] for w in words]
    assert coeffs == ["0.9", "0.001"]       # the config's own, the preset's (transformers')
    assert [x for x in words[0] if x != "0.9"] == [x for x in words[1] if x != "0.001"]
    s = from_config.settings
    assert (s["MODEL_SIZE"], s.setting("MODEL_SIZE").source) == ("gpt-oss-20b", "checkpoint")
    assert s.setting("SEQ_LENGTH").source == "checkpoint"
    assert (s["MOE_AUX_LOSS_COEFF"], s.setting("MOE_AUX_LOSS_COEFF").source) == \
        (0.9, "checkpoint")
    args = megatron_args(from_config)
    assert (args.num_experts, args.kv_channels, args.window_size) == (32, 64, (127, 0))
    assert args.softmax_type == "learnable" and args.position_embedding_type == "yarn"


def test_each_field_is_read_from_the_config(base_env, tmp_path):
    """A shape no preset has (another window, YaRN factor, experts, width) is launched as it
    is, under its folder's name; transformers 5's rope_parameters read as 4's rope_scaling."""
    config = dict(HUB_20B, sliding_window=64, num_local_experts=16, num_hidden_layers=6,
                  layer_types=["sliding_attention", "full_attention"] * 3,
                  rope_parameters=dict(HUB_20B["rope_scaling"], factor=16.0, rope_theta=50000))
    del config["rope_scaling"], config["rope_theta"]
    result = oss(base_env, MODEL_CONFIG=_folder(tmp_path, config, "my-oss"))
    shape = result.ctx.preset
    assert shape.name == "my-oss" and shape.num_layers == 6
    gpt = result.buckets["GPT_ARGS"]
    for flag, value in (("--window-size", "63,0"), ("--num-experts", "16"),
                        ("--rotary-scaling-factor", "16.0"), ("--rotary-base", "50000"),
                        ("--num-layers", "6")):
        assert gpt[gpt.index(flag) + 1] == value, flag
    megatron_args(result)


def test_an_import_launches_at_its_shape(base_env, tiny_import):
    """PRETRAINED_CHECKPOINT=<a gpt-oss import> and no MODEL_SIZE: MODEL_CONFIG is derived from
    the import, the shape is the import's (not refused for its model_type), the guard
    pretrained_checkpoint finds it fits, and Megatron's parser reads it back."""
    for how in ({"PRETRAINED_CHECKPOINT": tiny_import},
                {"PRETRAINED_CHECKPOINT": tiny_import, "MODEL_CONFIG": tiny_import}):
        result = oss(base_env, **how)
        s = result.settings
        assert (s["MODEL_SIZE"], s.setting("MODEL_SIZE").source) == \
            (TINY_GPT_OSS.name, "checkpoint")
        assert (s["NUM_LAYERS"], s.setting("NUM_LAYERS").source) == (2, "checkpoint")
        assert any("weights only, fresh optimizer" in n.message
                   for n in s.notices if n.guard == "pretrained_checkpoint")
        words = result.buckets["OUTPUT_ARGS"]
        assert words[words.index("--pretrained-checkpoint") + 1] == str(tiny_import)
        args = megatron_args(result)
        assert (args.hidden_size, args.num_experts, args.kv_channels, args.window_size) == \
            (256, 8, 32, (15, 0))
    # the same import beside a preset of another shape: refused with the fix
    from training.launch.guards import Refusals

    with pytest.raises(Refusals, match=r"\[pretrained_checkpoint\].*hidden_size: 256 "
                                        r"\(checkpoint\) vs 2880 \(launch\)"):
        oss(base_env, MODEL_SIZE="20b", NUM_LAYERS=2, PRETRAINED_CHECKPOINT=tiny_import)


@pytest.mark.parametrize("change, words", [
    ({"layer_types": ["full_attention", "sliding_attention"] * 12}, "layer_types"),
    ({"rope_scaling": dict(HUB_20B["rope_scaling"], truncate=True)}, "truncate true"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "'linear'"),
    ({"swiglu_limit": 10.0}, "swiglu_limit is 10.0"),
    ({"attention_bias": False}, "attention_bias false"),
    ({"tie_word_embeddings": True}, "ties the embeddings"),
    ({"sliding_window": None}, "no sliding_window"),
    ({"num_local_experts": 0}, "num_local_experts"),
    ({"num_key_value_heads": 7}, "do not divide"),
    ({"rope_theta": 1.5e5 + 0.5}, "--rotary-base is an integer"),
])
def test_what_megatron_cannot_express_is_refused_in_one_line(base_env, tmp_path, change, words):
    folder = _folder(tmp_path, {**HUB_20B, **change})
    with pytest.raises(BadInput) as err:
        oss(base_env, MODEL_CONFIG=folder)
    text = str(err.value)
    assert text.startswith(f"MODEL_CONFIG={folder}") and words in text and "\n" not in text


def test_through_another_entry_script_it_names_its_own(base_env, tmp_path):
    folder = _folder(tmp_path, HUB_20B)
    with pytest.raises(BadInput, match="launch it with examples/moe/train_gpt_oss.sh"):
        launch(base_env, family="qwen3_moe", layers=[MOE], MODEL_CONFIG=folder)


def test_entry_script_dry_run_shows_the_checkpoint_as_source(tiny_import, tmp_path):
    """DRY_RUN=1 bash examples/moe/train_gpt_oss.sh PRETRAINED_CHECKPOINT=<import>: the table's
    shape rows say `checkpoint`, torchrun's words carry the import's shape."""
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"),
           "EXPERIMENT_DIR": str(tmp_path / "experiment"), "DRY_RUN": "1", "VERBOSE": "1",
           "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(REPO / "examples/moe/train_gpt_oss.sh"),
                           f"PRETRAINED_CHECKPOINT={tiny_import}"], env=env, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    cells = [[c.strip() for c in line.split("\u2502")[1:4]] for line in out.splitlines()
             if line.count("\u2502") > 4]
    assert ["MODEL_SIZE", TINY_GPT_OSS.name, "checkpoint"] in cells, out
    assert ["hidden_size", "256", "checkpoint"] in cells, out
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("torchrun ")]
    assert "--pretrained-checkpoint" in line and "--window-size 15,0" in line


def test_the_20b_preset_is_the_hubs_config():
    """The preset and the Hub's config read the same: the reader is what names them equal."""
    from training.launch.model_config import shape_from_hf_config

    shape = shape_from_hf_config(HUB_20B, "x")
    for field in ("hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
                  "num_experts", "router_topk", "moe_ffn_hidden_size", "sliding_window",
                  "window_skip_freq", "yarn_factor", "yarn_original_max_positions",
                  "yarn_beta_fast", "yarn_beta_slow", "swiglu_limit", "rotary_base",
                  "norm_epsilon", "vocab_size", "max_position_embeddings", "linear_bias",
                  "attention_sinks", "clamped_swiglu", "yarn", "init_std"):
        assert getattr(shape, field) == getattr(GPT_OSS_20B, field), field
