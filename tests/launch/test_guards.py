"""Every guard fires, with its name and a message that says what to do."""
from __future__ import annotations

import pytest

import dataclasses

from training.launch import capabilities, megatron_info
from training.launch.guards import CHECKPOINT_TRACKER, Refusals

from .helpers import launch


def refused(env, guard, **toggles) -> str:
    with pytest.raises(Refusals) as err:
        launch(env, **toggles)
    names = [r.guard for r in err.value.refusals]
    assert guard in names, names
    return next(str(r) for r in err.value.refusals if r.guard == guard)


def notices(result, guard):
    return [n for n in result.settings.notices if n.guard == guard]


def test_transformer_engine_backend_needs_te_here(base_env):
    msg = refused(base_env, "backend_available", TRANSFORMER_IMPL="transformer_engine")
    assert "TRANSFORMER_IMPL=native" in msg


def test_auto_backend_is_native_without_te_and_te_on_a_named_platform(base_env):
    here = launch(base_env)
    assert here.settings["TRANSFORMER_IMPL"] == "native"
    assert here.settings.setting("TRANSFORMER_IMPL").source == "platform"
    b300 = launch(base_env, PLATFORM="b300")
    assert b300.settings["TRANSFORMER_IMPL"] == "transformer_engine"


def test_low_precision_needs_transformer_engine(base_env):
    msg = refused(base_env, "low_precision_needs_te", PRECISION="fp8", PLATFORM="h200",
                  TRANSFORMER_IMPL="native")
    assert "PRECISION=bf16" in msg


@pytest.mark.parametrize("precision,platform,can", [
    ("mxfp8", "h200", "b200, b300, gb200, gb300"),
    ("nvfp4", "mi355x", "gb300, gb200, b300, b200"),
    ("fp8_blockwise", "mi355x", "gb300, gb200, b300, b200, h200, h100"),
    ("mxfp4", "h200", "mi355x"),
    ("fp8", "h100", None),
    ("fp8_tensorwise", "mi300x", None),
    ("fp8_blockwise", "h200", None),
    ("mxfp8", "mi355x", None),
])
def test_precision_needs_hardware(base_env, precision, platform, can):
    if can is None:  # (the default 8B does not fit an H100's 80 GiB: not this test's subject)
        result = launch(base_env, PRECISION=precision, PLATFORM=platform,
                        PREFLIGHT_MEMORY="off")
        assert result.ctx.recipe.name == precision
        assert result.log_dir.parent.name == precision      # the run folder's tag
        return
    msg = refused(base_env, "precision_needs_hardware", PRECISION=precision, PLATFORM=platform)
    for name in can.split(", "):
        assert name in msg
    # the rule, with where it comes from, and what does run here
    assert "transformer_engine/pytorch/quantization.py" in msg and "ROCm" in msg
    assert "Use PRECISION=bf16" in msg


def test_hopper_runs_the_three_fp8_recipes_and_no_other(base_env):
    from training.launch.recipes import RECIPES

    runs = []
    for name in RECIPES:
        try:
            runs.append(launch(base_env, PRECISION=name, PLATFORM="h200").ctx.recipe.name)
        except Refusals as err:
            assert "precision_needs_hardware" in {r.guard for r in err.refusals}, name
    assert runs == ["bf16", "fp8", "fp8_tensorwise", "fp8_blockwise"]


def test_fp8_blockwise_uses_e4m3_and_megatrons_blockwise_recipe(base_env):
    result = launch(base_env, PRECISION="fp8_blockwise", PLATFORM="h200")
    gpt = result.buckets["GPT_ARGS"]
    assert gpt[gpt.index("--fp8-recipe") + 1] == "blockwise"
    assert gpt[gpt.index("--fp8-format") + 1] == "e4m3"
    assert result.settings.setting("FP8_FORMAT").source == "recipe"


