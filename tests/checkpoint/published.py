"""The config.json of eleven published models (written out here: no network), and the two cuts
the tests take of them: `cut` keeps every field and cuts the layers (the widths stay real: a
DRY_RUN, or dev/check_published_models.py's random-weight folders), `tiny` also shrinks the
widths while keeping each config's structure (GQA ratio, an explicit head dim apart from
hidden / heads, tied embeddings, biases, q/k norms, RoPE base and scaling, experts), so the
CPU suite builds, converts and runs them in seconds. Below them, what the tests and
dev/check_published_models.py share: a launch of a config, a random model of it, ours built
from a launch, and the logits of both."""
from __future__ import annotations

import copy
import json

import torch

LLAMA_3_1_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
    "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0", "use_cache": True, "vocab_size": 128256}

LLAMA_2_7B = {
    "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "tie_word_embeddings": False, "torch_dtype": "float16",
    "transformers_version": "4.31.0.dev0", "use_cache": True, "vocab_size": 32000}

TINYLLAMA_1_1B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 5632, "max_position_embeddings": 2048, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 22, "num_key_value_heads": 4,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.35.0",
    "use_cache": True, "vocab_size": 32000}

LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256}

LLAMA_3_2_3B = {
    **LLAMA_3_2_1B, "head_dim": 128, "hidden_size": 3072, "num_attention_heads": 24,
    "num_hidden_layers": 28}

SMOLLM2_135M = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 576,
    "initializer_range": 0.041666666666666664, "intermediate_size": 1536,
    "is_llama_config": True, "max_position_embeddings": 8192, "model_type": "llama",
    "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_interleaved": False, "rope_scaling": None,
    "rope_theta": 100000, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.40.1", "use_cache": True, "vocab_size": 49152}

MISTRAL_7B_V03 = {
    "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.42.0.dev0", "use_cache": True, "vocab_size": 32768}

QWEN2_5_7B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584,
    "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 131072,
    "max_window_layers": 28, "model_type": "qwen2", "num_attention_heads": 28,
    "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": True,
    "use_mrope": False, "use_sliding_window": False, "vocab_size": 152064}

QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
    "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False,
    "vocab_size": 151936}

QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
    "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
    "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}

MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
    "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": False,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.36.0.dev0", "use_cache": True, "vocab_size": 32000}

# Hub id -> config.json (the eleven)
PUBLISHED: dict[str, dict] = {
    "meta-llama/Llama-3.1-8B": LLAMA_3_1_8B,
    "meta-llama/Llama-2-7b-hf": LLAMA_2_7B,
    "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T": TINYLLAMA_1_1B,
    "meta-llama/Llama-3.2-1B": LLAMA_3_2_1B,
    "meta-llama/Llama-3.2-3B": LLAMA_3_2_3B,
    "HuggingFaceTB/SmolLM2-135M": SMOLLM2_135M,
    "mistralai/Mistral-7B-v0.3": MISTRAL_7B_V03,
    "Qwen/Qwen2.5-7B": QWEN2_5_7B,
    "Qwen/Qwen3-8B": QWEN3_8B,
    "Qwen/Qwen3-30B-A3B": QWEN3_30B_A3B,
    "mistralai/Mixtral-8x7B-v0.1": MIXTRAL_8X7B,
}

# Mistral-7B-v0.1 attends through a 4096-token sliding window: refused, by name
MISTRAL_7B_V01_WINDOW = {**MISTRAL_7B_V03, "sliding_window": 4096, "vocab_size": 32000,
                         "rope_theta": 10000.0}


def cut(config: dict, layers: int = 2) -> dict:
    """The published config with its layers cut (everything else real)."""
    return {**copy.deepcopy(config), "num_hidden_layers": layers}


