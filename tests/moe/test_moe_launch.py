"""The MoE launch: presets registered from the family package, the MoE toggles' flags, every MoE
guard by name, the words through megatron-core 0.19.2's own parser and validate_args (and into a
TransformerConfig), and the entry scripts' DRY_RUN."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import training.moe.presets  # noqa: F401 - registers qwen3_moe and mixtral
from training.launch.presets import FAMILIES
from training.moe.layer import MOE

from tests.launch import test_guards
from tests.launch.helpers import launch, megatron_args
from training.launch.settings import LaunchError
from tests.launch.test_guards import notices

REPO = Path(__file__).resolve().parents[2]


def moe(env, family="qwen3_moe", **toggles):
    """A launch as examples/moe/train_*.sh resolves it: the MoE recipe layer on the core."""
    return launch(env, family=family, layers=[MOE], **toggles)


def refused(env, guard, family="qwen3_moe", **toggles) -> str:
    return test_guards.refused(env, guard, family=family, layers=[MOE], **toggles)


def test_families_register_from_the_moe_package():
    assert FAMILIES["qwen3_moe"] == ({"30B-A3B": "qwen3-30B-A3B", "tiny": "tiny-moe"}, "30B-A3B")
    assert FAMILIES["mixtral"][1] == "8x7B"


def test_default_qwen3_moe_launch_words(base_env):
    result = moe(base_env, NUM_LAYERS=4)
    gpt = result.buckets["GPT_ARGS"]
    for words in (["--num-experts", "128"], ["--moe-router-topk", "8"],
                  ["--moe-ffn-hidden-size", "768"], ["--kv-channels", "128"], ["--qk-layernorm"],
                  ["--expert-model-parallel-size", "1"], ["--moe-grouped-gemm"],
                  ["--moe-token-dispatcher-type", "alltoall"], ["--moe-router-dtype", "fp32"],
                  ["--moe-aux-loss-coeff", "0.001"], ["--native-moe-permute"]):
        assert " ".join(words) in " ".join(gpt), words
    setting = result.settings.setting("MOE_AUX_LOSS_COEFF")
    assert (setting.value, setting.source) == (0.001, "preset")
    assert "--moe-expert-capacity-factor" not in gpt   # dropless by default


def test_the_core_launcher_knows_no_moe_toggle(base_env):
    """The core registry has none of the layer's toggles; a dense launch gets no MoE flag."""
    from training.launch.toggles import BY_NAME
    from training.moe.layer import TOGGLES

    assert not {t.name for t in TOGGLES} & set(BY_NAME)
    result = launch(base_env, PLATFORM="h200")   # SM90: where MOE_WGRAD_FUSION is on for MoE
    assert not [w for w in result.buckets["GPT_ARGS"] if "expert" in w or "moe" in w]
    assert "EP" not in result.settings.values and "MOE_WGRAD_FUSION" not in result.settings.values


@pytest.mark.parametrize("toggles,needle", [
    ({"EP": 3, "GPUS_PER_NODE": 3}, "must divide the 128 experts"),
    ({"EP": 0}, "EP=0 must be at least 1"),
    ({"ETP": 5, "GPUS_PER_NODE": 5}, "must divide the experts' FFN width 768"),
    ({"EP": 4, "GPUS_PER_NODE": 2}, "EP*ETP*PP=4*1*1=4 does not divide the world size 2"),
    ({"EP": 2, "ETP": 2, "PP": 2, "GPUS_PER_NODE": 4, "NUM_LAYERS": 4},
     "does not divide the world size 4"),
])
def test_expert_parallel_sizes(base_env, toggles, needle):
    assert needle in refused(base_env, "expert_parallel_sizes", **toggles)


def test_expert_parallel_layouts_that_megatron_accepts(base_env):
    result = moe(base_env, EP=8, GPUS_PER_NODE=8, NUM_LAYERS=4)
    assert "--expert-model-parallel-size 8" in " ".join(result.buckets["GPT_ARGS"])
    moe(base_env, EP=4, ETP=2, GPUS_PER_NODE=8, NUM_LAYERS=4)
    moe(base_env, EP=2, PP=2, GPUS_PER_NODE=4, NUM_LAYERS=4)


def test_tp_with_moe_needs_sequence_parallel(base_env):
    msg = refused(base_env, "moe_sequence_parallel", TP=2, GPUS_PER_NODE=2,
                  SEQUENCE_PARALLEL=0, NUM_LAYERS=4)
    assert "SEQUENCE_PARALLEL=1" in msg
    msg = refused(base_env, "moe_sequence_parallel", TP=2, GPUS_PER_NODE=2,
                  TRANSFORMER_IMPL="local", NUM_LAYERS=4)
    assert "local backend's torch norms" in msg
    assert moe(base_env, TP=2, GPUS_PER_NODE=2, NUM_LAYERS=4).settings["SEQUENCE_PARALLEL"]


def test_fsdp_with_expert_parallelism_is_refused(base_env):
    msg = refused(base_env, "fsdp_expert_parallel", FSDP=1, EP=2,
                  GPUS_PER_NODE=2, GRADIENT_ACCUMULATION_FUSION=0, DISTRIBUTED_OPTIMIZER=0,
                  OVERLAP_PARAM_GATHER=0, NUM_LAYERS=4)
    assert "EP=1" in msg


