"""gpt-oss as a family of the MoE launch: presets, their Megatron flags, and the guards.

openai/gpt-oss-20b's config.json (transformers' GptOssConfig defaults are gpt-oss-120b's): 24
layers, hidden 2880, 64 heads / 8 KV groups of head dim 64 (the query width, 4096, is not the
hidden size), 32 experts of FFN 2880, top-4, biases on every linear (q, k, v, o, the router,
each expert's two projections), a learnable attention sink per head, a 128-key sliding window
on every other layer (the first banded), YaRN RoPE (theta 150000, factor 32 over an original
4096, beta fast 32 / slow 1, correction range not truncated), RMSNorm eps 1e-5, vocabulary
201088, untied embeddings. Its experts' activation is a clamped SwiGLU:

    gate, up = clamp(gate, max=7), clamp(up, -7, 7);  out = gate * sigmoid(1.702 gate) * (up + 1)

(transformers' GptOssExperts._apply_gate, its gate and up interleaved in gate_up_proj), which is
megatron-core 0.19.2's quick_geglu (x sigmoid(1.702 x)) with glu_linear_offset 1 and
activation_func_clamp_value 7 (TEGroupedMLP clamps the gate above and the linear half both
ways). The routing is Megatron's default top-k: softmax over the chosen logits.

In Megatron's words (GptOssPreset.gpt_args): --quick-geglu --glu-linear-offset 1
--activation-func-clamp-value 7 (for --swiglu), biases on (no --disable-bias-linear),
--softmax-type learnable, --window-size 127,0 --window-attn-skip-freq 2 (Hugging Face's window
W counts the query itself: keys i-W < j <= i, Megatron's (left, right) = (W-1, 0); layer n,
counted from 1, is banded when n % 2 != 0), --position-embedding-type yarn with its factors.

Backends: the native backend runs sinks and the window in training/native/flex_attention.py
(its parity with HF passes on the GPU); TE's fused attention takes them (softmax_type needs TE
>= 2.8, Megatron asserts) and matched HF on an H200 (session 18), but on the TE backend
gpt-oss's MoE block (biased experts and router, the clamped quick-GeGLU) did not, so the guard
gpt_oss_te_backend refuses it there and TRANSFORMER_IMPL=auto picks native; Megatron's local
backend runs the attention in its unfused form (s x s scores) but cannot train the biased
experts. The guards below refuse what none can run.
"""
from __future__ import annotations

from dataclasses import dataclass

from training.launch.guards import LaunchContext, _off_or_refuse
from training.launch.layers import RecipeLayer
from training.launch.model_config import ConfigError, HFFamily, register_reader
from training.launch.presets import register_family
from training.launch.settings import Refusal
from training.launch.toggles import te_moe_blocker

from .presets import MoEPreset

FAMILY = "gpt_oss"
SCRIPT = "examples/moe/train_gpt_oss.sh"
TE_SOFTMAX_TYPE = (2, 8)     # megatron-core asserts TE >= 2.8 for softmax_type != vanilla


@dataclass(frozen=True)
class GptOssPreset(MoEPreset):
    """An MoE preset with gpt-oss's attention (sinks, alternating window), biased linears, its
    clamped SwiGLU and YaRN RoPE."""
    sliding_window: int = 128          # keys a banded layer sees, itself included
    window_skip_freq: int = 2          # every 2nd layer (counted from 1) sees everything
    attention_sinks: bool = True
    swiglu_limit: float = 7.0          # the clamp (quick_gelu's 1.702 is gpt-oss's alpha)
    glu_linear_offset: float = 1.0     # (up + 1)
    yarn_factor: float = 32.0
    yarn_original_max_positions: int = 4096
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    clamped_swiglu: bool = True        # False: Megatron's plain SwiGLU (the MLPerf reference's)
    yarn: bool = True                  # False: plain RoPE at rotary_base (the MLPerf reference's)
    linear_bias: bool = True           # biases on every linear (False: the MLPerf reference)
    init_std: float = 0.02

    def gpt_args(self, num_layers: int, seq_length: int) -> list[str]:
        args = []
        for word in super().gpt_args(num_layers, seq_length):
            if word == "--disable-bias-linear" and self.linear_bias:   # gpt-oss: on every linear
                continue
            if word == "--swiglu" and self.clamped_swiglu:
                args += ["--quick-geglu", "--glu-linear-offset", str(self.glu_linear_offset),
                         "--activation-func-clamp-value", str(self.swiglu_limit)]
                continue
            args.append(word)
        args[args.index("--init-method-std") + 1] = str(self.init_std)
        if self.yarn:
            args[args.index("--position-embedding-type") + 1] = "yarn"
            args += ["--rotary-scaling-factor", str(self.yarn_factor),
                     "--yarn-original-max-position-embeddings",
                     str(self.yarn_original_max_positions),
                     "--yarn-beta-fast", str(self.yarn_beta_fast),
                     "--yarn-beta-slow", str(self.yarn_beta_slow),
                     "--no-yarn-correction-range-round-to-int"]
        args += ["--window-size", f"{self.sliding_window - 1},0",
                 "--window-attn-skip-freq", str(self.window_skip_freq)]
        if self.attention_sinks:
            args += ["--softmax-type", "learnable"]
        return args


