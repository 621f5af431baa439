"""MixedPrecisionAdamW inside megatron-core 0.19.2's precision-aware distributed optimizer, on
the CPU in one gloo process (tests/native/megatron_cpu.py): what Megatron builds, that the step
reads the gradient buffer in place and keeps no fp32 main params, and a save/resume through
Megatron's dist_checkpointing in both optimizer formats: bit for bit with the same state
(Megatron's default one too), within bf16 rounding across states."""
from __future__ import annotations

import pytest
import torch

from training.native import optimizer as native_optimizer
from training.native.adamw import MixedPrecisionAdamW

from .megatron_cpu import on_cpu, tiny_model


NATIVE_OPTIMIZER = ("native_adam", "native_adam_kwargs", "native_precision_aware",
                    "torch_adam_state_dict", "torch_adam_load_copy")


@pytest.fixture
def megatron_native():
    """The patch table's optimizer entries as the native backend's run applies them (its
    --master-weights, torch kernels on the CPU), taken out afterwards."""
    from argparse import Namespace

    from training import megatron_patches
    from training.run import Run

    def install(master_weights):
        run = Run(args=Namespace(transformer_backend="native", native_kernels="torch",
                                 master_weights=master_weights))
        megatron_patches.apply(run, names=NATIVE_OPTIMIZER)
    megatron_patches.restore(names=NATIVE_OPTIMIZER)   # Megatron's own (an earlier test's out)
    yield install
    megatron_patches.restore(names=NATIVE_OPTIMIZER)


def _config(precision_aware: bool = True, **extra):
    """The precision-aware optimizer with bf16 moments, or (False) Megatron's default: fp32
    main params and moments in torch's AdamW (FusedTorchAdamW)."""
    from megatron.core.optimizer import OptimizerConfig

    if precision_aware:
        extra = dict(use_precision_aware_optimizer=True, exp_avg_dtype=torch.bfloat16,
                     exp_avg_sq_dtype=torch.bfloat16, main_grads_dtype=torch.bfloat16, **extra)
    return OptimizerConfig(optimizer="adam", lr=1e-2, bf16=True, weight_decay=0.1,
                           clip_grad=1.0, use_distributed_optimizer=True, **extra)


def _build(seed: int, precision_aware: bool = True):
    from megatron.core.distributed import (DistributedDataParallel,
                                           DistributedDataParallelConfig)
    from megatron.core.optimizer import get_megatron_optimizer

    torch.manual_seed(seed)
    model, config = tiny_model()
    ddp = DistributedDataParallel(
        config, DistributedDataParallelConfig(grad_reduce_in_fp32=False,
                                              use_distributed_optimizer=True), model)
    return ddp, get_megatron_optimizer(_config(precision_aware), [ddp])


def _step(ddp, opt, seed: int):
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    ddp.zero_grad_buffer()
    opt.zero_grad()
    ddp(x).float().pow(2).mean().backward()
    return opt.step()  # one rank: the reduce-scatter has nothing to do


def _inner(opt) -> MixedPrecisionAdamW:
    chained = getattr(opt, "chained_optimizers", [opt])
    return chained[0].optimizer


def test_without_the_native_install_megatron_asks_for_transformer_engine(megatron_native):
    with pytest.raises(RuntimeError, match="TransformerEngine"):
        _config()


@pytest.mark.parametrize("master_weights", ["fp32", "remainder", "stochastic"])
def test_megatron_builds_it_and_steps_on_the_gradient_buffer(megatron_native, master_weights):
    megatron_native(master_weights)
    with on_cpu():
        ddp, opt = _build(0)
        inner = _inner(opt)
        assert isinstance(inner, MixedPrecisionAdamW) and inner.main_params == master_weights
        before = [p.detach().clone() for p in ddp.module.parameters()]
        ok, grad_norm, _ = _step(ddp, opt, 0)
        assert ok and grad_norm > 0
        buffer = ddp.buffers[0]
        grad_lo = buffer.grad_data.data_ptr()
        grad_hi = grad_lo + buffer.grad_data.numel() * buffer.grad_data.element_size()
        for group in inner.param_groups:
            for shard in group["params"]:
                assert shard.dtype == torch.bfloat16
                state = inner.state[shard]
                assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16
        for p in ddp.module.parameters():
            assert p.main_param is None  # Megatron made no fp32 main params
        shards = [s for g in inner.param_groups for s in g["params"]]
        grads = [getattr(s, "decoupled_grad", None) for s in shards]
        assert all(g is not None and g.dtype == torch.bfloat16 for g in grads)
        assert all(grad_lo <= g.data_ptr() < grad_hi for g in grads)  # views, not copies
        after = list(ddp.module.parameters())
        assert all(not torch.equal(a, b) for a, b in zip(before, after))