def test_flex_dispatcher_needs_deep_ep(base_env):
    msg = refused(base_env, "moe_dispatcher_kernels", family="qwen3_moe",
                  MOE_TOKEN_DISPATCHER="flex", EP=2, GPUS_PER_NODE=2, NUM_LAYERS=4)
    assert "deep_ep" in msg and "MOE_TOKEN_DISPATCHER=alltoall" in msg


def test_local_backend_has_no_grouped_experts_or_fused_permute(base_env):
    result = moe(base_env, TRANSFORMER_IMPL="local", NUM_LAYERS=4)
    assert not result.settings["MOE_GROUPED_GEMM"] and not result.settings["MOE_PERMUTE_FUSION"]
    assert len(notices(result, "moe_expert_kernels")) == 2
    gpt = result.buckets["GPT_ARGS"]
    assert "--moe-grouped-gemm" not in gpt and "--native-moe-permute" not in gpt
    msg = refused(base_env, "moe_expert_kernels", TRANSFORMER_IMPL="local",
                  MOE_GROUPED_GEMM=1, NUM_LAYERS=4)
    assert "TRANSFORMER_IMPL=native" in msg


def test_permute_fusion_is_tes_kernel_with_tes_experts(base_env):
    gpt = moe(base_env, PLATFORM="h200", NUM_LAYERS=4, MOE_EXPERT_IMPL="te",
              TRANSFORMER_IMPL="transformer_engine").buckets["GPT_ARGS"]
    assert "--moe-permute-fusion" in gpt and "--native-moe-permute" not in gpt
    assert " ".join(["--moe-expert-impl", "te"]) in " ".join(gpt)


@pytest.mark.parametrize("platform,experts,says", [
    ("h200", "native", "measured on an H200"),
    ("h100", "native", "measured on an H200"),      # the same architecture (sm90)
    ("b300", "native", "not measured on this GPU"),
    ("mi355x", "te", "not measured on gfx950"),
])
def test_auto_experts_on_the_te_backend_follow_the_measured_table(base_env, platform, experts,
                                                                   says):
    """MOE_EXPERT_IMPL=auto on the TE backend picks by GPU architecture, with the reason saying
    whether a measurement stands behind it; the permute and the lean step follow the experts."""
    result = moe(base_env, PLATFORM=platform, NUM_LAYERS=4, TRANSFORMER_IMPL="transformer_engine")
    setting = result.settings.setting("MOE_EXPERT_IMPL")
    assert result.settings["TRANSFORMER_IMPL"] == "transformer_engine"
    assert (setting.value, setting.source) == (experts, "derived") and says in setting.reason
    gpt = " ".join(result.buckets["GPT_ARGS"])
    assert f"--moe-expert-impl {experts}" in gpt
    native = experts == "native"
    assert ("--native-moe-permute" in gpt) is native and ("--moe-permute-fusion" in gpt) is not native
    # the lean step follows the native experts onto the TE backend
    assert result.settings["MOE_LEAN_STEP"] is native
    assert ("--moe-device-counts" in gpt) is native


def test_auto_experts_on_the_native_backend_are_native(base_env):
    result = moe(base_env, TRANSFORMER_IMPL="native", NUM_LAYERS=4)
    assert result.settings["MOE_EXPERT_IMPL"] == "native"
    assert "--native-moe-permute" in result.buckets["GPT_ARGS"]


def test_tes_experts_need_the_te_backend(base_env):
    msg = refused(base_env, "moe_expert_impl", TRANSFORMER_IMPL="native", MOE_EXPERT_IMPL="te",
                  NUM_LAYERS=4)
    assert "MOE_EXPERT_IMPL=native" in msg


def test_the_lean_step_is_refused_with_tes_experts(base_env):
    te = dict(PLATFORM="h200", MOE_EXPERT_IMPL="te", TRANSFORMER_IMPL="transformer_engine",
              NUM_LAYERS=4)
    msg = refused(base_env, "moe_lean_step", MOE_LEAN_STEP=1, **te)
    assert "MOE_EXPERT_IMPL=te" in msg
    result = moe(base_env, **te)
    assert not result.settings["MOE_LEAN_STEP"]
    assert "MOE_EXPERT_IMPL=te" in result.settings.setting("MOE_LEAN_STEP").reason


@pytest.mark.parametrize("toggles,needle", [
    ({"MOE_PAD_TO_CAPACITY": 1}, "needs MOE_CAPACITY_FACTOR"),
    ({"MOE_CAPACITY_FACTOR": 0}, "must be positive"),
    ({"MOE_CAPACITY_FACTOR": 1.25, "MOE_LOAD_BALANCING": "sinkhorn"}, "sinkhorn"),
])
def test_token_dropping(base_env, toggles, needle):
    assert needle in refused(base_env, "moe_capacity", NUM_LAYERS=4,
                             **toggles)


def test_drop_policy_without_a_capacity_factor_warns(base_env):
    result = moe(base_env, MOE_TOKEN_DROP_POLICY="position", NUM_LAYERS=4)
    assert notices(result, "moe_capacity")
    assert "--moe-token-drop-policy" not in result.buckets["GPT_ARGS"]