def _gpt_oss(name, layers, experts, vocab_size=201088, seq_length=4096, norm_epsilon=1e-5,
             **kw):
    # openai/gpt-oss-{20b,120b} config.json; router_aux_loss_coef as transformers' GptOssConfig
    return GptOssPreset(
        name, layers, 2880, 2880, 64, 8, vocab_size, 131072, seq_length, 150000,
        norm_epsilon=norm_epsilon,
        num_experts=experts, router_topk=4, moe_ffn_hidden_size=2880, kv_channels=64,
        aux_loss_coeff=0.001, **kw)


GPT_OSS_20B = _gpt_oss("gpt-oss-20b", 24, 32)
GPT_OSS_120B = _gpt_oss("gpt-oss-120b", 36, 128)

# MLPerf Training's gpt_oss_20b (examples/mlperf/gpt_oss_20b/config.yaml): the model the reference
# trains from scratch, which is gpt-oss-20b's shape, not its architecture. The reference
# (mlcommons/training gpt_oss_20b/primus) builds Primus's `gpt_oss_20B.yaml` (which extends
# `deepseek_v2_base.yaml`, which extends `llama_base.yaml`) with conf/gpt_oss_20B-pretrain*.yaml's
# overrides: the Llama 3.1 8B tokenizer's vocabulary (128256: the C4 files are llama31_8b's),
# plain RoPE at theta 150000 (no YaRN), Megatron's SwiGLU, window_size (128, 0) on every other
# layer (129 keys in Hugging Face's count), init std 0.008, no load-balancing loss; and from the
# bases, what the overrides leave: q/k RMSNorm (deepseek_v2_base's qk_layernorm: true), no
# biases (llama_base's add_bias_linear: false), no sinks (no softmax_type anywhere: Megatron's
# vanilla softmax). Primus main of 2026-02-10 (3e7b8fa6), the reference's RCP runs of 2026-02-13
# (docs/gpt_oss.md). The norms' epsilon is 1e-6: the overrides set norm_epsilon 1e-6 and
# layernorm_epsilon 1e-5, and the Megatron-LM Primus pins (847781764, 2025-10-10) builds its
# TransformerConfig's layernorm_epsilon from args.norm_epsilon after copying the other fields.
GPT_OSS_20B_MLPERF = _gpt_oss("gpt-oss-20b-mlperf", 24, 32, vocab_size=128256,
                              seq_length=8192, norm_epsilon=1e-6, clamped_swiglu=False, yarn=False,
                              sliding_window=129, init_std=0.008, attention_sinks=False,
                              linear_bias=False, qk_layernorm=True)

# Tests and smoke runs: the tiny MoE shape (2 layers: one banded, one full) with gpt-oss's
# parts, a head dim of its own (4 heads of 32 in a width of 256 -> a 128-wide query), a window
# short enough to matter at test lengths, the Shakespeare corpus' vocabulary.
TINY_GPT_OSS = GptOssPreset(
    "tiny-gpt-oss", 2, 256, 128, 4, 2, 8192, 131072, 256, 150000, norm_epsilon=1e-5,
    num_experts=8, router_topk=2, moe_ffn_hidden_size=128, kv_channels=32, aux_loss_coeff=0.01,
    sliding_window=16, train_defaults={"BS": 8, "TOTAL_ITERS": 30})

