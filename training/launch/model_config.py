"""A model shape from a checkpoint's config: MODEL_CONFIG, and the import's own reading.

A preset is a named shape (training/launch/presets.py); a Hugging Face config.json is another
source of the same record. `shape_from_hf_config` reads every architecture field of a
config.json into a ModelPreset (training.run_description.Model's fields): widths, heads, KV
groups, head dim, norm epsilon, RoPE base and scaling factor, tied embeddings, q/k/v biases,
q/k norms, vocabulary, experts. Nothing downstream (pre-flight, FLOPs, run folder, guards,
Megatron's flags) cares which source a shape came from. The checkpoint import reads configs
through the same function, so what it converts is what a launch builds.

A field Megatron cannot express is refused here, by name (one line): a sliding window, a RoPE
scaling other than Llama 3's (or Llama 3's with other constants than Megatron's), biases
outside q/k/v, an activation other than SiLU, MoE routing Megatron's default router does not
compute. Standard library only (the launcher's side of the seam).

    MODEL_CONFIG=<folder with config.json | config.json | an import (hf_import.json)>
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from .guards import IMPORT_RECORD
from .presets import ModelPreset
from .settings import BadInput

CONFIG = "config.json"

# Megatron's RotaryEmbedding applies Llama 3's frequency scaling with these constants fixed
# (megatron/core/models/common/embeddings/rotary_pos_embedding.py _apply_scaling); only the
# factor is a flag (--rope-scaling-factor).
LLAMA3_ROPE_CONSTANTS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192}


@dataclass(frozen=True)
class HFFamily:
    """A Hugging Face architecture this project converts and launches."""
    model_type: str
    architecture: str          # the class name config.json's `architectures` holds
    moe: bool = False
    qkv_bias: bool = False     # q/k/v projections carry biases (Qwen2)
    qk_norm: bool = False      # RMSNorm on each head's query and key (Qwen3)


HF_FAMILIES: dict[str, HFFamily] = {f.model_type: f for f in (
    HFFamily("llama", "LlamaForCausalLM"),
    HFFamily("mistral", "MistralForCausalLM"),
    HFFamily("qwen2", "Qwen2ForCausalLM", qkv_bias=True),
    HFFamily("qwen3", "Qwen3ForCausalLM", qk_norm=True),
    HFFamily("qwen3_moe", "Qwen3MoeForCausalLM", moe=True, qk_norm=True),
    HFFamily("mixtral", "MixtralForCausalLM", moe=True),
)}
# model_type -> the function that reads its config.json into a shape, for a family that plugs
# in from above with a shape class of its own (training/moe/gpt_oss.py): its entry script
# imports it, which registers it here (register_reader). The families above read through
# shape_from_hf_config's own fields.
READERS: dict[str, Callable[[dict, str, int], ModelPreset]] = {}


def register_reader(family: HFFamily, reader: Callable[[dict, str, int], ModelPreset]) -> None:
    """A family plugged in from above reads its own config.json (reader(config, name,
    seq_length) -> its shape, ConfigError for what its preset cannot build). Idempotent."""
    HF_FAMILIES[family.model_type] = family
    READERS[family.model_type] = reader


class ConfigError(BadInput):
    """A config.json that cannot be launched or converted (message printed as is)."""


def hf_family(config: dict) -> HFFamily:
    kind = config.get("model_type")
    if kind not in HF_FAMILIES:
        raise ConfigError(f"config.json has model_type {kind!r}: this converts "
                          f"{', '.join(repr(k) for k in HF_FAMILIES)}"
                          + ("" if READERS else " (examples/moe/'s entry scripts add their "
                             "families' own, gpt_oss among them)"))
    return HF_FAMILIES[kind]


def _rope(config: dict) -> tuple[float, bool, float]:
    """(theta, scaling on, factor) from transformers 4's rope_theta/rope_scaling or 5's
    rope_parameters."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or params
    theta = config.get("rope_theta", params.get("rope_theta", 10000.0))
    kind = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    if kind == "default":
        return float(theta), False, 8.0
    if kind != "llama3":
        raise ConfigError(f"rope_scaling type {kind!r} cannot be expressed in Megatron's "
                          "flags (it scales RoPE as Llama 3 does, rope_type 'llama3', only): "
                          "not converted")
    for key, value in LLAMA3_ROPE_CONSTANTS.items():
        if key in scaling and float(scaling[key]) != value:
            raise ConfigError(f"rope_scaling.{key} is {scaling[key]}; Megatron's Llama 3 RoPE "
                              f"scaling fixes it at {value:g}: not converted")
    if "factor" not in scaling:
        raise ConfigError("rope_scaling (llama3) has no factor: not a complete config")
    return float(theta), True, float(scaling["factor"])


