"""The final argument list goes through megatron-core 0.19.2's own parser and validate_args."""
from __future__ import annotations

import pytest

from .helpers import launch, megatron_args


@pytest.mark.parametrize("precision,platform", [
    ("bf16", "auto"), ("bf16", "h200"), ("fp8", "h200"), ("fp8_tensorwise", "mi300x"),
    ("fp8_blockwise", "h200"), ("mxfp8", "b300"), ("nvfp4", "b300")])
def test_every_precision_parses(base_env, precision, platform):
    result = launch(base_env, PRECISION=precision, PLATFORM=platform)
    args = megatron_args(result, validate=False)
    assert args.bf16
    if precision == "bf16":
        assert args.fp8 is None and args.fp4 is None
    elif precision == "nvfp4":
        assert args.fp4 == "e2m1" and args.fp4_recipe == "nvfp4" and args.first_last_layers_bf16
    else:
        assert args.fp8 == result.settings["FP8_FORMAT"]
        assert args.fp8_recipe == result.ctx.recipe.fp8_recipe


@pytest.mark.parametrize("precision,platform", [
    ("bf16", "auto"), ("bf16", "b300"), ("fp8", "h200"), ("fp8_tensorwise", "h200"),
    ("fp8_blockwise", "h200"), ("mxfp8", "b300")])
def test_validate_args_accepts_what_runs_without_te(base_env, precision, platform):
    """The TE path (a named platform resolves to it) with every default-on toggle, each recipe
    Hopper runs among them, through megatron-core's own validate_args."""
    result = launch(base_env, PRECISION=precision, PLATFORM=platform)
    args = megatron_args(result)
    assert args.grad_reduce_in_bf16 and not args.accumulate_allreduce_grads_in_fp32
    assert args.cross_entropy_loss_fusion and args.cross_entropy_fusion_impl == "native"
    if platform != "auto":
        assert args.transformer_impl == "transformer_engine"
        assert args.gradient_accumulation_fusion and args.fused_single_qkv_rope
        assert args.use_distributed_optimizer and args.overlap_grad_reduce
    if result.ctx.recipe.fp8_recipe:
        assert args.fp8_recipe == result.ctx.recipe.fp8_recipe


def test_nvfp4_validation_needs_transformer_engine(base_env):
    """fp4 validation asks for TE >= 2.7; this machine has none, so Megatron stops there.

    Mutation caught: training/launch/capabilities.py for_platform saying a NVIDIA platform's
    image has no TE (`transformer_engine=platform.vendor != "nvidia"`): the launcher then
    refuses nvfp4 on b300 itself ([low_precision_needs_te], "... Transformer Engine ...") and
    Megatron never validates; the old match, "(?i)transformer.engine|TE", took that refusal
    (it matches any message with "te" in it)."""
    with pytest.raises(ValueError, match=r"--fp4-format requires Transformer Engine >= 2\.7"):
        megatron_args(launch(base_env, PRECISION="nvfp4", PLATFORM="b300"))


@pytest.mark.parametrize("name", ["GRADIENT_ACCUMULATION_FUSION", "GRAD_REDUCE_IN_BF16",
                                  "DDP_AVERAGE_IN_COLLECTIVE", "CROSS_ENTROPY_LOSS_FUSION",
                                  "FUSED_SINGLE_QKV_ROPE"])
@pytest.mark.parametrize("value", [0, 1])
def test_each_toggle_state_validates(base_env, name, value):
    args = megatron_args(launch(base_env, GPUS_PER_NODE=2, **{name: value}))
    expected = {
        "GRADIENT_ACCUMULATION_FUSION": args.gradient_accumulation_fusion,
        "GRAD_REDUCE_IN_BF16": args.grad_reduce_in_bf16,
        "DDP_AVERAGE_IN_COLLECTIVE": args.ddp_average_in_collective,
        "CROSS_ENTROPY_LOSS_FUSION": args.cross_entropy_loss_fusion,
        "FUSED_SINGLE_QKV_ROPE": args.fused_single_qkv_rope,
    }[name]
    assert expected is bool(value)
    if name == "GRAD_REDUCE_IN_BF16" and not value:
        assert args.accumulate_allreduce_grads_in_fp32


@pytest.mark.parametrize("toggles", [
    {"RECOMPUTE": "selective"}, {"RECOMPUTE": "full"},
    {"TP": 2, "GPUS_PER_NODE": 2, "PLATFORM": "h200", "TRANSFORMER_IMPL": "native"},
    {"FSDP": 1, "GPUS_PER_NODE": 2},
    {"MODEL_SIZE": "70B", "TP": 8, "GPUS_PER_NODE": 8, "PLATFORM": "h200",
     "TRANSFORMER_IMPL": "native", "PREFLIGHT_MEMORY": "off"},  # parses; would not fit
    {"MODEL_SIZE": "3.1-8B"}, {"PROFILE": "torch"}, {"TRANSFORMER_IMPL": "local"}])
