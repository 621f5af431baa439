"""Gradient-accumulation fusion for Megatron's own linears without apex (training/native/wgrad.py,
put in place by the patch table's native_wgrad entry): the output layer of Megatron's TE spec is
its ColumnParallelLinear, which calls apex's fused_weight_gradient_mlp_cuda even under TE.
Megatron's real layer on the CPU (gloo, one rank): refused without a kernel, built and
accumulating into main_grad with ours; apex's kernel, where Megatron imported it, stays."""
from __future__ import annotations

import socket
import types
from argparse import Namespace

import pytest
import torch

from training import megatron_patches as mp
from training import specs
from training.native import wgrad
from training.run import Run


def te_run(fusion: bool = True) -> Run:
    """A training.run.Run carrying the TE backend's arguments (no torchrun, no parser)."""
    return Run(args=Namespace(transformer_backend="transformer_engine", native_kernels="auto",
                              fused_single_qkv_rope=True, gradient_accumulation_fusion=fusion))


@pytest.fixture(scope="module")
def group():
    import torch.distributed as dist

    if not dist.is_initialized():
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                world_size=1)
    return dist.group.WORLD


@pytest.fixture
def layers(monkeypatch):
    """Megatron's tensor_parallel.layers as apex-less as this machine is, restored afterwards."""
    from megatron.core.tensor_parallel import layers

    monkeypatch.setattr(layers, "_grad_accum_fusion_available", False)
    monkeypatch.setattr(layers, "fused_weight_gradient_mlp_cuda", None, raising=False)
    yield layers
    mp.restore(groups=("native",))


def _output_layer(layers, group, fusion: bool = True):
    from megatron.core.model_parallel_config import ModelParallelConfig

    config = ModelParallelConfig(gradient_accumulation_fusion=fusion, use_cpu_initialization=True,
                                 params_dtype=torch.bfloat16)
    return layers.ColumnParallelLinear(16, 24, config=config, init_method=torch.nn.init.normal_,
                                       bias=False, gather_output=False, tp_group=group)


def test_megatron_refuses_the_fused_wgrad_without_a_kernel(layers, group):
    with pytest.raises(RuntimeError, match="fused_weight_gradient_mlp_cuda"):
        _output_layer(layers, group)


@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.bfloat16])
def test_the_output_layer_accumulates_into_main_grad_with_ours(layers, group, grad_dtype):
    assert mp.apply(te_run(), groups=("native",)) == ["native_wgrad", "native_wgrad_available"]
    assert layers.fused_weight_gradient_mlp_cuda is wgrad.TorchWgradAccum
    layer = _output_layer(layers, group)
    weight = layer.weight
    gen = torch.Generator().manual_seed(0)
    before = torch.randn(weight.shape, generator=gen).to(grad_dtype)
    weight.main_grad = before.clone()
    # bf16 parameters and activations, as in a run; the gradient buffer fp32 or bf16
    x = torch.randn(5, 2, 16, generator=gen).to(torch.bfloat16).requires_grad_()  # [s, b, h]
    out, _bias = layer(x)
    grad_out = torch.randn(out.shape, generator=gen).to(torch.bfloat16)
    out.backward(grad_out)
    expected = before.float() + (grad_out.reshape(-1, 24).t().float()
                                 @ x.detach().reshape(-1, 16).float())
    tol = {"rtol": 1e-5, "atol": 1e-5} if grad_dtype == torch.float32 else \
        {"rtol": 2e-2, "atol": 1e-1}
    torch.testing.assert_close(weight.main_grad.float(), expected, **tol)
    assert weight.main_grad.dtype == grad_dtype
    assert weight.grad is None                      # accumulated in place, not returned
    torch.testing.assert_close(x.grad, grad_out @ weight.detach(), rtol=2e-2, atol=2e-2)


def test_te_backend_setup_names_the_kernel_of_each_linear(layers, group):
    run = te_run()
    setup = specs.install_transformer_engine(run)
    assert run.patched == ["native_wgrad", "native_wgrad_available"]   # no other native kernel
    assert setup.parts["wgrad_te_linears"].startswith("Transformer Engine")
    assert setup.parts["wgrad_megatron_linears"] == (
        f"{mp.BY_NAME['native_wgrad'].what} ({mp.describe(wgrad.TorchWgradAccum)})")
    assert setup.parts["optimizer"].endswith("(Megatron's)")          # TE's FusedAdam on a GPU
    _output_layer(layers, group)                    # buildable now: the crash the TE path had
    off = specs.install_transformer_engine(te_run(fusion=False))
    assert set(off.parts) == {"wgrad", "optimizer"}
    assert layers.fused_weight_gradient_mlp_cuda is None        # taken out for a run without it


def test_te_backend_keeps_apexs_kernel_where_megatron_imported_it(layers, group, monkeypatch):
    apex_wgrad = types.ModuleType("fused_weight_gradient_mlp_cuda")
    monkeypatch.setattr(layers, "fused_weight_gradient_mlp_cuda", apex_wgrad)
    monkeypatch.setattr(layers, "_grad_accum_fusion_available", True)
    setup = specs.install_transformer_engine(te_run())
    assert layers.fused_weight_gradient_mlp_cuda is apex_wgrad
    assert setup.parts["wgrad_megatron_linears"] == "fused_weight_gradient_mlp_cuda (Megatron's)"