PRESETS: dict[str, GptOssPreset] = {p.name: p for p in (GPT_OSS_20B, GPT_OSS_120B,
                                                         GPT_OSS_20B_MLPERF, TINY_GPT_OSS)}
SIZES = {"20b": "gpt-oss-20b", "120b": "gpt-oss-120b", "20b-mlperf": "gpt-oss-20b-mlperf",
         "tiny": "tiny-gpt-oss"}


def hf_config(preset: GptOssPreset, num_layers: int | None = None, seq_length: int = 0):
    """transformers' GptOssConfig of a preset's shape (the parity tests and the bench's peer):
    the same attention (sinks, the window, every other layer banded from the first), experts,
    YaRN and biases as our flags build."""
    from transformers import GptOssConfig

    layers = num_layers or preset.num_layers
    if preset.window_skip_freq != 2 or not (preset.yarn and preset.clamped_swiglu):
        raise ValueError(f"{preset.name}: GptOssConfig has YaRN, the clamped SwiGLU and "
                         "alternating banded and full layers only")
    return GptOssConfig(
        num_hidden_layers=layers, num_local_experts=preset.num_experts,
        vocab_size=preset.vocab_size, hidden_size=preset.hidden_size,
        intermediate_size=preset.moe_ffn_hidden_size, head_dim=preset.head_dim,
        num_attention_heads=preset.num_attention_heads,
        num_key_value_heads=preset.num_query_groups, sliding_window=preset.sliding_window,
        max_position_embeddings=max(preset.max_position_embeddings, seq_length),
        rms_norm_eps=preset.norm_epsilon, num_experts_per_tok=preset.router_topk,
        swiglu_limit=preset.swiglu_limit, router_aux_loss_coef=preset.aux_loss_coeff,
        tie_word_embeddings=False, attention_bias=True,
        rope_parameters={"rope_type": "yarn", "rope_theta": float(preset.rotary_base),
                         "factor": preset.yarn_factor, "beta_fast": preset.yarn_beta_fast,
                         "beta_slow": preset.yarn_beta_slow, "truncate": False,
                         "original_max_position_embeddings": preset.yarn_original_max_positions})


# -- MODEL_CONFIG: a gpt-oss config.json (or an import of one) as a shape ------------------

