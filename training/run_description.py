"""The run description: what one launch resolved, typed, derived in one place.

The launcher (training/launch/) builds it from the resolved toggle values; manifest.json holds
it as its own sections (family, model, layout, values, precision, backend, ...), and every
reader builds it back from them with `RunDescription.from_dict` (manifests written before
this class existed carry the same sections and read the same way). bench, optimize, metrics
and mlperf read the run through it; nothing else re-derives world size, data parallelism,
micro-batches or tokens per step.

    RunDescription(family, model, values, platform, capabilities)
        .model     the architecture at this run's NUM_LAYERS and SEQ_LENGTH
        .layout    nodes, GPUs, TP/PP/CP, micro-batch, global batch -> world, DP, micro-batches
        .values    every toggle's resolved value, by its registry name (run["TP"])
        .with_values(TP=2)   the same run with toggles changed, derived again

Standard library only, and nothing of the launcher: both sides of the torchrun seam and every
tool that reads a run folder import it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

# Megatron pads the vocabulary to a multiple of this times TP (--make-vocab-size-divisible-by).
VOCAB_DIVISIBLE_BY = 128


@dataclass(frozen=True)
class Model:
    """A decoder's shape: a preset's (training/launch/presets.py), or a run's cut of it."""
    name: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    vocab_size: int
    max_position_embeddings: int
    seq_length: int
    rotary_base: int
    norm_epsilon: float = 1e-5
    rope_scaling: bool = False      # Llama 3's frequency scaling (rope_scaling_factor)
    num_experts: int | None = None  # None: dense
    preset_layers: int | None = None  # a run's model: its preset's own layer count
    kv_channels: int | None = None  # head dim, when it is not hidden / heads (Qwen3)
    qk_layernorm: bool = False      # RMSNorm on each head's query and key (Qwen3)
    router_topk: int = 0            # MoE: the experts each token is routed to
    moe_ffn_hidden_size: int = 0    # MoE: each expert's FFN width
    shared_expert_ffn_hidden_size: int = 0  # MoE: a shared expert's FFN width (0: none)
    rope_scaling_factor: float = 8.0  # Llama 3's factor: 8 (3.1), 32 (3.2)
    tied_embeddings: bool = False   # the output layer is the input embedding (Llama 3.2 1B)
    qkv_bias: bool = False          # biases on the q, k and v projections (Qwen2)
    # a sliding window (gpt-oss): the keys a banded layer's query sees, itself included (None:
    # every layer attends to all earlier keys), and which layers are banded, as Megatron's
    # window_attn_skip_freq says (an int N: every layer but each Nth; a 0/1 pattern per layer;
    # None: all)
    sliding_window: int | None = None
    window_skip_freq: int | tuple[int, ...] | None = None

    def __post_init__(self):  # one spelling of the default head dim (validate_args fills it in)
        if self.kv_channels == self.hidden_size // self.num_attention_heads:
            object.__setattr__(self, "kv_channels", None)
        if isinstance(self.window_skip_freq, list):   # a pattern read back from JSON
            object.__setattr__(self, "window_skip_freq", tuple(self.window_skip_freq))

    def banded(self, layer_number: int) -> bool:
        """Whether layer `layer_number` (from 1) attends within the sliding window only:
        megatron-core's is_layer_window_attention rule."""
        if not self.sliding_window:
            return False
        freq = self.window_skip_freq
        if freq is None:
            return True
        if isinstance(freq, int):
            return layer_number % freq != 0
        return bool(freq[layer_number - 1])

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def q_width(self) -> int:
        """The query projection's width: heads x head dim (the hidden size unless Qwen3)."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.num_query_groups * self.head_dim

    @property
    def moe(self) -> bool:
        return bool(self.num_experts)

    def padded_vocab(self, tp: int) -> int:
        multiple = VOCAB_DIVISIBLE_BY * tp
        return -(-self.vocab_size // multiple) * multiple

    @classmethod
    def of(cls, preset: "Model", num_layers: int | None = None,
           seq_length: int | None = None) -> "Model":
        """A preset's model at a run's layer count and sequence length."""
        own = {f.name: getattr(preset, f.name) for f in dataclasses.fields(cls)}
        own.update(num_layers=num_layers or preset.num_layers,
                   seq_length=seq_length or preset.seq_length,
                   preset_layers=preset.preset_layers or preset.num_layers)
        return cls(**own)

    @classmethod
    def from_megatron_args(cls, args) -> "Model":
        """The model Megatron's parsed arguments describe (the run side, under torchrun)."""
        groups = args.num_query_groups if args.group_query_attention else args.num_attention_heads
        experts = getattr(args, "num_experts", None)
        moe = {"router_topk": args.moe_router_topk,
               "moe_ffn_hidden_size": args.moe_ffn_hidden_size or args.ffn_hidden_size,
               "shared_expert_ffn_hidden_size": args.moe_shared_expert_intermediate_size or 0
               } if experts else {}
        return cls("megatron", args.num_layers, args.hidden_size, args.ffn_hidden_size,
                   args.num_attention_heads, groups, args.padded_vocab_size,
                   args.max_position_embeddings, args.seq_length, args.rotary_base,
                   args.layernorm_epsilon, num_experts=experts,
                   kv_channels=getattr(args, "kv_channels", None),
                   qk_layernorm=bool(getattr(args, "qk_layernorm", False)),
                   rope_scaling=bool(getattr(args, "use_rope_scaling", False)),
                   rope_scaling_factor=float(getattr(args, "rope_scaling_factor", 8.0)),
                   tied_embeddings=not getattr(args, "untie_embeddings_and_output_weights", True),
                   qkv_bias=bool(getattr(args, "add_qkv_bias", False)),
                   **_window_of_args(args), **moe)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Model":
        """From a manifest's `model` section (fields it does not know are left out)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _window_of_args(args) -> dict[str, Any]:
    """Megatron's --window-size (left, right) and --window-attn-skip-freq as Model's fields:
    a causal window (W - 1, 0) sees W keys."""
    window = getattr(args, "window_size", None)
    if not window:
        return {}
    freq = getattr(args, "window_attn_skip_freq", None)
    return {"sliding_window": int(window[0]) + 1,
            "window_skip_freq": tuple(freq) if isinstance(freq, (list, tuple)) else freq}


@dataclass(frozen=True)
class Layout:
    """How one optimizer step is spread over the GPUs."""
    nnodes: int
    gpus_per_node: int
    tp: int
    pp: int
    cp: int
    mbs: int              # micro-batch per GPU
    global_batch: int     # sequences per optimizer step

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> "Layout":
        return cls(values["NNODES"], values["GPUS_PER_NODE"], values["TP"], values["PP"],
                   values["CP"], values["MBS"], values["BS"])

    @property
    def world_size(self) -> int:
        return self.nnodes * self.gpus_per_node

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def dp(self) -> int:
        """Data-parallel ranks (at least 1; the guard parallel_sizes refuses a remainder)."""
        return max(self.world_size // max(self.model_parallel, 1), 1)

    @property
    def microbatches(self) -> int:
        """Micro-batches per optimizer step on each data-parallel rank (grad accumulation)."""
        return max(self.global_batch // max(self.mbs * self.dp, 1), 1)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "world_size": self.world_size, "dp": self.dp,
                "microbatches": self.microbatches}


def divisors(n: int) -> list[int]:
    """1..n's divisors: the sizes a parallel dimension of n can take."""
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class RunDescription:
    family: str                                   # llama3 | llama2 | ...
    model: Model                                  # num_layers, seq_length: from values
    values: Mapping[str, Any]                     # toggle name -> resolved value
    platform: str | None = None                   # training.platforms key, None: unknown
    capabilities: Mapping[str, Any] = field(default_factory=dict)  # what the node offered
    layout: Layout = field(init=False)

    def __post_init__(self):
        values = dict(self.values)
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "capabilities", dict(self.capabilities))
        object.__setattr__(self, "model", dataclasses.replace(
            self.model, num_layers=values["NUM_LAYERS"], seq_length=values["SEQ_LENGTH"]))
        object.__setattr__(self, "layout", Layout.from_values(values))

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def get(self, name: str, default: Any = None) -> Any:
        value = self.values.get(name)
        return default if value is None else value

    @property
    def precision(self) -> str:
        return self.values["PRECISION"]

    @property
    def backend(self) -> str:
        """transformer_engine | native | local (resolved: never auto)."""
        return self.values["TRANSFORMER_IMPL"]

    @property
    def kernels(self) -> str | None:
        """The native backend's kernels: liger | torch."""
        return self.values.get("NATIVE_KERNELS")

    @property
    def tokens_per_step(self) -> int:
        return self.layout.global_batch * self.model.seq_length

    def with_values(self, **changes: Any) -> "RunDescription":
        """The same run with some toggles changed; model and layout derived again. Sequence
        parallel follows a TP change as the launcher resolves it (on with TP>1, off with the
        local backend, whose torch norms refuse it) unless it is changed too."""
        values = {**self.values, **changes}
        if ("TP" in changes or "TRANSFORMER_IMPL" in changes) and \
                "SEQUENCE_PARALLEL" not in changes:
            values["SEQUENCE_PARALLEL"] = values["TP"] > 1 and values["TRANSFORMER_IMPL"] != "local"
        return dataclasses.replace(self, values=values)

    def with_platform(self, platform: str | None) -> "RunDescription":
        return dataclasses.replace(self, platform=platform)

    # -- manifest.json ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The manifest's sections that describe the run (derived ones included for readers
        that do not import this class; from_dict derives them again)."""
        return {"family": self.family, "model": self.model.to_dict(),
                "precision": self.precision, "backend": self.backend, "kernels": self.kernels,
                "platform": self.platform, "layout": self.layout.to_dict(),
                "tokens_per_step": self.tokens_per_step, "values": dict(self.values),
                "capabilities": dict(self.capabilities)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RunDescription":
        """From a manifest (or to_dict's output). KeyError/TypeError/ValueError when a section
        it needs is missing."""
        capabilities = data.get("capabilities") or {}
        platform = data["platform"] if "platform" in data else capabilities.get("platform")
        return cls(family=str(data.get("family") or "llama3"),
                   model=Model.from_dict(data["model"]), values=dict(data["values"]),
                   platform=platform, capabilities=capabilities)