def test_unknown_gpu_warns_instead_of_guessing(base_env, monkeypatch):
    from training.launch import capabilities

    unknown = capabilities.Capabilities(
        platform=None, source="detected", device_name="NVIDIA A40", gpu_count=1,
        transformer_engine=True, apex_fused_wgrad=True, liger=False, flash_attn=False)
    monkeypatch.setattr(capabilities, "resolve", lambda platform: unknown)
    result = launch(base_env, PRECISION="fp8")
    [notice] = notices(result, "precision_needs_hardware")
    assert "NVIDIA A40" in notice.message and "PLATFORM=<name>" in notice.message


def _detected(monkeypatch, platform: str, **fields):
    """This node as if it were a `platform` node (a real launch asks the installed Megatron)."""
    caps = dataclasses.replace(capabilities.for_platform(platform), source="detected",
                               device_name=platform, **fields)
    monkeypatch.setattr(capabilities, "resolve", lambda name: caps)
    return caps


def test_mxfp4_on_a_real_node_asks_the_installed_megatron(base_env, monkeypatch):
    _detected(monkeypatch, "mi355x")
    msg = refused(base_env, "recipe_needs_megatron_support", PRECISION="mxfp4")
    assert "--fp4-recipe mxfp4 (it offers nvfp4, custom)" in msg
    assert "megatron-core 0.19.2 (PyPI) (the Megatron here)" in msg and "Dockerfile.rocm" in msg


def test_mxfp4_dry_run_for_mi355x_resolves_against_the_images_megatron(base_env):
    """The seed's flagship case: refused before (the local megatron-core lacks the recipe), now
    checked against ROCm/Megatron-LM, the Megatron docker/Dockerfile.rocm installs."""
    result = launch(base_env, PRECISION="mxfp4", PLATFORM="mi355x", GRAD_REDUCE_IN_BF16=0)
    [notice] = notices(result, "recipe_needs_megatron_support")
    assert "ROCm/Megatron-LM" in notice.message and "--fp4-recipe mxfp4" in notice.message
    assert "GRAD_REDUCE_IN_BF16" in {n for n, s in result.settings.values.items()
                                     if s.source == "guard"}
    from training.launch.manifest import launch_manifest

    recorded = launch_manifest(result)["megatron"]
    assert recorded["image"] == "docker/Dockerfile.rocm"
    assert "mxfp4" in recorded["choices"]["--fp4-recipe"]
    assert megatron_info.ROCM_MEGATRON_COMMIT in recorded["source"]
    assert launch_manifest(launch(base_env))["megatron"] is None      # detected: the installed


@pytest.mark.parametrize("platform", ["h200", "b300", "mi300x", "mi355x"])
def test_every_recipe_a_platform_runs_is_offered_by_its_images_megatron(base_env, platform):
    from training.launch.recipes import RECIPES, platforms_supporting

    _image, build = megatron_info.for_vendor(capabilities.for_platform(platform).info.vendor)
    for name, recipe in RECIPES.items():
        if recipe.kind == "bf16" or platform not in platforms_supporting(recipe):
            continue
        result = launch(base_env, PRECISION=name, PLATFORM=platform)
        assert build.missing(result.buckets["GPT_ARGS"]) == [], name


def test_stock_record_is_what_the_installed_megatron_core_offers():
    """The recorded choices of the CUDA image's Megatron are the pinned megatron-core's, as its
    own parser states them (this venv has the same pin)."""
    assert megatron_info.asked().choices == megatron_info.STOCK.choices
    assert megatron_info.installed() is megatron_info.STOCK   # the pinned wheel: no parser needed
    assert megatron_info.STOCK_VERSION in megatron_info.asked().name
    from training.deploy.image import pinned_version, pyproject_requirements

    assert pinned_version("megatron-core", pyproject_requirements()) == megatron_info.STOCK_VERSION


