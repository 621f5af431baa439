"""The patch table (training/megatron_patches.py) against the pinned megatron-core: every
target exists with the signature its replacement was written against; applying is idempotent,
logged once, never stacks, and comes back out; and the native backend's entries name what is
in place, inspected on the built model and optimizer, with and without Transformer Engine's
imports in Megatron's modules (issue 19: the manifest said what a flag asked for)."""
from __future__ import annotations

import inspect
import types
from argparse import Namespace

import pytest
import torch

from tests.model.parity import native_run
from training import megatron_patches as mp
from training import specs
from training.run import Run


def original_of(patch: mp.Patch):
    """What Megatron itself has at the target (under our replacement, if one is in place)."""
    owner, attribute = mp.owner_of(patch)
    current = getattr(owner, attribute, mp._ABSENT)
    record = (vars(owner).get(mp.MARKER) or {}).get(attribute)
    if record is not None and record.replacement is current:
        return record.original
    return current


def test_the_table_is_pinned_to_megatron_core_0_19_2():
    from megatron.core import package_info

    assert package_info.__version__.split("+")[0] == "0.19.2"
    assert len(mp.BY_NAME) == len(mp.PATCHES)


@pytest.mark.parametrize("patch", mp.PATCHES, ids=lambda p: p.name)
def test_each_target_exists_as_the_patch_was_written(patch):
    original = original_of(patch)
    if original is mp._ABSENT:
        assert patch.absent_ok, f"{patch.target} is gone from megatron-core"
        return
    if patch.signature is not None:
        assert mp.plain_signature(original) == patch.signature, patch.target
    elif patch.replacement is None:                       # a flag we set
        assert type(original) is type(patch.constant), patch.target
    elif patch.as_is and inspect.isclass(mp.resolve(patch.replacement)):
        # a class Megatron instantiates (the optimizer) or a module of kernels (apex's wgrad)
        assert inspect.isclass(original) or inspect.ismodule(original), patch.target


@pytest.mark.parametrize("patch", [p for p in mp.PATCHES if p.replacement],
                         ids=lambda p: p.name)
def test_each_replacement_resolves_and_fits(patch):
    obj = mp.resolve(patch.replacement)
    if not patch.as_is:
        inspect.signature(obj).bind(object(), object(), *patch.args)  # (original, run, ...)
    elif patch.signature is not None and not inspect.isclass(obj):
        assert mp.plain_signature(obj) == patch.signature


def _fake_training(calls: list):
    fake = types.ModuleType("fake_training")

    def evaluate(*a, **kw):
        calls.append("evaluate")
        return {"lm loss": 2.5}, None, False

    fake.evaluate = evaluate
    return fake


def test_applying_twice_is_a_no_op_logged_once_and_another_run_rebuilds_without_stacking(
        capsys):
    calls: list = []
    fake = _fake_training(calls)
    original = fake.evaluate
    owners = {"megatron.training.training": fake}
    first, second = Run(args=None), Run(args=None)
    assert mp.apply(first, names=("eval_loss",), owners=owners) == ["eval_loss"]
    replaced = fake.evaluate
    assert mp.apply(first, names=("eval_loss",), owners=owners) == []
    assert fake.evaluate is replaced and first.patched == ["eval_loss"]
    assert capsys.readouterr().out.count("megatron patches applied: eval_loss") == 1

    assert mp.apply(second, names=("eval_loss",), owners=owners) == ["eval_loss"]
    assert vars(fake)[mp.MARKER]["evaluate"].original is original
    fake.evaluate()
    assert calls == ["evaluate"]                    # Megatron's ran once: not stacked
    assert second.eval_loss == 2.5 and first.eval_loss is None

    assert mp.restore(names=("eval_loss",), owners=owners) == ["eval_loss"]
    assert fake.evaluate is original