def test_layouts_and_levers_validate(base_env, toggles):
    """Megatron validates each layout, and each lever reaches its argument.

    Mutation caught: the FSDP toggle's flag dropped from the registry
    (training/launch/toggles.py), which validated before (three of these cases asserted
    nothing but that validation passed)."""
    args = megatron_args(launch(base_env, **toggles))
    if "FSDP" in toggles:
        assert args.use_torch_fsdp2
    if "PROFILE" in toggles:
        assert args.profile and args.use_pytorch_profiler
    if "TRANSFORMER_IMPL" in toggles:
        assert args.transformer_backend == toggles["TRANSFORMER_IMPL"]
    if toggles.get("RECOMPUTE"):
        assert args.recompute_granularity == toggles["RECOMPUTE"]
    if "TP" in toggles:
        assert args.tensor_model_parallel_size == toggles["TP"] and args.sequence_parallel
    if toggles.get("MODEL_SIZE") == "3.1-8B":
        assert args.use_rope_scaling and args.rotary_base == 500000


def test_llama2_presets_validate(base_env):
    for size in ("7B", "13B", "70B"):
        args = megatron_args(launch(base_env, family="llama2", MODEL_SIZE=size, PLATFORM="h200",
                                    TRANSFORMER_IMPL="native", GPUS_PER_NODE=8, TP=8,
                                    PREFLIGHT_MEMORY="off"))  # 70B at TP=8 alone: no fit
        assert args.seq_length == 4096 and args.rotary_base == 10000


@pytest.mark.parametrize("value,megatron_check", [("step", False), ("bucket", True)])
def test_nan_check_reaches_megatron(base_env, value, megatron_check):
    """NAN_CHECK=step (default) turns Megatron's per-bucket check off and ours on; bucket keeps
    Megatron's."""
    result = launch(base_env, **({} if value == "step" else {"NAN_CHECK": value}))
    args = megatron_args(result)
    assert args.nan_check == value
    assert args.check_for_nan_in_loss_and_grad is megatron_check


def test_manual_gc_interval_reaches_megatron(base_env):
    args = megatron_args(launch(base_env, MANUAL_GC_INTERVAL=100))
    assert args.manual_gc and args.manual_gc_interval == 100
    default = megatron_args(launch(base_env))
    assert not default.manual_gc


@pytest.mark.parametrize("precision", ["fp8", "fp8_tensorwise", "fp8_blockwise"])
def test_the_gpu_tests_fp8_launches_validate(base_env, precision):
    """tests/gpu/test_te_gpu.py's recipe runs, on a Hopper platform with TE: each validates."""
    from tests.gpu.test_te_gpu import RECIPE_SHAPE

    args = megatron_args(launch(base_env, PLATFORM="h200", TRANSFORMER_IMPL="transformer_engine",
                                PRECISION=precision, GPUS_PER_NODE=1, **RECIPE_SHAPE))
    assert args.num_layers == 1 and args.hidden_size % 128 == 0
    assert args.ffn_hidden_size % 128 == 0 and args.seq_length * args.micro_batch_size % 128 == 0


@pytest.mark.parametrize("words", [["SAVE={ckpt}"], ["SAVE_CKPT_PATH={ckpt}"], ["--save", "{ckpt}"]])
def test_save_without_save_interval_gets_the_forks_default_and_validates(base_env, tmp_path, words):
    """SAVE alone once reached Megatron without --save-interval and it asserted after torchrun.
    The launch now derives the ROCm fork's SAVE_INTERVAL (shown as derived, with why) and
    Megatron's validate_args accepts it."""
    from training.launch.fork_vars import BY_NAME

    result = launch(base_env, words=[w.format(ckpt=tmp_path / "ckpt") for w in words])
    interval = result.settings.setting("SAVE_INTERVAL")
    assert interval.value == int(BY_NAME["SAVE_INTERVAL"].defaults["llama3"])
    assert interval.source == "derived" and "SAVE is set" in interval.reason
    args = megatron_args(result)
    assert args.save == str(tmp_path / "ckpt") and args.save_interval == interval.value


def test_a_users_save_interval_is_kept_and_none_without_save(base_env, tmp_path):
    result = launch(base_env, SAVE=tmp_path / "ckpt", SAVE_INTERVAL=7)
    assert result.settings.setting("SAVE_INTERVAL").source == "env"
    assert megatron_args(result).save_interval == 7
    result = launch(base_env)
    assert result.settings["SAVE_INTERVAL"] is None
    assert "--save-interval" not in result.command_line