def test_mxfp4_forces_the_bf16_grad_buffer_loudly(base_env):
    result = launch(base_env, PRECISION="mxfp4", PLATFORM="mi355x", GRAD_REDUCE_IN_BF16=0)
    setting = result.settings.setting("GRAD_REDUCE_IN_BF16")
    assert setting.value is True and setting.source == "guard" and setting.requested is False
    [notice] = notices(result, "mxfp4_bf16_grad_buffer")
    assert "was set explicitly" in notice.message and "gemm_a4w4_asm" in notice.message
    assert "--grad-reduce-in-bf16" in result.buckets["GPT_ARGS"]
    # every layer fp4: the MLPerf recipe
    assert result.settings["FP4_SELECTIVE_BF16"] is False
    assert "--first-last-layers-bf16" not in result.buckets["GPT_ARGS"]


def test_nvfp4_keeps_first_and_last_layers_bf16_by_recipe(base_env):
    result = launch(base_env, PRECISION="nvfp4", PLATFORM="b300")
    gpt = result.buckets["GPT_ARGS"]
    assert result.settings.setting("FP4_SELECTIVE_BF16").source == "recipe"
    i = gpt.index("--num-layers-at-start-in-bf16")
    assert gpt[i + 1] == "1" and "--first-last-layers-bf16" in gpt
    custom = launch(base_env, PRECISION="nvfp4", PLATFORM="b300", FP4_BF16_LAYERS_START=2,
                    FP4_BF16_LAYERS_END=3)
    gpt = custom.buckets["GPT_ARGS"]
    assert gpt[gpt.index("--num-layers-at-end-in-bf16") + 1] == "3"


def test_mxfp8_with_hybrid_format_is_refused(base_env):
    msg = refused(base_env, "mxfp8_uses_e4m3", PRECISION="mxfp8", PLATFORM="b300",
                  FP8_FORMAT="hybrid")
    assert "diverge" in msg
    ok = launch(base_env, PRECISION="mxfp8", PLATFORM="b300")
    assert ok.settings["FP8_FORMAT"] == "e4m3"


def test_precision_knobs_without_their_recipe_warn(base_env):
    result = launch(base_env, FP8_FORMAT="hybrid")
    assert notices(result, "precision_only_knobs")


def test_fsdp_turns_off_what_it_cannot_do(base_env):
    result = launch(base_env, FSDP=1, GPUS_PER_NODE=8)
    for name in ("GRADIENT_ACCUMULATION_FUSION", "DISTRIBUTED_OPTIMIZER", "OVERLAP_PARAM_GATHER"):
        assert result.settings[name] is False
        assert result.settings.setting(name).source == "guard"
    assert "--use-torch-fsdp2" in result.buckets["EXTRA_ARGS"]
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in result.env


def test_fsdp_refuses_tensor_parallel_and_explicit_fusion(base_env):
    assert "TP=1" in refused(base_env, "fsdp_constraints", FSDP=1, TP=2, GPUS_PER_NODE=8)
    msg = refused(base_env, "fsdp_constraints", FSDP=1, GRADIENT_ACCUMULATION_FUSION=1)
    assert "GRADIENT_ACCUMULATION_FUSION=0" in msg


def test_local_backend_without_apex_turns_grad_accum_fusion_off(base_env):
    result = launch(base_env, TRANSFORMER_IMPL="local")
    setting = result.settings.setting("GRADIENT_ACCUMULATION_FUSION")
    assert setting.value is False and "apex" in setting.reason
    assert "--no-gradient-accumulation-fusion" in result.buckets["TRAIN_ARGS"]
    msg = refused(base_env, "grad_accum_fusion_kernel", TRANSFORMER_IMPL="local",
                  GRADIENT_ACCUMULATION_FUSION=1)
    assert "TRANSFORMER_IMPL=native" in msg


def test_native_backend_keeps_grad_accum_fusion_with_its_own_kernel(base_env):
    result = launch(base_env)
    assert result.settings["GRADIENT_ACCUMULATION_FUSION"] is True
    assert "--no-gradient-accumulation-fusion" not in result.buckets["TRAIN_ARGS"]