def test_device_counts_only_where_the_counts_are_the_dispatchers_only_host_value(base_env):
    native = {"TRANSFORMER_IMPL": "native", "NUM_LAYERS": 4}
    args = megatron_args(moe(base_env, MOE_DEVICE_COUNTS=1, MOE_LEAN_STEP=0, **native))
    assert args.moe_device_counts is True
    # off by default in the core; the MoE launch's lean step turns it on (below)
    assert megatron_args(moe(base_env, MOE_LEAN_STEP=0, **native)).moe_device_counts is False
    for toggles, why in (({"MOE_GROUPED_GEMM": 0}, "MOE_GROUPED_GEMM=0"),
                         ({"EP": 2, "GPUS_PER_NODE": 2}, "EP=2"),
                         ({"TP": 2, "GPUS_PER_NODE": 2}, "TP=2"),
                         ({"ETP": 2, "GPUS_PER_NODE": 2}, "ETP=2"),
                         ({"MOE_TOKEN_DISPATCHER": "allgather"},
                          "MOE_TOKEN_DISPATCHER=allgather"),
                         ({"MOE_CAPACITY_FACTOR": 1.25}, "MOE_CAPACITY_FACTOR"),
                         ({"TRANSFORMER_IMPL": "local", "MOE_GROUPED_GEMM": 0,
                           "MOE_PERMUTE_FUSION": 0}, "the local backend")):
        msg = refused(base_env, "moe_device_counts", MOE_DEVICE_COUNTS=1, MOE_LEAN_STEP=0,
                      **{**native, **toggles})
        assert why in msg and "MOE_DEVICE_COUNTS=0" in msg


LEAN = {"MOE_DEVICE_COUNTS": True, "ADAM_MOMENTS_DTYPE": "bf16", "MASTER_WEIGHTS": "remainder"}


def test_the_lean_step_is_the_moe_default_where_no_host_synchronisation_is_left(base_env):
    """Native backend, EP = TP = 1, grouped, dropless, bf16: the three settings come from the
    MoE layer with source "recipe" and a reason, the fused cross-entropy stays on (sync-free);
    MOE_LEAN_STEP=0 gives the core defaults."""
    result = moe(base_env, TRANSFORMER_IMPL="native", NUM_LAYERS=4)
    for name, value in LEAN.items():
        setting = result.settings.values[name]
        assert (setting.value, setting.source) == (value, "recipe"), name
        assert setting.reason.startswith("moe: MOE_LEAN_STEP: "), name
    args = megatron_args(result)
    assert args.moe_device_counts and args.cross_entropy_loss_fusion
    assert "bf" in str(args.exp_avg_dtype) and "bf" in str(args.exp_avg_sq_dtype)
    assert args.master_weights == "remainder"
    core = moe(base_env, TRANSFORMER_IMPL="native", NUM_LAYERS=4, MOE_LEAN_STEP=0)
    assert [core.settings[name] for name in LEAN] == [False, "fp32", "fp32"]
    assert core.settings["CROSS_ENTROPY_LOSS_FUSION"] is True
    assert not core.recipe_values


def test_the_lean_step_keeps_what_the_user_set(base_env):
    result = moe(base_env, TRANSFORMER_IMPL="native", NUM_LAYERS=4, CROSS_ENTROPY_LOSS_FUSION=1,
                 ADAM_MOMENTS_DTYPE="fp32")
    s = result.settings
    assert s["CROSS_ENTROPY_LOSS_FUSION"] is True and s["ADAM_MOMENTS_DTYPE"] == "fp32"
    assert (s["MOE_DEVICE_COUNTS"], s["MASTER_WEIGHTS"]) == (True, "remainder")


@pytest.mark.parametrize("toggles,why", [
    ({"EP": 2, "GPUS_PER_NODE": 2}, "EP=2"),
    ({"TP": 2, "GPUS_PER_NODE": 2}, "TP=2"),
    ({"ETP": 2, "GPUS_PER_NODE": 2}, "ETP=2"),
    ({"MOE_GROUPED_GEMM": 0}, "MOE_GROUPED_GEMM=0"),
    ({"MOE_CAPACITY_FACTOR": 1.25}, "MOE_CAPACITY_FACTOR"),
    ({"OPTIMIZER_CPU_OFFLOAD": 1}, "OPTIMIZER_CPU_OFFLOAD=1"),
    ({"DISTRIBUTED_OPTIMIZER": 0}, "DISTRIBUTED_OPTIMIZER=0"),
    ({"ADAM_BETA2": 0.999}, "ADAM_BETA2=0.999"),
    ({"TRANSFORMER_IMPL": "local", "MOE_GROUPED_GEMM": 0, "MOE_PERMUTE_FUSION": 0},
     "the local backend"),
])
def test_the_lean_step_steps_aside_with_a_reason_or_refuses_when_asked_for(base_env, toggles,
                                                                          why):
    native = {"TRANSFORMER_IMPL": "native", "NUM_LAYERS": 4}
    result = moe(base_env, **{**native, **toggles})
    lean = result.settings.values["MOE_LEAN_STEP"]
    assert (lean.value, lean.source) == (False, "derived") and why in lean.reason
    assert result.settings["MOE_DEVICE_COUNTS"] is False
    assert result.settings["ADAM_MOMENTS_DTYPE"] == "fp32"
    msg = refused(base_env, "moe_lean_step", MOE_LEAN_STEP=1, **{**native, **toggles})
    assert why in msg and "MOE_LEAN_STEP=0" in msg


