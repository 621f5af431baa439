"""The optimizer Megatron builds when neither Transformer Engine nor apex is installed.

Megatron then falls back to torch.optim.AdamW with its default (multi-tensor 'foreach')
implementation: on an H200 at the 8-layer Llama3-8B shape its step ran ~70 ms per global
batch, several kernels per parameter group. torch's fused AdamW (one kernel, fp32 state, the
same update rule) is what apex's and TE's FusedAdam give Megatron elsewhere: the patch table
(training.megatron_patches, native backend) makes Megatron build FusedTorchAdamW where it fell
back to torch's, and, under --use-precision-aware-optimizer (ADAM_MOMENTS_DTYPE,
MASTER_WEIGHTS, OPTIMIZER_CPU_OFFLOAD), training.native.adamw.MixedPrecisionAdamW: the
low-precision-state AdamW that takes the keywords Megatron gives TE's FusedAdam there.
"""
from __future__ import annotations

import torch

from training.native.adamw import MixedPrecisionAdamW

# The keywords Megatron adds for TE's FusedAdam under --use-precision-aware-optimizer.
PRECISION_AWARE_KEYWORDS = ("exp_avg_dtype", "exp_avg_sq_dtype", "master_weights",
                            "use_decoupled_grad", "master_weight_dtype")


class FusedTorchAdamW(torch.optim.AdamW):
    """torch AdamW, fused, accepting the keyword Megatron passes to apex/TE's FusedAdam."""

    def __init__(self, params, adam_w_mode: bool = True, **kwargs):
        if not adam_w_mode:
            raise ValueError("FusedTorchAdamW implements decoupled weight decay (AdamW) only")
        kwargs.setdefault("fused", torch.cuda.is_available())
        super().__init__(params, **kwargs)

    def load_state_dict(self, state_dict: dict) -> None:
        """Each parameter's step its own tensor again. Megatron's DistributedOptimizer, without
        apex or TE, restores one step tensor into every parameter's state; torch keeps it
        shared unless it moves it to another device (fused or capturable, CUDA parameters), and
        a shared step is incremented once per parameter at each step (bias correction off after
        a resume)."""
        super().load_state_dict(state_dict)
        for state in self.state.values():
            if torch.is_tensor(state.get("step")):
                state["step"] = state["step"].clone()


def adam_builder(master_weights: str = "fp32", kernels: str = "auto"):
    """What Megatron's optimizer factory calls as `Adam(...)` on the native backend without
    TE or apex:

    - with the precision-aware keywords: MixedPrecisionAdamW over the bf16 parameter shards
      (the moments' dtypes from Megatron, the master weights as --master-weights says);
    - with no keyword at all: the GPU part of Megatron's HybridDeviceOptimizer (CPU offload),
      which passes only parameter groups (fp32 copies, hyperparameters in the groups):
      MixedPrecisionAdamW in fp32 (a torch AdamW subclass there would be taken for the CPU
      part when the offload loads a checkpoint: Megatron tells the two apart by class);
    - otherwise Megatron's usual call: FusedTorchAdamW over the fp32 main params."""

    def adam(params, **kwargs) -> torch.optim.Optimizer:
        if any(k in kwargs for k in PRECISION_AWARE_KEYWORDS):
            return MixedPrecisionAdamW(params, main_params=master_weights, kernels=kernels,
                                       **kwargs)
        if not kwargs:
            return MixedPrecisionAdamW(params, master_weights=False, kernels=kernels)
        return FusedTorchAdamW(params, **kwargs)

    from training.megatron_patches import describe

    adam.native = True
    adam.description = (f"{describe(FusedTorchAdamW)} (torch AdamW, fused on CUDA, over the "
                        "fp32 main params); under the precision-aware optimizer "
                        f"{describe(MixedPrecisionAdamW)} (master weights: {master_weights})")
    return adam


def native_adam(original, run):
    """The patch table's factory for megatron.core.optimizer:Adam (native backend)."""
    kernels = "torch" if run.args.native_kernels == "torch" else "auto"
    return adam_builder(getattr(run.args, "master_weights", "fp32"), kernels)