def _save_and_resume(megatron_native, path, sharding, saved, resumed_as):
    """3 steps of the optimizer `saved` (master weights, precision-aware), a dist checkpoint,
    3 more steps; then a fresh model and the optimizer `resumed_as` loaded from it and stepped
    the same 3 times: (the uninterrupted run's grad norms and parameters, the resumed's, the
    resumed optimizer)."""
    from megatron.core import dist_checkpointing

    metadata = {"distrib_optim_sharding_type": sharding}
    megatron_native(saved[0])
    ddp, opt = _build(0, saved[1])
    for seed in range(3):
        _step(ddp, opt, seed)
    model_sd = ddp.module.sharded_state_dict(prefix="model.")
    dist_checkpointing.save({"model": model_sd,
                             "optimizer": opt.sharded_state_dict(model_sd, metadata=metadata)},
                            str(path))
    expected = [_step(ddp, opt, seed)[1] for seed in range(3, 6)]
    megatron_native(resumed_as[0])
    resumed_ddp, resumed = _build(1, resumed_as[1])  # other initial weights: all from the load
    model_sd = resumed_ddp.module.sharded_state_dict(prefix="model.")
    loaded = dist_checkpointing.load(
        {"model": model_sd,
         "optimizer": resumed.sharded_state_dict(model_sd, is_loading=True, metadata=metadata)},
        str(path))
    resumed_ddp.module.load_state_dict({k[len("model."):]: v for k, v in loaded["model"].items()})
    resumed.load_state_dict(loaded["optimizer"])
    got = [_step(resumed_ddp, resumed, seed)[1] for seed in range(3, 6)]
    return ((expected, list(ddp.module.parameters())),
            (got, list(resumed_ddp.module.parameters())), resumed)


def _resume_same_state(megatron_native, path, sharding, state):
    """A save and resume with the same optimizer state: (did the resumed run match the
    uninterrupted one bit for bit, grad norms and weights; its steps; its inner optimizer)."""
    (expected, before), (got, after), resumed = _save_and_resume(
        megatron_native, path, sharding, state, state)
    same = got == expected and all(torch.equal(a, b) for a, b in zip(before, after))
    inner = _inner(resumed)
    return same, [s["step"] for s in inner.state.values()], inner


DEFAULT_STATE = ("fp32", False)     # Megatron's default: fp32 main params, torch's AdamW
LEAN_STATE = ("remainder", True)    # the MoE lean step's: bf16 moments, remainder masters


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["dp_reshardable", "fully_reshardable"])
def test_the_default_optimizer_resumes_bit_for_bit(megatron_native, tmp_path, sharding):
    """Megatron's default optimizer on the native backend (fp32 main params in FusedTorchAdamW)
    through a dist checkpoint. Megatron restores one step tensor into every parameter's state;
    torch kept it shared on the CPU and counted it once per parameter (the grad norms parted
    from the second resumed step): FusedTorchAdamW.load_state_dict gives each its own."""
    with on_cpu():
        same, steps, inner = _resume_same_state(megatron_native, tmp_path, sharding,
                                                DEFAULT_STATE)
    assert same and {float(t) for t in steps} == {6.0}
    assert isinstance(inner, native_optimizer.FusedTorchAdamW)
    assert len({id(t) for t in steps}) == len(steps)


@pytest.mark.slow
@pytest.mark.parametrize("saved,resumed_as", [(DEFAULT_STATE, LEAN_STATE),
                                              (LEAN_STATE, DEFAULT_STATE)],
                         ids=["default-to-lean", "lean-to-default"])
