"""The issue's eleven published models (tests/checkpoint/published.py: their real config.json).

At their real widths, layers cut to 2: MODEL_CONFIG launches each at its own shape (DRY_RUN),
every field read back from the words by Megatron's own parser and validate_args.
At test widths (published.tiny: each config's structure kept), a random Hugging Face model of
each: import, export bitwise with the config and architecture name kept, a DRY_RUN from the
import carrying its shape, and our GPTModel built from that launch's Megatron arguments with
the import's weights computing Hugging Face's logits."""
from __future__ import annotations

import json

import pytest
import torch

import training.moe.presets  # noqa: F401 - registers qwen3_moe and mixtral
from training.checkpoint import record
from training.checkpoint.convert import export_checkpoint, import_checkpoint
from training.moe.layer import MOE

from tests.launch.helpers import launch, megatron_args

from .helpers import assert_bitwise_equal
from .published import MISTRAL_7B_V01_WINDOW, PUBLISHED, cut, tiny

MOE_FAMILIES = ("qwen3_moe", "mixtral")


def _launch(env, config: dict, **toggles):
    """The launch of a config's family: the MoE entry point's for the MoE ones."""
    kind = config["model_type"]
    if kind in MOE_FAMILIES:
        return launch(env, family=kind, layers=[MOE], **toggles)
    return launch(env, **toggles)