@pytest.mark.parametrize("layout,why", [({"TP": 2}, "TP=2"), ({"ETP": 2}, "ETP=2")])
def test_the_moe_launcher_keeps_the_counts_on_the_host_at_tp_or_etp_above_one(
        tmp_path, monkeypatch, capsys, layout, why):
    """Through the module examples/moe runs (training.moe.launch): MOE_DEVICE_COUNTS=1 at
    TP or ETP > 1 exits 2 naming the guard; left to the lean step, the launch line has no
    --moe-device-counts and MOE_LEAN_STEP is shown 0 with why."""
    from training.moe.launch import main

    monkeypatch.setenv("EXPERIMENT_DIR", str(tmp_path / "experiment"))
    monkeypatch.setenv("DRY_RUN", "1")
    words = ["--family", "qwen3_moe", "TRANSFORMER_IMPL=native", "NUM_LAYERS=4",
             "GPUS_PER_NODE=2", *(f"{k}={v}" for k, v in layout.items())]
    assert main([*words, "MOE_DEVICE_COUNTS=1"]) == 2
    err = capsys.readouterr().err
    assert "[moe_device_counts]" in err and why in err and "Set MOE_DEVICE_COUNTS=0" in err
    assert main(words) == 0
    out, err = capsys.readouterr()
    assert "--moe-device-counts" not in out and "--expert-tensor-parallel-size" in out
    (lean,) = [line for line in err.splitlines() if " MOE_LEAN_STEP " in line]
    assert " 0 " in lean and "derived" in lean and f"not here: {why}" in lean


def test_the_lean_step_runs_under_fp8_and_not_under_fp4(base_env):
    """fp8 on the TE backend keeps the native experts in bf16 and the lean step (run on an H200:
    moe-te-levers' PRECISION=fp8 row, 60.3 GiB); an fp4 recipe leaves it out, with why; an fp8
    MoE launch says what fp8 measured."""
    result = moe(base_env, PLATFORM="h200", NUM_LAYERS=4, PRECISION="fp8")
    assert result.settings["MOE_LEAN_STEP"] is True
    assert notices(result, "moe_low_precision")
    result = moe(base_env, PLATFORM="b300", NUM_LAYERS=4, PRECISION="nvfp4")
    lean = result.settings.values["MOE_LEAN_STEP"]
    assert lean.value is False and "PRECISION=nvfp4" in lean.reason
    assert not notices(moe(base_env, PLATFORM="h200", NUM_LAYERS=4), "moe_low_precision")


@pytest.mark.parametrize("mbs", [1, 2])
def test_an_fp8_moe_launch_quotes_the_closest_measurement(base_env, mbs):
    """The notice quotes docs/levers.json's closest fp8 row for this shape (the advisor's
    lookup), and recommends the recipe only where that row measured it faster: at micro-batch
    2 the row measured at micro-batch 2 (fp8 against bf16, both at MBS 2)."""
    from training import REPO_ROOT
    from training.optimize.levers import load_default

    result = moe(base_env, PLATFORM="h200", NUM_LAYERS=8, SEQ_LENGTH=4096, BS=8, MBS=mbs,
                 GPUS_PER_NODE=1, PRECISION="fp8", TRANSFORMER_IMPL="transformer_engine")
    (notice,) = notices(result, "moe_low_precision")
    text = notice.message
    assert "docs/benchmarks/moe-te-" in text and f"mbs {mbs} " in text, text
    entry = next(e for e in load_default(None, REPO_ROOT).entries
                 if e.source in text and e.set in text and f"mbs {mbs}" in text)
    faster = entry.verdict == "faster" and entry.ratio > 1
    assert ("measured faster than bf16" in text) is faster, text
    assert ("not recommended for throughput" in text) is not faster, text


def test_an_fp8_moe_notice_gives_no_verdict_from_another_gpu_or_recipe(base_env):
    """On a B300 the H200's fp8 rows are quoted without a verdict; mxfp8, never measured, is
    not judged by fp8's rows."""
    def notice(**env):
        result = moe(base_env, PLATFORM="b300", NUM_LAYERS=8, SEQ_LENGTH=4096, BS=8,
                     GPUS_PER_NODE=1, **env)
        (one,) = notices(result, "moe_low_precision")
        return one.message

    text = notice(PRECISION="fp8")
    assert "measured on NVIDIA H200 only, not on b300: no verdict here" in text, text
    assert "recommended" not in text and "faster than bf16" not in text
    text = notice(PRECISION="mxfp8")
    assert "not measured (docs/levers.json has no row of PRECISION=mxfp8;" in text, text


def test_under_platform_auto_the_detected_gpu_decides_the_verdict(base_env, monkeypatch):
    """PLATFORM=auto: the detected GPU is the launch's. An unknown one (TE installed, a GPU no
    platform names) gets the H200 rows without a verdict; a detected H200 gets one."""
    import dataclasses

    from training.launch import capabilities

    h200 = capabilities.for_platform("h200")
    for detected, says in ((dataclasses.replace(h200, platform=None, source="detected",
                                                device_name="NVIDIA Future GPU"),
                            "not on this GPU (not a known platform): no verdict here"),
                           (dataclasses.replace(h200, source="detected"),
                            "not recommended for throughput")):
        monkeypatch.setattr(capabilities, "detect", lambda d=detected: d)
        result = moe(base_env, PLATFORM="auto", NUM_LAYERS=8, SEQ_LENGTH=4096, BS=8,
                     GPUS_PER_NODE=1, PRECISION="fp8", TRANSFORMER_IMPL="transformer_engine")
        (one,) = notices(result, "moe_low_precision")
        assert says in one.message, one.message