def test_the_run_entries_go_into_megatron_and_come_back_out():
    run_entries = [p for p in mp.PATCHES if p.group == "run"]
    before = {p.name: original_of(p) for p in run_entries}
    # a listener (train too), an MoE model (its aux-loss capture too), Megatron's signal
    # handler (the preemption record) and heartbeats (the save's beat)
    run = Run(args=Namespace(num_experts=8, exit_signal_handler=True),
              mlperf=types.SimpleNamespace(), heartbeat=types.SimpleNamespace())
    mp.apply(run, groups=("run",))
    for patch in run_entries:
        owner, attribute = mp.owner_of(patch)
        assert not mp.in_place(patch.name).endswith("(Megatron's)"), patch.name
        assert getattr(owner, attribute) is not before[patch.name]
    mp.restore(groups=("run",))
    for patch in run_entries:
        owner, attribute = mp.owner_of(patch)
        assert getattr(owner, attribute) is before[patch.name], patch.name


def _megatron_adam(**overrides):
    """The torch optimizer Megatron builds for these settings (its own code, unwrapped)."""
    from megatron.core.optimizer import (OptimizerConfig,
                                         _get_megatron_optimizer_based_on_param_groups)

    params = [torch.nn.Parameter(torch.randn(4, 3))]
    optimizer, _ = _get_megatron_optimizer_based_on_param_groups(
        OptimizerConfig(optimizer="adam", lr=1e-3, weight_decay=0.1, **overrides), [],
        [{"params": params}], skip_megatron_wrapping=True)
    return optimizer


def _tiny_native_model(kernels: str = "torch"):
    from tests.model.parity import build_pair
    from training.launch.presets import preset_for

    preset = preset_for("llama3", "tiny")
    hf, gpt = build_pair(preset, 1, "native", kernels, "cpu", torch.float32)
    tokens = torch.randint(0, preset.vocab_size, (1, 8))
    gpt(tokens, torch.arange(8).unsqueeze(0), None)              # a forward on the CPU
    return gpt


@pytest.mark.slow
def test_without_te_or_apex_the_native_backend_fills_megatrons_fallbacks():
    from training.launch.capabilities import detect

    if detect().transformer_engine or detect().apex_fused_wgrad:
        pytest.skip("Transformer Engine or apex imports here: the other test covers it")
    setup = specs.install_native(native_run("torch", gradient_accumulation_fusion=True))
    optimizer = _megatron_adam()
    assert mp.describe(type(optimizer)) in setup.parts["optimizer"]
    assert type(optimizer).__name__ == "FusedTorchAdamW"
    assert "training.native.multi_tensor.foreach_l2_norm" in setup.parts["multi_tensor"]
    assert "training.native.wgrad.TorchWgradAccum" in setup.parts["wgrad"]
    assert "torch ops over the packed QKV" in setup.parts["qkv_rope"]
    gpt = _tiny_native_model()
    norms = [m for m in gpt.modules() if "RMSNorm" in type(m).__name__]
    assert norms and all(setup.parts["rmsnorm"].startswith(mp.describe(type(m))) for m in norms)


@pytest.mark.slow
def test_with_te_imported_the_manifest_names_what_runs(monkeypatch):
    """Megatron's modules as Transformer Engine's and apex's imports leave them: the native
    backend keeps the vendors' optimizer-side kernels and says so; its own RoPE replaces TE's,
    and a forward of the built model runs ours (TE's stand-in would raise)."""
    from megatron.core import optimizer as megatron_optimizer
    from megatron.core.optimizer import clip_grads
    from megatron.core.tensor_parallel import layers
    from megatron.core.transformer import attention

    class FusedAdam(torch.optim.AdamW):            # stands in for TE's FusedAdam
        def __init__(self, params, adam_w_mode=True, **kwargs):
            super().__init__(params, **kwargs)

    def te_multi_tensor_l2norm(*args):             # stands in for TE's multi_tensor_l2norm
        raise AssertionError("not called here")

    def te_apply_fused_qkv_rotary_pos_emb(*args):  # stands in for TE's fused QKV RoPE
        raise AssertionError("the native backend runs its own RoPE")

    apex_wgrad = types.ModuleType("fused_weight_gradient_mlp_cuda")
    monkeypatch.setattr(megatron_optimizer, "Adam", FusedAdam)
    monkeypatch.setattr(megatron_optimizer, "USING_PYTORCH_OPTIMIZER", False)
    monkeypatch.setattr(clip_grads, "l2_norm_impl", te_multi_tensor_l2norm)
    monkeypatch.setattr(attention, "apply_fused_qkv_rotary_pos_emb",
                        te_apply_fused_qkv_rotary_pos_emb, raising=False)
    monkeypatch.setattr(attention, "HAVE_FUSED_QKV_ROPE", True)
    monkeypatch.setattr(layers, "fused_weight_gradient_mlp_cuda", apex_wgrad, raising=False)
    monkeypatch.setattr(layers, "_grad_accum_fusion_available", True)

    setup = specs.install_native(native_run("torch", gradient_accumulation_fusion=True))
    optimizer = _megatron_adam()
    assert type(optimizer) is FusedAdam
    assert setup.parts["optimizer"] == f"{mp.describe(FusedAdam)} (Megatron's)"
    assert setup.parts["multi_tensor"].startswith(
        f"l2 norm: {mp.describe(te_multi_tensor_l2norm)} (Megatron's)")
    assert setup.parts["wgrad"] == "fused_weight_gradient_mlp_cuda (Megatron's)"
    assert "Transformer Engine" not in str(setup.parts)
    assert setup.parts["qkv_rope"].startswith("native fused QKV RoPE")
    _tiny_native_model()
    assert attention.apply_fused_qkv_rotary_pos_emb is not te_apply_fused_qkv_rotary_pos_emb