@pytest.mark.parametrize("apex", [False, True])
def test_te_backend_keeps_every_default_on_toggle_and_names_each_linears_wgrad(
        base_env, monkeypatch, apex):
    """The H200 case of issue 19: TE imports, apex does not. The output layer (Megatron's own
    ColumnParallelLinear) takes the native kernel; with apex, apex's."""
    from training.launch.toggles import PERF_TOGGLES

    _detected(monkeypatch, "h200", apex_fused_wgrad=apex, te_version="2.20.2")
    result = launch(base_env)
    assert result.settings["TRANSFORMER_IMPL"] == "transformer_engine"
    for toggle in PERF_TOGGLES:
        assert result.settings[toggle.name] is True, toggle.name
    assert result.settings["DISTRIBUTED_OPTIMIZER"] is True
    [notice] = notices(result, "grad_accum_fusion_kernel")
    assert "TE's linears" in notice.message and "output layer" in notice.message
    assert ("apex's fused_weight_gradient_mlp_cuda" if apex else "native cuBLAS") in notice.message


def test_a_backend_whose_linears_lack_a_kernel_turns_the_fusion_off(base_env, monkeypatch):
    from training.launch.guards import wgrad_kernels

    caps = _detected(monkeypatch, "h200", apex_fused_wgrad=False, transformer_engine=False)
    assert [k for _l, k in wgrad_kernels("local", caps)] == [None]
    assert [k for _l, k in wgrad_kernels("native", caps)] == ["native"]
    assert [k for _l, k in wgrad_kernels("transformer_engine", caps)] == [None, "native"]
    result = launch(base_env, TRANSFORMER_IMPL="local")
    assert "every linear" in result.settings.setting("GRADIENT_ACCUMULATION_FUSION").reason


def test_fused_qkv_rope_under_te_needs_te_2_8(base_env, monkeypatch):
    _detected(monkeypatch, "h200", te_version="2.7.0+abc")
    result = launch(base_env)
    setting = result.settings.setting("FUSED_SINGLE_QKV_ROPE")
    assert setting.value is False and "2.8" in setting.reason
    assert "--fused-single-qkv-rope" not in result.buckets["GPT_ARGS"]
    refused(base_env, "fused_qkv_rope_kernel", FUSED_SINGLE_QKV_ROPE=1)
    for version in ("2.20.2", "2.8.0.dev0", "unknown"):    # an unknown version is not refused
        _detected(monkeypatch, "h200", te_version=version)
        assert "--fused-single-qkv-rope" in launch(base_env).buckets["GPT_ARGS"], version


def test_te_cross_entropy_is_refused_and_native_is_the_default(base_env):
    msg = refused(base_env, "te_cross_entropy", CROSS_ENTROPY_FUSION_IMPL="te")
    assert "stability issues" in msg and "native" in msg
    result = launch(base_env, PLATFORM="b300")
    words = result.buckets["GPT_ARGS"]
    assert words[words.index("--cross-entropy-fusion-impl") + 1] == "native"


def test_fused_qkv_rope_off_on_the_local_backend(base_env):
    result = launch(base_env, TRANSFORMER_IMPL="local")
    assert result.settings.setting("FUSED_SINGLE_QKV_ROPE").source == "guard"
    assert "--fused-single-qkv-rope" not in result.buckets["GPT_ARGS"]
    refused(base_env, "fused_qkv_rope_kernel", TRANSFORMER_IMPL="local", FUSED_SINGLE_QKV_ROPE=1)


