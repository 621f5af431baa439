"""The gpt-oss launch: the family through the MoE launcher, its Megatron words through
megatron-core 0.19.2's own parser, validate_args and TransformerConfig, its guards by name, the
entry script's DRY_RUN and memory pre-flight."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from training.launch.presets import FAMILIES, SCRIPTS
from training.launch.settings import Refusal
from training.moe import gpt_oss
from training.moe.gpt_oss import GPT_OSS
from training.moe.layer import MOE

from tests.launch import test_guards
from tests.launch.helpers import launch, megatron_args
from tests.launch.test_guards import notices

REPO = Path(__file__).resolve().parents[2]


def oss(env, **toggles):
    return launch(env, family="gpt_oss", layers=[MOE, GPT_OSS], **toggles)


def refused(env, guard, **toggles) -> str:
    return test_guards.refused(env, guard, family="gpt_oss", layers=[MOE, GPT_OSS], **toggles)


def _after(words, flag):
    return words[words.index(flag) + 1]


def test_the_family_is_registered_with_its_entry_script():
    assert FAMILIES["gpt_oss"] == ({"20b": "gpt-oss-20b", "120b": "gpt-oss-120b",
                                    "20b-mlperf": "gpt-oss-20b-mlperf", "tiny": "tiny-gpt-oss"},
                                   "20b")
    assert SCRIPTS["gpt_oss"] == "examples/moe/train_gpt_oss.sh"
    assert (REPO / SCRIPTS["gpt_oss"]).exists()


def test_gpt_oss_20b_words(base_env):
    gpt = oss(base_env, NUM_LAYERS=4).buckets["GPT_ARGS"]
    for flag, value in (("--num-experts", "32"), ("--moe-router-topk", "4"),
                        ("--moe-ffn-hidden-size", "2880"), ("--kv-channels", "64"),
                        ("--num-query-groups", "8"), ("--position-embedding-type", "yarn"),
                        ("--rotary-base", "150000"), ("--rotary-scaling-factor", "32.0"),
                        ("--yarn-original-max-position-embeddings", "4096"),
                        ("--window-size", "127,0"), ("--window-attn-skip-freq", "2"),
                        ("--softmax-type", "learnable"), ("--glu-linear-offset", "1.0"),
                        ("--activation-func-clamp-value", "7.0")):
        assert _after(gpt, flag) == value, flag
    assert "--quick-geglu" in gpt and "--no-yarn-correction-range-round-to-int" in gpt
    assert "--swiglu" not in gpt and "--disable-bias-linear" not in gpt


@pytest.mark.parametrize("toggles", [
    {"NUM_LAYERS": 4},
    {"MODEL_SIZE": "tiny"},
    {"NUM_LAYERS": 4, "EP": 8, "GPUS_PER_NODE": 8},
    {"NUM_LAYERS": 4, "PLATFORM": "mi355x", "EP": 8, "GPUS_PER_NODE": 8},
])
def test_launches_pass_megatrons_validation(base_env, toggles):
    result = oss(base_env, **toggles)
    args = megatron_args(result)
    preset = result.ctx.preset
    assert args.num_experts == preset.num_experts and args.add_bias_linear
    assert args.window_size == (preset.sliding_window - 1, 0) and args.softmax_type == "learnable"
    assert not args.fused_single_qkv_rope and not args.bias_dropout_fusion
    if result.settings["TRANSFORMER_IMPL"] == "native":
        from megatron.core.fusions.fused_bias_geglu import quick_gelu
        from megatron.training.argument_utils import core_transformer_config_from_args

        config = core_transformer_config_from_args(args)
        assert config.activation_func is quick_gelu and config.gated_linear_unit
        assert (config.glu_linear_offset, config.activation_func_clamp_value) == (1.0, 7.0)
        assert config.add_bias_linear and config.add_qkv_bias
        assert config.window_attn_skip_freq == 2 and config.softmax_type == "learnable"
        assert config.yarn_rotary_scaling_factor == 32.0
        assert config.yarn_correction_range_round_to_int is False


def test_the_mlperf_preset_is_the_references_model(base_env):
    """MLPerf's gpt_oss_20b reference (Primus's gpt_oss_20B.yaml on deepseek_v2_base.yaml on
    llama_base.yaml, with the benchmark's overrides) is gpt-oss-20b's shape with Llama's parts:
    no sinks, no biases, q/k RMSNorm, plain SwiGLU and RoPE, a (128, 0) window every other
    layer (docs/gpt_oss.md); gpt-oss-20b itself keeps its sinks and biases."""
    from megatron.training.argument_utils import core_transformer_config_from_args

    result = oss(base_env, MODEL_SIZE="20b-mlperf", NUM_LAYERS=4)
    args = megatron_args(result)
    config = core_transformer_config_from_args(args)
    assert config.softmax_type == "vanilla" and config.qk_layernorm
    assert not config.add_bias_linear and not config.add_qkv_bias
    assert config.window_size == (128, 0) and config.window_attn_skip_freq == 2
    assert config.gated_linear_unit and config.activation_func_clamp_value is None
    assert args.position_embedding_type == "rope" and args.rotary_base == 150000
    # the reference's norm_epsilon 1e-6 (its layernorm_epsilon 1e-5 is overwritten by it in
    # the Megatron-LM Primus pins); gpt-oss-20b's own config.json says 1e-5
    assert config.layernorm_epsilon == 1e-6
    assert not result.settings["FUSED_SINGLE_QKV_ROPE"]   # the q/k norms sit before RoPE
    assert not notices(result, "gpt_oss_kernels")   # nothing of the biased experts applies
    sequential = oss(base_env, MODEL_SIZE="20b-mlperf", NUM_LAYERS=4, MOE_GROUPED_GEMM=0)
    assert not megatron_args(sequential).moe_grouped_gemm   # unbiased: SequentialMLP trains
    gpt_oss_20b = core_transformer_config_from_args(megatron_args(oss(base_env, NUM_LAYERS=4)))
    assert gpt_oss_20b.softmax_type == "learnable" and gpt_oss_20b.add_bias_linear
    assert gpt_oss_20b.layernorm_epsilon == 1e-5
    assert not gpt_oss_20b.qk_layernorm


def test_yarn_turns_the_fused_qkv_rope_off_with_why_or_refuses(base_env):
    result = oss(base_env, NUM_LAYERS=4)
    assert not result.settings["FUSED_SINGLE_QKV_ROPE"]
    (notice,) = notices(result, "gpt_oss_kernels")
    assert "attention factor" in notice.message
    assert "FUSED_SINGLE_QKV_ROPE=0" in refused(base_env, "gpt_oss_kernels", NUM_LAYERS=4,
                                                FUSED_SINGLE_QKV_ROPE=1)


def test_bias_dropout_fusion_is_refused_with_biased_experts(base_env):
    """Off on the native backend (derived there); a user's 1 is refused for the biased
    experts (TEGroupedMLP's assertion, whichever backend)."""
    result = oss(base_env, NUM_LAYERS=4, PLATFORM="h200", TRANSFORMER_IMPL="native")
    assert not result.settings["BIAS_DROPOUT_FUSION"]
    assert "BIAS_DROPOUT_FUSION=0" in refused(base_env, "gpt_oss_kernels", NUM_LAYERS=4,
                                              PLATFORM="h200", TRANSFORMER_IMPL="native",
                                              BIAS_DROPOUT_FUSION=1)


@pytest.mark.parametrize("toggles,needle", [
    ({"MOE_GROUPED_GEMM": 0}, "MOE_GROUPED_GEMM=1"),
    ({"TRANSFORMER_IMPL": "local"}, "TRANSFORMER_IMPL=native or transformer_engine"),
])
def test_sequential_experts_are_refused(base_env, toggles, needle):
    msg = refused(base_env, "gpt_oss_kernels", NUM_LAYERS=4, **toggles)
    assert needle in msg and "SequentialMLP" in msg


def test_context_parallel_runs_only_on_te_for_the_mlperf_variant(base_env):
    """The native backend (SDPA or flex attention) has no context parallelism: the core's
    guard refuses it; the TE backend runs it for the MLPerf variant (no biases, plain SwiGLU)
    and refuses gpt-oss's MoE block, so gpt-oss-20b has no context parallelism today."""
    msg = refused(base_env, "context_parallel_backend", NUM_LAYERS=4, CP=2, GPUS_PER_NODE=2)
    assert "CP=1" in msg
    mlperf = oss(base_env, MODEL_SIZE="20b-mlperf", NUM_LAYERS=4, CP=2, GPUS_PER_NODE=2,
                 PLATFORM="h200", TRANSFORMER_IMPL="transformer_engine")
    assert megatron_args(mlperf).context_parallel_size == 2
    assert not notices(mlperf, "gpt_oss_te_backend")
    assert "TRANSFORMER_IMPL=native" in refused(base_env, "gpt_oss_te_backend", NUM_LAYERS=4,
                                                CP=2, GPUS_PER_NODE=2, PLATFORM="h200",
                                                TRANSFORMER_IMPL="transformer_engine")


@pytest.mark.parametrize("platform", ["h200", "b300", "mi355x"])
def test_auto_keeps_gpt_oss_moe_block_off_the_te_backend(base_env, platform):
    """Where TE imports, TRANSFORMER_IMPL=auto runs gpt-oss's MoE block on the native backend
    on every GPU (TE's parity with HF failed there), with that reason; the MLPerf variant (no
    biases, plain SwiGLU) follows the MoE rule (TE where the native backend is not measured
    faster)."""
    setting = oss(base_env, NUM_LAYERS=4, PLATFORM=platform).settings.setting("TRANSFORMER_IMPL")
    assert setting.value == "native" and "biased experts and router and the clamped " \
        "quick-GeGLU" in setting.reason, setting.reason
    mlperf = oss(base_env, MODEL_SIZE="20b-mlperf", NUM_LAYERS=4, PLATFORM=platform)
    expected = "native" if platform == "h200" else "transformer_engine"
    assert mlperf.settings["TRANSFORMER_IMPL"] == expected
    assert not notices(mlperf, "gpt_oss_te_backend")


def test_gpt_oss_on_the_te_backend_is_refused_and_fp8_with_it(base_env):
    msg = refused(base_env, "gpt_oss_te_backend", NUM_LAYERS=4, PLATFORM="h200",
                  TRANSFORMER_IMPL="transformer_engine")
    assert "96x" in msg and "TRANSFORMER_IMPL=native" in msg and "PRECISION" not in msg
    msg = refused(base_env, "gpt_oss_te_backend", NUM_LAYERS=4, PLATFORM="h200",
                  TRANSFORMER_IMPL="transformer_engine", PRECISION="fp8")
    assert "PRECISION=bf16" in msg
    # auto with an fp8 recipe: the native backend, which has no fp8 layers, says why it is native
    msg = refused(base_env, "low_precision_needs_te", NUM_LAYERS=4, PLATFORM="h200",
                  PRECISION="fp8")
    assert "clamped quick-GeGLU" in msg and "PRECISION=bf16" in msg


def test_plain_torchrun_keeps_gpt_oss_moe_block_off_the_te_backend():
    from training.arguments import ArgumentConflict, as_the_launcher
    from training.launch.capabilities import for_platform

    caps = for_platform("h200")
    plain = ["--num-experts", "8", "--moe-grouped-gemm", "--disable-bias-linear"]
    te = ["--transformer-backend", "transformer_engine"]
    for words, parts in ((plain + ["--quick-geglu", "--activation-func-clamp-value", "7"],
                          "the clamped quick-GeGLU"),
                         (plain[:-1] + ["--softmax-type", "learnable"],   # biases on (default)
                          "biased experts and router")):
        argv, notes = as_the_launcher(words, caps)
        assert argv[argv.index("--transformer-backend", 5) + 1] == "native"
        assert any(f"an MoE block with {parts} (gpt-oss's)" in note for note in notes), notes
        with pytest.raises(ArgumentConflict, match="--transformer-backend native"):
            as_the_launcher(words + te, caps)
    # an unbiased MoE with sinks (the attention matched HF on TE), and a dense model with
    # biases: TE is not refused
    for words in (plain + ["--softmax-type", "learnable"], ["--softmax-type", "learnable"]):
        argv, _ = as_the_launcher(words + te, caps)
        assert argv[argv.index("--transformer-backend") + 1] == "transformer_engine"


def test_transformer_engine_before_2_8_has_no_sinks():
    """Before TE 2.8 megatron-core would assert on softmax_type; from 2.8 the MoE block's parity
    failure is the reason (and a named platform's image, version unknown here, gets that one
    too)."""
    def ctx(te):
        return SimpleNamespace(preset=gpt_oss.GPT_OSS_20B, backend="transformer_engine",
                               settings={"CP": 1}, caps=SimpleNamespace(te_version=te),
                               recipe=SimpleNamespace(name="bf16", kind="bf16"))

    with pytest.raises(Refusal, match="TE 2.8"):
        gpt_oss.gpt_oss_te_backend(ctx("2.7.0+abc"))
    for te in ("2.8.0", "2.20.2", None):
        with pytest.raises(Refusal, match="96x Hugging Face's own bf16 error"):
            gpt_oss.gpt_oss_te_backend(ctx(te))


def test_the_guards_leave_other_families_alone(base_env):
    result = launch(base_env, family="mixtral", layers=[MOE, GPT_OSS], NUM_LAYERS=4,
                    MOE_GROUPED_GEMM=0)
    assert not notices(result, "gpt_oss_kernels") and result.settings["FUSED_SINGLE_QKV_ROPE"]


def test_the_lean_step_applies_to_gpt_oss(base_env):
    """The biased experts keep the tokens per expert on the GPU (BiasedGroupedMLP)."""
    result = oss(base_env, NUM_LAYERS=4, TRANSFORMER_IMPL="native")
    assert result.settings["MOE_LEAN_STEP"] and result.settings["MOE_DEVICE_COUNTS"]


def _script(tmp_path, *words, **env):
    full = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"),
            "EXPERIMENT_DIR": str(tmp_path / "experiment"), "DRY_RUN": "1", "VERBOSE": "1",
            "PYTHON": sys.executable}
    full.update({k: str(v) for k, v in env.items()})
    return subprocess.run(["bash", str(REPO / "examples/moe/train_gpt_oss.sh"), *words],
                          env=full, capture_output=True, text=True, timeout=120, cwd=tmp_path)