def test_the_liger_megatron_switch_fills_the_same_slots():
    """training.native.IMPLEMENTATION: Liger's Megatron SwiGLU takes the slot ours takes, and
    Liger's Megatron RMSNorm is the spec's norm class (CPU tensors: torch, like ours)."""
    from training import native
    from training.native import norm

    saved = dict(native.IMPLEMENTATION)
    try:
        native.IMPLEMENTATION.update(rmsnorm="liger_megatron", swiglu="liger_megatron")
        setup = specs.install_native(native_run("liger"))
        assert "LigerMegatronSwiGLU" in setup.parts["swiglu"]
        assert issubclass(specs.norm_class("liger"), __import__(
            "liger_kernel.megatron", fromlist=["LigerMegatronRMSNorm"]).LigerMegatronRMSNorm)
        native.IMPLEMENTATION.update(rmsnorm="ours", swiglu="ours")
        setup = specs.install_native(native_run("liger"))
        assert setup.parts["swiglu"].startswith("native SwiGLU")
        assert specs.norm_class("liger") is norm.LigerRMSNorm
        assert "Liger-Kernel's kernel" in setup.parts["rmsnorm"]
        native.IMPLEMENTATION.update(rmsnorm="torch_fused")
        setup = specs.install_native(native_run("liger"))
        assert specs.norm_class("liger") is norm.FusedTorchRMSNorm
        assert "torch's fused rms_norm kernel" in setup.parts["rmsnorm"]
        assert specs.norm_class("torch") is norm.NativeRMSNorm
    finally:
        native.IMPLEMENTATION.update(saved)


def test_a_changed_target_is_applied_with_a_warning(monkeypatch, capsys):
    """Another Megatron at run time (a platform's image): the patch goes in, and the changed
    signature is printed (the CPU tests above fail on it instead)."""
    from megatron.core.datasets import utils as dataset_utils

    def compile_helpers(verbose):                  # a Megatron whose function takes an argument
        raise AssertionError("skipped")

    monkeypatch.setattr(dataset_utils, "compile_helpers", compile_helpers)
    assert mp.apply(Run(args=None), names=("dataset_helpers",)) == ["dataset_helpers"]
    dataset_utils.compile_helpers()
    out = capsys.readouterr().out
    assert ("WARNING: megatron patch target changed since it was written: "
            "megatron.core.datasets.utils:compile_helpers (verbose)") in out


def test_every_target_is_present_and_a_missing_one_is_named(monkeypatch):
    """missing_targets(): what the ROCm image's build checks its Megatron fork with."""
    assert mp.missing_targets() == []
    gone = mp.Patch("gone", "megatron.core.tensor_parallel.layers:no_such_name", None, "test",
                    None)
    monkeypatch.setattr(mp, "PATCHES", (*mp.PATCHES, gone))
    assert mp.missing_targets() == ["megatron.core.tensor_parallel.layers:no_such_name (gone)"]
    assert mp.main(["check"]) == 1