def tiny(config: dict, layers: int = 2) -> dict:
    """The config at test widths, each structural trait kept: the GQA ratio (MHA stays MHA),
    an explicit head dim apart from hidden / heads (Qwen3-30B-A3B's 128 in a width of 2048 /
    32 heads stays twice the width's own), tied embeddings, biases, q/k norms, RoPE base and
    scaling, experts (at most 8, top-2)."""
    out = cut(config, layers)
    heads, groups = config["num_attention_heads"], config.get("num_key_value_heads") or \
        config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    width_per_head = config["hidden_size"] / (heads * head_dim)   # 1, or 0.5 (Qwen3-30B-A3B)
    new_groups = min(groups, 2)
    new_heads = new_groups * min(heads // groups, 4)
    out.update(num_attention_heads=new_heads, num_key_value_heads=new_groups,
               hidden_size=int(new_heads * 16 * width_per_head), intermediate_size=96,
               vocab_size=256, bos_token_id=1, eos_token_id=2)
    if "head_dim" in config:
        out["head_dim"] = 16
    if "moe_intermediate_size" in config:
        out["moe_intermediate_size"] = 32
    for key in ("num_experts", "num_local_experts"):
        if key in config:
            out[key] = min(config[key], 8)
            out["num_experts_per_tok"] = min(config["num_experts_per_tok"], 2)
    return out


# -- shared by tests/checkpoint/test_published.py and dev/check_published_models.py ---------

MOE_FAMILIES = ("qwen3_moe", "mixtral")


def launch_config(env, config: dict, words=None, **toggles):
    """The launch (DRY_RUN) of a config's family: the MoE entry point's for the MoE ones."""
    import training.moe.presets  # noqa: F401 - registers qwen3_moe and mixtral
    from training.moe.layer import MOE

    from tests.launch.helpers import launch

    kind = config["model_type"]
    if kind in MOE_FAMILIES:
        return launch(env, family=kind, words=words, layers=[MOE], **toggles)
    return launch(env, words=words, **toggles)


def write_config(folder, config: dict):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def expect_args(args, config: dict) -> None:
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



def random_hf_model(folder, config: dict, dtype=torch.float32):
    """A random Hugging Face model of the config (its norms and biases random too), saved as
    transformers saves it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    write_config(folder / "config", config)
    hf_config = AutoConfig.from_pretrained(folder / "config")
    hf_config._attn_implementation = "sdpa"
    torch.manual_seed(0)   # built in its dtype: Mixtral's 2 real-width layers are 12 GB in fp32
    model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype).eval()
    with torch.no_grad():   # norms start at 1 and biases at 0: make a swapped one visible
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.2 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.normal_(0, 0.2)
            param.data = param.data.to(dtype)   # the RoPE frequencies (buffers) stay fp32
    model.save_pretrained(folder / "hf")
    return model, folder / "hf"


def ours_from_launch(result, vocab: int, dtype=torch.float32):
    """Our GPTModel as pretrain_gpt builds it from the launch's Megatron arguments (on the
    CPU, the torch kernels)."""
    from megatron.training.argument_utils import core_transformer_config_from_args

    from training import specs
    from training.pretrain_gpt import build_gpt_model
    from training.run import Run

    from tests.launch.helpers import megatron_args
    from tests.model.parity import init_single_rank
    from tests.moe.model import cpu_dispatcher_streams

    init_single_rank("cpu")
    args = megatron_args(result)
    args.use_cpu_initialization, args.padded_vocab_size = True, vocab
    args.bf16, args.params_dtype = dtype == torch.bfloat16, dtype
    args.gradient_accumulation_fusion = False      # no DDP main_grad buffers here
    # Megatron's torch.compile'd fusions (SwiGLU, cross-entropy) compile on their first call:
    # a minute or more on this CPU, for the same numbers
    args.bias_swiglu_fusion = args.cross_entropy_loss_fusion = False
    config = core_transformer_config_from_args(args)
    specs.install_native(Run(args=args))
    with cpu_dispatcher_streams():
        return build_gpt_model(args, config).to(dtype)


def logits(hf_model, gpt, vocab: int, batch: int = 2, seq: int = 32):
    """(HF's, ours) on the same random tokens, in fp32."""
    from tests.moe.model import cpu_dispatcher_streams

    tokens = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(seq).unsqueeze(0).expand(batch, seq)
    with torch.no_grad(), cpu_dispatcher_streams():
        return hf_model(input_ids=tokens).logits.float(), gpt(tokens, positions, None).float()