def test_an_fp8_moe_notice_with_te_experts_quotes_their_row(base_env):
    """MOE_EXPERT_IMPL=te puts the experts in TE's fp8 grouped linear: the notice quotes that
    row (0.204x on Qwen3), never the native experts' fp8 row."""
    result = moe(base_env, PLATFORM="h200", NUM_LAYERS=8, SEQ_LENGTH=4096, BS=8,
                 GPUS_PER_NODE=1, PRECISION="fp8", TRANSFORMER_IMPL="transformer_engine",
                 MOE_EXPERT_IMPL="te")
    (one,) = notices(result, "moe_low_precision")
    assert "PRECISION=fp8 MOE_EXPERT_IMPL=te vs PRECISION=bf16" in one.message, one.message
    assert "TE's grouped linear computes the experts in fp8" in one.message
    result = moe(base_env, PLATFORM="h200", NUM_LAYERS=8, SEQ_LENGTH=4096, BS=8,
                 GPUS_PER_NODE=1, PRECISION="fp8", TRANSFORMER_IMPL="transformer_engine")
    (one,) = notices(result, "moe_low_precision")
    assert "MOE_EXPERT_IMPL=te" not in one.message and "stay bf16" in one.message


def test_a_cuda_graph_of_the_moe_step_needs_the_counts_on_the_gpu(base_env):
    """The lean step leaves nothing a graph cannot capture; the core defaults' MoE dispatcher
    reads the tokens per expert on the host in every layer: refused."""
    native = {"TRANSFORMER_IMPL": "native", "NUM_LAYERS": 4, "CUDA_GRAPH": "full_iteration"}
    args = megatron_args(moe(base_env, **native))
    assert args.cuda_graph_impl == "full_iteration" and args.moe_device_counts
    msg = refused(base_env, "cuda_graph", MOE_LEAN_STEP=0, **native)
    assert "set MOE_DEVICE_COUNTS=1" in msg and "CROSS_ENTROPY" not in msg


def test_negative_aux_loss_coefficient_is_refused(base_env):
    assert ">= 0" in refused(base_env, "moe_aux_loss", family="qwen3_moe",
                             MOE_AUX_LOSS_COEFF=-0.1, NUM_LAYERS=4)


def test_qk_norms_turn_the_fused_qkv_rope_off(base_env):
    result = moe(base_env, NUM_LAYERS=4)
    assert not result.settings["FUSED_SINGLE_QKV_ROPE"]
    assert notices(result, "fused_qkv_rope_qk_norm")
    refused(base_env, "fused_qkv_rope_qk_norm", FUSED_SINGLE_QKV_ROPE=1,
            NUM_LAYERS=4)
    assert moe(base_env, family="mixtral", NUM_LAYERS=4).settings["FUSED_SINGLE_QKV_ROPE"]


@pytest.mark.parametrize("family,toggles", [
    ("qwen3_moe", {"NUM_LAYERS": 4}),
    ("qwen3_moe", {"MODEL_SIZE": "tiny"}),
    ("mixtral", {"NUM_LAYERS": 4}),
    ("mixtral", {"MODEL_SIZE": "tiny", "MOE_GROUPED_GEMM": 0, "MOE_PERMUTE_FUSION": 0}),
    ("qwen3_moe", {"NUM_LAYERS": 4, "EP": 8, "GPUS_PER_NODE": 8, "PLATFORM": "h200",
                   "TRANSFORMER_IMPL": "native"}),
    ("qwen3_moe", {"NUM_LAYERS": 4, "EP": 4, "ETP": 2, "TP": 2, "GPUS_PER_NODE": 8,
                   "PLATFORM": "h200", "TRANSFORMER_IMPL": "native"}),
    ("qwen3_moe", {"NUM_LAYERS": 4, "MOE_TOKEN_DISPATCHER": "allgather",
                   "MOE_CAPACITY_FACTOR": 1.25, "MOE_TOKEN_DROP_POLICY": "position",
                   "MOE_PAD_TO_CAPACITY": 1, "MOE_ROUTER_DTYPE": "none",
                   "MOE_LOAD_BALANCING": "seq_aux_loss"}),
    ("mixtral", {"NUM_LAYERS": 4, "PLATFORM": "h200"}),   # TE backend, TE permute fusion
])
def test_moe_launches_pass_megatrons_validation(base_env, family, toggles):
    result = moe(base_env, family=family, **toggles)
    args = megatron_args(result)
    preset = result.ctx.preset
    assert args.num_experts == preset.num_experts and args.moe_router_topk == preset.router_topk
    assert args.expert_model_parallel_size == result.settings["EP"]
    assert args.moe_grouped_gemm is result.settings["MOE_GROUPED_GEMM"]
    assert args.moe_aux_loss_coeff == result.settings["MOE_AUX_LOSS_COEFF"]
    if result.settings["TRANSFORMER_IMPL"] == "native":
        # the model's config: TransformerConfig's own MoE checks (the TE side needs TE here)
        from megatron.training.argument_utils import core_transformer_config_from_args

        config = core_transformer_config_from_args(args)
        assert config.num_moe_experts == preset.num_experts
        assert args.native_moe_permute is result.settings["MOE_PERMUTE_FUSION"]
        assert config.qk_layernorm is preset.qk_layernorm


