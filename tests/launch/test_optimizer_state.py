"""ADAM_MOMENTS_DTYPE, MASTER_WEIGHTS, OPTIMIZER_CPU_OFFLOAD: the words they emit, Megatron's own
parser and validate_args on them, and the guard optimizer_state's refusals."""
from __future__ import annotations

import pytest

from training.launch.settings import BadInput, LaunchError

from .helpers import launch, megatron_args

NATIVE = {"TRANSFORMER_IMPL": "native"}


def _train_args(result) -> list[str]:
    return result.buckets["TRAIN_ARGS"]


def test_the_defaults_emit_nothing_and_keep_megatrons_fp32_state(base_env):
    result = launch(base_env, **NATIVE)
    assert "--use-precision-aware-optimizer" not in _train_args(result)
    args = megatron_args(result)
    assert not args.use_precision_aware_optimizer and not args.optimizer_cpu_offload


@pytest.mark.parametrize("moments,master", [("bf16", "fp32"), ("bf16", "remainder"),
                                            ("fp32", "remainder"), ("bf16", "stochastic")])
def test_state_toggles_validate_in_megatron(base_env, moments, master):
    import torch

    result = launch(base_env, ADAM_MOMENTS_DTYPE=moments, MASTER_WEIGHTS=master, **NATIVE)
    words = _train_args(result)
    assert "--use-precision-aware-optimizer" in words
    args = megatron_args(result)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[moments]
    assert args.use_precision_aware_optimizer
    assert args.exp_avg_dtype == args.exp_avg_sq_dtype == dtype
    assert args.main_params_dtype == torch.float32
    assert args.main_grads_dtype == torch.bfloat16      # the bf16 gradient buffer (default)
    assert args.master_weights == master
    assert args.store_param_remainders is (master == "remainder")  # TE's FusedAdam reads it


def test_fp32_gradients_keep_fp32_main_grads(base_env):
    import torch

    args = megatron_args(launch(base_env, ADAM_MOMENTS_DTYPE="bf16", GRAD_REDUCE_IN_BF16=0,
                                **NATIVE))
    assert args.main_grads_dtype == torch.float32 and args.accumulate_allreduce_grads_in_fp32


def test_cpu_offload_validates_with_its_fraction(base_env):
    result = launch(base_env, OPTIMIZER_CPU_OFFLOAD=1, OPTIMIZER_OFFLOAD_FRACTION=0.5, **NATIVE)
    args = megatron_args(result)
    assert args.optimizer_cpu_offload and args.use_precision_aware_optimizer
    assert args.optimizer_offload_fraction == 0.5 and args.overlap_cpu_optimizer_d2h_h2d


def test_the_table_shows_each_toggles_words(base_env):
    result = launch(base_env, ADAM_MOMENTS_DTYPE="bf16", MASTER_WEIGHTS="remainder", **NATIVE)
    assert "--exp-avg-dtype" in result.emitted["ADAM_MOMENTS_DTYPE"]
    assert result.emitted["MASTER_WEIGHTS"][-2:] == ["--master-weights", "remainder"]


@pytest.mark.parametrize("toggles,match", [
    ({"ADAM_MOMENTS_DTYPE": "bf16", "DISTRIBUTED_OPTIMIZER": 0},
     "distributed optimizer only"),
    ({"MASTER_WEIGHTS": "remainder", "FSDP": 1, "GPUS_PER_NODE": 2},
     r"\(FSDP=1\)"),
    ({"ADAM_MOMENTS_DTYPE": "bf16", "TRANSFORMER_IMPL": "local"}, "local backend"),
    ({"MASTER_WEIGHTS": "stochastic", "PLATFORM": "h200"}, "no stochastic rounding"),
    ({"MASTER_WEIGHTS": "stochastic", "PLATFORM": "h200", "TRANSFORMER_IMPL": "native"},
     "where TE imports"),
    ({"MASTER_WEIGHTS": "remainder", "PLATFORM": "h200", "PRECISION": "fp8_tensorwise"},
     "quantised weights"),
    ({"OPTIMIZER_CPU_OFFLOAD": 1, "ADAM_MOMENTS_DTYPE": "bf16", **NATIVE}, "keeps fp32"),
])
def test_what_cannot_run_is_refused_with_the_way_out(base_env, toggles, match):
    with pytest.raises(LaunchError, match=match) as err:
        launch(base_env, **toggles)
    assert "[optimizer_state]" in str(err.value)


@pytest.mark.parametrize("fraction", ["0", "1.5", "-0.5"])
def test_an_offload_fraction_outside_0_1_is_refused_by_the_registry(base_env, fraction):
    """The registry's range check (one line, before anything is derived), offload on or off."""
    for offload in ("0", "1"):
        with pytest.raises(BadInput, match=r"OPTIMIZER_OFFLOAD_FRACTION=.*\(0, 1\]"):
            launch(base_env, OPTIMIZER_CPU_OFFLOAD=offload, OPTIMIZER_OFFLOAD_FRACTION=fraction,
                   **NATIVE)


def test_resume_under_offload_without_te_is_refused(base_env, tmp_path):
    load = tmp_path / "ckpt"
    load.mkdir()
    (load / "latest_checkpointed_iteration.txt").write_text("10")
    with pytest.raises(LaunchError, match="Resume without the offload"):
        launch(base_env, OPTIMIZER_CPU_OFFLOAD=1, LOAD=str(load), **NATIVE)


def test_bf16_moments_with_a_slow_second_moment_warn(base_env):
    result = launch(base_env, ADAM_MOMENTS_DTYPE="bf16", ADAM_BETA2=0.999, **NATIVE)
    warnings = [n.message for n in result.settings.notices
                if n.level == "warning" and n.guard == "optimizer_state"]
    assert warnings and "2^-9" in warnings[0]
    quiet = launch(base_env, ADAM_MOMENTS_DTYPE="bf16", **NATIVE)
    assert not [n for n in quiet.settings.notices if n.guard == "optimizer_state"]


def test_te_backend_runs_te_fused_adam_with_remainders(base_env):
    """Under TE, --master-weights remainder is TE's store_param_remainders (no flag of its
    own in Megatron), fp32 a plain fp32 master."""
    for master, remainders in (("remainder", True), ("fp32", False)):
        result = launch(base_env, PLATFORM="b300", ADAM_MOMENTS_DTYPE="bf16",
                        MASTER_WEIGHTS=master)
        assert result.settings["TRANSFORMER_IMPL"] == "transformer_engine"
        args = megatron_args(result, validate=False)
        assert args.store_param_remainders is remainders
