"""Model presets: MODEL_SIZE -> architecture flags, per script family.

Shapes are the published Llama configurations (hidden, FFN, heads, KV groups, vocab, RoPE
base, norm epsilon); `tiny` is a 2-layer model for tests and smoke runs. A preset may also set
training defaults (batch, sequence length) where the family default would not fit.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from training.run_description import Model

from .settings import BadInput


@dataclass(frozen=True)
class ModelPreset(Model):
    """A model shape (training.run_description.Model) with the training defaults it needs."""
    train_defaults: dict = field(default_factory=dict)

    def gpt_args(self, num_layers: int, seq_length: int) -> list[str]:
        args = [
            "--num-layers", str(num_layers),
            "--hidden-size", str(self.hidden_size),
            "--ffn-hidden-size", str(self.ffn_hidden_size),
            "--num-attention-heads", str(self.num_attention_heads),
            "--max-position-embeddings", str(max(self.max_position_embeddings, seq_length)),
            "--position-embedding-type", "rope",
            "--rotary-base", str(self.rotary_base),
            "--normalization", "RMSNorm",
            "--norm-epsilon", str(self.norm_epsilon),
            "--swiglu",
            *(() if self.tied_embeddings else ("--untie-embeddings-and-output-weights",)),
            "--disable-bias-linear",
            *(("--add-qkv-bias",) if self.qkv_bias else ()),
            "--attention-dropout", "0.0",
            "--hidden-dropout", "0.0",
            "--init-method-std", "0.02",
        ]
        if self.num_query_groups != self.num_attention_heads:
            args += ["--group-query-attention", "--num-query-groups", str(self.num_query_groups)]
        if self.rope_scaling:
            args += ["--use-rope-scaling", "--rope-scaling-factor", f"{self.rope_scaling_factor:g}"]
        if self.kv_channels:
            args += ["--kv-channels", str(self.kv_channels)]
        if self.qk_layernorm:
            args += ["--qk-layernorm"]
        if self.num_experts:   # every layer an MoE layer
            args += ["--num-experts", str(self.num_experts),
                     "--moe-router-topk", str(self.router_topk),
                     "--moe-ffn-hidden-size", str(self.moe_ffn_hidden_size)]
            if self.shared_expert_ffn_hidden_size:
                args += ["--moe-shared-expert-intermediate-size",
                         str(self.shared_expert_ffn_hidden_size)]
        return args


_TINY = ModelPreset("tiny", 2, 256, 704, 4, 2, 8192, 1024, 256, 10000,
                    train_defaults={"BS": 8, "TOTAL_ITERS": 30})

PRESETS: dict[str, ModelPreset] = {p.name: p for p in (
    ModelPreset("llama3-8B", 32, 4096, 14336, 32, 8, 128256, 8192, 8192, 500000),
    ModelPreset("llama3-70B", 80, 8192, 28672, 64, 8, 128256, 8192, 8192, 500000),
    ModelPreset("llama3.1-8B", 32, 4096, 14336, 32, 8, 128256, 131072, 8192, 500000,
                rope_scaling=True),
    ModelPreset("llama2-7B", 32, 4096, 11008, 32, 32, 32000, 4096, 4096, 10000),
    ModelPreset("llama2-13B", 40, 5120, 13824, 40, 40, 32000, 4096, 4096, 10000),
    ModelPreset("llama2-70B", 80, 8192, 28672, 64, 8, 32000, 4096, 4096, 10000),
    _TINY,
)}

# family -> (MODEL_SIZE value -> preset name, default MODEL_SIZE)
FAMILIES: dict[str, tuple[dict[str, str], str]] = {
    "llama3": ({"8B": "llama3-8B", "70B": "llama3-70B", "3.1-8B": "llama3.1-8B",
                "tiny": "tiny"}, "8B"),
    "llama2": ({"7B": "llama2-7B", "13B": "llama2-13B", "70B": "llama2-70B",
                "tiny": "tiny"}, "7B"),
}


# family -> its entry script (what a user runs; the bench launches it)
SCRIPTS: dict[str, str] = {"llama3": "examples/llama/train_llama3.sh",
                           "llama2": "examples/llama/train_llama2.sh"}


def register_family(family: str, sizes: dict[str, str], default: str,
                    presets: dict[str, ModelPreset], script: str) -> None:
    """A model family that plugs in from above (training/moe/presets.py): its presets,
    MODEL_SIZE values and entry script join the tables the launcher resolves from.
    Idempotent."""
    PRESETS.update(presets)
    FAMILIES[family] = (dict(sizes), default)
    SCRIPTS[family] = script


def preset_for(family: str, model_size: str | None) -> ModelPreset:
    if family not in FAMILIES:
        raise BadInput(f"unknown model family {family!r}: use one of {', '.join(FAMILIES)}.")
    sizes, default = FAMILIES[family]
    size = default if model_size is None else model_size
    if size not in sizes:
        raise BadInput(f"MODEL_SIZE={size!r} is not a {family} preset: use one of "
                       f"{', '.join(sizes)}.")
    return PRESETS[sizes[size]]