def _script(tmp_path, name, *words, **env):
    full = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "VERBOSE": "1",
            "EXPERIMENT_DIR": str(tmp_path / "experiment"), "DRY_RUN": "1",
            "PYTHON": sys.executable}
    full.update({k: str(v) for k, v in env.items()})
    return subprocess.run(["bash", str(REPO / "examples" / "moe" / name), *words], env=full,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)


@pytest.mark.parametrize("name,experts", [("train_qwen3_moe.sh", "128"),
                                          ("train_mixtral.sh", "8")])
def test_entry_scripts_dry_run(tmp_path, name, experts):
    proc = _script(tmp_path, name, "NUM_LAYERS=2", "EP=2", GPUS_PER_NODE=2)
    assert proc.returncode == 0, proc.stderr
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("torchrun ")]
    words = shlex.split(line)
    assert words[words.index("--num-experts") + 1] == experts
    assert words[words.index("--expert-model-parallel-size") + 1] == "2"
    assert "EP" in proc.stderr and "cli" in proc.stderr


def test_entry_script_refusal_exits_2_with_the_guard(tmp_path):
    proc = _script(tmp_path, "train_mixtral.sh", "EP=3", GPUS_PER_NODE=3)
    assert proc.returncode == 2
    assert "[expert_parallel_sizes]" in proc.stderr and "Traceback" not in proc.stderr


def test_readme_moe_tables_are_generated_from_the_layer():
    from training.moe import docs as moe_docs

    assert moe_docs.main(["--check"]) == 0, "README.md is stale: run python -m training.moe.docs"


def test_moe_help_quotes_no_measured_figure_and_points_at_measured_rows():
    """Like the core registry's help (tests/launch/test_readme.py): the measured effect lives in
    docs/levers.json; a toggle with rows there says so."""
    import json
    import re

    from training.moe.layer import TOGGLES

    figure = re.compile(r"\d+(\.\d+)?\s*(x\b|GB\b|GiB\b|MB\b|ms\b|TFLOP)"
                        r"|\d+(\.\d+)?%\s*(faster|slower|more|less|higher|lower)")
    data = json.loads((REPO / "docs" / "levers.json").read_text())
    measured = {word.split("=")[0] for lever in data["levers"] if lever["kind"] != "peer"
                for word in lever["set"].split() if "=" in word}
    for toggle in TOGGLES:
        assert not figure.search(toggle.help), toggle.name
        assert toggle.levers is (toggle.name in measured), toggle.name


def test_plain_torchrun_default_of_the_native_permute_is_the_layers():
    from training.arguments import NATIVE_MOE_PERMUTE_DEFAULT, megatron_parser
    from training.moe.layer import TOGGLES

    (toggle,) = [t for t in TOGGLES if t.name == "MOE_PERMUTE_FUSION"]
    assert NATIVE_MOE_PERMUTE_DEFAULT is toggle.default
    assert megatron_parser().parse_args([]).native_moe_permute is toggle.default


@pytest.mark.parametrize("toggles", [
    {"NUM_LAYERS": 4, "EP": 2, "ETP": 1, "GPUS_PER_NODE": 2, "MOE_CAPACITY_FACTOR": 1.5,
     "MOE_PAD_TO_CAPACITY": 1, "MOE_TOKEN_DROP_POLICY": "position"},
    {"NUM_LAYERS": 4, "PLATFORM": "h200"},                          # TE: --moe-permute-fusion
])
def test_every_moe_word_is_routed_by_its_megatron_group(base_env, toggles):
    """As tests/launch/test_registry.py checks the core's: each --flag of an MoE launch sits in
    the bucket its Megatron argument group routes to (Megatron's "moe" group: GPT_ARGS)."""
    from training.launch.toggles import GROUP_TO_BUCKET, MEGATRON_BUCKETS

    from tests.launch.helpers import flag_groups

    groups = flag_groups()
    result = moe(base_env, **toggles)
    for bucket in MEGATRON_BUCKETS:
        for word in result.buckets[bucket]:
            if word.startswith("--"):
                assert word in groups, f"{word} is not a Megatron flag"
                assert GROUP_TO_BUCKET[groups[word]] == bucket, (word, groups[word], bucket)


def test_entry_scripts_run_the_memory_preflight(tmp_path):
    """Qwen3-30B-A3B whole on one H200 cannot fit (30.5B parameters with their Adam states):
    refused before torchrun, as examples/llama's scripts refuse; 8 GPUs with EP=8 pass it."""
    proc = _script(tmp_path, "train_qwen3_moe.sh", PLATFORM="h200", GPUS_PER_NODE=1)
    assert proc.returncode == 2, proc.stderr
    assert "[preflight_memory]" in proc.stderr and "Traceback" not in proc.stderr
    proc = _script(tmp_path, "train_qwen3_moe.sh", "EP=8", PLATFORM="h200", GPUS_PER_NODE=8)
    assert proc.returncode == 0, proc.stderr
    assert "preflight_memory" in proc.stderr


