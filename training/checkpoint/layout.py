"""The Llama tensors of Hugging Face and of Megatron's GPTModel, and the map between them.

Megatron's layout differs from Hugging Face's in two tensors of each layer:
  linear_qkv  one matrix, rows grouped per query group: [q heads of group g, k_g, v_g]
  linear_fc1  gate and up projections stacked (gate first: SwiGLU is silu(gate) * up)
and in the names of the two norms, which Megatron files under the linear they feed
(linear_qkv.layer_norm_weight, linear_fc1.layer_norm_weight: the Transformer Engine spec fuses
them there, and the local spec maps its own names onto these in its sharded state dict).

In the distributed checkpoint all layers of one tensor form a single global tensor with a
leading layer axis (Megatron's sharded_state_dict); here each layer is one chunk of it. Every
row of a Megatron tensor is one row of one Hugging Face tensor, so each Megatron tensor is a
stack of row blocks of Hugging Face tensors: that one plan drives both the import (rows read
into place) and the export (rows copied back out).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# Llama 3.1's frequency scaling: the values Megatron's RotaryEmbedding hard-codes beside
# --rope-scaling-factor (megatron/core/models/common/embeddings/rotary_pos_embedding.py).
LLAMA31_ROPE_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}

EMBEDDING = "embedding.word_embeddings.weight"
FINAL_NORM = "decoder.final_layernorm.weight"
OUTPUT = "output_layer.weight"
QKV = "decoder.layers.self_attention.linear_qkv.weight"
INPUT_NORM = "decoder.layers.self_attention.linear_qkv.layer_norm_weight"
PROJ = "decoder.layers.self_attention.linear_proj.weight"
FC1 = "decoder.layers.mlp.linear_fc1.weight"
MLP_NORM = "decoder.layers.mlp.linear_fc1.layer_norm_weight"
FC2 = "decoder.layers.mlp.linear_fc2.weight"
LAYER_KEYS = (QKV, INPUT_NORM, PROJ, FC1, MLP_NORM, FC2)
# Megatron's linear layers (local spec and TE spec alike) each save an `_extra_state` object
# per layer (None without fp8); a load asks for them, so the import writes them.
EXTRA_STATE_KEYS = tuple(f"decoder.layers.{m}._extra_state" for m in (
    "self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1",
    "mlp.linear_fc2"))
# The final norm is Transformer Engine's RMSNorm (Megatron's TENorm) under the TE spec, and
# under the local spec where TE is installed (megatron/core/transformer/transformer_block.py
# LayerNormImpl): its fp8 metadata is one more object, which a strict load asks for. Written
# as None too (TE's set_extra_state skips None: fresh fp8 metadata, as a new run's); a spec
# whose final norm keeps no extra state leaves it unread.
FINAL_NORM_EXTRA_STATE = "decoder.final_layernorm._extra_state"

HF_EMBEDDING, HF_NORM, HF_HEAD = "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"
HF_LAYER_PARTS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                  "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
                  "post_attention_layernorm")


def hf_name(layer: int, part: str) -> str:
    return f"model.layers.{layer}.{part}.weight"


class ArchitectureError(ValueError):
    """A config that is not a Llama this package converts (message printed as is)."""


@dataclass(frozen=True)
class Architecture:
    """What fixes a Llama's tensors and numerics, in Megatron's terms."""

    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    vocab_size: int
    max_position_embeddings: int
    rotary_base: float
    norm_epsilon: float
    rope_scaling: dict | None = None    # LLAMA31_ROPE_SCALING or None
    head_dim: int | None = None         # None: hidden_size // num_attention_heads
    tied_embeddings: bool = False
    linear_bias: bool = False
    activation: str = "silu"

    def __post_init__(self):
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)

    @property
    def kv_channels(self) -> int:
        return self.head_dim

    def differences(self, other: "Architecture", ignore: tuple[str, ...] = ("num_layers",)
                    ) -> list[str]:
        """'field: ours vs theirs' for every field that differs."""
        out = []
        for f in dataclasses.fields(self):
            if f.name in ignore:
                continue
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if mine != theirs:
                out.append(f"{f.name}: {_fmt(mine)} vs {_fmt(theirs)}")
        return out

    @classmethod
    def from_preset(cls, preset, num_layers: int | None = None) -> "Architecture":
        return cls(num_layers=num_layers or preset.num_layers, hidden_size=preset.hidden_size,
                   ffn_hidden_size=preset.ffn_hidden_size,
                   num_attention_heads=preset.num_attention_heads,
                   num_query_groups=preset.num_query_groups, vocab_size=preset.vocab_size,
                   max_position_embeddings=preset.max_position_embeddings,
                   rotary_base=float(preset.rotary_base), norm_epsilon=preset.norm_epsilon,
                   rope_scaling=dict(LLAMA31_ROPE_SCALING) if preset.rope_scaling else None)

    @classmethod
    def from_hf_config(cls, config: dict) -> "Architecture":
        """From a config.json (transformers 4's rope_theta/rope_scaling or 5's rope_parameters)."""
        kind = config.get("model_type")
        if kind != "llama" and "LlamaForCausalLM" not in (config.get("architectures") or []):
            raise ArchitectureError(f"not a Llama checkpoint: config.json has model_type "
                                    f"{kind!r} (this converts model_type 'llama')")
        missing = [k for k in ("num_hidden_layers", "hidden_size", "intermediate_size",
                               "num_attention_heads", "vocab_size") if k not in config]
        if missing:
            raise ArchitectureError(f"config.json lacks {', '.join(missing)}: not a complete "
                                    "Llama config")
        from training.records import HFConfig, RecordError, validate

        try:
            validate(config, HFConfig, "config.json")
        except RecordError as err:
            raise ArchitectureError(str(err)) from None
        rope = config.get("rope_parameters") or {}
        theta = config.get("rope_theta", rope.get("rope_theta", 10000.0))
        heads = config["num_attention_heads"]
        return cls(num_layers=config["num_hidden_layers"], hidden_size=config["hidden_size"],
                   ffn_hidden_size=config["intermediate_size"], num_attention_heads=heads,
                   num_query_groups=config.get("num_key_value_heads") or heads,
                   vocab_size=config["vocab_size"],
                   max_position_embeddings=config.get("max_position_embeddings", 2048),
                   rotary_base=float(theta), norm_epsilon=float(config.get("rms_norm_eps", 1e-6)),
                   rope_scaling=_rope_scaling(config.get("rope_scaling") or rope),
                   head_dim=config.get("head_dim") or None,
                   tied_embeddings=bool(config.get("tie_word_embeddings", False)),
                   linear_bias=bool(config.get("attention_bias") or config.get("mlp_bias")),
                   activation=config.get("hidden_act", "silu"))

    def hf_config_fields(self) -> dict:
        """The architecture part of a config.json, in the spelling every transformers reads
        (rope_theta and rope_scaling; transformers 5 turns them into rope_parameters)."""
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                "num_hidden_layers": self.num_layers, "hidden_size": self.hidden_size,
                "intermediate_size": self.ffn_hidden_size,
                "num_attention_heads": self.num_attention_heads,
                "num_key_value_heads": self.num_query_groups, "head_dim": self.kv_channels,
                "vocab_size": self.vocab_size,
                "max_position_embeddings": self.max_position_embeddings,
                "rope_theta": self.rotary_base, "rope_scaling": self.rope_scaling,
                "rms_norm_eps": self.norm_epsilon, "hidden_act": self.activation,
                "tie_word_embeddings": self.tied_embeddings, "attention_bias": self.linear_bias,
                "mlp_bias": self.linear_bias}


def _rope_scaling(params: dict) -> dict | None:
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return None
    out = {"rope_type": kind}
    for key in ("factor", "low_freq_factor", "high_freq_factor"):
        if key in params:
            out[key] = float(params[key])
    if "original_max_position_embeddings" in params:
        out["original_max_position_embeddings"] = int(params["original_max_position_embeddings"])
    return out


def _fmt(value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={v}" for k, v in value.items() if k != "rope_type") + "}"
    return str(value)


def match_preset(arch: Architecture, presets: dict, name: str | None = None):
    """The preset this architecture is (its layer count may differ: NUM_LAYERS); raises
    ArchitectureError naming the differing fields of the named (or nearest) preset."""
    # MoE presets (training/moe registers them into the same table) have experts this Llama
    # mapping does not write: never a match (training/moe/hf_qwen3_moe.py maps Qwen3-MoE)
    if name and getattr(presets[name], "num_experts", None):
        raise ArchitectureError(f"preset {name} is a mixture of experts: this import maps "
                                "Llama checkpoints only")
    candidates = ([presets[name]] if name else
                  [p for p in presets.values() if not getattr(p, "num_experts", None)])
    diffs = {p.name: Architecture.from_preset(p).differences(arch) for p in candidates}
    exact = [p for p in candidates if not diffs[p.name]]
    if exact:
        return exact[0]
    nearest = min(candidates, key=lambda p: len(diffs[p.name]))
    what = f"preset {nearest.name}" if name else f"any preset (nearest: {nearest.name})"
    raise ArchitectureError(f"the Hugging Face config does not match {what}: "
                            f"{'; '.join(diffs[nearest.name])} (preset vs config.json)")


# -- the tensors -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Block:
    """Rows [row, row + rows) of a Hugging Face tensor."""

    hf_name: str
    row: int
    rows: int


@dataclass(frozen=True)
class MegatronTensor:
    """One chunk of a dist-checkpoint tensor: rows [row, row + rows) of a whole tensor, or of
    one layer of a stacked one (all its rows unless split_rows cut it)."""

    key: str
    shape: tuple[int, ...]          # the tensor's (one layer's) shape, without the layer axis
    blocks: tuple[Block, ...]       # this chunk's rows, stacked along dim 0, in order
    layer: int | None = None
    num_layers: int | None = None
    row: int = 0                    # this chunk's first row

    @property
    def rows(self) -> int:
        return sum(b.rows for b in self.blocks)

    @property
    def global_shape(self) -> tuple[int, ...]:
        return self.shape if self.layer is None else (self.num_layers, *self.shape)

    @property
    def chunk_shape(self) -> tuple[int, ...]:
        piece = (self.rows, *self.shape[1:])
        return piece if self.layer is None else (1, *piece)

    @property
    def offsets(self) -> tuple[int, ...]:
        rows = (self.row,) + (0,) * (len(self.shape) - 1)
        return rows if self.layer is None else (self.layer, *rows)

    def numel(self) -> int:
        n = 1
        for d in self.chunk_shape:
            n *= d
        return n


def split_rows(tensors: list[MegatronTensor], max_bytes: int, itemsize: int
               ) -> list[MegatronTensor]:
    """Chunks of at most max_bytes (at least one row each): a chunk larger than that becomes
    consecutive row ranges, each its own chunk of the global tensor (Megatron's loader
    reshards from any chunking, as it does from a save at another TP)."""
    out = []
    for t in tensors:
        row_bytes = t.numel() // t.rows * itemsize
        step = max(1, max_bytes // row_bytes)
        if t.rows <= step:
            out.append(t)
            continue
        start = 0
        while start < t.rows:
            out.append(dataclasses.replace(t, blocks=_slice_blocks(t.blocks, start, step),
                                           row=t.row + start))
            start += step
    return out


def _slice_blocks(blocks: tuple[Block, ...], start: int, count: int) -> tuple[Block, ...]:
    """Rows [start, start + count) of a stack of blocks, as blocks."""
    out, at = [], 0
    for b in blocks:
        lo, hi = max(start, at), min(start + count, at + b.rows)
        if lo < hi:
            out.append(Block(b.hf_name, b.row + lo - at, hi - lo))
        at += b.rows
    return tuple(out)


def hf_shapes(arch: Architecture) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face tensor of this architecture and its shape, in file order."""
    h, ffn, hd = arch.hidden_size, arch.ffn_hidden_size, arch.kv_channels
    q_rows, kv_rows = arch.num_attention_heads * hd, arch.num_query_groups * hd
    shapes = {HF_EMBEDDING: (arch.vocab_size, h)}
    per_layer = {"self_attn.q_proj": (q_rows, h), "self_attn.k_proj": (kv_rows, h),
                 "self_attn.v_proj": (kv_rows, h), "self_attn.o_proj": (h, q_rows),
                 "mlp.gate_proj": (ffn, h), "mlp.up_proj": (ffn, h), "mlp.down_proj": (h, ffn),
                 "input_layernorm": (h,), "post_attention_layernorm": (h,)}
    for layer in range(arch.num_layers):
        for part in HF_LAYER_PARTS:
            shapes[hf_name(layer, part)] = per_layer[part]
    shapes[HF_NORM] = (h,)
    shapes[HF_HEAD] = (arch.vocab_size, h)
    return shapes