def _rope(config: dict) -> dict:
    """The RoPE parameters of transformers 4 (rope_theta, rope_scaling) or 5 (rope_parameters)."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise ConfigError("gpt-oss config.json's rope_scaling is not an object")
    if "rope_theta" not in rope and "rope_theta" in config:
        rope = dict(rope, rope_theta=config["rope_theta"])
    return rope


def _number(table: dict, key: str, default, what: str) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or value != value or value == float("inf"):
        raise ConfigError(f"gpt-oss config.json's {what}{key} is {value!r}: a positive number "
                          "is needed")
    return value


def shape_from_hf_config(config: dict, name: str, seq_length: int = 4096) -> GptOssPreset:
    """A gpt-oss config.json as the GptOssPreset that builds it (MODEL_CONFIG, and the
    checkpoint import's check: what it converts is what a launch builds); ConfigError, one
    line, naming what Megatron's gpt-oss cannot express: YaRN RoPE (its correction range not
    truncated), banded and full layers in turn from a banded first, the clamped SwiGLU at 7,
    biased attention, untied embeddings. `seq_length` is the launch's default, capped at the
    config's max_position_embeddings."""
    need = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
            "num_local_experts", "intermediate_size", "vocab_size", "num_experts_per_tok")
    missing = [k for k in need if isinstance(config.get(k), bool)
               or not isinstance(config.get(k), int) or config[k] < 1]
    if missing:
        raise ConfigError(f"gpt-oss config.json lacks positive integer {', '.join(missing)}")
    layers, heads, groups = (config[k] for k in ("num_hidden_layers", "num_attention_heads",
                                                 "num_key_value_heads"))
    if heads % groups:
        raise ConfigError(f"{heads} attention heads do not divide into {groups} key/value groups")
    types = config.get("layer_types")
    alternate = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    if types is not None and list(types) != alternate:
        raise ConfigError("gpt-oss config.json's layer_types are not banded and full layers in "
                          "turn from a banded first: Megatron's window (--window-attn-skip-freq "
                          "2) cannot express them")
    window = config.get("sliding_window")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ConfigError("gpt-oss config.json has no sliding_window (a positive integer)")
    rope = _rope(config)
    if rope.get("rope_type", rope.get("type")) != "yarn":
        raise ConfigError(f"gpt-oss config.json's RoPE is {rope.get('rope_type')!r}; this "
                          "converts YaRN (the preset's --position-embedding-type yarn)")
    if rope.get("truncate", False):
        raise ConfigError("gpt-oss config.json's YaRN truncates its correction range "
                          "(truncate true); gpt-oss's does not (--no-yarn-correction-range-"
                          "round-to-int)")
    theta = _number(rope, "rope_theta", 150000.0, "rope ")
    if theta != int(theta):
        raise ConfigError(f"rope_theta is {theta:g}: Megatron's --rotary-base is an integer")
    if config.get("tie_word_embeddings"):
        raise ConfigError("gpt-oss config.json ties the embeddings; gpt-oss's are untied and "
                          "the preset builds them so")
    if config.get("attention_bias") is False:
        raise ConfigError("gpt-oss config.json has attention_bias false; the preset's attention "
                          "is biased")
    for key, want in (("swiglu_limit", 7.0), ("hidden_act", "silu")):
        if key in config and config[key] != want:
            raise ConfigError(f"gpt-oss config.json's {key} is {config[key]!r}; Megatron's "
                              f"gpt-oss experts run {want!r}")
    max_pos = config.get("max_position_embeddings", 131072)
    if isinstance(max_pos, bool) or not isinstance(max_pos, int) or max_pos < 1:
        raise ConfigError(f"gpt-oss config.json's max_position_embeddings is {max_pos!r}: a "
                          "positive integer is needed")
    hidden, ffn = config["hidden_size"], config["intermediate_size"]
    aux = config.get("router_aux_loss_coef", 0.001)
    if aux != 0:
        aux = _number(config, "router_aux_loss_coef", 0.001, "")
    return GptOssPreset(
        name, layers, hidden, ffn, heads, groups, config["vocab_size"], max_pos,
        min(seq_length, max_pos), int(theta),
        norm_epsilon=float(_number(config, "rms_norm_eps", 1e-5, "")),
        num_experts=config["num_local_experts"], router_topk=config["num_experts_per_tok"],
        moe_ffn_hidden_size=ffn, kv_channels=config.get("head_dim") or None,
        aux_loss_coeff=float(aux), sliding_window=window,
        yarn_factor=float(_number(rope, "factor", 32.0, "rope ")),
        yarn_original_max_positions=int(_number(rope, "original_max_position_embeddings", 4096,
                                                "rope ")),
        yarn_beta_fast=float(_number(rope, "beta_fast", 32.0, "rope ")),
        yarn_beta_slow=float(_number(rope, "beta_slow", 1.0, "rope ")),
        init_std=float(_number(config, "initializer_range", 0.02, "")))


def register() -> None:
    register_family(FAMILY, SIZES, "20b", PRESETS, SCRIPT)
    register_reader(HFFamily(FAMILY, "GptOssForCausalLM", moe=True), shape_from_hf_config)


register()


# -- guards ----------------------------------------------------------------------------------

def _te_version(ctx) -> tuple[int, ...] | None:
    from training.launch.guards import _version

    te = ctx.caps.te_version
    return _version(te) if te and te != "unknown" else None


def gpt_oss_te_backend(ctx: LaunchContext) -> None:
    """On the TE backend: sinks need TE >= 2.8 (megatron-core asserts on softmax_type before),
    and gpt-oss's MoE block is refused (te_moe_blocker: its parity with HF failed on an H200),
    an fp8 recipe with it therefore too (only TE has fp8 layers), and context parallelism
    (only TE's attention has it). The MLPerf variant (plain SwiGLU, no biases, no sinks) runs
    there."""
    preset = ctx.preset
    if not isinstance(preset, GptOssPreset) or ctx.backend != "transformer_engine":
        return
    te = _te_version(ctx)
    if preset.attention_sinks and te is not None and (0,) < te < TE_SOFTMAX_TYPE:
        raise Refusal("gpt_oss_te_backend",
                      f"{preset.name}'s attention sinks run in Transformer Engine's fused "
                      f"attention from TE 2.8 (softmax_type); this one is "
                      f"{ctx.caps.te_version} (megatron-core would assert). Use "
                      "TRANSFORMER_IMPL=native.")
    blocked = te_moe_blocker(True, preset.linear_bias, preset.clamped_swiglu)
    if blocked:
        needs_te = (f" PRECISION={ctx.recipe.name} needs the TE backend's layers: use "
                    "PRECISION=bf16 with it." if ctx.recipe.kind != "bf16" else "")
        raise Refusal("gpt_oss_te_backend",
                      f"TRANSFORMER_IMPL=transformer_engine for {preset.name}: {blocked}. Use "
                      f"TRANSFORMER_IMPL=native (flex attention, the native experts).{needs_te}")