@pytest.mark.parametrize("platform,precision,backend,says", [
    ("h200", "bf16", "native", "measured faster than the TE backend on sm90"),
    ("h100", "bf16", "native", "measured faster than the TE backend on sm90"),
    ("b300", "bf16", "transformer_engine", "not measured against it on sm100"),
    ("mi355x", "bf16", "transformer_engine", "not measured against it on gfx950"),
    ("h200", "fp8", "transformer_engine", "transformer_engine imports"),
])
def test_auto_backend_for_moe_follows_the_measurement(base_env, platform, precision, backend,
                                                      says):
    """TRANSFORMER_IMPL=auto for an MoE model where TE imports: the native backend where it was
    measured faster (bf16 on an H200's architecture), TE elsewhere with the reason saying no
    measurement stands behind it, TE for an fp8 recipe (the native backend has none)."""
    setting = moe(base_env, PLATFORM=platform, PRECISION=precision,
                  NUM_LAYERS=4).settings.setting("TRANSFORMER_IMPL")
    assert setting.value == backend and says in setting.reason, setting.reason


def test_auto_backend_for_a_dense_model_stays_te(base_env):
    setting = launch(base_env, PLATFORM="h200").settings.setting("TRANSFORMER_IMPL")
    assert setting.value == "transformer_engine"


def test_plain_torchrun_derives_the_same_moe_backend():
    """A plain torchrun of an MoE model (training.arguments.as_the_launcher) takes the launcher's
    rule: native for bf16 on an H200 with TE installed, TE for fp8 (an MoE without biases, as
    Megatron-LM's MoE examples run it: a biased MoE block is kept off TE, te_moe_blocker)."""
    from training.arguments import as_the_launcher
    from training.launch.capabilities import for_platform

    caps = for_platform("h200")
    moe_words = ["--num-experts", "8", "--moe-grouped-gemm", "--disable-bias-linear"]
    argv, _ = as_the_launcher(moe_words, caps)
    assert argv[argv.index("--transformer-backend", 3) + 1] == "native"
    argv, _ = as_the_launcher(moe_words + ["--fp8-format", "hybrid"], caps)
    assert argv[argv.index("--transformer-backend", 3) + 1] == "transformer_engine"
    assert argv[argv.index("--moe-expert-impl") + 1] == "native"


# -- the lean step's CUDA graph --------------------------------------------------------------------

def test_the_lean_step_is_graphed_on_the_native_backend_in_bf16(base_env):
    """Where it was measured (native, bf16, a run long enough to replay): CUDA_GRAPH from the
    MoE layer with its reason; the core guard keeps the eager iterations and the capture out
    of the measure; Megatron's parser takes the words."""
    result = moe(base_env, TRANSFORMER_IMPL="native", NUM_LAYERS=4, TOTAL_ITERS=20,
                 PLATFORM="h200")
    graph = result.settings.setting("CUDA_GRAPH")
    assert (graph.value, graph.source) == ("full_iteration", "recipe")
    assert graph.reason.startswith("moe: MOE_LEAN_STEP: ") and "CUDA graph" in graph.reason
    assert result.settings["METRICS_WARMUP_ITERS"] >= 4
    args = megatron_args(result)
    assert (args.cuda_graph_impl, args.cuda_graph_warmup_steps) == ("full_iteration", 3)
    assert moe(base_env, TRANSFORMER_IMPL="native", NUM_LAYERS=4, PLATFORM="h200",
               MOE_LEAN_STEP=0).settings["CUDA_GRAPH"] == "none"


@pytest.mark.parametrize("toggles,why", [
    ({"TOTAL_ITERS": 4}, "never be replayed"),
    ({"METRICS_WARMUP_ITERS": 2}, "METRICS_WARMUP_ITERS=2"),
    ({"PROFILE": "torch"}, "PROFILE=torch"),
    ({"RECOMPUTE": "full"}, "RECOMPUTE=full"),
    ({"NAN_CHECK": "bucket"}, "NAN_CHECK=bucket"),
    ({"PLATFORM": "mi355x"}, "measured on sm90 only"),
    ({"PLATFORM": "b300"}, "measured on sm90 only"),
])
def test_the_lean_step_is_not_graphed_where_the_graph_is_unmeasured(base_env, toggles, why):
    result = moe(base_env, TRANSFORMER_IMPL="native", NUM_LAYERS=4,
                 **{"TOTAL_ITERS": 20, "PLATFORM": "h200", **toggles})
    graph = result.settings.setting("CUDA_GRAPH")
    assert graph.value == "none" and why in graph.reason, graph
    assert "--cuda-graph-impl" not in " ".join(result.buckets["GPT_ARGS"])


def test_the_users_cuda_graph_setting_is_kept(base_env):
    result = moe(base_env, TRANSFORMER_IMPL="native", NUM_LAYERS=4, TOTAL_ITERS=20,
                 CUDA_GRAPH="none", PLATFORM="h200")
    assert result.settings.setting("CUDA_GRAPH").source != "recipe"
    assert result.settings["CUDA_GRAPH"] == "none"


WGRAD_OFF = [
    ({"GRADIENT_ACCUMULATION_FUSION": 0}, "GRADIENT_ACCUMULATION_FUSION=0"),
    ({"MOE_GROUPED_GEMM": 0}, "not the native grouped experts"),
    ({"TRANSFORMER_IMPL": "transformer_engine", "MOE_EXPERT_IMPL": "te"},
     "the experts are TE's grouped linear"),
]