def _refuse_unexpressible(config: dict, family: HFFamily) -> None:
    window = config.get("sliding_window")
    uses_window = (config.get("use_sliding_window", False) if family.model_type in
                   ("qwen2", "qwen3", "qwen3_moe") else True)
    if window is not None and uses_window:
        raise ConfigError(f"sliding_window is {window}: Megatron's attention here is full "
                          "causal attention, so this model would attend differently (a "
                          "Mistral with sliding_window null converts)")
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"hidden_act is {act!r}: Megatron's SwiGLU here is SiLU-gated")
    if config.get("mlp_bias"):
        raise ConfigError("mlp_bias is true: biases on the MLP are not converted")
    if config.get("attention_bias"):
        raise ConfigError("attention_bias is true: a bias on the attention output projection "
                          "is not converted (Megatron's --add-qkv-bias biases q, k and v only)")
    if family.moe:
        if family.model_type == "qwen3_moe":
            if not config.get("norm_topk_prob", False):
                raise ConfigError("norm_topk_prob is false: Megatron's router renormalises the "
                                  "top-k weights (softmax over the chosen logits); not converted")
            if config.get("mlp_only_layers"):
                raise ConfigError("mlp_only_layers is set: dense layers among the MoE layers "
                                  "are not converted")
            if config.get("decoder_sparse_step", 1) != 1:
                raise ConfigError(f"decoder_sparse_step is {config['decoder_sparse_step']}: "
                                  "only every layer an MoE layer (1) is converted")
        if config.get("shared_expert_intermediate_size"):
            raise ConfigError("shared_expert_intermediate_size is set: shared experts are not "
                              "converted")


def _int(config: dict, key: str, default=None) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"config.json's {key} is {value!r}: a positive integer is needed")
    return value


def shape_from_hf_config(config: dict, name: str, seq_length: int = 4096) -> ModelPreset:
    """Every architecture field of a Hugging Face config.json as a shape (ModelPreset);
    ConfigError naming the field Megatron cannot express. `seq_length` is the launch's
    default, capped at the config's max_position_embeddings."""
    if not isinstance(config, dict):
        raise ConfigError("config.json is not a JSON object")
    family = hf_family(config)
    missing = [k for k in ("num_hidden_layers", "hidden_size", "intermediate_size",
                           "num_attention_heads", "vocab_size") if k not in config]
    if missing:
        raise ConfigError(f"config.json lacks {', '.join(missing)}: not a complete "
                          f"{family.model_type} config")
    from training.records import HFConfig, RecordError, validate

    try:   # the schema of the files we read (types and ranges), before any field is used
        validate(config, HFConfig, "config.json")
    except RecordError as err:
        raise ConfigError(str(err)) from None
    if family.model_type in READERS:
        return READERS[family.model_type](config, name, seq_length)
    _refuse_unexpressible(config, family)
    theta, scaling, factor = _rope(config)
    if theta != int(theta):
        raise ConfigError(f"rope_theta is {theta:g}: Megatron's --rotary-base is an integer")
    heads = _int(config, "num_attention_heads")
    groups = _int(config, "num_key_value_heads", heads)
    hidden = _int(config, "hidden_size")
    if heads % groups:
        raise ConfigError(f"{heads} attention heads do not divide into {groups} key/value "
                          "groups")
    head_dim = config.get("head_dim") or None
    max_pos = _int(config, "max_position_embeddings", 2048)
    moe = {}
    if family.moe:
        # transformers 5 saves either family's expert count as num_local_experts
        experts_key = "num_experts" if config.get("num_experts") else "num_local_experts"
        ffn_key = "moe_intermediate_size" if family.model_type == "qwen3_moe" \
            else "intermediate_size"
        moe = {"num_experts": _int(config, experts_key),
               "router_topk": _int(config, "num_experts_per_tok"),
               "moe_ffn_hidden_size": _int(config, ffn_key)}
    defaults = ({"MOE_AUX_LOSS_COEFF": float(config.get("router_aux_loss_coef", 0.001))}
                if family.moe else {})
    return ModelPreset(
        name, _int(config, "num_hidden_layers"), hidden, _int(config, "intermediate_size"),
        heads, groups, _int(config, "vocab_size"), max_pos, min(seq_length, max_pos),
        int(theta), norm_epsilon=float(config.get("rms_norm_eps", 1e-6)), rope_scaling=scaling,
        rope_scaling_factor=factor, kv_channels=int(head_dim) if head_dim else None,
        qk_layernorm=family.qk_norm, qkv_bias=family.qkv_bias,
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        train_defaults=defaults, **moe)


# The shape's fields as the launch table shows them: (field, config.json's name, the
# Megatron flag that carries it)
SHOWN_FIELDS = (
    ("num_layers", "num_hidden_layers", "--num-layers"),
    ("hidden_size", "hidden_size", "--hidden-size"),
    ("ffn_hidden_size", "intermediate_size", "--ffn-hidden-size"),
    ("num_attention_heads", "num_attention_heads", "--num-attention-heads"),
    ("num_query_groups", "num_key_value_heads", "--num-query-groups"),
    ("head_dim", "head_dim", "--kv-channels"),
    ("vocab_size", "vocab_size", "--vocab-size"),
    ("max_position_embeddings", "max_position_embeddings", "--max-position-embeddings"),
    ("rotary_base", "rope_theta", "--rotary-base"),
    ("rope_scaling_factor", "rope_scaling.factor", "--rope-scaling-factor"),
    ("norm_epsilon", "rms_norm_eps", "--norm-epsilon"),
    ("tied_embeddings", "tie_word_embeddings", "--untie-embeddings-and-output-weights"),
    ("qkv_bias", "model_type: q/k/v biases", "--add-qkv-bias"),
    ("qk_layernorm", "model_type: q/k norms", "--qk-layernorm"),
    ("num_experts", "num_experts", "--num-experts"),
    ("router_topk", "num_experts_per_tok", "--moe-router-topk"),
    ("moe_ffn_hidden_size", "moe_intermediate_size", "--moe-ffn-hidden-size"))