def megatron_tensors(arch: Architecture) -> list[MegatronTensor]:
    """The Megatron chunks of this architecture, in the order the import writes them."""
    if arch.num_attention_heads % arch.num_query_groups:
        raise ArchitectureError(f"{arch.num_attention_heads} attention heads do not divide into "
                                f"{arch.num_query_groups} key/value groups")
    h, ffn, hd, L = arch.hidden_size, arch.ffn_hidden_size, arch.kv_channels, arch.num_layers
    groups = arch.num_query_groups
    per_group = arch.num_attention_heads // groups
    q_rows = arch.num_attention_heads * hd

    def whole(name: str, rows: int) -> tuple[Block, ...]:
        return (Block(name, 0, rows),)

    out = [MegatronTensor(EMBEDDING, (arch.vocab_size, h), whole(HF_EMBEDDING, arch.vocab_size))]
    for layer in range(L):
        def name(part: str) -> str:
            return hf_name(layer, part)

        qkv = []
        for g in range(groups):
            qkv += [Block(name("self_attn.q_proj"), g * per_group * hd, per_group * hd),
                    Block(name("self_attn.k_proj"), g * hd, hd),
                    Block(name("self_attn.v_proj"), g * hd, hd)]
        chunks = {
            QKV: ((q_rows + 2 * groups * hd, h), tuple(qkv)),
            INPUT_NORM: ((h,), whole(name("input_layernorm"), h)),
            PROJ: ((h, q_rows), whole(name("self_attn.o_proj"), h)),
            FC1: ((2 * ffn, h), (Block(name("mlp.gate_proj"), 0, ffn),
                                 Block(name("mlp.up_proj"), 0, ffn))),
            MLP_NORM: ((h,), whole(name("post_attention_layernorm"), h)),
            FC2: ((h, ffn), whole(name("mlp.down_proj"), h)),
        }
        for key in LAYER_KEYS:
            shape, blocks = chunks[key]
            out.append(MegatronTensor(key, shape, blocks, layer, L))
    out.append(MegatronTensor(FINAL_NORM, (h,), whole(HF_NORM, h)))
    out.append(MegatronTensor(OUTPUT, (arch.vocab_size, h), whole(HF_HEAD, arch.vocab_size)))
    return out


def extra_state_keys(num_layers: int) -> list[str]:
    """The unique keys of the `_extra_state` objects the import writes
    (ShardedObject.unique_key): the per-layer ones and the final norm's."""
    return [f"{key}/shard_{layer}_{num_layers}" for layer in range(num_layers)
            for key in EXTRA_STATE_KEYS] + [f"{FINAL_NORM_EXTRA_STATE}/shard_0_1"]