def test_ce_chunk_mem_reaches_megatron_args_only_where_it_acts(base_env):
    words = launch(base_env, CE_CHUNK_MEM=8, TRANSFORMER_IMPL="native",
                   NATIVE_KERNELS="liger").buckets["GPT_ARGS"]
    assert words[words.index("--ce-chunk-mem") + 1] == "8"
    assert "integer >= 1" in refused(base_env, "ce_chunk_mem", CE_CHUNK_MEM=0)
    for toggles, why in (({"TRANSFORMER_IMPL": "local"}, "the local backend"),
                         ({"CROSS_ENTROPY_LOSS_FUSION": 0}, "CROSS_ENTROPY_LOSS_FUSION=0"),
                         ({"TP": 2, "GPUS_PER_NODE": 2}, "vocab-parallel"),
                         ({"NATIVE_KERNELS": "torch"}, "its own chunking")):
        msg = refused(base_env, "ce_chunk_mem", **{"CE_CHUNK_MEM": 8, "TRANSFORMER_IMPL": "native",
                                                    "NATIVE_KERNELS": "liger", **toggles})
        assert why in msg and "Unset CE_CHUNK_MEM" in msg
    # the default (8) is never refused, and reaches the native backend's arguments
    launch(base_env, TRANSFORMER_IMPL="local")
    launch(base_env, TRANSFORMER_IMPL="native", NATIVE_KERNELS="torch")
    words = launch(base_env, TRANSFORMER_IMPL="native").buckets["GPT_ARGS"]
    assert words[words.index("--ce-chunk-mem") + 1] == "8"
    launch(base_env, CE_CHUNK_MEM=1, TRANSFORMER_IMPL="local")  # Liger's own chunking


def test_transformer_engine_runs_the_liger_fused_linear_ce_at_tp1(base_env):
    """Under the TE spec the output layer is Megatron's own linear: with Liger (NATIVE_KERNELS
    resolved on TE too) the fused linear cross-entropy takes it, and CE_CHUNK_MEM sizes it;
    with NATIVE_KERNELS=torch it is Megatron's fused cross-entropy, and CE_CHUNK_MEM refused."""
    te = {"PLATFORM": "h200", "TRANSFORMER_IMPL": "transformer_engine"}
    words = launch(base_env, CE_CHUNK_MEM=4, NATIVE_KERNELS="liger", **te).buckets["GPT_ARGS"]
    assert words[words.index("--native-kernels") + 1] == "liger"
    assert words[words.index("--ce-chunk-mem") + 1] == "4"
    msg = refused(base_env, "ce_chunk_mem", CE_CHUNK_MEM=4, NATIVE_KERNELS="torch", **te)
    assert "Megatron's fused cross-entropy" in msg and "Unset CE_CHUNK_MEM" in msg
    words = launch(base_env, TRANSFORMER_IMPL="local").buckets["GPT_ARGS"]
    assert "--native-kernels" not in words          # the local spec has no kernels of ours


def test_one_rule_says_which_cross_entropy_runs():
    from training.launch.toggles import fused_linear_ce

    assert fused_linear_ce("native", True, 1, 1, "torch")[0] == "torch"
    assert fused_linear_ce("native", True, 1, 1, "liger")[0] == "liger"
    assert fused_linear_ce("transformer_engine", True, 1, 1, "liger")[0] == "liger"
    for args, why in ((("transformer_engine", True, 1, 1, "torch"), "NATIVE_KERNELS=torch"),
                      (("native", False, 1, 1, "liger"), "CROSS_ENTROPY_LOSS_FUSION=0"),
                      (("transformer_engine", True, 2, 1, "liger"), "TP>1"),
                      (("transformer_engine", True, 1, 2, "liger"), "CP>1"),
                      (("local", True, 1, 1, "liger"), "the local backend")):
        kernels, reason = fused_linear_ce(*args)
        assert kernels is None and why in reason


def test_context_parallel_needs_te(base_env):
    assert "CP=1" in refused(base_env, "context_parallel_backend", CP=2, GPUS_PER_NODE=2)