def native_adam_over_te(original, run):
    """The patch table's factory for megatron.core.optimizer:Adam where it is Transformer
    Engine's FusedAdam and ADAM_IMPL=native: under the precision-aware optimizer (Megatron's
    call carries exp_avg_dtype and the rest) MixedPrecisionAdamW, which takes the same keywords
    and keeps the Adam step in its param groups, where Megatron's distributed optimizer saves
    and restores it when TE imports (USING_TE_OPTIMIZER); any other call (Megatron's default
    fp32 state, the CPU offload's GPU part) TE's FusedAdam as before."""
    ours = native_adam(original, run)

    def adam(params, **kwargs) -> torch.optim.Optimizer:
        if any(k in kwargs for k in PRECISION_AWARE_KEYWORDS):
            return ours(params, **kwargs)
        return original(params, **kwargs)

    from training.megatron_patches import describe

    adam.description = (f"under the precision-aware optimizer {describe(MixedPrecisionAdamW)} "
                         f"(master weights: {getattr(run.args, 'master_weights', 'fp32')}) in "
                         f"place of {describe(original)}; otherwise {describe(original)}")
    return adam


def precision_aware_without_te(original, run=None):
    """OptimizerConfig.__post_init__ where Megatron's Adam is ours. Megatron 0.19.2 checks, for
    --use-precision-aware-optimizer, that Transformer Engine's FusedAdam imports and takes the
    precision keywords (RuntimeError otherwise); it skips that one check under CPU offload,
    whose optimizer is its own. MixedPrecisionAdamW takes the same keywords: the check is
    skipped the same way, Megatron's other checks run, then its flag for the precision-aware
    path is set again without the offload term (the native backend runs no fp8, so the path
    is always the master-weights one)."""

    def post_init(self):
        if not self.use_precision_aware_optimizer or self.optimizer_cpu_offload:
            return original(self)
        self.optimizer_cpu_offload = True
        try:
            original(self)
        finally:
            self.optimizer_cpu_offload = False
        self.use_precision_aware_optimizer_no_fp8_or_ds_fp8 = (
            self.main_params_dtype != torch.float32
            or self.fp8_recipe is None or self.fp8_recipe == "delayed")

    return post_init


@torch.no_grad()
def fill_initial_adam_state(optimizer: torch.optim.Optimizer) -> None:
    """Give every parameter the state torch's Adam/AdamW creates at its first step (step 0,
    zero moments): the same memory and the same next update as the lazy initialisation."""
    for group in optimizer.param_groups:
        on_device = group.get("fused") or group.get("capturable")
        for p in group["params"]:
            optimizer.state[p] = {
                "step": torch.zeros((), dtype=torch.float32,
                                    device=p.device if on_device else "cpu"),
                "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
            }


# Megatron 0.19.2's distributed optimizer saves and loads with torch's Adam/AdamW (its own
# fallback without TE or apex, and FusedTorchAdamW) only after two fixes, entries of the patch
# table (training.megatron_patches) for every backend:
#
# 1. Its state_dict() reads every parameter's Adam 'step' (`assert len(steps) == 1`), and a
#    resume calls it before any step has run, when a torch optimizer has no state yet (seen
#    on 2 H200s, resuming at DP=2 from a TP=2 checkpoint). The state is filled first, as
#    torch fills it at its first step; the load then overwrites it.
# 2. Its per-parameter copy of the checkpoint's tensors mishandles 'step', which torch keeps
#    per parameter and Megatron restores from the param groups (load_state_dict): the
#    fully_reshardable format leaves 'step' out and the copy raises KeyError: 'step'; the
#    default dp_reshardable format hands it the step captured before the load (a
#    LocalNonpersistentObject), which overwrites the restored one, so Adam's bias
#    correction restarts after every resume (2.8% loss drift over 10 iterations of the
#    tiny preset on an H200, against 1e-3 wanted). The copy now leaves 'step' alone (a
#    non-tensor entry, which Megatron's loop skips).
# With TE or apex, whose optimizers keep no per-parameter step, neither changes anything.
# MixedPrecisionAdamW (the precision-aware path without TE) keeps torch's per-parameter step
# too: its state is filled the same way (zero moments, the master from the parameter).

def state_filled_before_state_dict(original, run=None):
    """DistributedOptimizer.state_dict: a torch Adam/AdamW without state is filled first."""

    def state_dict(self):
        inner = self.optimizer
        if isinstance(inner, (torch.optim.Adam, torch.optim.AdamW)) and not inner.state:
            fill_initial_adam_state(inner)
        if isinstance(inner, MixedPrecisionAdamW) and not inner.state:
            for group in inner.param_groups:
                for p in group["params"]:
                    inner.initialize_state(p, group)
        return original(self)

    return state_dict


def copy_leaving_step(original, run=None):
    """DistributedOptimizer._set_main_param_and_optimizer_states: 'step' left alone."""

    def set_main_param_and_optimizer_states(self, model_param, tensors):
        return original(self, model_param, {**tensors, "step": None})

    return set_main_param_and_optimizer_states
