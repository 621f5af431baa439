"""The tensors of Hugging Face's decoder families and of Megatron's GPTModel, and the map
between them: one conversion table per family, both directions.

Families (model_type): llama, mistral (a Llama without a sliding window), qwen2 (q/k/v biases),
qwen3 (q/k norms, its own head dim), qwen3_moe and mixtral (experts); tied or untied
embeddings. Their config.json is read into a shape by training/launch/model_config.py (the
launcher reads MODEL_CONFIG with the same function), which refuses what Megatron cannot express.

Megatron's layout differs from Hugging Face's in a few tensors of each layer:
  linear_qkv  one matrix, rows grouped per query group: [q heads of group g, k_g, v_g]
              (its bias, Qwen2's, the same way)
  linear_fc1  gate and up projections stacked (gate first: SwiGLU is silu(gate) * up)
  experts     each projection of every expert of a layer in one tensor [experts, out, in]
              (what the native grouped experts, TEGroupedMLP and SequentialMLP save), fc1 of
              each expert its gate and up stacked; Hugging Face keeps one tensor per expert
and in the names of the two norms, which Megatron files under the linear they feed
(linear_qkv.layer_norm_weight, linear_fc1.layer_norm_weight: the Transformer Engine spec fuses
them there, and the local spec maps its own names onto these in its sharded state dict).

In the distributed checkpoint all layers of one tensor form a single global tensor with a
leading layer axis (Megatron's sharded_state_dict); here each layer is one chunk of it. Every
row of a Megatron tensor (seen as 2-D: [all but its last axis, last axis]) is one row of one
Hugging Face tensor, so each Megatron tensor is a stack of row blocks of Hugging Face tensors:
that one plan drives both the import (rows read into place) and the export (rows copied back).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# Llama 3's frequency scaling: the constants Megatron's RotaryEmbedding hard-codes beside
# --rope-scaling-factor (megatron/core/models/common/embeddings/rotary_pos_embedding.py);
# the factor is the model's (8 for Llama 3.1, 32 for Llama 3.2).
LLAMA31_ROPE_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}

EMBEDDING = "embedding.word_embeddings.weight"
FINAL_NORM = "decoder.final_layernorm.weight"
OUTPUT = "output_layer.weight"
QKV = "decoder.layers.self_attention.linear_qkv.weight"
QKV_BIAS = "decoder.layers.self_attention.linear_qkv.bias"
Q_NORM = "decoder.layers.self_attention.q_layernorm.weight"
K_NORM = "decoder.layers.self_attention.k_layernorm.weight"
INPUT_NORM = "decoder.layers.self_attention.linear_qkv.layer_norm_weight"
PROJ = "decoder.layers.self_attention.linear_proj.weight"
FC1 = "decoder.layers.mlp.linear_fc1.weight"
MLP_NORM = "decoder.layers.mlp.linear_fc1.layer_norm_weight"
FC2 = "decoder.layers.mlp.linear_fc2.weight"
ROUTER = "decoder.layers.mlp.router.weight"
EXPERT_FC1 = "decoder.layers.mlp.experts.experts.linear_fc1.weight"
EXPERT_FC2 = "decoder.layers.mlp.experts.experts.linear_fc2.weight"
LAYER_KEYS = (QKV, INPUT_NORM, PROJ, FC1, MLP_NORM, FC2)     # a plain Llama's
# Megatron's linear layers (local spec and TE spec alike) each save an `_extra_state` object
# per layer (None without fp8); a load asks for them, so the import writes them. An MoE layer
# has its attention's two (the native grouped experts and the router keep none).
ATTENTION_LINEARS = ("self_attention.linear_qkv", "self_attention.linear_proj")
MLP_LINEARS = ("mlp.linear_fc1", "mlp.linear_fc2")
EXTRA_STATE_KEYS = tuple(f"decoder.layers.{m}._extra_state"
                         for m in ATTENTION_LINEARS + MLP_LINEARS)
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


def hf_name(layer: int, part: str, kind: str = "weight") -> str:
    return f"model.layers.{layer}.{part}.{kind}"


@dataclass(frozen=True)
class ExpertNames:
    """Where a family keeps its router and experts in a Hugging Face checkpoint."""
    block: str          # the layer's MoE module: mlp | block_sparse_moe
    gate: str           # each expert's gate projection (SwiGLU's silu input)
    up: str
    down: str


EXPERT_NAMES = {"qwen3_moe": ExpertNames("mlp", "gate_proj", "up_proj", "down_proj"),
                "mixtral": ExpertNames("block_sparse_moe", "w1", "w3", "w2")}
# Either family's experts fused, per layer (transformers 5's modules, both families alike):
# the router mlp.gate.weight [E, hidden]; mlp.experts.gate_up_proj [E, 2F, hidden], each
# expert's gate rows then its up rows (Megatron's linear_fc1 row for row); mlp.experts.down_proj
# [E, hidden, F] (Megatron's linear_fc2)
FUSED_EXPERTS = ("mlp.gate.weight", "mlp.experts.gate_up_proj", "mlp.experts.down_proj")


class ArchitectureError(ValueError):
    """A config this package does not convert (message printed as is)."""


def _family_of(model) -> str:
    """The conversion table of a shape with no config.json behind it (a preset's)."""
    if model.num_experts:
        return "qwen3_moe" if model.qk_layernorm else "mixtral"
    if model.qk_layernorm:
        return "qwen3"
    return "qwen2" if model.qkv_bias else "llama"


@dataclass(frozen=True)
class Architecture:
    """What fixes a decoder's tensors and numerics, in Megatron's terms, and its family's
    conversion table (`family`: config.json's model_type)."""

    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    vocab_size: int
    max_position_embeddings: int
    rotary_base: float
    norm_epsilon: float
    rope_scaling: dict | None = None    # Llama 3's scaling (LLAMA31_ROPE_SCALING, its factor)
    head_dim: int | None = None         # None: hidden_size // num_attention_heads
    tied_embeddings: bool = False
    qkv_bias: bool = False
    qk_layernorm: bool = False
    num_experts: int = 0
    router_topk: int = 0
    moe_ffn_hidden_size: int = 0
    family: str = "llama"
    architecture: str = "LlamaForCausalLM"   # the Hugging Face class an export names
    # the Hugging Face folder holds each layer's experts fused (FUSED_EXPERTS), as transformers
    # 5 keeps them in memory and saves them with save_original_format=False; else one tensor
    # per expert, the published form. Read from the files, not the config: not part of a shape.
    fused_experts: bool = False

    def __post_init__(self):
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)

    @property
    def kv_channels(self) -> int:
        return self.head_dim

    @property
    def moe(self) -> bool:
        return bool(self.num_experts)

    def differences(self, other: "Architecture",
                    ignore: tuple[str, ...] = ("num_layers", "family", "architecture",
                                               "fused_experts")
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
    def from_model(cls, model, num_layers: int | None = None, family: str | None = None,
                   architecture: str | None = None) -> "Architecture":
        """From a shape (training.run_description.Model: a preset, or MODEL_CONFIG's)."""
        from training.launch.model_config import HF_FAMILIES

        family = family or _family_of(model)
        return cls(num_layers=num_layers or model.num_layers, hidden_size=model.hidden_size,
                   ffn_hidden_size=model.ffn_hidden_size,
                   num_attention_heads=model.num_attention_heads,
                   num_query_groups=model.num_query_groups, vocab_size=model.vocab_size,
                   max_position_embeddings=model.max_position_embeddings,
                   rotary_base=float(model.rotary_base), norm_epsilon=model.norm_epsilon,
                   rope_scaling=(dict(LLAMA31_ROPE_SCALING,
                                      factor=float(getattr(model, "rope_scaling_factor", 8.0)))
                                 if model.rope_scaling else None),
                   head_dim=model.head_dim,
                   tied_embeddings=bool(getattr(model, "tied_embeddings", False)),
                   qkv_bias=bool(getattr(model, "qkv_bias", False)),
                   qk_layernorm=bool(model.qk_layernorm), num_experts=model.num_experts or 0,
                   router_topk=model.router_topk if model.num_experts else 0,
                   moe_ffn_hidden_size=model.moe_ffn_hidden_size if model.num_experts else 0,
                   family=family,
                   architecture=architecture or HF_FAMILIES[family].architecture)

    from_preset = from_model

    def to_model_fields(self) -> dict:
        """The shape's fields as training.run_description.Model spells them (the record's
        `preset_fields`, which the launcher's pretrained_checkpoint guard compares)."""
        scaling = self.rope_scaling or {}
        default_head = self.hidden_size // self.num_attention_heads
        return {"hidden_size": self.hidden_size, "ffn_hidden_size": self.ffn_hidden_size,
                "num_attention_heads": self.num_attention_heads,
                "num_query_groups": self.num_query_groups, "vocab_size": self.vocab_size,
                "max_position_embeddings": self.max_position_embeddings,
                "rotary_base": self.rotary_base, "norm_epsilon": self.norm_epsilon,
                "rope_scaling": bool(scaling),
                "rope_scaling_factor": float(scaling.get("factor", 8.0)),
                "kv_channels": None if self.head_dim == default_head else self.head_dim,
                "tied_embeddings": self.tied_embeddings, "qkv_bias": self.qkv_bias,
                "qk_layernorm": self.qk_layernorm, "num_experts": self.num_experts or None,
                "router_topk": self.router_topk, "moe_ffn_hidden_size": self.moe_ffn_hidden_size}

    @classmethod
    def from_hf_config(cls, config: dict) -> "Architecture":
        """From a config.json (transformers 4's rope_theta/rope_scaling or 5's
        rope_parameters), read as the launcher reads MODEL_CONFIG."""
        from training.launch.model_config import ConfigError, shape_from_hf_config

        try:
            shape = shape_from_hf_config(config, "import")
        except ConfigError as err:
            raise ArchitectureError(str(err)) from None
        names = config.get("architectures") or []
        return cls.from_model(shape, family=config["model_type"],
                              architecture=names[0] if len(names) == 1 else None)

    def hf_config_fields(self) -> dict:
        """The architecture part of a config.json, in the spelling every transformers reads
        (rope_theta and rope_scaling; transformers 5 turns them into rope_parameters)."""
        fields = {"architectures": [self.architecture], "model_type": self.family,
                  "num_hidden_layers": self.num_layers, "hidden_size": self.hidden_size,
                  "intermediate_size": self.ffn_hidden_size,
                  "num_attention_heads": self.num_attention_heads,
                  "num_key_value_heads": self.num_query_groups,
                  "vocab_size": self.vocab_size,
                  "max_position_embeddings": self.max_position_embeddings,
                  "rope_theta": self.rotary_base, "rope_scaling": self.rope_scaling,
                  "rms_norm_eps": self.norm_epsilon, "hidden_act": "silu",
                  "tie_word_embeddings": self.tied_embeddings}
        if self.head_dim != self.hidden_size // self.num_attention_heads:
            fields["head_dim"] = self.head_dim     # else each family's default (or the source's)
        if self.family in ("llama", "qwen3", "qwen3_moe"):
            fields["attention_bias"] = False
        if self.family == "llama":
            fields["mlp_bias"] = False
        if self.family in ("mistral", "mixtral"):
            fields["sliding_window"] = None
        if self.family == "qwen3_moe":
            fields.update(num_experts=self.num_experts, num_experts_per_tok=self.router_topk,
                          moe_intermediate_size=self.moe_ffn_hidden_size, norm_topk_prob=True)
        if self.family == "mixtral":
            fields.update(num_local_experts=self.num_experts,
                          num_experts_per_tok=self.router_topk)
        return fields


def _fmt(value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={v}" for k, v in value.items() if k != "rope_type") + "}"
    return str(value)


def match_preset(arch: Architecture, presets: dict, name: str | None = None):
    """The preset this architecture is (its layer count may differ: NUM_LAYERS); raises
    ArchitectureError naming the differing fields of the named (or nearest) preset."""
    candidates = [presets[name]] if name else list(presets.values())
    diffs = {p.name: Architecture.from_model(p).differences(arch) for p in candidates}
    exact = [p for p in candidates if not diffs[p.name]]
    if exact:
        return exact[0]
    nearest = min(candidates, key=lambda p: len(diffs[p.name]))
    what = f"preset {nearest.name}" if name else f"any preset (nearest: {nearest.name})"
    raise ArchitectureError(f"the Hugging Face config does not match {what}: "
                            f"{'; '.join(diffs[nearest.name])} (preset vs config.json)")


def matching_preset(arch: Architecture, presets: dict):
    """The preset of this shape (layer count aside), or None."""
    return next((p for p in presets.values()
                 if not Architecture.from_model(p).differences(arch)), None)


# -- the tensors -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Block:
    """Rows [row, row + rows) of a Hugging Face tensor seen as 2-D (a 1-D tensor: its
    elements)."""

    hf_name: str
    row: int
    rows: int


def flat_rows(shape: tuple[int, ...]) -> int:
    """The rows of a tensor of this shape seen as 2-D ([all but the last axis, last axis];
    a 1-D tensor's elements)."""
    n = 1
    for d in shape[:-1] if len(shape) > 1 else shape:
        n *= d
    return n


@dataclass(frozen=True)
class MegatronTensor:
    """One chunk of a dist-checkpoint tensor: rows [row, row + rows) along the first axis of a
    whole tensor, or of one layer of a stacked one (all of them unless split_rows cut it).
    Its blocks are rows of it seen as 2-D (an expert tensor's first-axis row is one expert:
    several blocks)."""

    key: str
    shape: tuple[int, ...]          # the tensor's (one layer's) shape, without the layer axis
    blocks: tuple[Block, ...]       # this chunk's 2-D rows, stacked, in order
    layer: int | None = None
    num_layers: int | None = None
    row: int = 0                    # this chunk's first row along the first axis

    @property
    def per_row(self) -> int:
        """2-D rows in one row of the first axis."""
        return flat_rows(self.shape) // self.shape[0]

    @property
    def rows(self) -> int:
        return sum(b.rows for b in self.blocks) // self.per_row

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
    """Chunks of at most max_bytes (at least one first-axis row each): a chunk larger than
    that becomes consecutive row ranges, each its own chunk of the global tensor (Megatron's
    loader reshards from any chunking, as it does from a save at another TP)."""
    out = []
    for t in tensors:
        row_bytes = t.numel() // t.rows * itemsize
        step = max(1, max_bytes // row_bytes)
        if t.rows <= step:
            out.append(t)
            continue
        start = 0
        while start < t.rows:
            count = min(step, t.rows - start)
            out.append(dataclasses.replace(
                t, blocks=_slice_blocks(t.blocks, start * t.per_row, count * t.per_row),
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


def qkv_blocks(q: str, k: str, v: str, groups: int, per_group: int, head_dim: int
               ) -> tuple[Block, ...]:
    """Megatron's linear_qkv rows (weight or bias) from Hugging Face's q, k and v: per query
    group g, its query heads, then k_g, then v_g."""
    out = []
    for g in range(groups):
        out += [Block(q, g * per_group * head_dim, per_group * head_dim),
                Block(k, g * head_dim, head_dim), Block(v, g * head_dim, head_dim)]
    return tuple(out)


def _layer_table(arch: Architecture, layer: int) -> list[tuple[str, tuple, tuple, tuple]]:
    """The family's conversion table for one layer: (Megatron key, Megatron shape, its blocks,
    the Hugging Face tensors and shapes it reads) in the order the import writes them."""
    h, ffn, hd = arch.hidden_size, arch.ffn_hidden_size, arch.kv_channels
    groups = arch.num_query_groups
    per_group = arch.num_attention_heads // groups
    q_rows, kv_rows = arch.num_attention_heads * hd, groups * hd

    def name(part: str, kind: str = "weight") -> str:
        return hf_name(layer, part, kind)

    def grouped(kind: str) -> tuple[Block, ...]:
        return qkv_blocks(*(name(f"self_attn.{p}_proj", kind) for p in "qkv"), groups,
                          per_group, hd)

    def whole(hf: str, shape: tuple) -> tuple:
        return (Block(hf, 0, flat_rows(shape)),), {hf: shape}

    qkv_shape = (q_rows + 2 * kv_rows, h)
    rows = [(QKV, qkv_shape, grouped("weight"),
             {name("self_attn.q_proj"): (q_rows, h), name("self_attn.k_proj"): (kv_rows, h),
              name("self_attn.v_proj"): (kv_rows, h)})]
    if arch.qkv_bias:
        rows.append((QKV_BIAS, (q_rows + 2 * kv_rows,), grouped("bias"),
                     {name("self_attn.q_proj", "bias"): (q_rows,),
                      name("self_attn.k_proj", "bias"): (kv_rows,),
                      name("self_attn.v_proj", "bias"): (kv_rows,)}))
    rows.append((INPUT_NORM, (h,), *whole(name("input_layernorm"), (h,))))
    if arch.qk_layernorm:
        rows.append((Q_NORM, (hd,), *whole(name("self_attn.q_norm"), (hd,))))
        rows.append((K_NORM, (hd,), *whole(name("self_attn.k_norm"), (hd,))))
    rows.append((PROJ, (h, q_rows), *whole(name("self_attn.o_proj"), (h, q_rows))))
    rows.append((MLP_NORM, (h,), *whole(name("post_attention_layernorm"), (h,))))
    if not arch.moe:
        rows.append((FC1, (2 * ffn, h),
                     (Block(name("mlp.gate_proj"), 0, ffn), Block(name("mlp.up_proj"), 0, ffn)),
                     {name("mlp.gate_proj"): (ffn, h), name("mlp.up_proj"): (ffn, h)}))
        rows.append((FC2, (h, ffn), *whole(name("mlp.down_proj"), (h, ffn))))
        return rows
    e, f = arch.num_experts, arch.moe_ffn_hidden_size
    if arch.fused_experts:
        router, gate_up, down = (f"model.layers.{layer}.{part}" for part in FUSED_EXPERTS)
        rows.append((ROUTER, (e, h), *whole(router, (e, h))))
        rows.append((EXPERT_FC1, (e, 2 * f, h), *whole(gate_up, (e, 2 * f, h))))
        rows.append((EXPERT_FC2, (e, h, f), *whole(down, (e, h, f))))
        return rows
    names = EXPERT_NAMES[arch.family]
    rows.append((ROUTER, (e, h), *whole(name(f"{names.block}.gate"), (e, h))))
    fc1, fc2, reads1, reads2 = [], [], {}, {}
    for x in range(e):
        expert = f"{names.block}.experts.{x}"
        fc1 += [Block(name(f"{expert}.{names.gate}"), 0, f),
                Block(name(f"{expert}.{names.up}"), 0, f)]
        fc2.append(Block(name(f"{expert}.{names.down}"), 0, h))
        reads1.update({name(f"{expert}.{names.gate}"): (f, h), name(f"{expert}.{names.up}"): (f, h)})
        reads2[name(f"{expert}.{names.down}")] = (h, f)
    rows.append((EXPERT_FC1, (e, 2 * f, h), tuple(fc1), reads1))
    rows.append((EXPERT_FC2, (e, h, f), tuple(fc2), reads2))
    return rows


def layer_keys(arch: Architecture) -> tuple[str, ...]:
    """The Megatron keys of one layer of this architecture."""
    return tuple(row[0] for row in _layer_table(arch, 0))


def hf_shapes(arch: Architecture) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face tensor of this architecture and its shape, in file order."""
    h = arch.hidden_size
    shapes = {HF_EMBEDDING: (arch.vocab_size, h)}
    for layer in range(arch.num_layers):
        for *_, reads in _layer_table(arch, layer):
            shapes.update(reads)
    shapes[HF_NORM] = (h,)
    if not arch.tied_embeddings:
        shapes[HF_HEAD] = (arch.vocab_size, h)
    return shapes


def megatron_tensors(arch: Architecture) -> list[MegatronTensor]:
    """The Megatron chunks of this architecture, in the order the import writes them."""
    if arch.num_attention_heads % arch.num_query_groups:
        raise ArchitectureError(f"{arch.num_attention_heads} attention heads do not divide into "
                                f"{arch.num_query_groups} key/value groups")
    h, L = arch.hidden_size, arch.num_layers
    out = [MegatronTensor(EMBEDDING, (arch.vocab_size, h),
                          (Block(HF_EMBEDDING, 0, arch.vocab_size),))]
    for layer in range(L):
        for key, shape, blocks, _ in _layer_table(arch, layer):
            out.append(MegatronTensor(key, shape, blocks, layer, L))
    out.append(MegatronTensor(FINAL_NORM, (h,), (Block(HF_NORM, 0, h),)))
    if not arch.tied_embeddings:   # tied: Megatron's output layer is the embedding
        out.append(MegatronTensor(OUTPUT, (arch.vocab_size, h),
                                  (Block(HF_HEAD, 0, arch.vocab_size),)))
    return out


def extra_state_keys(num_layers: int, moe: bool = False) -> list[str]:
    """The unique keys of the `_extra_state` objects the import writes
    (ShardedObject.unique_key): the per-layer ones and the final norm's."""
    linears = ATTENTION_LINEARS if moe else ATTENTION_LINEARS + MLP_LINEARS
    return [f"decoder.layers.{m}._extra_state/shard_{layer}_{num_layers}"
            for layer in range(num_layers) for m in linears] + \
        [f"{FINAL_NORM_EXTRA_STATE}/shard_0_1"]


# -- a table in memory (state dicts) -------------------------------------------------------------

def table_to_megatron(rows, hf_tensors: dict) -> dict:
    """A conversion table's rows ((Megatron key, shape, blocks, reads), as _layer_table's) applied
    to Hugging Face tensors in memory: each Megatron tensor its blocks' rows, stacked."""
    import torch

    out = {}
    for key, shape, blocks, _reads in rows:
        parts = [rows_view(hf_tensors[b.hf_name].contiguous())[b.row:b.row + b.rows]
                 for b in blocks]
        out[key] = torch.cat(parts).reshape(shape) if len(parts) > 1 else \
            parts[0].reshape(shape).clone()
    return out


def table_to_hf(rows, megatron_tensors: dict) -> dict:
    """The same table the other way: each Hugging Face tensor (its shape in `reads`) filled
    from the rows of the Megatron tensors its blocks are in."""
    import torch

    out: dict = {}
    for key, _shape, blocks, reads in rows:
        source, at = rows_view(megatron_tensors[key].contiguous()), 0
        for b in blocks:
            if b.hf_name not in out:
                out[b.hf_name] = torch.empty(reads[b.hf_name], dtype=source.dtype)
            rows_view(out[b.hf_name])[b.row:b.row + b.rows] = source[at:at + b.rows]
            at += b.rows
    return out


def rows_view(tensor):
    """A tensor seen as 2-D rows, Block's rows ([all but the last axis, last axis]; a 1-D
    tensor: its elements), as a view: writing into it writes the tensor."""
    return tensor.view(-1, tensor.shape[-1]) if tensor.dim() > 1 else tensor
