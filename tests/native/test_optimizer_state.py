"""FusedTorchAdamW's state_dict on a fresh optimizer (what a resume asks for first) and that the
filled state changes nothing about the update (CPU, unfused path)."""
from __future__ import annotations

import torch

from training.native.optimizer import FusedTorchAdamW


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(4, 3, generator=gen)),
            torch.nn.Parameter(torch.randn(5, generator=gen))]


def _step(opt, params, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    opt.step()


def test_a_fresh_optimizer_reports_one_step_for_every_parameter():
    params = _params()
    state = FusedTorchAdamW(params, lr=1e-2, fused=False).state_dict()["state"]
    assert len(state) == len(params)
    assert {float(s["step"]) for s in state.values()} == {0.0}  # what Megatron asserts on
    assert all(torch.count_nonzero(s["exp_avg"]) == 0 for s in state.values())


def test_filled_state_updates_like_a_lazily_initialised_adamw():
    ours, ref = _params(), _params()
    opt = FusedTorchAdamW(ours, lr=1e-2, weight_decay=0.1, fused=False)
    opt.state_dict()  # fills the state before any step, as a resume does
    ref_opt = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.1)
    for seed in range(3):
        _step(opt, ours, seed)
        _step(ref_opt, ref, seed)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert {float(s["step"]) for s in opt.state_dict()["state"].values()} == {3.0}


def test_state_round_trips_through_load_state_dict():
    params = _params()
    opt = FusedTorchAdamW(params, lr=1e-2, fused=False)
    _step(opt, params, 0)
    saved = opt.state_dict()
    fresh_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    fresh = FusedTorchAdamW(fresh_params, lr=1e-2, fused=False)
    fresh.state_dict()
    fresh.load_state_dict(saved)
    for a, b in zip(fresh.state_dict()["state"].values(), saved["state"].values()):
        torch.testing.assert_close(a["exp_avg_sq"], b["exp_avg_sq"])
        assert float(a["step"]) == 1.0


def _reshardable_copy(opt, param, tensors):
    """Megatron's per-parameter copy of a fully-reshardable load, on a stand-in for the
    DistributedOptimizer (only the attributes that method reads)."""
    from types import SimpleNamespace

    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    me = SimpleNamespace(model_param_group_index_map={param: (0, 0)}, optimizer=opt,
                         config=SimpleNamespace(
                             use_precision_aware_optimizer_no_fp8_or_ds_fp8=False))
    with torch.no_grad():  # as in Megatron's loader
        DistributedOptimizer._set_main_param_and_optimizer_states(me, param, tensors)


def test_reshardable_load_copies_moments_and_keeps_the_restored_step(monkeypatch):
    import pytest
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    from training.native.optimizer import restore_torch_adam_step_from_param_groups

    params = _params()
    opt = FusedTorchAdamW(params, lr=1e-2, fused=False)
    _step(opt, params, 0)  # step 1: what load_state_dict restored from the param groups
    saved = {"param": torch.full((4, 3), 7.0), "exp_avg": torch.full((4, 3), 0.5),
             "exp_avg_sq": torch.full((4, 3), 0.25)}
    stale_step = {**saved, "step": torch.zeros(())}  # dp_reshardable: captured before the load
    # Megatron 0.19.2 as shipped: fully_reshardable stops, dp_reshardable resets the step
    with pytest.raises(KeyError, match="step"):
        _reshardable_copy(opt, params[0], dict(saved))
    _reshardable_copy(opt, params[0], dict(stale_step))
    assert float(opt.state[params[0]]["step"]) == 0.0
    opt.state[params[0]]["step"].fill_(1.0)

    monkeypatch.setattr(DistributedOptimizer, "_set_main_param_and_optimizer_states",
                        DistributedOptimizer._set_main_param_and_optimizer_states)
    restore_torch_adam_step_from_param_groups()
    for tensors in (saved, stale_step):
        _reshardable_copy(opt, params[0], dict(tensors))
        state = opt.state[params[0]]
        assert torch.equal(params[0].detach(), saved["param"])
        assert torch.equal(state["exp_avg"], saved["exp_avg"])
        assert torch.equal(state["exp_avg_sq"], saved["exp_avg_sq"])
        assert float(state["step"]) == 1.0