@pytest.mark.parametrize("toggles,expect", [
    ({"TP": 3, "GPUS_PER_NODE": 8}, "must be one of 1, 2, 4, 8"),
    ({"TP": 16, "GPUS_PER_NODE": 16}, "Nearest valid TP: 8"),
    ({"BS": 100, "GPUS_PER_NODE": 8}, "Nearest valid BS: 96 or 104"),
    ({"PP": 3, "GPUS_PER_NODE": 3, "BS": 126}, "Nearest valid PP: 2 or 4"),
])
def test_parallel_sizes_refused_with_nearest_valid(base_env, toggles, expect):
    assert expect in refused(base_env, "parallel_sizes", **toggles)


def test_sequence_parallel_follows_tp(base_env):
    assert launch(base_env, TP=2, GPUS_PER_NODE=2).settings["SEQUENCE_PARALLEL"] is True
    result = launch(base_env, SEQUENCE_PARALLEL=1)
    assert result.settings["SEQUENCE_PARALLEL"] is False
    assert notices(result, "sequence_parallel")


def test_local_backend_drops_sequence_parallel(base_env):
    result = launch(base_env, TRANSFORMER_IMPL="local", TP=2, GPUS_PER_NODE=2)
    assert result.settings.setting("SEQUENCE_PARALLEL").source == "guard"
    refused(base_env, "local_norm_sequence_parallel", TRANSFORMER_IMPL="local", TP=2,
            GPUS_PER_NODE=2, SEQUENCE_PARALLEL=1)


def test_overlap_param_gather_needs_the_distributed_optimizer(base_env):
    result = launch(base_env, DISTRIBUTED_OPTIMIZER=0)
    assert result.settings.setting("OVERLAP_PARAM_GATHER").source == "guard"
    refused(base_env, "optimizer_overlap", DISTRIBUTED_OPTIMIZER=0, OVERLAP_PARAM_GATHER=1)


@pytest.mark.parametrize("addr", [None, "localhost", "127.0.0.1", "::1"])
def test_multinode_refuses_missing_or_loopback_master(base_env, addr):
    toggles = {"NNODES": 2, "GPUS_PER_NODE": 8}
    if addr:
        toggles["MASTER_ADDR"] = addr
    assert "MASTER_ADDR" in refused(base_env, "multinode_master_addr", **toggles)


def test_multinode_with_a_real_master_resolves(base_env):
    result = launch(base_env, NNODES=2, NODE_RANK=1, MASTER_ADDR="node-0.cluster",
                    GPUS_PER_NODE=8)
    words = result.buckets["DISTRIBUTED_ARGS"]
    assert words[words.index("--master-addr") + 1] == "node-0.cluster"
    assert result.run.layout.world_size == 16
    refused(base_env, "multinode_master_addr", NNODES=2, NODE_RANK=2,
            MASTER_ADDR="node-0.cluster", GPUS_PER_NODE=8)


def test_high_lr_with_small_eps_warns(base_env):
    [notice] = notices(launch(base_env, LR="8e-4"), "adam_eps_at_high_lr")
    assert "ADAM_EPS=1e-5" in notice.message and "5.9" in notice.message
    assert not notices(launch(base_env, LR="8e-4", ADAM_EPS="1e-5"), "adam_eps_at_high_lr")


def test_schedule_refusals_and_derived_warmup(base_env):
    result = launch(base_env, TOTAL_ITERS=50)
    assert result.settings["WARMUP_ITERS"] == 5
    assert result.settings.setting("WARMUP_ITERS").source == "derived"
    refused(base_env, "schedule", TOTAL_ITERS=10, WARMUP_ITERS=10)
    refused(base_env, "schedule", LR="1e-4", MIN_LR="1e-3")


def test_profile_window_checked(base_env):
    refused(base_env, "profile_window", PROFILE="torch", PROFILE_STEP_END=100)
    refused(base_env, "profile_window", PROFILE="torch", PROFILE_RANKS="3")
    result = launch(base_env, PROFILE="torch", PROFILE_STEP_START=3, PROFILE_STEP_END=6)
    out = result.buckets["OUTPUT_ARGS"]
    assert "--use-pytorch-profiler" in out and out[out.index("--profile-ranks") + 1] == "0"


