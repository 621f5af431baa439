"""Layer specs for the three backends, and the native kernels' installation.

  transformer_engine  Megatron's TE spec (fused LayerNorm-linear, TE attention, fp8/fp4)
  local               Megatron's local spec, unchanged (torch norms, unfused attention)
  native              the local spec's linears and MLP, with SDPA core attention and the
                      native RMSNorm; plus, installed into Megatron by install_native():
                      fused QKV RoPE, a one-pass SwiGLU, gradient-accumulation fusion and
                      a fused AdamW without apex/TE, and the fused linear cross-entropy as
                      the model's output processor
Nothing here re-decides a setting: the launcher resolved backend, kernels and toggles, and
this module builds exactly that, or fails loudly.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field


@dataclass
class NativeSetup:
    """What install_native() put in place (printed at startup, stored in the manifest)."""

    kernels: str
    parts: dict[str, str] = field(default_factory=dict)


def layer_spec(backend: str, config):
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec, get_gpt_layer_with_transformer_engine_spec)

    if backend == "transformer_engine":
        return get_gpt_layer_with_transformer_engine_spec(
            qk_layernorm=config.qk_layernorm, fp8=None)
    spec = get_gpt_layer_local_spec(normalization=config.normalization,
                                    qk_layernorm=config.qk_layernorm)
    if backend == "local":
        return spec
    if backend != "native":
        raise ValueError(f"unknown backend {backend!r}")
    from training.native.attention import SDPAttention
    from training.native.norm import NativeRMSNorm

    spec = copy.deepcopy(spec)
    sub = spec.submodules
    sub.input_layernorm = NativeRMSNorm
    sub.pre_mlp_layernorm = NativeRMSNorm
    sub.self_attention.submodules.core_attention = SDPAttention
    return spec


def install_native(kernels: str, gradient_accumulation_fusion: bool,
                   fused_single_qkv_rope: bool) -> NativeSetup:
    """Install the native backend's kernels into Megatron (before the model is built)."""
    from training.native import multi_tensor, norm, optimizer, rope, swiglu, wgrad

    setup = NativeSetup(kernels=kernels)
    norm.configure(kernels)
    setup.parts["rmsnorm"] = ("Liger-Kernel Triton RMSNorm" if kernels == "liger"
                              else "torch RMSNorm (fp32 statistics)")
    setup.parts["attention"] = "torch SDPA, cuDNN > flash > memory-efficient"
    if fused_single_qkv_rope:
        setup.parts["qkv_rope"] = rope.install(kernels)
    else:
        setup.parts["qkv_rope"] = "Megatron's unfused RoPE (FUSED_SINGLE_QKV_ROPE=0)"
    setup.parts["swiglu"] = (swiglu.install() if kernels == "liger"
                             else "Megatron's fused SwiGLU (torch)")
    setup.parts["optimizer"] = optimizer.install()
    setup.parts["multi_tensor"] = multi_tensor.install()
    if gradient_accumulation_fusion:
        setup.parts["wgrad"] = wgrad.install()
    else:
        setup.parts["wgrad"] = "autograd weight gradient, added to main_grad by DDP hooks"
    return setup


def install_transformer_engine(gradient_accumulation_fusion: bool) -> NativeSetup:
    """What the TE spec needs from us before the model is built. Its linears accumulate their
    weight gradients with TE's own kernel; the output layer is Megatron's own
    ColumnParallelLinear, which with gradient-accumulation fusion calls apex's
    fused_weight_gradient_mlp_cuda even under the TE spec (and fails where apex is absent):
    it gets the native backend's cuBLAS accumulate instead (the guard grad_accum_fusion_kernel
    chose the same)."""
    from training.native import wgrad

    setup = NativeSetup(kernels="transformer_engine")
    if gradient_accumulation_fusion:
        setup.parts["wgrad_te_linears"] = "Transformer Engine (fuse_wgrad_accumulation)"
        setup.parts["wgrad_megatron_linears"] = wgrad.install()
    else:
        setup.parts["wgrad"] = "autograd weight gradient, added to main_grad by DDP hooks"
    return setup


def decoder_spec(backend: str, config, vp_stage=None):
    """What GPTModel takes as transformer_layer_spec: a layer spec, or for the native backend
    the block's submodules, so the final norm is the native RMSNorm too (Megatron's default
    torch-norm wrapper refuses sequence parallel)."""
    layer = layer_spec(backend, config)
    if backend != "native":
        return layer
    from megatron.core.transformer.transformer_block import (TransformerBlockSubmodules,
                                                             get_num_layers_to_build)

    from training.native.norm import NativeRMSNorm

    return TransformerBlockSubmodules(
        layer_specs=[layer] * get_num_layers_to_build(config, vp_stage=vp_stage),
        layer_norm=NativeRMSNorm)