def test_a_resume_may_change_the_optimizer_state(megatron_native, tmp_path, saved, resumed_as):
    """A checkpoint saved with one optimizer state resumes under the other (MOE_LEAN_STEP or
    ADAM_MOMENTS_DTYPE / MASTER_WEIGHTS changed between the runs): the checkpoint holds fp32
    masters and moments either way, and the continued run stays within bf16 rounding of the
    uninterrupted one."""
    with on_cpu():
        (expected, before), (got, after), _ = _save_and_resume(
            megatron_native, tmp_path, "fully_reshardable", saved, resumed_as)
        assert all(abs(g - e) / e < 1e-2 for g, e in zip(got, expected)), (got, expected)
        worst = max((a.float() - b.float()).abs().max().item() for a, b in zip(before, after))
        assert worst < 4e-3, worst   # a few bf16 ulps of these weights (~0.1-1)


@pytest.mark.slow
@pytest.mark.parametrize("master_weights", ["fp32", "remainder", "stochastic"])
@pytest.mark.parametrize("sharding", ["dp_reshardable", "fully_reshardable"])
def test_dist_checkpoint_save_and_resume_continue_bit_for_bit(megatron_native, tmp_path,
                                                               master_weights, sharding):
    with on_cpu():
        same, steps, inner = _resume_same_state(megatron_native, tmp_path, sharding,
                                                (master_weights, True))
    assert same and {float(t) for t in steps} == {6.0}
    assert isinstance(inner, MixedPrecisionAdamW) and inner.main_params == master_weights


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["dp_reshardable", "fully_reshardable"])
def test_a_resume_keeps_the_step_where_megatron_reads_it_from_the_groups(
        megatron_native, tmp_path, sharding, monkeypatch):
    """Where TE or apex imports, Megatron's distributed optimizer saves the Adam step from the
    param groups and restores only the groups' (TE's FusedAdam keeps it there), passing the
    fresh optimizer's zero per-parameter step: MixedPrecisionAdamW keeps the group's count too
    and reads it back first, so a resume continues bit for bit (before: the step restarted at
    0, and the bias correction with it). Megatron's module flags stand in for TE here."""
    import megatron.core.optimizer.distrib_optimizer as distrib_optimizer

    monkeypatch.setattr(distrib_optimizer, "HAVE_APEX_OR_TE", True)
    monkeypatch.setattr(distrib_optimizer, "USING_TE_OPTIMIZER", True)
    with on_cpu():
        same, steps, inner = _resume_same_state(megatron_native, tmp_path, sharding, LEAN_STATE)
    assert same and {float(t) for t in steps} == {6.0}
    assert [g["step"] for g in inner.param_groups] == [6, 6]


def test_the_native_adam_builds_the_right_optimizer_for_each_call():
    adam = native_optimizer.adam_builder("remainder", "torch")
    params = [torch.nn.Parameter(torch.zeros(4))]
    # Megatron's usual path: keywords, no precision ones
    plain = adam(params, lr=1e-3, weight_decay=0.0, betas=(0.9, 0.95), eps=1e-8,
                 adam_w_mode=True)
    assert isinstance(plain, native_optimizer.FusedTorchAdamW)
    # the precision-aware path
    bf16 = [torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))]
    aware = adam(bf16, lr=1e-3, adam_w_mode=True, master_weights=True,
                 exp_avg_dtype=torch.bfloat16, exp_avg_sq_dtype=torch.bfloat16,
                 use_decoupled_grad=True, master_weight_dtype=torch.float32)
    assert isinstance(aware, MixedPrecisionAdamW) and aware.exp_avg_dtype == torch.bfloat16
    assert aware.main_params == "remainder"
    # HybridDeviceOptimizer's GPU part: parameter groups only (fp32 copies)
    group = {"params": params, "lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8,
             "weight_decay": 0.1, "bias_correction": True, "fused": True}
    offload_gpu = adam([group])
    assert isinstance(offload_gpu, MixedPrecisionAdamW)
    assert not isinstance(offload_gpu, torch.optim.AdamW)  # Megatron's CPU-part test by class
    params[0].grad = torch.ones(4)
    offload_gpu.step()
    assert bool((params[0] < 0).all())


# -- ADAM_IMPL=native: MixedPrecisionAdamW in place of TE's FusedAdam (where TE imports) --------

