"""ADAM_IMPL: the precision-aware optimizer's AdamW (TE's FusedAdam where TE imports, or the
native MixedPrecisionAdamW in its place): the launcher's words through Megatron's parser, the
guard adam_impl (bf16 only; said where it changes nothing)."""
from __future__ import annotations

import training.moe.launch  # noqa: F401 - registers the MoE families
from training.moe.layer import MOE

from tests.launch.helpers import launch, megatron_args
from tests.launch.test_guards import notices, refused

H200 = {"PLATFORM": "h200", "GPUS_PER_NODE": "1", "BS": "8"}


def test_the_default_is_auto_and_passes_through(base_env):
    result = launch(base_env, family="qwen3_moe", layers=[MOE], NUM_LAYERS=4, **H200)
    assert result.settings["ADAM_IMPL"] == "auto"
    assert megatron_args(result).adam_impl == "auto"
    assert not notices(result, "adam_impl")


def test_native_under_the_lean_step_with_te_is_ours(base_env):
    result = launch(base_env, family="qwen3_moe", layers=[MOE], NUM_LAYERS=4, ADAM_IMPL="native",
                    **H200)
    words = result.buckets["TRAIN_ARGS"]
    assert words[words.index("--adam-impl") + 1] == "native"
    args = megatron_args(result)
    assert args.adam_impl == "native" and args.use_precision_aware_optimizer
    (note,) = notices(result, "adam_impl")
    assert "in place of TE's FusedAdam" in note.message and "moe-te-adam" in note.message


def test_native_where_it_would_change_nothing_is_refused(base_env):
    """Megatron's default optimizer state (no precision-aware optimizer), or no TE here (the
    native AdamW runs anyway): refused with what to do."""
    text = refused(base_env, "adam_impl", NUM_LAYERS=2, ADAM_IMPL="native", **H200)
    assert "ADAM_MOMENTS_DTYPE or MASTER_WEIGHTS not fp32" in text
    text = refused(base_env, "adam_impl", family="qwen3_moe", layers=[MOE], NUM_LAYERS=4,
                   ADAM_IMPL="native")             # this CPU node: TE does not import
    assert "Transformer Engine does not import" in text and "ADAM_IMPL=auto" in text


def test_native_with_an_fp8_recipe_is_refused(base_env):
    text = refused(base_env, "adam_impl", family="qwen3_moe", layers=[MOE], NUM_LAYERS=4,
                   ADAM_IMPL="native", PRECISION="fp8", **H200)
    assert "ADAM_IMPL=auto" in text and "PRECISION=fp8" in text
