"""Megatron's distributed-optimizer checkpoints with torch's AdamW (training/native/optimizer.py):
the state filled before a resume reads it, the per-parameter copy of a load, and that neither
changes the update (CPU, unfused path). Both go into Megatron as entries of the patch table."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from training import megatron_patches
from training.native.optimizer import FusedTorchAdamW, fill_initial_adam_state
from training.run import Run

TORCH_ADAM = ("torch_adam_state_dict", "torch_adam_load_copy")


def make_torch_adam_checkpoints_load() -> None:
    megatron_patches.apply(Run(args=None), names=TORCH_ADAM)


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(4, 3, generator=gen)),
            torch.nn.Parameter(torch.randn(5, generator=gen))]


def _step(opt, params, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    opt.step()


def test_filled_state_updates_like_a_lazily_initialised_adamw():
    ours, ref = _params(), _params()
    opt = FusedTorchAdamW(ours, lr=1e-2, weight_decay=0.1, fused=False)
    fill_initial_adam_state(opt)  # before any step, as a resume does
    assert {float(s["step"]) for s in opt.state_dict()["state"].values()} == {0.0}
    ref_opt = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.1)
    for seed in range(3):
        _step(opt, ours, seed)
        _step(ref_opt, ref, seed)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert {float(s["step"]) for s in opt.state_dict()["state"].values()} == {3.0}


@pytest.mark.parametrize("adam", [FusedTorchAdamW, torch.optim.AdamW])  # ours; Megatron's own
def test_a_fresh_torch_adam_is_filled_before_megatron_reads_its_steps(monkeypatch, adam):
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    seen = []

    def megatron_state_dict(self):  # stands in for Megatron's, which asserts one step
        seen.append({float(s["step"]) for s in self.optimizer.state.values()})
        return {}

    monkeypatch.setattr(DistributedOptimizer, "state_dict", megatron_state_dict)
    monkeypatch.setattr(DistributedOptimizer, "_set_main_param_and_optimizer_states",
                        DistributedOptimizer._set_main_param_and_optimizer_states)
    make_torch_adam_checkpoints_load()
    me = SimpleNamespace(optimizer=adam(_params(), lr=1e-2))
    DistributedOptimizer.state_dict(me)
    assert seen == [{0.0}] and len(me.optimizer.state) == 2


def _reshardable_copy(method, opt, param, tensors):
    me = SimpleNamespace(model_param_group_index_map={param: (0, 0)}, optimizer=opt,
                         config=SimpleNamespace(
                             use_precision_aware_optimizer_no_fp8_or_ds_fp8=False))
    with torch.no_grad():  # as in Megatron's loader
        method(me, param, tensors)


def test_reshardable_load_copies_moments_and_keeps_the_restored_step(monkeypatch):
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    params = _params()
    opt = FusedTorchAdamW(params, lr=1e-2, fused=False)
    _step(opt, params, 0)  # step 1: what load_state_dict restored from the param groups
    saved = {"param": torch.full((4, 3), 7.0), "exp_avg": torch.full((4, 3), 0.5),
             "exp_avg_sq": torch.full((4, 3), 0.25)}
    stale_step = {**saved, "step": torch.zeros(())}  # dp_reshardable: captured before the load
    shipped = DistributedOptimizer._set_main_param_and_optimizer_states
    # Megatron 0.19.2 as shipped: fully_reshardable stops, dp_reshardable resets the step
    with pytest.raises(KeyError, match="step"):
        _reshardable_copy(shipped, opt, params[0], dict(saved))
    _reshardable_copy(shipped, opt, params[0], dict(stale_step))
    assert float(opt.state[params[0]]["step"]) == 0.0
    opt.state[params[0]]["step"].fill_(1.0)

    for name in ("state_dict", "_set_main_param_and_optimizer_states"):
        monkeypatch.setattr(DistributedOptimizer, name, getattr(DistributedOptimizer, name))
    make_torch_adam_checkpoints_load()
    for tensors in (saved, stale_step):
        _reshardable_copy(DistributedOptimizer._set_main_param_and_optimizer_states, opt,
                          params[0], dict(tensors))
        state = opt.state[params[0]]
        assert torch.equal(params[0].detach(), saved["param"])
        assert torch.equal(state["exp_avg"], saved["exp_avg"])
        assert torch.equal(state["exp_avg_sq"], saved["exp_avg_sq"])
        assert float(state["step"]) == 1.0
