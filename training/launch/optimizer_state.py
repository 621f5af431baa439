"""The optimizer-state toggles -> Megatron's precision-aware optimizer and CPU offload flags.

megatron-core 0.19.2 keeps fp32 main params and fp32 Adam moments (12 B per parameter, sharded
by the distributed optimizer) and copies each gradient shard to fp32 for the step. Its
`--use-precision-aware-optimizer` instead gives the optimizer the bf16 parameter shards and
their gradients in the gradient buffer (`decoupled_grad`), and lets it keep the moments in
`--exp-avg-dtype`/`--exp-avg-sq-dtype` and the master weights itself: Transformer Engine's
FusedAdam under TE, training.native.adamw.MixedPrecisionAdamW on the native backend without TE.
Megatron requires it for `--optimizer-cpu-offload` as well (its HybridDeviceOptimizer reuses
that path). The guard `optimizer_state` (guards.py) decides what can run where.
"""
from __future__ import annotations

from typing import Any


def precision_aware(settings: Any) -> bool:
    """Whether the launch uses Megatron's precision-aware optimizer."""
    return (settings["ADAM_MOMENTS_DTYPE"] != "fp32" or settings["MASTER_WEIGHTS"] != "fp32"
            or bool(settings["OPTIMIZER_CPU_OFFLOAD"]))


def optimizer_state_words(settings: Any) -> dict[str, list[str]]:
    """The Megatron words each toggle contributes (nothing at the defaults: Megatron's
    usual fp32 main params and moments)."""
    if not precision_aware(settings):
        return {}
    moments = settings["ADAM_MOMENTS_DTYPE"]
    grads = "bf16" if settings["GRAD_REDUCE_IN_BF16"] else "fp32"
    words = {
        "ADAM_MOMENTS_DTYPE": ["--use-precision-aware-optimizer", "--exp-avg-dtype", moments,
                               "--exp-avg-sq-dtype", moments, "--main-grads-dtype", grads],
        # main params stay fp32 in Megatron's terms; --master-weights (ours) says how they are
        # stored (and sets Megatron's store_param_remainders, which has no flag)
        "MASTER_WEIGHTS": ["--main-params-dtype", "fp32", "--master-weights",
                           settings["MASTER_WEIGHTS"]],
    }
    if settings["OPTIMIZER_CPU_OFFLOAD"]:
        words["OPTIMIZER_CPU_OFFLOAD"] = ["--optimizer-cpu-offload",
                                          "--overlap-cpu-optimizer-d2h-h2d"]
        words["OPTIMIZER_OFFLOAD_FRACTION"] = ["--optimizer-offload-fraction",
                                               f"{settings['OPTIMIZER_OFFLOAD_FRACTION']:g}"]
    return words