class StandInFusedAdam(torch.optim.AdamW):
    """Transformer Engine's FusedAdam as Megatron meets it (its module, its keywords), on the
    CPU: torch's AdamW under TE's name, its step in the param groups as TE keeps it."""

    def __init__(self, params, adam_w_mode=True, capturable=False, **kwargs):
        for key in (*native_optimizer.PRECISION_AWARE_KEYWORDS, "store_param_remainders"):
            self.precision_keywords = {**getattr(self, "precision_keywords", {}),
                                       key: kwargs.pop(key, None)}
        super().__init__(params, **kwargs)

    def step(self, closure=None):
        loss = super().step(closure)
        for group in self.param_groups:
            group["step"] = group.get("step", 0) + 1
        return loss


StandInFusedAdam.__module__ = "transformer_engine.pytorch.optimizers.fused_adam"


@pytest.fixture
def te_imports(monkeypatch):
    """Megatron as it is where TE imports: its Adam TE's FusedAdam (the stand-in), its
    keywords TE's, its distributed optimizer's step in the groups, its precision-aware check
    passed (TE's FusedAdam takes the keywords); the patch table's optimizer entries installed
    with ADAM_IMPL's value, taken out before Megatron's own come back."""
    from argparse import Namespace

    import megatron.core.optimizer as mcore_optimizer
    import megatron.core.optimizer.distrib_optimizer as distrib_optimizer
    from megatron.core.optimizer.optimizer_config import OptimizerConfig

    from training import megatron_patches
    from training.run import Run

    names = (*NATIVE_OPTIMIZER, "native_adam_over_te")
    megatron_patches.restore(names=names)
    monkeypatch.setattr(mcore_optimizer, "Adam", StandInFusedAdam)
    monkeypatch.setattr(mcore_optimizer, "USING_PYTORCH_OPTIMIZER", False)
    monkeypatch.setattr(distrib_optimizer, "HAVE_APEX_OR_TE", True)
    monkeypatch.setattr(distrib_optimizer, "USING_TE_OPTIMIZER", True)
    monkeypatch.setattr(OptimizerConfig, "__post_init__",
                        native_optimizer.precision_aware_without_te(OptimizerConfig.__post_init__))
    impl = {}

    def install(master_weights):
        run = Run(args=Namespace(transformer_backend="native", native_kernels="torch",
                                 master_weights=master_weights, adam_impl=impl["value"]))
        return megatron_patches.apply(run, names=names)

    def with_impl(value):
        impl["value"] = value
        return install
    yield with_impl
    megatron_patches.restore(names=names)


@pytest.mark.parametrize("adam_impl, state, built", [
    ("native", LEAN_STATE, MixedPrecisionAdamW),      # the swap
    ("auto", LEAN_STATE, StandInFusedAdam),           # today's default: TE's
    ("native", DEFAULT_STATE, StandInFusedAdam),      # Megatron's default state: TE's stays
])
def test_adam_impl_native_builds_ours_in_place_of_te_fused_adam(te_imports, adam_impl, state,
                                                                 built):
    install = te_imports(adam_impl)
    applied = install(state[0])
    assert ("native_adam_over_te" in applied) == (adam_impl == "native")
    assert "native_adam" not in applied          # its entry replaces torch's AdamW only
    with on_cpu():
        ddp, opt = _build(0, state[1])
        inner = _inner(opt)
        assert type(inner) is built
        if built is StandInFusedAdam:
            assert (inner.precision_keywords["exp_avg_dtype"] is not None) == state[1]
            return                   # a stand-in: it names what Megatron built, no more
        ok, grad_norm, _ = _step(ddp, opt, 0)
        assert ok and grad_norm > 0
        if built is MixedPrecisionAdamW:
            assert inner.main_params == state[0]
            assert [g["step"] for g in inner.param_groups] == [1, 1]


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["dp_reshardable", "fully_reshardable"])
def test_adam_impl_native_resumes_bit_for_bit_where_te_imports(te_imports, tmp_path, sharding):
    """The swap's save and resume through Megatron's dist checkpoint with TE's flags: the Adam
    step is saved from and restored into the param groups (Megatron's TE path), and the resumed
    run matches the uninterrupted one bit for bit."""
    with on_cpu():
        same, steps, inner = _resume_same_state(te_imports("native"), tmp_path, sharding,
                                                LEAN_STATE)
    assert isinstance(inner, MixedPrecisionAdamW)
    assert same and {float(t) for t in steps} == {6.0}
    assert [g["step"] for g in inner.param_groups] == [6, 6]