def shape_rows(shape: ModelPreset, words: list[str]) -> list[dict[str, str]]:
    """The launch table's rows of a checkpoint's shape: each field, its value, the config's
    name for it and the Megatron words that carry it (`words`: the launch's)."""
    rows = []
    for field, key, flag in SHOWN_FIELDS:
        if field == "rope_scaling_factor" and not shape.rope_scaling:
            continue
        if field in ("num_experts", "router_topk", "moe_ffn_hidden_size") and not shape.moe:
            continue
        value = shape.head_dim if field == "head_dim" else getattr(shape, field)
        if flag not in words:
            shown = "-"
        elif isinstance(value, bool) or words.index(flag) + 1 == len(words) \
                or words[words.index(flag) + 1].startswith("--"):
            shown = flag
        else:
            shown = f"{flag} {words[words.index(flag) + 1]}"
        rows.append({"toggle": f"  {field}", "value": str(int(value) if isinstance(value, bool)
                                                       else value),
                     "source": "checkpoint", "flag": shown, "bucket": "GPT_ARGS",
                     "reason": f"config.json {key}"})
    return rows


@dataclass(frozen=True)
class ModelConfig:
    """A shape read from MODEL_CONFIG, and where it came from."""
    shape: ModelPreset
    hf_config: dict
    path: Path                 # the config.json, or the import's record
    kind: str                  # "config" | "import"
    record: dict | None = None


def _read(path: Path, what: str) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ConfigError(f"{path} is not a readable {what} ({err})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path} is not a {what}: a JSON {type(value).__name__}")
    return value


def shape_name(path: Path) -> str:
    """A run-folder-safe name for a shape read from `path`: its model folder's name."""
    folder = (path.parent if path.name in (CONFIG, IMPORT_RECORD) else path).resolve()
    # a Hub download: .../models--ORG--NAME/snapshots/<commit>/
    hub = folder.parent.parent.name if folder.parent.name == "snapshots" else ""
    base = hub.split("--")[-1] if hub.startswith("models--") else folder.name
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-.")
    return name or "model"


# What a shape's name does not decide: a preset of the same fields is the same model
_NOT_SHAPE = ("name", "num_layers", "seq_length", "preset_layers", "train_defaults",
              "aux_loss_coeff")      # the router's loss coefficient: a training default


def published(shape: ModelPreset) -> ModelPreset:
    """The shape under its preset's name where it is a preset's (its layer count aside, the
    preset's kept as `preset_layers`: a 2-layer cut of Llama 3.1 8B is llama3.1-8B-2L):
    presets stay the names of the published shapes. Else the shape as it is."""
    from dataclasses import fields

    from .presets import PRESETS

    def key(model, names) -> tuple:
        return tuple(getattr(model, name, None) for name in names)

    def same(preset) -> bool:   # the fields of either's class (a family's own too: gpt-oss's)
        names = sorted({f.name for f in fields(shape) + fields(preset)} - set(_NOT_SHAPE))
        return key(preset, names) == key(shape, names)

    match = next((p for p in PRESETS.values() if same(p)), None)
    return shape if match is None else replace(shape, name=match.name,
                                               preset_layers=match.num_layers)


def load_model_config(value: str, seq_length: int = 4096) -> ModelConfig:
    """MODEL_CONFIG: a folder holding config.json, a config.json, or an import folder (its
    record holds the source's config). ConfigError, one line, for anything else."""
    path = Path(value).expanduser()
    if path.is_dir() and (path / IMPORT_RECORD).is_file():
        record = _read(path / IMPORT_RECORD, "import record")
        config = record.get("hf_config")
        if not isinstance(config, dict):
            raise ConfigError(f"{path / IMPORT_RECORD} holds no hf_config: import the checkpoint "
                              "again with `python -m training.checkpoint import`")
        name = record.get("name") or shape_name(path)
        shape = shape_from_hf_config(config, name, seq_length)
        return ModelConfig(shape, config, path / IMPORT_RECORD, "import", record)
    if path.is_dir():
        path = path / CONFIG
        if not path.is_file():
            raise ConfigError(f"MODEL_CONFIG={value}: the folder holds neither config.json nor "
                              f"{IMPORT_RECORD}: give a Hugging Face model folder, its "
                              "config.json, or an import")
    elif not path.is_file():
        raise ConfigError(f"MODEL_CONFIG={value}: no such file or folder: give a Hugging Face "
                          "model folder, its config.json, or an import")
    config = _read(path, "Hugging Face config.json")
    shape = shape_from_hf_config(config, shape_name(path), seq_length)
    return ModelConfig(published(shape), config, path, "config")
