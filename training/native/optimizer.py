"""The optimizer Megatron builds when neither Transformer Engine nor apex is installed.

Megatron then falls back to torch.optim.AdamW with its default (multi-tensor 'foreach')
implementation: on an H200 at the 8-layer Llama3-8B shape its step ran ~70 ms per global
batch, several kernels per parameter group. torch's fused AdamW (one kernel, fp32 state, the
same update rule) is what apex's and TE's FusedAdam give Megatron elsewhere. `install()`
makes Megatron build torch.optim.AdamW(fused=True) on CUDA.
"""
from __future__ import annotations

import torch


class FusedTorchAdamW(torch.optim.AdamW):
    """torch AdamW, fused, accepting the keyword Megatron passes to apex/TE's FusedAdam."""

    def __init__(self, params, adam_w_mode: bool = True, **kwargs):
        if not adam_w_mode:
            raise ValueError("FusedTorchAdamW implements decoupled weight decay (AdamW) only")
        kwargs.setdefault("fused", torch.cuda.is_available())
        super().__init__(params, **kwargs)

    def state_dict(self):
        """Megatron 0.19.2's distributed optimizer, without apex/TE, reads the 'step' of every
        parameter's state in its own state_dict(), and a resume calls that before any step has
        run: on an empty state its `assert len(steps) == 1` stops the load (seen on 2 H200s,
        resuming at DP=2 from a TP=2 checkpoint). So an empty state is first filled the way
        torch's AdamW fills it at its first step (step 0, zero moments): the same memory, the
        same update, and the load then overwrites it."""
        if not self.state:
            self._fill_initial_state()
        return super().state_dict()

    @torch.no_grad()
    def _fill_initial_state(self) -> None:
        for group in self.param_groups:
            on_device = group.get("fused") or group.get("capturable")
            for p in group["params"]:
                self.state[p] = {
                    "step": torch.zeros((), dtype=torch.float32,
                                        device=p.device if on_device else "cpu"),
                    "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
                }


def install() -> str:
    from megatron.core import optimizer as megatron_optimizer

    if not megatron_optimizer.USING_PYTORCH_OPTIMIZER:
        return "Transformer Engine / apex FusedAdam (installed)"
    megatron_optimizer.Adam = FusedTorchAdamW
    megatron_optimizer.USING_PYTORCH_OPTIMIZER = False
    return "torch AdamW(fused=True) over the fp32 main params"


def allow_torch_adam_step_in_reshardable_load() -> None:
    """Megatron 0.19.2's fully-reshardable optimizer load (its default checkpoint format) copies
    every tensor of a parameter's optimizer state from the checkpoint, but leaves 'step' out
    of what it read (torch Adam's step travels in the param groups and is restored by
    load_state_dict). torch's AdamW keeps 'step' as a per-parameter tensor, so the copy looks
    it up and stops the resume with KeyError: 'step' (seen on 2 H200s, DP=2 from a TP=2
    checkpoint). Any torch AdamW run hits it: Megatron's own fallback (no TE, no apex) and
    ours. Marking 'step' as absent (not a tensor) makes the copy skip it, as Megatron's loop
    already does for non-tensor entries; step keeps the value load_state_dict restored."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    original = DistributedOptimizer._set_main_param_and_optimizer_states
    if getattr(original, "_skips_missing_step", False):
        return

    def set_states(self, model_param, tensors):
        if "step" not in tensors:
            tensors = {**tensors, "step": None}
        return original(self, model_param, tensors)

    set_states._skips_missing_step = True
    DistributedOptimizer._set_main_param_and_optimizer_states = set_states
