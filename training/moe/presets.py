"""MoE model presets: the published shapes of Qwen3-MoE and Mixtral, and tiny ones for tests.

An MoE preset is a dense preset (attention, norms, vocabulary, RoPE) plus its experts: how
many, how many each token is routed to (top-k), each expert's FFN width, a shared expert if
any, and the router's load-balancing coefficient from the published config. Every layer is
an MoE layer (Qwen3-30B-A3B's decoder_sparse_step 1, Mixtral's).
"""
from __future__ import annotations

from dataclasses import dataclass

from training.launch.presets import ModelPreset, register_family


@dataclass(frozen=True)
class MoEPreset(ModelPreset):
    """A Model with experts (training.run_description.Model's MoE fields, whose flags
    ModelPreset.gpt_args emits) and the router's published load-balancing coefficient, the
    launch's default MOE_AUX_LOSS_COEFF (source "preset")."""
    aux_loss_coeff: float = 0.01             # the published router_aux_loss_coef

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "train_defaults",
                           {"MOE_AUX_LOSS_COEFF": self.aux_loss_coeff, **self.train_defaults})


# Qwen/Qwen3-30B-A3B config.json: 48 layers, hidden 2048, 32 heads / 4 KV groups of head dim
# 128, 128 experts of FFN 768, top-8 with the top-k renormalised (norm_topk_prob), no shared
# expert, vocab 151936, RoPE theta 1e6, RMSNorm eps 1e-6, untied embeddings, aux 0.001.
# (intermediate_size 6144 is the dense FFN width, unused: every layer is MoE.)
QWEN3_30B_A3B = MoEPreset(
    "qwen3-30B-A3B", 48, 2048, 6144, 32, 4, 151936, 40960, 4096, 1000000, norm_epsilon=1e-6,
    num_experts=128, router_topk=8, moe_ffn_hidden_size=768, kv_channels=128,
    qk_layernorm=True, aux_loss_coeff=0.001)

# mistralai/Mixtral-8x7B-v0.1 config.json: 32 layers, hidden 4096, 32 heads / 8 KV groups,
# 8 experts of FFN 14336, top-2, vocab 32000, RoPE theta 1e6, eps 1e-5, aux 0.02.
MIXTRAL_8X7B = MoEPreset(
    "mixtral-8x7B", 32, 4096, 14336, 32, 8, 32000, 32768, 4096, 1000000, norm_epsilon=1e-5,
    num_experts=8, router_topk=2, moe_ffn_hidden_size=14336, aux_loss_coeff=0.02)

# mistralai/Mixtral-8x22B-v0.1 config.json: 56 layers, hidden 6144, 48 heads / 8 KV groups,
# 8 experts of FFN 16384, top-2, vocab 32768, RoPE theta 1e6, eps 1e-5, aux 0.001.
MIXTRAL_8X22B = MoEPreset(
    "mixtral-8x22B", 56, 6144, 16384, 48, 8, 32768, 65536, 4096, 1000000, norm_epsilon=1e-5,
    num_experts=8, router_topk=2, moe_ffn_hidden_size=16384, aux_loss_coeff=0.001)

# Tests and smoke runs: the tiny dense preset's width and vocabulary (the shipped Shakespeare
# corpus is tokenized at 8192) with 8 experts, top-2; tiny-moe is Qwen3-like (q/k norms, a
# head dim of its own: 4 heads of 32 in a width of 256), tiny-mixtral Mixtral-like.
TINY_MOE = MoEPreset(
    "tiny-moe", 2, 256, 704, 4, 2, 8192, 1024, 256, 10000, norm_epsilon=1e-6,
    num_experts=8, router_topk=2, moe_ffn_hidden_size=128, kv_channels=32,
    qk_layernorm=True, aux_loss_coeff=0.01, train_defaults={"BS": 8, "TOTAL_ITERS": 30})
TINY_MIXTRAL = MoEPreset(
    "tiny-mixtral", 2, 256, 704, 4, 2, 8192, 1024, 256, 10000,
    num_experts=8, router_topk=2, moe_ffn_hidden_size=128, aux_loss_coeff=0.01,
    train_defaults={"BS": 8, "TOTAL_ITERS": 30})

MOE_PRESETS: dict[str, MoEPreset] = {p.name: p for p in (
    QWEN3_30B_A3B, MIXTRAL_8X7B, MIXTRAL_8X22B, TINY_MOE, TINY_MIXTRAL)}

# family -> (MODEL_SIZE value -> preset name, default MODEL_SIZE)
MOE_FAMILIES: dict[str, tuple[dict[str, str], str]] = {
    "qwen3_moe": ({"30B-A3B": "qwen3-30B-A3B", "tiny": "tiny-moe"}, "30B-A3B"),
    "mixtral": ({"8x7B": "mixtral-8x7B", "8x22B": "mixtral-8x22B", "tiny": "tiny-mixtral"},
                "8x7B"),
}


def register() -> None:
    """Make the MoE families known to the launcher (training.launch.presets)."""
    for family, (sizes, default) in MOE_FAMILIES.items():
        register_family(family, sizes, default, MOE_PRESETS, f"examples/moe/train_{family}.sh")


register()