def test_nsys_profile_wraps_the_launch(base_env):
    result = launch(base_env, PROFILE="nsys")
    assert result.command[:2] == ["nsys", "profile"]
    assert "--capture-range=cudaProfilerApi" in result.command
    assert "--use-pytorch-profiler" not in result.buckets["OUTPUT_ARGS"]


def test_empty_load_is_refused_unless_resume_auto(base_env, tmp_path):
    empty = tmp_path / "ckpt"
    empty.mkdir()
    msg = refused(base_env, "load_checkpoint", LOAD=empty)
    assert "RESUME=auto" in msg
    result = launch(base_env, LOAD=empty, RESUME="auto")
    assert notices(result, "load_checkpoint")
    (empty / CHECKPOINT_TRACKER).write_text("10")
    assert "iter_0000010/" in refused(base_env, "load_checkpoint", LOAD=empty)  # named, not there
    (empty / "iter_0000010").mkdir()      # begun, nothing written: no checkpoint yet
    assert "iter_0000010/, which is incomplete" in refused(base_env, "load_checkpoint",
                                                           LOAD=empty)
    (empty / "iter_0000010" / ".metadata").write_bytes(b"index")
    (empty / "iter_0000010" / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    assert "--load" in launch(base_env, LOAD=empty).buckets["OUTPUT_ARGS"]


def test_missing_dataset_is_refused_before_torchrun(base_env, tmp_path):
    msg = refused(base_env, "data_path", DATA_PATH=str(tmp_path / "nothing"))
    assert "nothing.bin" in msg


def test_no_gpu_refuses_a_real_launch(base_env):
    assert "DRY_RUN=1" in refused(base_env, "gpus_present", DRY_RUN=0)
    assert "PLATFORM=auto" in refused(base_env, "gpus_present", DRY_RUN=0, PLATFORM="h200")


def test_all_refusals_of_a_launch_are_reported_together(base_env):
    with pytest.raises(Refusals) as err:
        launch(base_env, TP=3, CROSS_ENTROPY_FUSION_IMPL="te", NNODES=2)
    names = {r.guard for r in err.value.refusals}
    assert {"parallel_sizes", "te_cross_entropy", "multinode_master_addr"} <= names


@pytest.mark.parametrize("toggles,precision", [
    ({"TE_FP8": 1}, "fp8"),
    ({"TE_FP8": 1, "TE_FP8_RECIPE": "tensorwise"}, "fp8_tensorwise"),
    ({"TE_FP8": 1, "TE_FP8_RECIPE": "mxfp8"}, "mxfp8"),
    ({"TE_FP8": 1, "TE_FP8_RECIPE": "blockwise"}, "fp8_blockwise"),
    ({"TE_FP4": 1, "TE_FP4_RECIPE": "nvfp4"}, "nvfp4"),
    ({"TE_FP8": 1, "PRECISION": "fp8"}, "fp8"),
])
def test_rocm_spellings_resolve_to_precision(base_env, toggles, precision):
    result = launch(base_env, PLATFORM="gb300", **toggles)
    assert result.ctx.recipe.name == precision
    assert result.log_dir.parent.name == precision


@pytest.mark.parametrize("toggles,guard,says", [
    ({"TE_FP8": 1, "PRECISION": "bf16"}, "precision_spelling_conflict", "Use one spelling"),
    ({"TE_FP8": 0, "PRECISION": "fp8"}, "precision_spelling_conflict", "Use one spelling"),
    ({"TE_FP8": 1, "TE_FP4": 1}, "fp8_and_fp4_together", "Pick one"),
    ({"TE_FP4": 1, "TE_FP4_RECIPE": "mxfp4", "PRECISION": "nvfp4"}, "precision_spelling_conflict",
     "Use one spelling"),
])
def test_conflicting_spellings_are_refused(base_env, toggles, guard, says):
    """Each conflict refused by its own guard, with its own advice (and with the other guards'
    refusals, in one report).

    Mutation caught: a spelling guard refusing under another guard's name (TE_FP8=1 TE_FP4=1
    as precision_spelling_conflict): `refused` looks the refusal up by the guard's name."""
    assert says in refused(base_env, guard, PLATFORM="gb300", **toggles)


def test_recipe_variable_without_its_switch_is_refused_with_the_rest(base_env):
    """A refusal of the precision's spelling is reported with the other guards' refusals."""
    with pytest.raises(Refusals) as err:
        launch(base_env, TE_FP8_RECIPE="tensorwise", TP=3, GPUS_PER_NODE=8)
    messages = {r.guard: str(r) for r in err.value.refusals}
    assert "TE_FP8_RECIPE=tensorwise needs TE_FP8=1" in messages["precision_spelling_conflict"]
    assert "parallel_sizes" in messages


# -- CUDA_GRAPH ------------------------------------------------------------------------------------

def test_cuda_graph_keeps_the_fused_cross_entropy_and_the_capture_out_of_the_measure(
        base_env):
    """full_iteration on the native backend: the fused linear CE runs Liger's kernel without a
    host read (training/native/cross_entropy.py), so it stays on; the eager iterations and the
    capture's are not steady steps."""
    from .helpers import megatron_args

    result = launch(base_env, CUDA_GRAPH="full_iteration", TOTAL_ITERS=10)   # default 2
    ce = result.settings.setting("CROSS_ENTROPY_LOSS_FUSION")
    assert ce.value is True and ce.source == "default"
    warmup = result.settings.setting("METRICS_WARMUP_ITERS")
    assert warmup.value == 4 and warmup.source == "guard"
    args = megatron_args(result)   # Megatron's parser and validate_args accept it
    assert (args.cuda_graph_impl, args.cuda_graph_warmup_steps) == ("full_iteration", 3)
    assert not args.check_for_nan_in_loss_and_grad
    assert "--cuda-graph-impl" not in " ".join(launch(base_env).buckets["GPT_ARGS"])


@pytest.mark.parametrize("toggles,needle", [
    ({"NAN_CHECK": "bucket"}, "set NAN_CHECK=step"),
    ({"METRICS_WARMUP_ITERS": 3}, "METRICS_WARMUP_ITERS=4 or more"),
    ({"CUDA_GRAPH_WARMUP": 0}, "at least one eager iteration"),
    ({"PRECISION": "fp8", "PLATFORM": "h200"}, "PRECISION=bf16 or CUDA_GRAPH=none"),
])
def test_cuda_graph_refuses_a_step_it_cannot_capture(base_env, toggles, needle):
    assert needle in refused(base_env, "cuda_graph", CUDA_GRAPH="full_iteration", **toggles)


def test_cuda_graph_flag_after_the_script_name_is_the_toggle(base_env):
    """Megatron's --cuda-graph-impl given by hand goes through the same guard."""
    result = launch(base_env, words=["--cuda-graph-impl", "full_iteration"])
    assert result.settings["CUDA_GRAPH"] == "full_iteration"
    assert result.settings["CROSS_ENTROPY_LOSS_FUSION"] is True
    with pytest.raises(Refusals) as err:
        launch(base_env, words=["--cuda-graph-impl", "full_iteration"], NAN_CHECK="bucket")
    assert "cuda_graph" in [r.guard for r in err.value.refusals]


def test_cuda_graph_warmup_without_a_graph_is_refused(base_env):
    assert "would change nothing" in refused(base_env, "cuda_graph", CUDA_GRAPH_WARMUP=5)


def test_cuda_graph_short_run_warns_that_it_never_replays(base_env):
    result = launch(base_env, CUDA_GRAPH="full_iteration", TOTAL_ITERS=4)
    assert notices(result, "cuda_graph")