def gpt_oss_kernels(ctx: LaunchContext) -> None:
    """What gpt-oss's parts rule out: Megatron's fused QKV RoPE skips YaRN's attention factor,
    its SequentialMLP (MOE_GROUPED_GEMM=0, the local backend) cannot train biased experts, and
    TEGroupedMLP asserts on the bias-dropout fusion with biases."""
    preset = ctx.preset
    if not isinstance(preset, GptOssPreset):
        return
    if preset.yarn:
        _off_or_refuse(ctx, "FUSED_SINGLE_QKV_ROPE", "gpt_oss_kernels",
                       "YaRN RoPE scales cos and sin by its attention factor (1 + 0.1 ln 32), "
                       "which Megatron's fused QKV RoPE path does not apply (its split path "
                       "does)", "Set FUSED_SINGLE_QKV_ROPE=0.")
    if not preset.linear_bias:      # the MLPerf reference's: Megatron's own unbiased experts
        return
    if "BIAS_DROPOUT_FUSION" in ctx.settings.values:
        _off_or_refuse(ctx, "BIAS_DROPOUT_FUSION", "gpt_oss_kernels",
                       "megatron-core's TEGroupedMLP asserts 'bias_dropout_fusion is not "
                       "supported ... when add_bias_linear=True'", "Set BIAS_DROPOUT_FUSION=0.")
    sequential = ("its local spec always builds SequentialMLP" if ctx.backend == "local" else
                  "MOE_GROUPED_GEMM=0 builds SequentialMLP"
                  if not ctx.settings.get("MOE_GROUPED_GEMM", True) else None)
    if sequential:
        instead = ("Use TRANSFORMER_IMPL=native or transformer_engine." if ctx.backend == "local"
                   else "Use MOE_GROUPED_GEMM=1.")
        raise Refusal("gpt_oss_kernels",
                      f"{preset.name}'s experts have biases, and Megatron's SequentialMLP "
                      f"cannot train biased experts in megatron-core 0.19.2 (MLP.forward adds "
                      f"the expert bias in place on a custom Function's output: autograd raises "
                      f"at the first backward); here {sequential}. {instead}")


def gpt_oss_cuda_graph(ctx: LaunchContext) -> None:
    """The lean MoE step's CUDA graph: gpt-oss's step under it (flex attention's compiled
    kernel, the block mask cached per shape) was captured and trained on an H200 but measured
    no faster than eager (session 16): the default is turned off with the reason; a user's
    CUDA_GRAPH=full_iteration runs, with a warning to compare."""
    if not isinstance(ctx.preset, GptOssPreset) or ctx.settings["CUDA_GRAPH"] == "none":
        return
    why = (f"{ctx.preset.name}'s step (flex attention with sinks and a sliding window) measured "
           "no faster under the CUDA graph on an H200 (session 16, one run each: docs/moe.md), "
           "its GPU idle 3% of an eager step")
    if ctx.settings.is_explicit("CUDA_GRAPH"):
        ctx.settings.warn("gpt_oss_cuda_graph", f"CUDA_GRAPH={ctx.settings['CUDA_GRAPH']}: {why}; "
                          "compare its tokens/s with CUDA_GRAPH=none")
        return
    ctx.settings.correct("CUDA_GRAPH", "none", "gpt_oss_cuda_graph",
                         f"{why} (CUDA_GRAPH=full_iteration tries it)")


GUARDS = (gpt_oss_te_backend, gpt_oss_kernels, gpt_oss_cuda_graph)

GPT_OSS = RecipeLayer(FAMILY, values=lambda settings: [], guards=GUARDS)