def _write(folder, config: dict):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _expect(args, config: dict) -> None:
    """Megatron's parsed arguments carry every architecture field of the config."""
    heads = config["num_attention_heads"]
    assert args.num_layers == config["num_hidden_layers"]
    assert args.hidden_size == config["hidden_size"]
    assert args.num_attention_heads == heads
    groups = config.get("num_key_value_heads") or heads
    assert (args.num_query_groups if args.group_query_attention else heads) == groups
    assert args.kv_channels == (config.get("head_dim") or config["hidden_size"] // heads)
    assert args.vocab_size == config["vocab_size"]
    assert args.layernorm_epsilon == config["rms_norm_eps"]
    assert args.rotary_base == int(config.get("rope_theta", 10000))
    scaling = config.get("rope_scaling")
    assert args.use_rope_scaling == bool(scaling)
    if scaling:
        assert args.rope_scaling_factor == scaling["factor"]
    assert args.untie_embeddings_and_output_weights == (not config["tie_word_embeddings"])
    assert args.add_qkv_bias == (config["model_type"] == "qwen2")
    assert args.qk_layernorm == config["model_type"].startswith("qwen3")
    experts = config.get("num_experts") or config.get("num_local_experts")
    assert args.num_experts == experts
    if experts:
        assert args.moe_router_topk == config["num_experts_per_tok"]
        assert args.moe_ffn_hidden_size == config.get("moe_intermediate_size",
                                                      config["intermediate_size"])
        assert args.moe_aux_loss_coeff == config["router_aux_loss_coef"]
    else:
        assert args.ffn_hidden_size == config["intermediate_size"]


@pytest.mark.parametrize("hub_id", sorted(PUBLISHED))
def test_model_config_launches_a_published_model_at_its_own_shape(base_env, tmp_path, hub_id):
    config = cut(PUBLISHED[hub_id])
    folder = _write(tmp_path / hub_id.split("/")[1], config)
    result = _launch(base_env, config, MODEL_CONFIG=folder)
    s = result.settings
    assert s.setting("MODEL_SIZE").source == "checkpoint"
    assert s["MODEL_SIZE"] == folder.name and result.ctx.run_name.startswith(folder.name)
    assert (s["NUM_LAYERS"], s.setting("NUM_LAYERS").source) == (2, "checkpoint")
    _expect(megatron_args(result), config)
    from training.launch.manifest import launch_manifest

    rows = launch_manifest(result)["model_config"]["fields"]
    assert {r["source"] for r in rows} == {"checkpoint"}
    assert {r["toggle"].strip(): r["value"] for r in rows}["hidden_size"] == \
        str(config["hidden_size"])


def _hf_model(folder, config: dict, dtype=torch.float32):
    """A random Hugging Face model of the config (its norms and biases random too), saved as
    transformers saves it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    _write(folder / "config", config)
    hf_config = AutoConfig.from_pretrained(folder / "config")
    hf_config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config).to(dtype).eval()
    with torch.no_grad():   # norms start at 1 and biases at 0: make a swapped one visible
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.2 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.normal_(0, 0.2)
    model.save_pretrained(folder / "hf")
    return model, folder / "hf"


def _ours(result, vocab: int):
    """Our GPTModel as pretrain_gpt builds it from the launch's Megatron arguments (fp32 on
    the CPU, the torch kernels)."""
    from megatron.training.argument_utils import core_transformer_config_from_args

    from training import specs
    from training.pretrain_gpt import build_gpt_model
    from training.run import Run

    from tests.model.parity import init_single_rank
    from tests.moe.model import cpu_dispatcher_streams

    init_single_rank("cpu")
    args = megatron_args(result)
    args.use_cpu_initialization, args.padded_vocab_size = True, vocab
    args.bf16, args.params_dtype = False, torch.float32
    config = core_transformer_config_from_args(args)
    specs.install_native(Run(args=args))
    with cpu_dispatcher_streams():
        return build_gpt_model(args, config)


@pytest.mark.parametrize("hub_id", sorted(PUBLISHED))
def test_a_published_family_round_trips_and_computes_hf_logits(base_env, tmp_path, hub_id):
    from transformers import AutoConfig

    from training.checkpoint.megatron import load_weights

    from tests.moe.model import cpu_dispatcher_streams

    config = tiny(PUBLISHED[hub_id])
    hf_model, hf = _hf_model(tmp_path, config)
    out = tmp_path / "megatron"
    import_checkpoint(str(hf), out, progress=False)
    rec = record.read_record(out)
    assert rec["family"] == config["model_type"] and rec["name"] == "hf"
    export_checkpoint(out, tmp_path / "back", progress=False)
    assert_bitwise_equal(hf, tmp_path / "back")
    back = json.loads((tmp_path / "back" / "config.json").read_text())
    assert back["architectures"] == config["architectures"]
    same = {"_name_or_path": None, "transformers_version": None}
    assert AutoConfig.from_pretrained(tmp_path / "back").to_dict() | same == \
        AutoConfig.from_pretrained(hf).to_dict() | same

    # a DRY_RUN from the import carries its shape; our model of it computes HF's logits
    result = _launch(base_env, config, PRETRAINED_CHECKPOINT=out, NATIVE_KERNELS="torch",
                     TRANSFORMER_IMPL="native")
    assert result.settings.setting("MODEL_SIZE").source == "checkpoint"
    gpt = _ours(result, config["vocab_size"])
    assert load_weights(gpt, out) == []
    gpt.eval()
    tokens = torch.randint(0, config["vocab_size"], (2, 32),
                           generator=torch.Generator().manual_seed(1))
    positions = torch.arange(32).unsqueeze(0).expand(2, 32)
    with torch.no_grad(), cpu_dispatcher_streams():
        theirs = hf_model(input_ids=tokens).logits.float()
        ours = gpt(tokens, positions, None).float()
    assert (ours - theirs).abs().max().item() < 1e-4 * max(theirs.abs().mean().item(), 1.0)


def test_a_sliding_window_is_refused_naming_it(base_env, tmp_path):
    folder = _write(tmp_path / "Mistral-7B-v0.1", cut(MISTRAL_7B_V01_WINDOW))
    from training.launch.settings import BadInput

    with pytest.raises(BadInput, match="sliding_window is 4096"):
        launch(base_env, MODEL_CONFIG=folder)


def test_model_config_and_model_size_are_one_source(base_env, tmp_path):
    from training.launch.guards import Refusals
    from training.launch.settings import BadInput

    folder = _write(tmp_path / "Llama-3.2-1B", cut(PUBLISHED["meta-llama/Llama-3.2-1B"]))
    with pytest.raises(Refusals, match=r"\[model_config\] MODEL_SIZE=8B and MODEL_CONFIG="):
        launch(base_env, MODEL_CONFIG=folder, MODEL_SIZE="8B")
    with pytest.raises(BadInput, match="launch it with examples/moe/train_mixtral.sh"):
        launch(base_env, MODEL_CONFIG=_write(tmp_path / "mixtral",
                                             cut(PUBLISHED["mistralai/Mixtral-8x7B-v0.1"])))
    with pytest.raises(BadInput, match="launch it with examples/llama/train_llama3.sh"):
        launch(base_env, family="mixtral", layers=[MOE], MODEL_CONFIG=folder)


def test_the_shape_feeds_flops_memory_and_the_run_folder(base_env, tmp_path):
    """Llama 3.2 1B: the FLOPs count its own widths; the memory estimate counts its tied
    output layer once."""
    from training.metrics import flops_per_token
    from training.optimize.memory import stage_params

    config = cut(PUBLISHED["meta-llama/Llama-3.2-1B"])
    tied = launch(base_env, MODEL_CONFIG=_write(tmp_path / "Llama-3.2-1B", config))
    untied = launch(base_env, MODEL_CONFIG=_write(tmp_path / "untied", {
        **config, "tie_word_embeddings": False}))
    h, f, s, v = 2048, 8192, tied.run.model.seq_length, 128256
    per_layer = 2 * h * (h + 2 * 512) + 2 * h * h + 2 * s * h + 6 * h * f
    assert flops_per_token(tied.run.model) == 3 * (2 * per_layer + 2 * h * v)
    assert stage_params(untied.run, "only") - stage_params(tied.run, "only") == \
        tied.run.model.padded_vocab(1) * h
    assert tied.ctx.run_name.startswith("Llama-3.2-1B_")


def test_the_datas_vocabulary_must_hold_the_checkpoints_rows(base_env, tmp_path):
    """With a dataset, Megatron's vocabulary is its tokenizer's (padded): Llama 3.2's 128256
    rows do not fit a 300-token tokenizer's 384 and are refused before torchrun, with both
    fixes; padded to 128256 after the script name, the launch goes on with a warning that
    the token ids name other tokens."""
    from training.launch.guards import Refusals

    from tests.mlperf.datasets import make_datasets

    data = make_datasets(tmp_path / "data")["DATA_PATH"]
    folder = _write(tmp_path / "Llama-3.2-1B", cut(PUBLISHED["meta-llama/Llama-3.2-1B"]))
    with pytest.raises(Refusals, match=r"\[checkpoint_vocabulary\] .* 128256 rows: the load "
                                       r"would stop.*--make-vocab-size-divisible-by 128256"):
        launch(base_env, MODEL_CONFIG=folder, DATA_PATH=data)
    padded = launch(base_env, words=["--make-vocab-size-divisible-by", "128256"], MODEL_CONFIG=folder,
                    DATA_PATH=data)
    (warning,) = [n.message for n in padded.settings.notices if n.guard == "checkpoint_vocabulary"]
    assert "name other tokens" in warning