def test_entry_script_dry_run_and_preflight(tmp_path):
    """gpt-oss-20b on 8 H200s with EP=8 passes the memory pre-flight; whole on one H200 it is
    refused before torchrun (21B parameters with their Adam states)."""
    proc = _script(tmp_path, "EP=8", PLATFORM="h200", GPUS_PER_NODE=8)
    assert proc.returncode == 0, proc.stderr
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("torchrun ")]
    words = shlex.split(line)
    assert _after(words, "--num-experts") == "32" and _after(words, "--softmax-type") == "learnable"
    assert "preflight_memory" in proc.stderr
    proc = _script(tmp_path, PLATFORM="h200", GPUS_PER_NODE=1)
    assert proc.returncode == 2 and "[preflight_memory]" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_gpt_oss_120b_is_sized_by_the_preflight(tmp_path):
    """gpt-oss-120b: one node of 8 H200s at EP=8 keeps every expert's fp32 state on its one
    expert-data-parallel rank and is refused; two nodes with the 16-bit optimizer state, or
    four (expert DP 4), fit by the estimate."""
    proc = _script(tmp_path, "MODEL_SIZE=120b", "EP=8", PLATFORM="h200", GPUS_PER_NODE=8)
    assert proc.returncode == 2 and "[preflight_memory]" in proc.stderr
    assert "expert DP = 1" in proc.stderr
    for words in (["NNODES=4"], ["NNODES=2", "ADAM_MOMENTS_DTYPE=bf16",
                                 "MASTER_WEIGHTS=remainder"]):
        proc = _script(tmp_path, "MODEL_SIZE=120b", "EP=8", *words, PLATFORM="h200",
                       GPUS_PER_NODE=8, MASTER_ADDR="node0")
        assert proc.returncode == 0 and "fits" in proc.stderr, proc.stderr