@pytest.mark.parametrize("toggles,why", WGRAD_OFF)
def test_wgrad_fusion_where_it_would_change_nothing_is_refused(base_env, toggles, why):
    assert why in refused(base_env, "moe_wgrad_fusion", PLATFORM="h200", NUM_LAYERS=4,
                          MOE_WGRAD_FUSION=1, **{"TRANSFORMER_IMPL": "native", **toggles})
    args = megatron_args(moe(base_env, TRANSFORMER_IMPL="native", NUM_LAYERS=4,
                             MOE_WGRAD_FUSION=1))
    assert args.moe_wgrad_fusion and args.gradient_accumulation_fusion


@pytest.mark.parametrize("platform", ["h200", "h100"])
def test_wgrad_fusion_is_the_moe_default_where_it_was_measured(base_env, platform):
    """SM90, the native grouped experts with gradient-accumulation fusion (bench part
    moe-levers-wgrad): on by default, the flag given, Megatron's parser takes it."""
    result = moe(base_env, PLATFORM=platform, NUM_LAYERS=4)
    setting = result.settings.setting("MOE_WGRAD_FUSION")
    assert (setting.value, setting.source) == (True, "default")
    assert result.settings["MOE_EXPERT_IMPL"] == "native"
    assert "--moe-wgrad-fusion" in result.buckets["GPT_ARGS"]
    args = megatron_args(result)
    assert args.moe_wgrad_fusion and args.gradient_accumulation_fusion


@pytest.mark.parametrize("toggles,why", [
    *WGRAD_OFF,
    ({"FSDP": 1}, "FSDP=1"),
    ({"PLATFORM": "mi355x"}, "measured on sm90 only: PLATFORM=mi355x (gfx950) unmeasured; "
                             "set MOE_WGRAD_FUSION=1 to try"),
    ({"PLATFORM": "b300"}, "measured on sm90 only"),
])
def test_wgrad_fusion_steps_aside_with_a_reason_where_unmeasured_or_idle(base_env, toggles,
                                                                        why):
    result = moe(base_env, NUM_LAYERS=4,
                 **{"PLATFORM": "h200", "TRANSFORMER_IMPL": "native", **toggles})
    setting = result.settings.setting("MOE_WGRAD_FUSION")
    assert (setting.value, setting.source) == (False, "derived"), setting
    assert setting.reason.startswith("not here: ") and why in setting.reason
    assert "--moe-wgrad-fusion" not in result.buckets["GPT_ARGS"]


def test_wgrad_fusion_asked_for_on_an_unmeasured_gpu_is_kept(base_env):
    result = moe(base_env, PLATFORM="mi355x", TRANSFORMER_IMPL="native", NUM_LAYERS=4,
                 MOE_WGRAD_FUSION=1)
    assert result.settings.is_explicit("MOE_WGRAD_FUSION")
    assert "--moe-wgrad-fusion" in result.buckets["GPT_ARGS"]


def test_the_wgrad_guard_turns_the_default_off_and_refuses_only_a_users_1(base_env,
                                                                       monkeypatch):
    """Where the fusion is off by the guards' time but the derivation left the default on (a
    core guard turning GRADIENT_ACCUMULATION_FUSION off after it), the guard corrects it with
    why instead of refusing a setting the user never made."""
    from training.moe import layer

    monkeypatch.setattr(layer, "wgrad_fusion", lambda settings: None)
    result = moe(base_env, PLATFORM="h200", TRANSFORMER_IMPL="native", NUM_LAYERS=4,
                 GRADIENT_ACCUMULATION_FUSION=0)
    assert result.settings["MOE_WGRAD_FUSION"] is False
    assert "GRADIENT_ACCUMULATION_FUSION=0" in result.settings.setting("MOE_WGRAD_FUSION").reason
    assert "--moe-wgrad-fusion" not in result.buckets["GPT_ARGS"]


@pytest.mark.parametrize("recipe", ["fp8_tensorwise", "mxfp8"])
def test_a_recipe_that_keeps_its_own_masters_turns_the_lean_steps_remainders_off(base_env, recipe):
    """The lean step's MASTER_WEIGHTS=remainder is a recipe layer's default, not the user's: a
    precision recipe whose quantised weights Megatron keeps fp32 masters of itself turns it to
    fp32 with the reason (session 17's moe-te-more found PRECISION=fp8_tensorwise refused for a
    setting the user never made); the 16-bit moments stay. The user's own remainder is refused."""
    platform = "b300" if recipe == "mxfp8" else "h200"
    result = moe(base_env, NUM_LAYERS=4, PLATFORM=platform, PRECISION=recipe)
    master = result.settings.setting("MASTER_WEIGHTS")
    assert (master.value, master.source) == ("fp32", "guard"), master
    assert "keeps fp32 main params" in master.reason
    assert result.settings["ADAM_MOMENTS_DTYPE"] == "bf16"
    assert "remainder" not in result.emitted.get("MASTER_WEIGHTS", [])
    with pytest.raises(LaunchError, match=r"\[optimizer_state\].*MASTER_WEIGHTS=fp32"):
        moe(base_env, NUM_LAYERS=4, PLATFORM=platform, PRECISION=recipe,
            MASTER_WEIGHTS="remainder")