def test_the_bench_part_of_the_bar():
    """gpt-oss-peers: gpt-oss-20b cut to 8 layers at seq 8192 (fits one H200 by the estimate),
    ours on the native backend against Hugging Face's GptOssForCausalLM, which the HF peer
    builds with flex attention and each decoder layer compiled."""
    from training.bench import catalog
    from training.bench.hf_peer import hf_model_config
    from training.bench.ours import family_layers

    shape = catalog.PART_SHAPES["gpt-oss-peers"]
    assert (shape.preset, shape.num_layers, shape.seq_length) == ("gpt-oss-20b", 8, 8192)
    assert ("gpt-oss-peers", "peers", ("native", "hf_compile")) in catalog.MOE_PARTS
    assert family_layers("gpt_oss") == [MOE, GPT_OSS]
    model_class, config = hf_model_config(gpt_oss.GPT_OSS_20B, 8, 8192)
    assert model_class.__name__ == "GptOssForCausalLM"
    assert (config.num_hidden_layers, config.num_local_experts, config.sliding_window) == (8, 32,
                                                                                           128)


def test_the_lean_steps_cuda_graph_is_off_for_flex_attention(base_env):
    """gpt-oss's step measured no faster under the CUDA graph: the lean step's default graph is
    turned off with the reason; a user's CUDA_GRAPH=full_iteration runs, warned."""
    result = oss(base_env, TRANSFORMER_IMPL="native", TOTAL_ITERS=20, PLATFORM="h200")
    graph = result.settings.setting("CUDA_GRAPH")
    assert graph.value == "none" and graph.source == "guard" and "flex" in graph.reason
    assert "CUDA_GRAPH=full_iteration tries it" in graph.reason
    tried = oss(base_env, TRANSFORMER_IMPL="native", TOTAL_ITERS=20, CUDA_GRAPH="full_iteration",
                PLATFORM="h200")
    assert tried.settings["CUDA_GRAPH"] == "full_iteration"
    assert [n.level for n in tried.settings.notices if n.guard == "gpt_oss_cuda_graph"] == \
        ["warning"]
